//! The key directory (SPEC §2): one folder per identity generation plus a
//! state file naming the active and the pending generation. Its layout and
//! the state file's records are in `keydir_format` (re-exported here); this
//! module opens, locks, reads and writes it.
//!
//! Every write is write-temp, fsync, rename, fsync-dir.

use std::fs::{self, File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::fcntl::{Flock, FlockArg};

use crate::error::{Error, Result};
use crate::keydir_format::parse_generation_dir;
use crate::ports::{KeyStore, OvsdbIdentityKeys};

mod atomic;
pub use atomic::{AtomicWriteError, temporary_files, write_atomic};
// The format lives below the key store trait, which speaks in it; its
// items keep their paths here.
pub use crate::keydir_format::{
    ActiveRecord, CsrBinding, GenerationFile, IdentityPaths, KeyDirState, LOCK_FILE, MovedAside,
    PendingRecord, PendingStage, RetiredRecord, STATE_FILE, STATE_VERSION, files,
    generation_dir_name, identity_paths_in,
};

/// An open key directory, under its process's [`OwnerLock`].
#[derive(Debug)]
pub struct KeyDir {
    dir: PathBuf,
    // The flock lives as long as its last holder: the process keeps one
    // for its whole life, so closing and reopening the directory (after an
    // error) never lets a second process in between.
    _owner: Arc<OwnerLock>,
}

/// A process's claim on a key directory (SPEC §2): an exclusive `flock` on
/// `.lock`, which also records the owner's PID so that a second process can
/// say who holds it. Taken before the process touches the key directory,
/// the lease, OVSDB or the kernel; released when dropped (or when the
/// process dies, by the kernel).
#[derive(Debug)]
pub struct OwnerLock {
    dir: PathBuf,
    _lock: Flock<File>,
}

impl OwnerLock {
    /// Creates the directory (0700) if needed and takes its lock without
    /// waiting. Held elsewhere: [`Error::KeyDirLocked`] with the holder's
    /// recorded PID. Not creatable or writable: [`Error::KeyDirReadOnly`]
    /// (or [`Error::KeyDirFull`]).
    pub fn acquire(dir: impl Into<PathBuf>) -> Result<OwnerLock> {
        let dir = dir.into();
        create_private_dir(&dir).map_err(|e| match e {
            Error::KeyDirIo { source, .. } if is_read_only(&source) => Error::KeyDirReadOnly {
                path: dir.clone(),
                source,
            },
            Error::KeyDirReadOnly { source, .. } => Error::KeyDirReadOnly {
                path: dir.clone(),
                source,
            },
            other => other,
        })?;
        let lock_path = dir.join(LOCK_FILE);
        let lock_file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&lock_path)
            .map_err(|e| match io_err(&lock_path, e) {
                Error::KeyDirReadOnly { source, .. } => Error::KeyDirReadOnly {
                    path: dir.clone(),
                    source,
                },
                other => other,
            })?;
        let lock = match Flock::lock(lock_file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => lock,
            Err((file, nix::errno::Errno::EWOULDBLOCK)) => {
                return Err(Error::KeyDirLocked {
                    holder: recorded_pid(&file),
                    path: dir,
                });
            }
            Err((_, errno)) => return Err(io_err(&lock_path, std::io::Error::from(errno))),
        };
        // Ours now: record who we are for the next process that asks. Only
        // a courtesy — the flock is the lock — so a full disk does not stop
        // the owner (the refusal then just cannot name it).
        let pid = format!("{}\n", std::process::id());
        if let Err(e) = lock
            .set_len(0)
            .and_then(|()| lock.write_all_at(pid.as_bytes(), 0))
            .and_then(|()| lock.sync_data())
        {
            tracing::warn!(path = %lock_path.display(), error = %e, "could not record the owner's PID");
        }
        // Only the owner writes here and the lock is ours: a temporary file
        // of an atomic write is what a crash between its creation and its
        // rename left (possibly part of a private key). Nothing reads it;
        // it goes.
        for tmp in temporary_files(&dir) {
            match fs::remove_file(&tmp) {
                Ok(()) => {
                    tracing::warn!(path = %tmp.display(), "removed an interrupted write's temporary file");
                }
                Err(e) => {
                    tracing::warn!(path = %tmp.display(), error = %e, "could not remove an interrupted write's temporary file");
                }
            }
        }
        Ok(OwnerLock { dir, _lock: lock })
    }

    /// The directory this lock owns.
    pub fn path(&self) -> &Path {
        &self.dir
    }
}

