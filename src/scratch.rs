//! Scratch files and folders that must not outlive the run on any exit path.
//!
//! A temporary pruned model for evaluation, a scratch checkpoint per
//! GradProbe step, the shards of an unfinished save: dropping their owner
//! removes them on every ordinary path (success, error, `?`), but a signal
//! ends the process through `exit`, where no destructor runs. So each is
//! registered here while it lives, and the signal handler calls
//! [`remove_all`] before exiting. (SIGKILL runs nothing at all: what it
//! leaves is in the system's temporary folder or beside the save folder,
//! named `prunemem-*` or `*.partial`.)

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Registered paths; `true`: a folder removed only if it is empty.
static LIVE: Mutex<Vec<(u64, PathBuf, bool)>> = Mutex::new(Vec::new());
static NEXT: AtomicU64 = AtomicU64::new(1);

fn remove(path: &Path) {
    if path.is_dir() {
        let _ = std::fs::remove_dir_all(path);
    } else {
        let _ = std::fs::remove_file(path);
    }
}

/// A registered path: removed when the guard drops, unless kept.
#[derive(Debug)]
pub struct Guard {
    id: u64,
    path: PathBuf,
    only_if_empty: bool,
}

impl Guard {
    /// Registers `path` (a file or a folder) for removal.
    pub fn new(path: PathBuf) -> Self {
        Self::register(path, false)
    }

    /// Registers folder `path` for removal only if it is empty by then (an
    /// unfinished save's folder: its shards go, a log written inside stays).
    pub fn if_empty(path: PathBuf) -> Self {
        Self::register(path, true)
    }

    fn register(path: PathBuf, only_if_empty: bool) -> Self {
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut live) = LIVE.lock() {
            live.push((id, path.clone(), only_if_empty));
        }
        Self {
            id,
            path,
            only_if_empty,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops tracking the path and leaves it where it is (it was renamed
    /// into place, or is worth keeping).
    pub fn keep(self) {
        unregister(self.id);
        std::mem::forget(self);
    }
}

fn unregister(id: u64) {
    if let Ok(mut live) = LIVE.lock() {
        live.retain(|(i, _, _)| *i != id);
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        unregister(self.id);
        match self.only_if_empty {
            true => {
                let _ = std::fs::remove_dir(&self.path);
            }
            false => remove(&self.path),
        }
    }
}

/// A fresh folder `prunemem-<what>-XXXX` in the system's temporary folder,
/// removed on every exit path.
pub fn dir(what: &str) -> std::io::Result<Guard> {
    let path = tempfile::Builder::new()
        .prefix(&format!("prunemem-{what}-"))
        .tempdir()?
        .keep();
    Ok(Guard::new(path))
}

/// Removes every registered path (the signal handler's last act).
pub fn remove_all() {
    let mut paths: Vec<(PathBuf, bool)> = match LIVE.lock() {
        Ok(mut live) => live.drain(..).map(|(_, p, e)| (p, e)).collect(),
        Err(_) => return,
    };
    // Files first, then the folders that held them if nothing else is there.
    paths.sort_by_key(|(_, only_if_empty)| *only_if_empty);
    for (p, only_if_empty) in paths {
        match only_if_empty {
            true => {
                let _ = std::fs::remove_dir(&p);
            }
            false => remove(&p),
        }
    }
}

/// Paths registered now (for tests and diagnostics).
pub fn registered() -> Vec<PathBuf> {
    LIVE.lock()
        .map(|l| l.iter().map(|(_, p, _)| p.clone()).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_remove_on_drop_keep_on_keep_and_all_go_at_once() {
        let a = dir("test").unwrap();
        let a_path = a.path().to_path_buf();
        std::fs::write(a_path.join("x"), "x").unwrap();
        assert!(registered().contains(&a_path));
        drop(a);
        assert!(!a_path.exists() && !registered().contains(&a_path));

        let b = dir("test").unwrap();
        let b_path = b.path().to_path_buf();
        b.keep();
        assert!(b_path.exists() && !registered().contains(&b_path));
        std::fs::remove_dir_all(&b_path).unwrap();

        let c = dir("test").unwrap();
        let c_path = c.path().to_path_buf();
        remove_all();
        assert!(!c_path.exists(), "removed without the guard dropping");
        drop(c); // removing twice is harmless
    }
}
