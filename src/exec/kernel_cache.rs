//! Keeping the kernel cache's root from growing without end. Each build
//! compiles into a folder of its own (`cube::kernel_cache`: cubecl keys a
//! kernel by its name, not its body, so builds cannot share one), and
//! every upgrade or rebuilt kernel left the older folder behind — a few MB
//! a build on Vulkan, more where NVRTC compiled a model's matmuls. A run
//! now marks its build's folder as used ([`MARKER`], its modification time
//! the last use) and removes the least recently used of the others past
//! [`DEFAULT_KEEP`] builds (`PRUNEMEM_KERNEL_CACHE_KEEP=N`, or `all`).
//!
//! Only folders that carry the marker are ever removed: a folder without
//! it (a user's own, or an older build's from before the marker) is not
//! this module's to delete, and a symbolic link is never followed, so a
//! cache root pointed at a shared place (`PRUNEMEM_KERNEL_CACHE=DIR`)
//! loses nothing but prunemem's own builds.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use thiserror::Error;

/// Where a device run's compiled kernels are kept between runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// This build's folder under prunemem's root (`cube::kernel_cache`):
    /// marked and tidied by [`prepare`].
    Build(PathBuf),
    /// Where a `cubecl.toml` / `burn.toml` of the user's says (cubecl's
    /// own setting, which prunemem leaves as it is): described, never
    /// marked or tidied.
    Cubecl(String),
    /// Nowhere: every run compiles (`PRUNEMEM_KERNEL_CACHE=off`, or a
    /// build without a device backend).
    Off,
}

impl Place {
    /// The plan's `kernel_cache` setting: the folder, cubecl's setting,
    /// or `off`.
    pub fn setting(&self) -> String {
        match self {
            Place::Build(folder) => folder.display().to_string(),
            Place::Cubecl(what) => what.clone(),
            Place::Off => "off".into(),
        }
    }
}

/// The file that marks a folder as a prunemem build's compiled kernels;
/// written (so its modification time refreshed) by every run that uses it.
pub const MARKER: &str = ".prunemem-build";

/// How many builds' folders are kept, this run's included, when
/// `PRUNEMEM_KERNEL_CACHE_KEEP` is not set.
pub const DEFAULT_KEEP: usize = 4;

/// An older build's folder that a run removed (the plan's
/// `kernel_cache_removed` entries).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Removed {
    /// The folder's name (`VERSION-HASH`).
    pub build: String,
    /// The bytes its files held.
    pub bytes: u64,
}

/// What a device run did to the kernel cache before its first launch.
#[derive(Debug, Default)]
pub struct Prepared {
    /// Older builds' folders removed, least recently used first.
    pub removed: Vec<Removed>,
    /// Why the folder could not be marked or the root tidied (a line).
    pub warning: Option<String>,
}

/// Marks `folder` (this build's, under the cache's root) as used and
/// removes the root's least recently used builds past the kept count.
pub fn prepare(folder: &Path) -> Prepared {
    let (Some(root), Some(current)) = (folder.parent(), folder.file_name()) else {
        return Prepared::default();
    };
    if let Err(e) = mark(folder) {
        return Prepared {
            removed: Vec::new(),
            warning: Some(format!(
                "cannot mark the kernel cache {} as used ({e}); no older build's kernels removed",
                folder.display()
            )),
        };
    }
    match keep_from_env() {
        Ok(Some(keep)) => Prepared {
            removed: tidy(root, &current.to_string_lossy(), keep),
            warning: None,
        },
        Ok(None) => Prepared::default(),
        Err(e) => Prepared {
            removed: Vec::new(),
            warning: Some(format!("{e}; no older build's kernels removed")),
        },
    }
}

/// `PRUNEMEM_KERNEL_CACHE_KEEP` names neither a count nor `all`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("PRUNEMEM_KERNEL_CACHE_KEEP={0:?}: expected a number of builds (1 or more) or `all`")]
pub struct BadKeep(pub String);

/// `PRUNEMEM_KERNEL_CACHE_KEEP`: `Ok(Some(n))` keeps `n` builds (at least
/// one, this run's), `Ok(None)` keeps every build (`all`); anything else is
/// an error naming the value, and nothing is removed.
pub fn keep_from_env() -> Result<Option<usize>, BadKeep> {
    match std::env::var("PRUNEMEM_KERNEL_CACHE_KEEP") {
        Err(_) => Ok(Some(DEFAULT_KEEP)),
        Ok(v) => parse_keep(&v),
    }
}

fn parse_keep(v: &str) -> Result<Option<usize>, BadKeep> {
    match v.trim() {
        "all" => Ok(None),
        n => match n.parse::<usize>() {
            Ok(n) if n >= 1 => Ok(Some(n)),
            _ => Err(BadKeep(v.to_string())),
        },
    }
}