/// The PID the holder wrote into the lock file; `None` while it has not
/// written it yet (or wrote something else).
fn recorded_pid(file: &File) -> Option<u32> {
    let mut buf = [0u8; 32];
    let n = file.read_at(&mut buf, 0).ok()?;
    std::str::from_utf8(&buf[..n]).ok()?.trim().parse().ok()
}

fn io_err(path: &Path, source: std::io::Error) -> Error {
    if is_full(&source) {
        Error::KeyDirFull {
            path: path.to_path_buf(),
            source,
        }
    } else if is_read_only(&source) {
        Error::KeyDirReadOnly {
            path: path.to_path_buf(),
            source,
        }
    } else {
        Error::KeyDirIo {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Makes a secret file (a private key, the lease) 0600 again when group or
/// others can access it, and says so: the agent writes them 0600, so a
/// wider mode is someone's `chmod`, a restore from backup, or a copy — the
/// key may have been read. Tightened rather than refused: refusing would
/// take the node's encryption down over a mode bit while doing nothing for
/// the exposure, which only a renewal (or a CA rotation) ends. Returns the
/// mode it had when it was changed; a missing file is `Ok(None)`.
pub fn tighten_secret(path: &Path) -> std::io::Result<Option<u32>> {
    // The mode is read and changed on one descriptor opened without
    // following links, so the check and the change are of the same file.
    let Some(file) = open_no_follow(path)? else {
        return Ok(None);
    };
    let mode = file.metadata()?.permissions().mode() & 0o777;
    if mode & 0o077 == 0 {
        return Ok(None);
    }
    file.set_permissions(fs::Permissions::from_mode(0o600))?;
    tracing::warn!(
        path = %path.display(),
        mode = format!("{mode:04o}"),
        "a secret file was readable beyond its owner; set it back to 0600 — if others could \
         read it on this host, renew the identity (delete the node's CSR generation) or rotate"
    );
    Ok(Some(mode))
}

/// Reads a file of the key directory without following a symbolic link
/// (see [`open_no_follow`]); a missing file is `Ok(None)`.
pub fn read_no_follow(path: &Path) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::Read;
    let Some(mut file) = open_no_follow(path)? else {
        return Ok(None);
    };
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    Ok(Some(bytes))
}

/// Opens a key-directory file for reading, never through a symbolic link:
/// a link there would make a repair change a file elsewhere, and a file
/// that is a link is not the one the agent wrote. A link is refused with
/// its path; a missing file is `Ok(None)`.
fn open_no_follow(path: &Path) -> std::io::Result<Option<File>> {
    match OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) => Err(std::io::Error::new(
            ErrorKind::InvalidInput,
            format!(
                "{} is a symbolic link; the key directory's files are never followed: replace \
                 it with the file itself",
                path.display()
            ),
        )),
        Err(e) => Err(e),
    }
}

/// The key directory's state as a read-only run sees it: nothing is moved,
/// repaired or created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeekedState {
    /// No `state.json`.
    Missing,
    /// The state file, decoded.
    Present(Box<KeyDirState>),
    /// A state file that does not decode or has an unknown version: why.
    /// Left where it is (the agent moves it aside when it next starts).
    Unusable(String),
}

/// Reads `dir`'s `state.json` without changing anything, for the cleanup:
/// [`KeyDir::load`] moves an unusable file aside, which a run that ends
/// with nothing to release must not do.
pub fn peek_state(dir: &Path) -> Result<PeekedState> {
    let path = dir.join(STATE_FILE);
    let bytes = match read_no_follow(&path) {
        Ok(Some(b)) => b,
        Ok(None) => return Ok(PeekedState::Missing),
        Err(e) => return Err(io_err(&path, e)),
    };
    Ok(match serde_json::from_slice::<KeyDirState>(&bytes) {
        Ok(s) if s.version == STATE_VERSION => PeekedState::Present(Box::new(s)),
        Ok(s) => {
            PeekedState::Unusable(format!("{}: unknown version {}", path.display(), s.version))
        }
        Err(e) => PeekedState::Unusable(format!("{}: unparseable: {e}", path.display())),
    })
}

