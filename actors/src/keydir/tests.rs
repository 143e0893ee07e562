use super::*;
use std::os::unix::fs::MetadataExt;

fn mode(p: &Path) -> u32 {
    fs::metadata(p).unwrap().mode() & 0o777
}

#[test]
fn creates_private_dir_and_locks_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("keys");
    let kd = KeyDir::open(&dir).unwrap();
    assert_eq!(mode(&dir), 0o700);
    // A second owner in the same or another process is refused.
    match KeyDir::open(&dir) {
        Err(Error::KeyDirLocked { path }) => assert_eq!(path, dir),
        other => panic!("expected KeyDirLocked, got {other:?}"),
    }
    drop(kd);
    KeyDir::open(&dir).unwrap();
}

#[test]
fn secret_files_are_0600_and_state_round_trips() {
    let tmp = tempfile::tempdir().unwrap();
    let kd = KeyDir::open(tmp.path()).unwrap();
    kd.create_generation(1).unwrap();
    kd.write_file(1, files::PRIVATE_KEY, b"k", true).unwrap();
    kd.write_file(1, files::CERTIFICATE, b"c", false).unwrap();
    assert_eq!(mode(&kd.generation_dir(1)), 0o700);
    assert_eq!(mode(&kd.identity_paths(1).private_key), 0o600);
    assert_eq!(kd.read_file(1, files::PRIVATE_KEY).unwrap(), b"k");

    let state = KeyDirState {
        version: STATE_VERSION,
        last_generation: 1,
        active: None,
        pending: Some(PendingRecord {
            generation: 1,
            key_digest: "ab".into(),
            csr_name: "ovn-ipsec-x".into(),
            csr_uid: None,
            trust_digest: "cd".into(),
            stage: PendingStage::Prepared,
            trust_refresh: false,
        }),
        retired: vec![],
    };
    kd.save(&state).unwrap();
    assert_eq!(mode(&tmp.path().join(STATE_FILE)), 0o600);
    let (loaded, moved) = kd.load(0).unwrap();
    assert_eq!(loaded, state);
    assert!(moved.is_none());
    // No temp files left behind.
    let leftovers: Vec<_> = fs::read_dir(tmp.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty());
}

#[test]
fn corrupt_and_unknown_version_state_is_moved_aside() {
    let tmp = tempfile::tempdir().unwrap();
    let kd = KeyDir::open(tmp.path()).unwrap();
    fs::write(tmp.path().join(STATE_FILE), b"{not json").unwrap();
    let (state, moved) = kd.load(1234).unwrap();
    let moved = moved.unwrap();
    assert_eq!(state.active, None);
    assert_eq!(moved.moved_to, tmp.path().join("state.json.corrupt-1234"));
    assert_eq!(fs::read(&moved.moved_to).unwrap(), b"{not json");
    assert!(!tmp.path().join(STATE_FILE).exists());

    fs::write(
        tmp.path().join(STATE_FILE),
        br#"{"version":99,"lastGeneration":0,"active":null,"pending":null}"#,
    )
    .unwrap();
    let (_, moved) = kd.load(1234).unwrap();
    let moved = moved.unwrap();
    // Never overwrites an earlier one.
    assert_eq!(moved.moved_to, tmp.path().join("state.json.corrupt-1234.1"));
    assert!(moved.reason.contains("version 99"));
}

#[test]
fn orphan_generations_are_adopted_and_numbering_continues() {
    let tmp = tempfile::tempdir().unwrap();
    let kd = KeyDir::open(tmp.path()).unwrap();
    kd.create_generation(7).unwrap();
    let (state, _) = kd.load(50).unwrap();
    assert_eq!(state.last_generation, 7);
    assert_eq!(
        state.retired,
        vec![RetiredRecord {
            generation: 7,
            retired_at: 50
        }]
    );
}

#[test]
fn gc_respects_grace_active_and_ovsdb_references() {
    let tmp = tempfile::tempdir().unwrap();
    let kd = KeyDir::open(tmp.path()).unwrap();
    for g in 1..=4 {
        kd.create_generation(g).unwrap();
    }
    let mut state = KeyDirState {
        version: STATE_VERSION,
        last_generation: 4,
        active: Some(ActiveRecord {
            generation: 4,
            certificate_digest: "x".into(),
        }),
        pending: None,
        retired: vec![
            RetiredRecord {
                generation: 1,
                retired_at: 0,
            },
            RetiredRecord {
                generation: 2,
                retired_at: 0,
            },
            RetiredRecord {
                generation: 3,
                retired_at: 90,
            },
        ],
    };
    // OVSDB still points at generation 2 (activation of 4 not seen there).
    let referenced = vec![kd.identity_paths(2).certificate];
    let removed = kd
        .collect_garbage(&mut state, 100, 60, &referenced)
        .unwrap();
    assert_eq!(removed, vec![1]);
    assert!(!kd.generation_dir(1).exists());
    assert!(kd.generation_dir(2).exists());
    assert!(kd.generation_dir(3).exists(), "inside the grace period");
    assert!(kd.generation_dir(4).exists());
    assert_eq!(
        state
            .retired
            .iter()
            .map(|r| r.generation)
            .collect::<Vec<_>>(),
        vec![2, 3]
    );
}

/// A directory path that cannot be created, also as root: root bypasses
/// permission bits, so it gets a path under /sys (EPERM, or EROFS where
/// /sys is mounted read-only), which is how a read-only /etc looks too.
pub(crate) fn unwritable_dir(tmp: &Path) -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        PathBuf::from("/sys/kube-ovn-ipsec-test-keys")
    } else {
        let ro = tmp.join("ro");
        fs::create_dir_all(&ro).unwrap();
        fs::set_permissions(&ro, fs::Permissions::from_mode(0o500)).unwrap();
        ro.join("keys")
    }
}

#[test]
fn read_only_dir_is_reported_with_path() {
    let tmp = tempfile::tempdir().unwrap();
    let target = unwritable_dir(tmp.path());
    match KeyDir::open(&target) {
        Err(e @ Error::KeyDirReadOnly { .. }) => {
            let text = e.to_string();
            assert!(text.contains(&target.display().to_string()), "{text}");
            assert!(text.contains("OVN_IPSEC_KEY_DIR"), "{text}");
        }
        other => panic!("expected KeyDirReadOnly, got {other:?}"),
    }
}
