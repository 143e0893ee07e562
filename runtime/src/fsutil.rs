//! The boot ID. Crash-safe writes are `actors::keydir::write_atomic`
//! (write-temp, fsync, rename, fsync-dir; the temp file removed on failure),
//! the one implementation for the agent; callers here map its error to
//! [`Error::Io`].

use std::fs;
use std::path::Path;

use crate::Error;

/// Reads `/proc/sys/kernel/random/boot_id` (the boot the evidence belongs
/// to: SA and guard observations are meaningless after a reboot).
pub fn boot_id() -> Result<String, Error> {
    let path = Path::new("/proc/sys/kernel/random/boot_id");
    fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use actors::keydir::write_atomic;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn atomic_write_replaces_with_mode() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.json");
        write_atomic(&p, b"one", 0o600).unwrap();
        write_atomic(&p, b"two", 0o600).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            1,
            "temp file left"
        );
        assert_eq!(boot_id().unwrap().len(), 36);
    }
}
