//! Models named by their Hugging Face Hub id (`HuggingFaceTB/SmolLM2-135M`).
//!
//! [`resolve`] turns `--model` into a local folder: an existing folder is used
//! as is; a Hub id is looked up first in the Hugging Face cache that
//! transformers fills (`$HF_HUB_CACHE`, `$HF_HOME/hub`,
//! `~/.cache/huggingface/hub`), then in prunemem's own cache, and otherwise
//! downloaded there: `config.json`, the tokenizer files, and
//! `model.safetensors` or the index and every shard it names. `HF_TOKEN`
//! authenticates gated models, `HF_ENDPOINT` selects a mirror, and
//! `HF_HUB_OFFLINE=1` forbids downloads. Files are written under a temporary
//! name and renamed when complete, so an interrupted download is never
//! mistaken for a finished one.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::ModelError;
use super::checkpoint::{INDEX_FILE, SINGLE_FILE};

/// True for strings shaped like a Hub repository id.
pub fn looks_like_repo_id(s: &str) -> bool {
    let mut parts = s.split('/');
    let (Some(org), Some(name), None) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let ok = |p: &str| {
        !p.is_empty()
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    };
    ok(org) && ok(name) && !org.starts_with('.') && !name.starts_with('.')
}

fn env_path(key: &str) -> Option<PathBuf> {
    std::env::var_os(key)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// Where transformers caches Hub downloads.
pub fn hf_cache_dir() -> Option<PathBuf> {
    env_path("HF_HUB_CACHE")
        .or_else(|| env_path("HF_HOME").map(|h| h.join("hub")))
        .or_else(|| env_path("XDG_CACHE_HOME").map(|c| c.join("huggingface/hub")))
        .or_else(|| env_path("HOME").map(|h| h.join(".cache/huggingface/hub")))
}

/// Where prunemem downloads models.
pub fn prunemem_cache_dir() -> Option<PathBuf> {
    env_path("PRUNEMEM_CACHE")
        .or_else(|| env_path("XDG_CACHE_HOME").map(|c| c.join("prunemem")))
        .or_else(|| env_path("HOME").map(|h| h.join(".cache/prunemem")))
}

fn complete(dir: &Path) -> bool {
    dir.join("config.json").is_file()
        && (dir.join(SINGLE_FILE).is_file() || dir.join(INDEX_FILE).is_file())
}

/// A snapshot of `repo` at `revision` in a transformers cache, if complete.
pub fn find_in_hf_cache(cache: &Path, repo: &str, revision: &str) -> Option<PathBuf> {
    let root = cache.join(format!("models--{}", repo.replace('/', "--")));
    let commit = std::fs::read_to_string(root.join("refs").join(revision))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| revision.to_string());
    let dir = root.join("snapshots").join(commit);
    complete(&dir).then_some(dir)
}

/// A revision is a branch, a tag, a commit or `refs/pr/N`: components of
/// letters, digits and `-_.`, none of them `.` or `..`, so that joined to a
/// cache folder it cannot leave it.
pub fn safe_revision(revision: &str) -> bool {
    !revision.is_empty()
        && revision.len() <= 256
        && revision.split('/').all(|part| {
            !part.is_empty()
                && part != "."
                && part != ".."
                && part
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        })
}

/// `--model` as a local folder, downloading from the Hub when needed.
pub fn resolve(model: &str, revision: &str) -> Result<PathBuf, ModelError> {
    let local = PathBuf::from(model);
    if local.exists() || !looks_like_repo_id(model) {
        return Ok(local);
    }
    if !safe_revision(revision) {
        return Err(ModelError::Checkpoint(format!(
            "--revision '{}' is not a branch, tag or commit name (letters, digits, '-', '_', '.', parts joined by '/')",
            crate::input::escape(revision)
        )));
    }
    if let Some(dir) = hf_cache_dir().and_then(|c| find_in_hf_cache(&c, model, revision)) {
        return Ok(dir);
    }
    let cache = prunemem_cache_dir().ok_or_else(|| {
        ModelError::Checkpoint("cannot find a cache folder: set PRUNEMEM_CACHE".into())
    })?;
    let dir = cache.join("hub").join(model).join(revision);
    if complete(&dir) {
        return Ok(dir);
    }
    if std::env::var("HF_HUB_OFFLINE").as_deref() == Ok("1") {
        return Err(ModelError::Checkpoint(format!(
            "{model} is not in the Hugging Face cache and HF_HUB_OFFLINE=1 forbids downloading it"
        )));
    }
    download(model, revision, &dir)?;
    Ok(dir)
}

fn endpoint() -> String {
    std::env::var("HF_ENDPOINT")
        .ok()
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| "https://huggingface.co".into())
        .trim_end_matches('/')
        .to_string()
}