/// No space (or quota) left: its own reason — the Talos advice of a
/// read-only directory would send the operator the wrong way.
fn is_full(e: &std::io::Error) -> bool {
    e.kind() == ErrorKind::StorageFull
        || e.raw_os_error() == Some(nix::libc::ENOSPC)
        || e.raw_os_error() == Some(nix::libc::EDQUOT)
}

fn is_read_only(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem
    ) || e.raw_os_error() == Some(nix::libc::EROFS)
        || e.raw_os_error() == Some(nix::libc::EACCES)
        || e.raw_os_error() == Some(nix::libc::EPERM)
}

/// The generation OVSDB's identity keys name, with the whole generation
/// checked (SPEC §2: never a mix; what the crash and chaos tests assert): all three keys or none, every one naming the
/// file of *one* generation folder of `key_dir`, the files present and the
/// certificate for the key, and that generation the one `state` records
/// as active (or, mid-activation, as issued and pending). `None`: OVSDB
/// holds no identity and none is recorded active.
pub fn published_generation(
    key_dir: &Path,
    ovs: &OvsdbIdentityKeys,
    state: &KeyDirState,
) -> Result<Option<u64>, String> {
    let named = [&ovs.private_key, &ovs.certificate, &ovs.ca_cert];
    if named.iter().all(|k| k.is_none()) {
        return match &state.active {
            None => Ok(None),
            Some(a) => Err(format!(
                "state.json records generation {} active, OVSDB holds no identity",
                a.generation
            )),
        };
    }
    let Some(g) = (1..=state.last_generation).find(|g| {
        identity_paths_in(key_dir, *g)
            .private_key
            .display()
            .to_string()
            == ovs.private_key.clone().unwrap_or_default()
    }) else {
        return Err(format!(
            "OVSDB's private_key {:?} names no generation of {}",
            ovs.private_key,
            key_dir.display()
        ));
    };
    let want = OvsdbIdentityKeys::from_paths(&identity_paths_in(key_dir, g));
    if &want != ovs {
        return Err(format!(
            "OVSDB mixes generations: {ovs:?}, generation {g} is {want:?}"
        ));
    }
    let dir = key_dir.join(generation_dir_name(g));
    let read = |name: &str| {
        std::fs::read(dir.join(name))
            .map_err(|e| format!("OVSDB names {}, unreadable: {e}", dir.join(name).display()))
    };
    let key = crate::pki::PrivateKey::from_pem(&read(files::PRIVATE_KEY)?)
        .map_err(|e| format!("generation {g}'s key does not parse: {e}"))?;
    let chain = kube_ovn_ipsec_api::pki::CertificateChain::from_pem(&read(files::CERTIFICATE)?)
        .map_err(|e| format!("generation {g}'s certificate does not parse: {e}"))?;
    if chain.leaf().public_key_bytes() != key.public_key_raw() {
        return Err(format!("generation {g}'s certificate is not for its key"));
    }
    read(files::CA)?;
    let recorded = state.active.as_ref().is_some_and(|a| a.generation == g)
        || state
            .pending
            .as_ref()
            .is_some_and(|p| p.generation == g && p.stage == PendingStage::Issued);
    if !recorded {
        return Err(format!(
            "OVSDB is on generation {g}, which state.json names neither active nor issued-pending"
        ));
    }
    Ok(Some(g))
}

/// [`write_atomic`] with the key directory's error classification.
fn write_atomic_kd(path: &Path, data: &[u8], mode: u32) -> Result<()> {
    write_atomic(path, data, mode).map_err(|e| io_err(&e.path, e.source))
}

fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err(dir, e))
}

fn create_private_dir(path: &Path) -> Result<()> {
    match fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
    {
        Ok(()) => {}
        Err(e) => return Err(io_err(path, e)),
    }
    fs::set_permissions(path, fs::Permissions::from_mode(0o700)).map_err(|e| io_err(path, e))
}

