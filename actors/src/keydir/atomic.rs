//! Crash-safe file replacement (SPEC §2): write a temporary file, fsync it,
//! rename it over the target, fsync the directory. The one implementation
//! for the agent: the key directory's generations and state file, and the
//! binary's lease, observations and CA copies.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A failed [`write_atomic`]: the path the failing step touched (the
/// temporary file, the target or the directory) and the OS error. Each
/// caller maps it into its own crate's error.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {source}")]
pub struct AtomicWriteError {
    /// The file or directory the failing step touched.
    pub path: PathBuf,
    /// The OS error.
    #[source]
    pub source: std::io::Error,
}

/// Writes `data` to `path` atomically with `mode`: a temporary file in the
/// same directory (mode set exactly, whatever the umask), fsynced, renamed
/// over `path`, then the directory fsynced, so a crash leaves either the
/// old or the new content, never a mix. On failure the temporary file is
/// removed, so failed writes leave nothing behind.
pub fn write_atomic(path: &Path, data: &[u8], mode: u32) -> Result<(), AtomicWriteError> {
    let at = |p: &Path| {
        let path = p.to_path_buf();
        move |source| AtomicWriteError { path, source }
    };
    let parent = path.parent().unwrap_or(Path::new("."));
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = parent.join(format!(".{file_name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)
            .map_err(at(&tmp))?;
        // The mode given to open() is filtered by the umask and does not
        // apply to a temp file left by an earlier crash; set it exactly.
        f.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(at(&tmp))?;
        f.write_all(data).map_err(at(&tmp))?;
        f.sync_all().map_err(at(&tmp))?;
        drop(f);
        fs::rename(&tmp, path).map_err(at(path))?;
        File::open(parent)
            .and_then(|d| d.sync_all())
            .map_err(at(parent))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// The temporary files of [`write_atomic`] (`.<name>.tmp-<pid>`) in `dir`
/// and in its subdirectories (one level: the key directory's generation
/// folders). Outside a write in progress each is a crash's leftover.
pub fn temporary_files(dir: &Path) -> std::collections::BTreeSet<PathBuf> {
    let mut dirs = vec![dir.to_path_buf()];
    if let Ok(entries) = fs::read_dir(dir) {
        dirs.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
    }
    dirs.iter()
        .filter_map(|d| fs::read_dir(d).ok())
        .flat_map(|entries| entries.flatten())
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with('.') && name.contains(".tmp-")
        })
        .map(|e| e.path())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_with_exact_mode_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.json");
        write_atomic(&p, b"one", 0o644).unwrap();
        write_atomic(&p, b"two", 0o600).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn failed_write_removes_its_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        // A non-empty directory in the way: the rename fails after the temp
        // file was written and fsynced.
        let target = dir.path().join("in-the-way");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("inner"), b"x").unwrap();
        let err = write_atomic(&target, b"data", 0o600).unwrap_err();
        assert_eq!(err.path, target);
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["in-the-way".to_string()], "temp file left");
        assert_eq!(fs::read(target.join("inner")).unwrap(), b"x");
    }
}
