//! An exclusive lock on a destination folder, so two runs never write the
//! same `OUT.partial/` or rename each other's work into `OUT/`.
//!
//! The lock is `OUT.lock`, a file beside the destination held with an
//! advisory `flock` for the writer's lifetime; it carries the holder's pid,
//! start time and command line, so the run that is refused can say who
//! holds it. The kernel drops the lock when the holder dies, SIGKILL
//! included, so a crashed run never blocks the next one.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::ModelError;

/// Held while a run writes `OUT`; released (and its file removed) on drop.
#[derive(Debug)]
pub struct DestLock {
    file: File,
    path: PathBuf,
    /// Removes the lock file on a signal too (SIGINT, SIGTERM, SIGHUP end
    /// the process without running destructors: `crate::scratch`).
    _removed: crate::scratch::Guard,
}

/// `OUT.lock` beside `out`.
pub fn lock_path(out: &Path) -> PathBuf {
    let mut name = out
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".lock");
    out.with_file_name(name)
}

/// Whether a live process holds `out`'s lock now (a run still writing it).
/// The probe takes a shared lock for an instant and never creates the file.
pub fn held(out: &Path) -> bool {
    let Ok(file) = File::open(lock_path(out)) else {
        return false;
    };
    matches!(file.try_lock_shared(), Err(TryLockError::WouldBlock))
}

impl DestLock {
    /// Takes the lock on `out`, or says who holds it.
    pub fn acquire(out: &Path) -> Result<Self, ModelError> {
        let path = lock_path(out);
        let io = |e: std::io::Error| ModelError::io(&path, e);
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| ModelError::io(parent, e))?;
        }
        // The file may be removed by a holder that just finished between our
        // open and our lock: retry until the locked file is the one at `path`.
        for _ in 0..100 {
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(io)?;
            match file.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => {
                    let mut holder = String::new();
                    let _ = file.read_to_string(&mut holder);
                    return Err(ModelError::Checkpoint(format!(
                        "{} is being written by another prunemem run ({}); wait for it or choose another folder",
                        out.display(),
                        holder.trim().replace('\n', ", ")
                    )));
                }
                Err(TryLockError::Error(e)) => return Err(io(e)),
            }
            let same = match (file.metadata(), std::fs::metadata(&path)) {
                (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
                _ => false,
            };
            if !same {
                continue;
            }
            let me = format!(
                "pid {}, started {}, {}",
                std::process::id(),
                crate::memory::iso8601_utc(crate::memory::unix_ms_now()),
                std::env::args_os()
                    .map(|a| a.to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(" ")
            );
            file.set_len(0).map_err(io)?;
            file.seek(SeekFrom::Start(0)).map_err(io)?;
            file.write_all(me.as_bytes()).map_err(io)?;
            let removed = crate::scratch::Guard::new(path.clone());
            return Ok(Self {
                file,
                path,
                _removed: removed,
            });
        }
        Err(ModelError::Checkpoint(format!(
            "{}: could not take the lock",
            path.display()
        )))
    }
}

impl Drop for DestLock {
    fn drop(&mut self) {
        // Remove while still holding it (the guard would too, after);
        // closing the file releases the lock.
        let _ = std::fs::remove_file(&self.path);
        let _ = self.file.unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_naming_the_first_and_released_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("pruned");
        let first = DestLock::acquire(&out).unwrap();
        assert!(lock_path(&out).exists());
        let err = DestLock::acquire(&out).unwrap_err().to_string();
        assert!(err.contains("another prunemem run"), "{err}");
        assert!(
            err.contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
        drop(first);
        assert!(!lock_path(&out).exists());
        let again = DestLock::acquire(&out).unwrap();
        drop(again);
    }
}