impl KeyDir {
    /// Opens (creating if needed) the key directory under a lock of its
    /// own: for tests and one-shot tools. The agent takes its
    /// [`OwnerLock`] at start-up and uses [`KeyDir::open_owned`].
    ///
    /// A directory that cannot be created or written is
    /// [`Error::KeyDirReadOnly`] ([`Error::KeyDirFull`] when out of space);
    /// one locked by another process is [`Error::KeyDirLocked`].
    pub fn open(dir: impl Into<PathBuf>) -> Result<KeyDir> {
        Self::open_owned(Arc::new(OwnerLock::acquire(dir)?))
    }

    /// Opens the key directory `owner` holds, probing that it is writable.
    pub fn open_owned(owner: Arc<OwnerLock>) -> Result<KeyDir> {
        let dir = owner.path().to_path_buf();
        // Probe writability now: a directory that exists but is read-only
        // (a read-only bind mount) must be reported before any key is made.
        write_atomic_kd(&dir.join(".probe"), b"", 0o600).map_err(|e| match e {
            Error::KeyDirReadOnly { source, .. } | Error::KeyDirIo { source, .. } => {
                Error::KeyDirReadOnly {
                    path: dir.clone(),
                    source,
                }
            }
            other => other,
        })?;
        let _ = fs::remove_file(dir.join(".probe"));
        Ok(KeyDir { dir, _owner: owner })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// A generation's folder.
    pub fn generation_dir(&self, generation: u64) -> PathBuf {
        self.dir.join(generation_dir_name(generation))
    }

    /// The three OVSDB paths of a generation.
    pub fn identity_paths(&self, generation: u64) -> IdentityPaths {
        identity_paths_in(&self.dir, generation)
    }

    /// Generation folders present on disk.
    pub fn generations_on_disk(&self) -> Result<Vec<u64>> {
        let mut out = Vec::new();
        let entries = fs::read_dir(&self.dir).map_err(|e| io_err(&self.dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| io_err(&self.dir, e))?;
            if let Some(g) = entry.file_name().to_str().and_then(parse_generation_dir) {
                out.push(g);
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// Loads the state. A missing file is an empty state; an unreadable or
    /// unknown-version file is moved aside (never deleted) and an empty
    /// state returned with the [`MovedAside`] notice. Orphan generation
    /// folders (from a crash before their state was written) are adopted as
    /// retired at `now`, so they are collected after the grace period.
    pub fn load(&self, now_unix: i64) -> Result<(KeyDirState, Option<MovedAside>)> {
        let path = self.dir.join(STATE_FILE);
        let mut moved = None;
        let mut state = match fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice::<KeyDirState>(&bytes) {
                Ok(s) if s.version == STATE_VERSION => s,
                Ok(s) => {
                    moved = Some(self.move_aside(
                        &path,
                        now_unix,
                        format!("unknown version {}", s.version),
                    )?);
                    KeyDirState::default()
                }
                Err(e) => {
                    moved = Some(self.move_aside(&path, now_unix, format!("unparseable: {e}"))?);
                    KeyDirState::default()
                }
            },
            Err(e) if e.kind() == ErrorKind::NotFound => KeyDirState::default(),
            Err(e) => return Err(io_err(&path, e)),
        };
        state.version = STATE_VERSION;
        let on_disk = self.generations_on_disk()?;
        if let Some(max) = on_disk.iter().copied().max() {
            state.last_generation = state.last_generation.max(max);
        }
        for g in on_disk {
            let known = state.active.as_ref().is_some_and(|a| a.generation == g)
                || state.pending.as_ref().is_some_and(|p| p.generation == g)
                || state.retired.iter().any(|r| r.generation == g);
            if !known {
                state.retired.push(RetiredRecord {
                    generation: g,
                    retired_at: now_unix,
                });
            }
        }
        Ok((state, moved))
    }

    fn move_aside(&self, path: &Path, now_unix: i64, reason: String) -> Result<MovedAside> {
        let mut target = self.dir.join(format!("{STATE_FILE}.corrupt-{now_unix}"));
        let mut n = 1;
        while target.exists() {
            target = self
                .dir
                .join(format!("{STATE_FILE}.corrupt-{now_unix}.{n}"));
            n += 1;
        }
        fs::rename(path, &target).map_err(|e| io_err(path, e))?;
        fsync_dir(&self.dir)?;
        Ok(MovedAside {
            moved_to: target,
            reason,
        })
    }

    /// Persists the state (atomically).
    pub fn save(&self, state: &KeyDirState) -> Result<()> {
        let json = serde_json::to_vec_pretty(state)
            .map_err(|e| Error::KeyGeneration(format!("encoding key directory state: {e}")))?;
        write_atomic_kd(&self.dir.join(STATE_FILE), &json, 0o600)
    }

    /// Creates a generation folder (0700).
    pub fn create_generation(&self, generation: u64) -> Result<PathBuf> {
        let g = self.generation_dir(generation);
        create_private_dir(&g)?;
        fsync_dir(&self.dir)?;
        Ok(g)
    }

    /// Writes a file in a generation folder atomically; `secret` files get
    /// mode 0600, others 0644.
    pub fn write_file(&self, generation: u64, name: &str, data: &[u8], secret: bool) -> Result<()> {
        let mode = if secret { 0o600 } else { 0o644 };
        write_atomic_kd(&self.generation_dir(generation).join(name), data, mode)
    }

    /// Reads a file of a generation.
    pub fn read_file(&self, generation: u64, name: &str) -> Result<Vec<u8>> {
        let p = self.generation_dir(generation).join(name);
        if name == files::PRIVATE_KEY {
            tighten_secret(&p).map_err(|e| io_err(&p, e))?;
        }
        fs::read(&p).map_err(|e| io_err(&p, e))
    }

    /// Removes retired generations older than `grace_secs` that are neither
    /// active, pending, nor referenced by any of `referenced` (the paths
    /// OVSDB points at). Returns the removed generations; the caller saves
    /// the updated state.
    pub fn collect_garbage(
        &self,
        state: &mut KeyDirState,
        now_unix: i64,
        grace_secs: i64,
        referenced: &[PathBuf],
    ) -> Result<Vec<u64>> {
        let mut removed = Vec::new();
        let mut keep = Vec::new();
        for r in std::mem::take(&mut state.retired) {
            let dir = self.generation_dir(r.generation);
            let in_use = state
                .active
                .as_ref()
                .is_some_and(|a| a.generation == r.generation)
                || state
                    .pending
                    .as_ref()
                    .is_some_and(|p| p.generation == r.generation)
                || referenced.iter().any(|p| p.starts_with(&dir));
            if in_use || now_unix - r.retired_at < grace_secs {
                keep.push(r);
                continue;
            }
            match fs::remove_dir_all(&dir) {
                Ok(()) => removed.push(r.generation),
                Err(e) if e.kind() == ErrorKind::NotFound => removed.push(r.generation),
                Err(e) => {
                    keep.push(r);
                    state.retired = keep;
                    return Err(io_err(&dir, e));
                }
            }
        }
        state.retired = keep;
        if !removed.is_empty() {
            fsync_dir(&self.dir)?;
        }
        Ok(removed)
    }
}

impl KeyStore for KeyDir {
    fn identity_paths(&self, generation: u64) -> IdentityPaths {
        KeyDir::identity_paths(self, generation)
    }

    fn load(&self, now_unix: i64) -> Result<(KeyDirState, Option<MovedAside>)> {
        KeyDir::load(self, now_unix)
    }

    fn read_file(&self, generation: u64, name: &str) -> Result<Vec<u8>> {
        KeyDir::read_file(self, generation, name)
    }

    fn write_generation(
        &self,
        generation: u64,
        files: &[GenerationFile<'_>],
        state: &KeyDirState,
    ) -> Result<()> {
        self.create_generation(generation)?;
        for f in files {
            self.write_file(generation, f.name, f.data, f.secret)?;
        }
        self.save(state)
    }

    fn save(&self, state: &KeyDirState) -> Result<()> {
        KeyDir::save(self, state)
    }

    fn collect_garbage(
        &self,
        state: &mut KeyDirState,
        now_unix: i64,
        grace_secs: i64,
        referenced: &[PathBuf],
    ) -> Result<Vec<u64>> {
        KeyDir::collect_garbage(self, state, now_unix, grace_secs, referenced)
    }
}

#[cfg(test)]
pub(crate) mod tests;
