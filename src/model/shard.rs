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

/// The piece of a mapping the chunked readers take at a time.
pub const READ_CHUNK: usize = 8 << 20;

/// Hands `start..end` of a mapping to `f` `chunk` bytes at a time (with
/// each piece's offset), and drops each piece's pages from the resident set
/// once `f` is done with it ([`release_range`]): a large tensor is never
/// mapped whole. Stops at `f`'s first error.
pub fn for_each_chunk_releasing<E>(
    mmap: &Mmap,
    start: usize,
    end: usize,
    chunk: usize,
    mut f: impl FnMut(usize, &[u8]) -> Result<(), E>,
) -> Result<(), E> {
    let mut a = start;
    while a < end {
        let b = (a + chunk.max(1)).min(end);
        f(a, &mmap[a..b])?;
        release_range(mmap, a, b);
        a = b;
    }
    Ok(())
}

/// Copies `start..end` of a mapping to the heap 8 MiB at a time, releasing
/// each piece once copied: reading a 500 MiB embedding never holds it twice.
pub fn copy_releasing(mmap: &Mmap, start: usize, end: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(end - start);
    let copied = for_each_chunk_releasing(mmap, start, end, READ_CHUNK, |_, piece| {
        out.extend_from_slice(piece);
        Ok::<(), std::convert::Infallible>(())
    });
    let Ok(()) = copied;
    out
}

/// How far around a faulting page Linux may map pages already in the page
/// cache: `fault_around_bytes` (64 KiB by default), or, since the page cache
/// keeps files in large folios (ext4 on Linux 6.18 here), the whole folio
/// the page lies in, up to a PMD (2 MiB on x86-64). One read of a 1 MiB
/// file written in one call mapped all of it (1024 kB resident, 892 kB of
/// it left by a 64 KiB window; `model::shard`'s unit test, 2026-11-25).
const FAULT_AROUND: usize = 2 << 20;

/// Drops `start..end` of a mapping from this process's resident set, with
/// the fault-around window on either side. The pages stay in the OS page
/// cache; reading them again maps them back. Used after a tensor is copied
/// out, so a layer-by-layer run's RSS holds one layer, not every layer it
/// has read.
///
/// The window matters: each read maps up to [`FAULT_AROUND`] of the
/// neighbouring tensors' pages (64 KiB of fault-around on small folios),
/// and a neighbour read and released earlier
/// stays mapped — on SmolLM2 about 290 KiB per layer of each checkpoint
/// read, 8.4 MiB of the source and as much of the pruned copy by the end of
/// a run (measured with `scripts/bench/rss_breakdown.py`). Releasing a
/// neighbour's pages costs at most a minor fault when it is read.
pub fn release_range(mmap: &Mmap, start: usize, end: usize) {
    let start = start.saturating_sub(FAULT_AROUND);
    let end = end.saturating_add(FAULT_AROUND).min(mmap.len());
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
    let text = crate::input::read_string(index, crate::input::JSON_LIMIT, "a safetensors index")?;
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
    let file = crate::input::open(path, u64::MAX, "a safetensors file")?;
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

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// Resident kB of the mapping that starts at `addr`, from /proc/self/smaps.
    fn resident_kb(addr: usize) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let head = format!("{addr:x}-");
        let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&head));
        lines.next().expect("the mapping is listed");
        let rss = lines.find(|l| l.starts_with("Rss:")).unwrap();
        rss.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    #[test]
    fn releasing_a_read_range_leaves_none_of_the_file_mapped() {
        // One page read in the middle of a file whose pages are all in the
        // page cache: the fault maps its neighbours too (fault-around, or
        // the whole large folio the page lies in).
        let path = std::env::temp_dir().join(format!("prunemem-shard-{}", std::process::id()));
        std::fs::write(&path, vec![7u8; 8 << 20]).unwrap();
        let mmap = unsafe { Mmap::map(&std::fs::File::open(&path).unwrap()) }.unwrap();
        let (a, b) = ((4 << 20) + (260 << 10), (4 << 20) + (264 << 10));
        let sum: u64 = mmap[a..b].iter().map(|&x| x as u64).sum();
        assert_eq!(sum, 7 * 4096);
        assert!(
            resident_kb(mmap.as_ptr() as usize) >= 4,
            "the read page is mapped"
        );
        release_range(&mmap, a, b);
        let left = resident_kb(mmap.as_ptr() as usize);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            left, 0,
            "{left} kB of the file stay mapped after the release"
        );
    }
}