/// Marks `folder` (this build's, created if missing) as used now.
pub fn mark(folder: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(folder)?;
    let name = folder.file_name().map(|n| n.to_string_lossy().into_owned());
    std::fs::write(folder.join(MARKER), name.unwrap_or_default() + "\n")
}

/// Removes the marked build folders under `root`, other than `current`,
/// past the `keep - 1` most recently used; returns what it removed, least
/// recently used first. A folder that cannot be read or removed is left.
pub fn tidy(root: &Path, current: &str, keep: usize) -> Vec<Removed> {
    let mut builds = marked_builds(root, current);
    // Most recently used first; the same time, by name (a stable order).
    builds.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let mut removed = Vec::new();
    for (path, _) in builds.into_iter().skip(keep.saturating_sub(1)).rev() {
        let bytes = tree_bytes(&path);
        if std::fs::remove_dir_all(&path).is_ok() {
            let build = path.file_name().map(|n| n.to_string_lossy().into_owned());
            removed.push(Removed {
                build: build.unwrap_or_default(),
                bytes,
            });
        }
    }
    removed
}

/// The folders directly under `root` (not links) that carry the marker as
/// a plain file, but `current`, with the marker's modification time.
fn marked_builds(root: &Path, current: &str) -> Vec<(PathBuf, SystemTime)> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_name() != current)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            let marker = std::fs::symlink_metadata(e.path().join(MARKER)).ok()?;
            let used = marker.modified().ok()?;
            marker.is_file().then(|| (e.path(), used))
        })
        .collect()
}

/// The bytes of the plain files under `dir`, links not followed.
fn tree_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => tree_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A build folder with a file of `bytes` bytes, marked as used `age`
    /// seconds ago.
    fn build(root: &Path, name: &str, bytes: usize, age: u64) -> PathBuf {
        let dir = root.join(name);
        std::fs::create_dir_all(dir.join("vulkan")).unwrap();
        std::fs::write(dir.join("vulkan").join("k.bin"), vec![1u8; bytes]).unwrap();
        mark(&dir).unwrap();
        let when = SystemTime::now() - Duration::from_secs(age);
        let f = std::fs::File::options()
            .write(true)
            .open(dir.join(MARKER))
            .unwrap();
        f.set_modified(when).unwrap();
        dir
    }

    #[test]
    fn the_least_recently_used_builds_go_and_nothing_unmarked_does() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        build(r, "0.1.0-current", 10, 0);
        build(r, "0.1.0-aaaa", 100, 50);
        build(r, "0.1.0-bbbb", 200, 10);
        build(r, "0.1.0-cccc", 300, 30);
        build(r, "0.1.0-dddd", 400, 40);
        // A user's folder and an older build's without the marker.
        std::fs::create_dir_all(r.join("notes")).unwrap();
        std::fs::write(r.join("notes").join("keep.txt"), "mine").unwrap();
        std::fs::create_dir_all(r.join("0.1.0-0000").join("vulkan")).unwrap();
        // A link to a marked folder elsewhere is not followed.
        let elsewhere = tempfile::tempdir().unwrap();
        let outside = build(elsewhere.path(), "0.1.0-eeee", 5, 1000);
        std::os::unix::fs::symlink(&outside, r.join("0.1.0-link")).unwrap();

        let removed = tidy(r, "0.1.0-current", 3);
        // Kept: this run's and the two most recent others (bbbb, cccc).
        assert_eq!(
            removed,
            vec![
                Removed {
                    build: "0.1.0-aaaa".into(),
                    bytes: 100 + "0.1.0-aaaa\n".len() as u64
                },
                Removed {
                    build: "0.1.0-dddd".into(),
                    bytes: 400 + "0.1.0-dddd\n".len() as u64
                },
            ]
        );
        for kept in [
            "0.1.0-current",
            "0.1.0-bbbb",
            "0.1.0-cccc",
            "notes",
            "0.1.0-0000",
            "0.1.0-link",
        ] {
            assert!(r.join(kept).exists(), "{kept}");
        }
        assert!(outside.join(MARKER).exists());
        // Run again: nothing more to remove.
        assert!(tidy(r, "0.1.0-current", 3).is_empty());
        // Keeping one build removes every other marked one.
        assert_eq!(tidy(r, "0.1.0-current", 1).len(), 2);
        assert!(r.join("0.1.0-current").exists() && r.join("notes").exists());
    }

    #[test]
    fn a_missing_root_removes_nothing() {
        let root = tempfile::tempdir().unwrap();
        assert!(tidy(&root.path().join("absent"), "x", 1).is_empty());
    }

    #[test]
    fn keep_is_a_count_of_builds_or_all() {
        assert_eq!(parse_keep("2"), Ok(Some(2)));
        assert_eq!(parse_keep(" all "), Ok(None));
        for bad in ["0", "-1", "two", ""] {
            let err = parse_keep(bad).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!("PRUNEMEM_KERNEL_CACHE_KEEP={bad:?}:")),
                "{err}"
            );
        }
    }
}