/// Fetches one file of `repo` into `dir`; `Ok(false)` when the Hub has no
/// such file (404).
fn fetch(repo: &str, revision: &str, file: &str, dir: &Path) -> Result<bool, ModelError> {
    let url = format!("{}/{repo}/resolve/{revision}/{file}", endpoint());
    let mut req = ureq::get(&url).set(
        "user-agent",
        concat!("prunemem/", env!("CARGO_PKG_VERSION")),
    );
    if let Ok(token) = std::env::var("HF_TOKEN") {
        req = req.set("authorization", &format!("Bearer {token}"));
    }
    let resp = match req.call() {
        Ok(r) => r,
        Err(ureq::Error::Status(404, _)) => return Ok(false),
        Err(ureq::Error::Status(code @ (401 | 403), _)) => {
            return Err(ModelError::Checkpoint(format!(
                "{url}: HTTP {code}; the model may be gated: accept its licence on the Hub and set HF_TOKEN"
            )));
        }
        Err(e) => return Err(ModelError::Checkpoint(format!("{url}: {e}"))),
    };
    let target = dir.join(file);
    let partial = dir.join(format!("{file}.partial"));
    let mut out = std::fs::File::create(&partial).map_err(|e| ModelError::io(&partial, e))?;
    let mut reader = resp.into_reader();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = reader
            .read(&mut buf)
            .map_err(|e| ModelError::io(&target, e))?;
        if n == 0 {
            break;
        }
        std::io::Write::write_all(&mut out, &buf[..n]).map_err(|e| ModelError::io(&partial, e))?;
    }
    std::fs::rename(&partial, &target).map_err(|e| ModelError::io(&target, e))?;
    Ok(true)
}

fn download(repo: &str, revision: &str, dir: &Path) -> Result<(), ModelError> {
    std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    eprintln!(
        "prunemem: downloading {repo} ({revision}) from {} into {}",
        endpoint(),
        dir.display()
    );
    if !fetch(repo, revision, "config.json", dir)? {
        return Err(ModelError::Checkpoint(format!(
            "{repo} has no config.json on the Hub"
        )));
    }
    for optional in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "special_tokens_map.json",
    ] {
        fetch(repo, revision, optional, dir)?;
    }
    if fetch(repo, revision, INDEX_FILE, dir)? {
        let text =
            std::fs::read_to_string(dir.join(INDEX_FILE)).map_err(|e| ModelError::io(dir, e))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| ModelError::Checkpoint(format!("{INDEX_FILE}: {e}")))?;
        let mut files: Vec<String> = json["weight_map"]
            .as_object()
            .map(|m| {
                m.values()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        files.sort();
        files.dedup();
        for f in files {
            if f.contains('/') || f.contains("..") {
                return Err(ModelError::Checkpoint(format!(
                    "{INDEX_FILE} names an unsafe file '{f}'"
                )));
            }
            if !fetch(repo, revision, &f, dir)? {
                return Err(ModelError::Checkpoint(format!(
                    "{repo}: the index names {f}, which the Hub does not have"
                )));
            }
        }
    } else if !fetch(repo, revision, SINGLE_FILE, dir)? {
        return Err(ModelError::Checkpoint(format!(
            "{repo} has neither {SINGLE_FILE} nor {INDEX_FILE} (only safetensors checkpoints are supported)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_ids() {
        assert!(looks_like_repo_id("HuggingFaceTB/SmolLM2-135M"));
        assert!(looks_like_repo_id("meta-llama/Llama-3.2-1B"));
        assert!(!looks_like_repo_id("models/smollm2-135m/extra"));
        assert!(!looks_like_repo_id("smollm2"));
        assert!(!looks_like_repo_id("./x/y"));
        assert!(!looks_like_repo_id("../x"));
    }

    #[test]
    fn revisions_cannot_leave_the_cache() {
        for ok in ["main", "v1.0", "refs/pr/12", "0123abcd"] {
            assert!(safe_revision(ok), "{ok}");
        }
        for bad in [
            "",
            "../../etc",
            "a/../b",
            "/abs",
            "a//b",
            ".",
            "x\x1b]0;t",
            "a b",
        ] {
            assert!(!safe_revision(bad), "{bad}");
        }
        let e = resolve("org/name", "../../outside")
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not a branch, tag or commit name"), "{e}");
    }

    #[test]
    fn finds_transformers_cache_snapshots() {
        let cache = tempfile::tempdir().unwrap();
        let root = cache.path().join("models--org--tiny");
        let snap = root.join("snapshots/abc123");
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::create_dir_all(root.join("refs")).unwrap();
        std::fs::write(root.join("refs/main"), "abc123\n").unwrap();
        assert_eq!(
            find_in_hf_cache(cache.path(), "org/tiny", "main"),
            None,
            "incomplete"
        );
        std::fs::write(snap.join("config.json"), "{}").unwrap();
        std::fs::write(snap.join("model.safetensors"), "").unwrap();
        assert_eq!(
            find_in_hf_cache(cache.path(), "org/tiny", "main"),
            Some(snap)
        );
    }
}
