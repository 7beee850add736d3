//! Reading compressed-tensors sparse folders: what their `config.json`
//! declares, and the dense model they hold, decompressed one weight at a
//! time (the writing side is the parent module).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::{CompressReport, Lazy, SparseFormat, copied, nonzero, write_config, write_views};
use crate::model::ModelError;
use crate::model::shard::{self, Shard, TensorEntry};
use crate::model::shard::{INDEX_FILE, SINGLE_FILE};

/// The sparse format a folder's `config.json` declares, if any.
pub fn declared_format(dir: &Path) -> Option<SparseFormat> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    let q = v.get("quantization_config")?;
    if q.get("quant_method")?.as_str()? != "compressed-tensors" {
        return None;
    }
    SparseFormat::from_name(q.get("sparsity_config")?.get("format")?.as_str()?)
}

/// The `global_sparsity` a compressed folder's `config.json` declares.
pub fn declared_sparsity(dir: &Path) -> Option<f64> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    v.get("quantization_config")?
        .get("sparsity_config")?
        .get("global_sparsity")?
        .as_f64()
}

/// Bytes per element of a folder's compressed values (its weights' dtype).
pub fn stored_width(dir: &Path) -> Option<u64> {
    let (tensors, _) = open_raw(dir).ok()?;
    let (_, e) = tensors.iter().find(|(n, _)| n.ends_with(".compressed"))?;
    Some((e.dtype.bitsize() / 8).max(1) as u64)
}

/// A compressed folder's tensors, mapped (no model config checks): one
/// `model.safetensors`, or the shards its index names (llm-compressor
/// writes those).
fn open_raw(dir: &Path) -> Result<(BTreeMap<String, TensorEntry>, Vec<Shard>), ModelError> {
    let index = dir.join(INDEX_FILE);
    let files = if index.is_file() {
        shard::read_index(&index)?.0
    } else if dir.join(SINGLE_FILE).is_file() {
        vec![SINGLE_FILE.to_string()]
    } else {
        return Err(ModelError::Checkpoint(format!(
            "{}: no {SINGLE_FILE} or {}",
            dir.display(),
            INDEX_FILE
        )));
    };
    let (mut tensors, mut shards) = (BTreeMap::new(), Vec::new());
    for (i, file) in files.iter().enumerate() {
        let (shard, entries) = shard::map_shard(&dir.join(file), i)?;
        tensors.extend(entries);
        shards.push(shard);
    }
    Ok((tensors, shards))
}

/// Writes the dense model of compressed folder `dir` into `out_dir` (which
/// must exist): `model.safetensors` and `config.json` without the sparsity
/// section, one weight decompressed at a time.
pub fn decompress(dir: &Path, out_dir: &Path) -> Result<CompressReport, ModelError> {
    let format = declared_format(dir).ok_or_else(|| {
        ModelError::Checkpoint(format!(
            "{}: config.json declares no compressed-tensors sparse format",
            dir.display()
        ))
    })?;
    let (tensors, shards) = open_raw(dir)?;
    let bytes_of = |e: &TensorEntry| &shards[e.shard].mmap[e.start..e.end];
    let mut views: Vec<(String, Lazy<'_>)> = Vec::new();
    let (mut zeros, mut total, mut count) = (0u64, 0u64, 0usize);
    for (name, e) in &tensors {
        let Some(prefix) = name.strip_suffix(".compressed") else {
            let known = [".shape", ".bitmask", ".row_offsets"];
            let part_of_compressed = known.iter().any(|s| {
                name.strip_suffix(s)
                    .is_some_and(|p| tensors.contains_key(&format!("{p}.compressed")))
            });
            if !part_of_compressed {
                views.push((name.clone(), copied(&shards, e)));
            }
            continue;
        };
        let part = |s: &str| {
            tensors.get(&format!("{prefix}.{s}")).ok_or_else(|| {
                ModelError::Checkpoint(format!("{}: {prefix}.{s} is missing", dir.display()))
            })
        };
        let (shape_e, bits_e) = (part("shape")?, part("bitmask")?);
        let dims: Vec<usize> = bytes_of(shape_e)
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap_or_default()) as usize)
            .collect();
        let [rows, cols] = dims[..] else {
            return Err(ModelError::Checkpoint(format!(
                "{prefix}.shape: expected two dimensions, found {dims:?}"
            )));
        };
        let width = (e.dtype.bitsize() / 8).max(1);
        let per_row = cols.div_ceil(8);
        let bits = bytes_of(bits_e);
        let kept = bits.iter().map(|b| b.count_ones() as usize).sum::<usize>();
        if bits.len() != rows * per_row || kept * width != e.end - e.start {
            return Err(ModelError::Checkpoint(format!(
                "{prefix}: bitmask and values disagree ({kept} kept, {} value bytes)",
                e.end - e.start
            )));
        }
        let values = bytes_of(e);
        zeros += nonzero(values, e.dtype).iter().filter(|k| !**k).count() as u64
            + (rows * cols - kept) as u64;
        total += (rows * cols) as u64;
        count += 1;
        let dtype = e.dtype;
        views.push((
            format!("{prefix}.weight"),
            Lazy {
                dtype,
                shape: vec![rows, cols],
                len: rows * cols * width,
                make: Box::new(move || {
                    let mut out = vec![0u8; rows * cols * width];
                    let mut at = 0;
                    for r in 0..rows {
                        for c in 0..cols {
                            if bits[r * per_row + c / 8] >> (c % 8) & 1 == 1 {
                                let dst = (r * cols + c) * width;
                                out[dst..dst + width].copy_from_slice(&values[at..at + width]);
                                at += width;
                            }
                        }
                    }
                    out
                }),
            },
        ));
    }
    let bytes_in: u64 = tensors.values().map(|e| (e.end - e.start) as u64).sum();
    let bytes_out = write_views(&views, out_dir)?;
    write_config(dir, out_dir, None)?;
    Ok(CompressReport {
        format,
        compressed_tensors: count,
        global_sparsity: zeros as f64 / total.max(1) as f64,
        bytes_in,
        bytes_out,
        out: out_dir.to_path_buf(),
    })
}
