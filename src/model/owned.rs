//! Folders prunemem writes a model into (`prune --save`, `convert --out`)
//! and what it may replace there: only what it wrote itself.
//!
//! A model folder prunemem writes carries a marker, [`MARKER`], listing the
//! entries it put there. A destination that exists is replaced only when it
//! holds that marker (and then only the entries the marker lists), or when
//! the user says `--overwrite` (and then only the files of the same name as
//! the new model's); anything else in the folder — a project's `src/`, a
//! `README.md`, a `checkpoint-500/` — is never deleted. A destination that
//! is not ours and not overwritten is refused before any work, in one line,
//! with nothing touched.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::ModelError;

/// The marker file in every model folder prunemem writes.
pub const MARKER: &str = ".prunemem-owned.json";

/// Why a destination is refused.
fn refused(out: &Path, why: &str) -> ModelError {
    ModelError::Refused(format!(
        "{}: {why}; nothing was touched (choose another folder{})",
        out.display(),
        if why.contains("not a folder") {
            ""
        } else {
            ", or pass --overwrite to write the model's files into it: files prunemem did not write are never deleted"
        }
    ))
}

/// The entries the marker in `dir` lists (`None`: no marker, or one that
/// cannot be read).
fn marked(dir: &Path) -> Option<BTreeSet<String>> {
    let text = std::fs::read_to_string(dir.join(MARKER)).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let files = v.get("entries")?.as_array()?;
    Some(
        files
            .iter()
            .filter_map(|f| f.as_str())
            .map(str::to_string)
            .collect(),
    )
}

/// Whether a model may be written at `out`: it is absent, an empty folder,
/// a folder prunemem wrote, or `overwrite` says so. Checked before any work.
pub fn check_destination(out: &Path, overwrite: bool) -> Result<(), ModelError> {
    let meta = match std::fs::symlink_metadata(out) {
        Err(_) => return Ok(()),
        Ok(m) => m,
    };
    if !meta.is_dir() {
        return Err(refused(out, "exists and is not a folder"));
    }
    let empty = std::fs::read_dir(out)
        .map(|mut d| d.next().is_none())
        .unwrap_or(false);
    if empty || overwrite || marked(out).is_some() {
        return Ok(());
    }
    Err(refused(out, "exists and was not written by prunemem"))
}

/// Names of `dir`'s entries.
fn entries(dir: &Path) -> Result<Vec<String>, ModelError> {
    let mut names = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|e| ModelError::io(dir, e))? {
        let e = e.map_err(|e| ModelError::io(dir, e))?;
        names.push(e.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok(names)
}

fn write_marker(dir: &Path, names: &[String]) -> Result<(), ModelError> {
    let path = dir.join(MARKER);
    let text = serde_json::json!({
        "written_by": format!("prunemem {}", env!("CARGO_PKG_VERSION")),
        "entries": names,
    });
    std::fs::write(&path, text.to_string()).map_err(|e| ModelError::io(&path, e))
}

fn remove(path: &Path) -> Result<(), ModelError> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| ModelError::io(path, e))?;
    let r = match meta.is_dir() {
        true => std::fs::remove_dir_all(path),
        false => std::fs::remove_file(path),
    };
    r.map_err(|e| ModelError::io(path, e))
}

