//! The invariants checked after every fault, over what the test read from
//! the node (pure but for reading the key directory's files). Each returns
//! the violation as a sentence an operator could act on.

use std::collections::BTreeSet;
use std::path::Path;

use actors::keydir::{KeyDirState, files};
use actors::pki::PrivateKey;
use kube_ovn_ipsec_api::pki::CertificateChain;

/// The generation OVSDB's identity keys name, the whole generation
/// checked (invariant 1): `actors::keydir::published_generation`.
pub use actors::keydir::published_generation as one_generation;

/// The atomic writes' temporary files (`.<name>.tmp-<pid>`) in the key
/// directory and its generation folders: `actors::keydir::temporary_files`.
/// One seen once may be a write in progress (the agent keeps renewing);
/// one seen again a second later was left behind (invariant 3).
pub use actors::keydir::temporary_files;

/// Every file of the key directory and its generation folders parses as
/// what it is named (invariant 3): a key as a key, a certificate or CA as
/// certificates, a request as PEM. Temporary files are
/// [`temporary_files`]' to judge.
pub fn no_half_written(key_dir: &Path) -> Result<(), String> {
    let mut bad = Vec::new();
    let mut scan = |dir: &Path| -> Result<(), String> {
        let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.contains(".tmp-") {
                continue;
            }
            let Ok(data) = std::fs::read(e.path()) else {
                continue;
            };
            let ok = match name.as_str() {
                files::PRIVATE_KEY => PrivateKey::from_pem(&data).is_ok(),
                files::CERTIFICATE | files::CA => CertificateChain::from_pem(&data).is_ok(),
                files::REQUEST => data.starts_with(b"-----BEGIN"),
                _ => true,
            };
            if !ok {
                bad.push(format!("{} does not parse", e.path().display()));
            }
        }
        Ok(())
    };
    scan(key_dir)?;
    for e in std::fs::read_dir(key_dir)
        .map_err(|e| format!("{}: {e}", key_dir.display()))?
        .flatten()
    {
        if e.path().is_dir() {
            scan(&e.path())?;
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(bad.join("; "))
    }
}

/// A valid identity is never lost (invariant 3): the generation active
/// before the fault is still active, or a later one is.
pub fn identity_kept(before: Option<u64>, after: &KeyDirState) -> Result<(), String> {
    let now = after.active.as_ref().map(|a| a.generation);
    match (before, now) {
        (Some(b), Some(n)) if n >= b => Ok(()),
        (None, _) => Ok(()),
        (Some(b), n) => Err(format!("generation {b} was active, now {n:?} is")),
    }
}

/// Key material in a text served or logged (invariant 7): the PEM armour
/// of a key or certificate, named.
pub fn key_material(text: &str) -> Option<&'static str> {
    const MARKERS: [(&str, &str); 3] = [
        ("PRIVATE KEY-----", "a private key"),
        ("-----BEGIN CERTIFICATE", "a certificate's PEM"),
        ("-----BEGIN CERTIFICATE REQUEST", "a CSR's PEM"),
    ];
    MARKERS
        .iter()
        .find(|(m, _)| text.contains(m))
        .map(|(_, what)| *what)
}

/// What of `before` changed in `after` (invariant 5): lines of an XFRM
/// dump of state this project did not create, compared as sets.
pub fn foreign_unchanged(before: &str, after: &str) -> Result<(), String> {
    let set = |s: &str| {
        s.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect::<BTreeSet<_>>()
    };
    let (b, a) = (set(before), set(after));
    let gone: Vec<_> = b.difference(&a).cloned().collect();
    if gone.is_empty() {
        Ok(())
    } else {
        Err(format!("foreign XFRM state changed: {gone:?} gone"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actors::keydir;
    use actors::ports::OvsdbIdentityKeys;

    fn active(generation: u64) -> keydir::ActiveRecord {
        keydir::ActiveRecord {
            generation,
            certificate_digest: String::new(),
            csr: None,
        }
    }

    #[test]
    fn key_material_is_named_and_plain_text_passes() {
        assert_eq!(
            key_material("x -----BEGIN PRIVATE KEY----- y"),
            Some("a private key")
        );
        assert_eq!(
            key_material("-----BEGIN EC PRIVATE KEY-----"),
            Some("a private key")
        );
        assert_eq!(
            key_material("-----BEGIN CERTIFICATE-----"),
            Some("a certificate's PEM")
        );
        assert_eq!(key_material(r#"{"generation":3,"phase":"Ready"}"#), None);
    }

    #[test]
    fn an_identity_may_advance_never_go_back_or_vanish() {
        let mut s = KeyDirState::default();
        assert!(identity_kept(None, &s).is_ok());
        assert!(
            identity_kept(Some(2), &s)
                .unwrap_err()
                .contains("generation 2")
        );
        s.active = Some(active(3));
        assert!(identity_kept(Some(2), &s).is_ok());
        assert!(identity_kept(Some(4), &s).is_err());
    }

    #[test]
    fn temporary_files_are_found_in_generation_folders_and_parsed_files_judged() {
        let dir = tempfile::tempdir().unwrap();
        let g = dir.path().join("gen-00000001");
        std::fs::create_dir(&g).unwrap();
        std::fs::write(g.join(".cert.pem.tmp-42"), b"half").unwrap();
        std::fs::write(dir.path().join(".state.json.tmp-42"), b"{").unwrap();
        assert_eq!(temporary_files(dir.path()).len(), 2);
        assert!(
            no_half_written(dir.path()).is_ok(),
            "temporaries are not judged here"
        );
        std::fs::write(g.join(files::CERTIFICATE), b"not a certificate").unwrap();
        assert!(
            no_half_written(dir.path())
                .unwrap_err()
                .contains("cert.pem does not parse")
        );
    }

    #[test]
    fn foreign_state_may_gain_lines_never_lose_one() {
        assert!(foreign_unchanged("a\nb\n", "b\na\nc").is_ok());
        assert!(
            foreign_unchanged("a\nb", "a")
                .unwrap_err()
                .contains("\"b\"")
        );
    }

    #[test]
    fn ovsdb_without_identity_is_consistent_only_without_an_active_record() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = KeyDirState::default();
        assert_eq!(
            one_generation(dir.path(), &OvsdbIdentityKeys::default(), &s),
            Ok(None)
        );
        s.active = Some(active(1));
        assert!(one_generation(dir.path(), &OvsdbIdentityKeys::default(), &s).is_err());
    }
}
