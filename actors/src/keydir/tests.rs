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
        Err(e @ Error::KeyDirLocked { .. }) => {
            let Error::KeyDirLocked { path, holder } = &e else {
                unreachable!()
            };
            assert_eq!(path, &dir);
            // The holder recorded its PID; the refusal names it.
            assert_eq!(*holder, Some(std::process::id()));
            assert!(
                e.to_string()
                    .contains(&format!("PID {}", std::process::id())),
                "{e}"
            );
        }
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
            requester_pod_uid: None,
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
            csr: None,
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

/// A tiny tmpfs that [`FullFs::fill`] fills up: ENOSPC for the next write
/// of any size. Root only (mount); unmounted on drop.
pub(crate) struct FullFs {
    pub(crate) dir: PathBuf,
    _tmp: tempfile::TempDir,
}

impl FullFs {
    pub(crate) fn new() -> FullFs {
        assert!(
            nix::unistd::geteuid().is_root(),
            "a full filesystem needs a tmpfs mount: run the tests as root"
        );
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("full");
        fs::create_dir_all(&dir).unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs"])
            .arg(&dir)
            .status()
            .unwrap();
        assert!(ok.success(), "mount tmpfs: {ok}");
        FullFs { dir, _tmp: tmp }
    }

    /// Fills it, leaving room for no data block at all.
    pub(crate) fn fill(&self) {
        let mut f = File::create(self.dir.join("filler")).unwrap();
        let block = [0u8; 4096];
        while std::io::Write::write_all(&mut f, &block).is_ok() {}
    }
}

impl Drop for FullFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.dir).status();
    }
}

#[test]
fn a_full_filesystem_is_key_dir_full_and_leaves_nothing_behind() {
    let full = FullFs::new();
    let kd = KeyDir::open(&full.dir).unwrap();
    kd.create_generation(1).unwrap();
    full.fill();
    let e = kd
        .write_file(1, files::PRIVATE_KEY, &[7u8; 2048], true)
        .unwrap_err();
    assert!(matches!(e, Error::KeyDirFull { .. }), "{e:?}");
    let text = e.to_string();
    assert!(text.contains("no space left"), "{text}");
    assert!(
        !text.contains("OVN_IPSEC_KEY_DIR"),
        "the read-only advice: {text}"
    );
    assert_eq!(
        e.status_reason(),
        kube_ovn_ipsec_api::status::Reason::KeyDirFull
    );
    // The failed write left no partial file behind.
    let left: Vec<_> = fs::read_dir(kd.generation_dir(1))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_world_readable_private_key_is_tightened_on_read() {
    let tmp = tempfile::tempdir().unwrap();
    let kd = KeyDir::open(tmp.path()).unwrap();
    kd.create_generation(1).unwrap();
    kd.write_file(1, files::PRIVATE_KEY, b"k", true).unwrap();
    kd.write_file(1, files::CERTIFICATE, b"c", false).unwrap();
    let key = kd.generation_dir(1).join(files::PRIVATE_KEY);
    fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).unwrap();
    assert_eq!(kd.read_file(1, files::PRIVATE_KEY).unwrap(), b"k");
    assert_eq!(mode(&key), 0o600, "a 0644 key was read as it was");
    // The certificate is public: left as it is.
    assert_eq!(mode(&kd.generation_dir(1).join(files::CERTIFICATE)), 0o644);
    assert_eq!(tighten_secret(&key).unwrap(), None, "already 0600");
    fs::set_permissions(&key, fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(tighten_secret(&key).unwrap(), Some(0o640));
    assert_eq!(tighten_secret(&tmp.path().join("missing")).unwrap(), None);
}

#[test]
fn a_secret_that_is_a_symbolic_link_is_refused_never_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("elsewhere");
    fs::write(&target, b"not ours").unwrap();
    fs::set_permissions(&target, fs::Permissions::from_mode(0o644)).unwrap();
    let link = tmp.path().join("protection-lease.json");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let e = tighten_secret(&link).unwrap_err();
    assert!(e.to_string().contains("symbolic link"), "{e}");
    let e = read_no_follow(&link).unwrap_err();
    assert!(e.to_string().contains("symbolic link"), "{e}");
    assert_eq!(mode(&target), 0o644, "the repair followed the link");
    assert_eq!(fs::read(&target).unwrap(), b"not ours");
}

#[test]
fn peeking_at_an_unusable_state_file_leaves_it_where_it_is() {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join(STATE_FILE), b"{ not json").unwrap();
    match peek_state(tmp.path()).unwrap() {
        PeekedState::Unusable(why) => assert!(why.contains("unparseable"), "{why}"),
        other => panic!("{other:?}"),
    }
    let names: Vec<_> = fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from(STATE_FILE)]);
    assert_eq!(
        peek_state(&tmp.path().join("none")).unwrap(),
        PeekedState::Missing
    );
}

#[test]
fn the_owner_removes_what_an_interrupted_write_left_and_nothing_else() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("keys");
    let gen_dir = dir.join("gen-000001");
    fs::create_dir_all(&gen_dir).unwrap();
    // What a SIGKILL between a temporary file's creation and its rename
    // leaves, beside files that must stay.
    let leftovers = [
        dir.join(".state.json.tmp-4242"),
        gen_dir.join(".key.pem.tmp-4242"),
    ];
    for p in &leftovers {
        fs::write(p, b"partial").unwrap();
    }
    let kept = [
        dir.join("state.json"),
        gen_dir.join("key.pem"),
        dir.join(".hidden"),
    ];
    for p in &kept {
        fs::write(p, b"whole").unwrap();
    }
    assert_eq!(temporary_files(&dir), leftovers.iter().cloned().collect());
    let _kd = KeyDir::open(&dir).unwrap();
    for p in &leftovers {
        assert!(!p.exists(), "{} left", p.display());
    }
    for p in &kept {
        assert_eq!(fs::read(p).unwrap(), b"whole", "{}", p.display());
    }
}