/// Moves the finished folder `tmp` to `out`. An absent `out` is a rename;
/// an existing one keeps every entry prunemem did not write: the entries
/// its old marker lists are replaced, and with `overwrite` the files of
/// the same name as the new ones. Everything is checked before anything is
/// removed.
pub fn install(tmp: &Path, out: &Path, overwrite: bool) -> Result<PathBuf, ModelError> {
    let new: Vec<String> = entries(tmp)?.into_iter().filter(|n| n != MARKER).collect();
    if std::fs::symlink_metadata(out).is_err() {
        write_marker(tmp, &new)?;
        std::fs::rename(tmp, out).map_err(|e| ModelError::io(out, e))?;
        return Ok(out.to_path_buf());
    }
    check_destination(out, overwrite)?;
    let ours = marked(out).unwrap_or_default();
    for name in &new {
        let dest = out.join(name);
        let Ok(meta) = std::fs::symlink_metadata(&dest) else {
            continue;
        };
        let replaceable = ours.contains(name) || (overwrite && meta.is_file());
        if !replaceable {
            return Err(refused(
                out,
                &format!("holds {name}, which prunemem did not write"),
            ));
        }
    }
    // The old model's entries that the new one does not have (older
    // shards) were ours too.
    for name in ours.iter().filter(|n| !new.contains(n)) {
        let old = out.join(name);
        if std::fs::symlink_metadata(&old).is_ok() {
            remove(&old)?;
        }
    }
    for name in &new {
        let dest = out.join(name);
        if std::fs::symlink_metadata(&dest).is_ok() {
            remove(&dest)?;
        }
        let from = tmp.join(name);
        std::fs::rename(&from, &dest).map_err(|e| ModelError::io(&dest, e))?;
    }
    write_marker(out, &new)?;
    std::fs::remove_dir_all(tmp).map_err(|e| ModelError::io(tmp, e))?;
    Ok(out.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model_in(dir: &Path, files: &[&str]) {
        std::fs::create_dir_all(dir).unwrap();
        for f in files {
            std::fs::write(dir.join(f), f).unwrap();
        }
    }

    #[test]
    fn a_folder_prunemem_did_not_write_is_refused_and_untouched() {
        let t = tempfile::tempdir().unwrap();
        let project = t.path().join("project");
        model_in(&project, &["config.json", "data.csv"]);
        std::fs::create_dir_all(project.join("src")).unwrap();
        let e = check_destination(&project, false).unwrap_err().to_string();
        assert!(
            e.contains("not written by prunemem") && e.contains("--overwrite"),
            "{e}"
        );
        let tmp = t.path().join("project.partial");
        model_in(&tmp, &["config.json", "model.safetensors"]);
        assert!(install(&tmp, &project, false).is_err());
        assert_eq!(
            std::fs::read_to_string(project.join("config.json")).unwrap(),
            "config.json"
        );
        assert!(project.join("data.csv").exists() && project.join("src").is_dir());
        // A file in the way is refused even with --overwrite.
        let file = t.path().join("file");
        std::fs::write(&file, "x").unwrap();
        assert!(check_destination(&file, true).is_err());
    }

    #[test]
    fn overwrite_replaces_same_named_files_and_keeps_the_rest() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("out");
        model_in(&out, &["config.json", "README.md"]);
        std::fs::create_dir_all(out.join("checkpoint-500")).unwrap();
        let tmp = t.path().join("out.partial");
        model_in(&tmp, &["config.json", "model.safetensors"]);
        install(&tmp, &out, true).unwrap();
        assert!(out.join("README.md").exists() && out.join("checkpoint-500").is_dir());
        assert!(out.join("model.safetensors").exists() && !tmp.exists());
        assert_eq!(marked(&out).unwrap().len(), 2);
    }

    #[test]
    fn a_folder_prunemem_wrote_is_replaced_entry_by_entry() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("out");
        let first = t.path().join("a.partial");
        model_in(&first, &["config.json", "model-00001-of-00002.safetensors"]);
        install(&first, &out, false).unwrap();
        // The user adds a note beside the model.
        std::fs::write(out.join("NOTES.md"), "mine").unwrap();
        let second = t.path().join("b.partial");
        model_in(&second, &["config.json", "model.safetensors"]);
        install(&second, &out, false).unwrap();
        assert!(!out.join("model-00001-of-00002.safetensors").exists());
        assert!(out.join("model.safetensors").exists());
        assert_eq!(
            std::fs::read_to_string(out.join("NOTES.md")).unwrap(),
            "mine"
        );
    }
}
