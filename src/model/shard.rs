//! One safetensors file of a checkpoint: memory-mapped, its header checked
//! against its size, its tensors' byte ranges listed; and the sharded
//! index that names the files. Kept apart from the checkpoint (which uses it) so the
//! file-level checks (truncation, bad offsets, hostile shard names) read on
//! their own; nothing here decodes a tensor.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use super::ModelError;

/// The sharded index's file name.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// A single-file checkpoint's weights.
pub const SINGLE_FILE: &str = "model.safetensors";

/// One memory-mapped safetensors file.
pub struct Shard {
    pub path: PathBuf,
    pub mmap: Arc<Mmap>,
    /// Length of the JSON header (which starts at byte 8).
    pub header_len: usize,
}

/// Copies `start..end` of a mapping to the heap 8 MiB at a time, releasing
/// each piece once copied: reading a 500 MiB embedding never holds it twice.
pub fn copy_releasing(mmap: &Mmap, start: usize, end: usize) -> Vec<u8> {
    const CHUNK: usize = 8 << 20;
    let mut out = Vec::with_capacity(end - start);
    let mut a = start;
    while a < end {
        let b = (a + CHUNK).min(end);
        out.extend_from_slice(&mmap[a..b]);
        release_range(mmap, a, b);
        a = b;
    }
    out
}

/// Drops `start..end` of a mapping from this process's resident set. The
/// pages stay in the OS page cache; reading them again maps them back. Used
/// after a tensor is copied out, so a layer-by-layer run's RSS holds one
/// layer, not every layer it has read.
pub fn release_range(mmap: &Mmap, start: usize, end: usize) {
    if end > start {
        // SAFETY: the mapping is read-only and file-backed, so DONTNEED only
        // discards page-table entries; the data is re-read on next access.
        let _ = unsafe {
            mmap.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
        };
    }
}

/// Where one tensor lives.
#[derive(Debug, Clone)]
pub struct TensorEntry {
    pub shard: usize,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Absolute byte range in the shard file.
    pub start: usize,
    pub end: usize,
}

pub(crate) fn read_index(
    index: &Path,
) -> Result<(Vec<String>, HashMap<String, String>), ModelError> {
    let text = std::fs::read_to_string(index).map_err(|e| ModelError::io(index, e))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| ModelError::Checkpoint(format!("{}: not valid JSON: {e}", index.display())))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| {
            ModelError::Checkpoint(format!("{}: no 'weight_map' object", index.display()))
        })?;
    let mut weight_map = HashMap::new();
    let mut files: Vec<String> = Vec::new();
    for (name, file) in map {
        let file = file.as_str().ok_or_else(|| {
            ModelError::Checkpoint(format!(
                "{}: weight_map['{name}'] is not a file name",
                index.display()
            ))
        })?;
        if file.contains('/') || file.contains("..") {
            return Err(ModelError::Checkpoint(format!(
                "{}: shard name '{file}' is not a plain file name",
                index.display()
            )));
        }
        if !files.iter().any(|f| f == file) {
            files.push(file.to_string());
        }
        weight_map.insert(name.clone(), file.to_string());
    }
    files.sort();
    Ok((files, weight_map))
}

/// Maps a safetensors file and validates its header against its size.
pub fn map_shard(
    path: &Path,
    index: usize,
) -> Result<(Shard, Vec<(String, TensorEntry)>), ModelError> {
    let file = std::fs::File::open(path).map_err(|e| ModelError::io(path, e))?;
    // SAFETY: the mapping is read-only; prunemem never writes its inputs. A
    // file truncated by another process while mapped would fault, as it would
    // for any mmap reader (transformers and candle included).
    let mmap = unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))?;
    let invalid = |reason: String| ModelError::Safetensors {
        path: path.display().to_string(),
        reason,
    };
    let (header_len, metadata) =
        SafeTensors::read_metadata(&mmap).map_err(|e| invalid(describe(e)))?;
    let base = 8 + header_len;
    let mut entries = Vec::new();
    for (name, info) in metadata.tensors() {
        let (s, e) = info.data_offsets;
        entries.push((
            name,
            TensorEntry {
                shard: index,
                dtype: info.dtype,
                shape: info.shape.clone(),
                start: base + s,
                end: base + e,
            },
        ));
    }
    Ok((
        Shard {
            path: path.to_path_buf(),
            mmap: Arc::new(mmap),
            header_len,
        },
        entries,
    ))
}

fn describe(e: safetensors::SafeTensorError) -> String {
    use safetensors::SafeTensorError as E;
    match e {
        E::MetadataIncompleteBuffer => {
            "the header's offsets do not match the file size (truncated or corrupt)".into()
        }
        E::InvalidOffset(name) => {
            format!("the header gives tensor '{name}' offsets that do not fit")
        }
        E::TensorInvalidInfo => {
            "the header gives a tensor whose shape and dtype do not match its byte size".into()
        }
        E::InvalidHeaderLength | E::HeaderTooSmall => {
            "the file is too short for its header (truncated)".into()
        }
        E::HeaderTooLarge => "the header length is implausibly large".into(),
        other => format!("{other:?}"),
    }
}
