//! Sparse checkpoints that are actually smaller: the compressed-tensors
//! layouts vLLM and llm-compressor load (`sparse-bitmask` for any sparsity,
//! `sparse-24-bitmask` for 2:4), written from and read back to a dense
//! Hugging Face folder.
//!
//! Every decoder linear weight `P.weight` (q, k, v, o, gate, up, down; the
//! sparsity targets) becomes, in compressed-tensors' names and dtypes:
//! - `sparse-bitmask`: `P.shape` (i64 `[2]`), `P.compressed` (the non-zero
//!   values in row-major order, the weight's dtype, `[nnz]`), `P.bitmask`
//!   (u8 `[rows, ⌈cols/8⌉]`, bit `j % 8` of byte `j / 8` set where column `j`
//!   is kept: numpy's `packbits(bitorder="little")`), `P.row_offsets` (i64
//!   `[rows]`, where each row's values start);
//! - `sparse-24-bitmask`: `P.shape` (i64 `[2, 1]`), `P.compressed`
//!   (`[rows, cols/2]`: two values of every group of four), `P.bitmask`.
//!
//! Everything else is copied as it is. `config.json` gets the
//! `quantization_config` section with `quant_method: compressed-tensors` and
//! its `sparsity_config` (format, `global_sparsity`, `sparsity_structure`,
//! targets `Linear`, ignore `lm_head`). Tensors are produced one at a time
//! from the mapped input while the file is written: memory holds one
//! weight, never the model.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, View};
use serde_json::{Value, json};

mod read;
pub use read::{declared_format, declared_sparsity, decompress, stored_width};

use std::collections::BTreeMap;

use super::ModelError;
use super::llama::LAYER_LINEARS;
use super::shard::{SINGLE_FILE, Shard, TensorEntry, copy_releasing};

/// The dense checkpoint the compressor reads: its folder, files and
/// tensors, and a way to let go of a tensor's pages once written
/// (`model::checkpoint::Checkpoint` is one). A trait, so that this module
/// never names the checkpoint, which opens compressed folders through it.
pub trait Dense {
    fn folder(&self) -> &Path;
    fn shards(&self) -> &[Shard];
    fn tensors(&self) -> &BTreeMap<String, TensorEntry>;
    /// A tensor's stored bytes.
    fn bytes(&self, name: &str) -> Result<&[u8], ModelError>;
    /// Drops a tensor's pages from the resident set.
    fn release(&self, name: &str);
    /// The tensors' bytes as stored.
    fn stored_bytes(&self) -> u64;
}

fn entry<'a>(ckpt: &'a dyn Dense, name: &str) -> Result<&'a TensorEntry, ModelError> {
    ckpt.tensors()
        .get(name)
        .ok_or_else(|| ModelError::MissingTensor {
            name: name.to_string(),
            dir: ckpt.folder().display().to_string(),
        })
}

/// The compressed-tensors version whose layout this writes (0.14.x are
/// the last releases with its sparse compressors; 0.15.0 has none).
pub const COMPRESSED_TENSORS_VERSION: &str = "0.14.0";

/// Which compressed-tensors sparse format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum SparseFormat {
    /// `sparse-bitmask`: any sparsity.
    Bitmask,
    /// `sparse-24-bitmask`: every group of four keeps at most two.
    TwoFour,
}

impl SparseFormat {
    pub fn name(self) -> &'static str {
        match self {
            SparseFormat::Bitmask => "sparse-bitmask",
            SparseFormat::TwoFour => "sparse-24-bitmask",
        }
    }

    fn structure(self) -> &'static str {
        match self {
            SparseFormat::Bitmask => "unstructured",
            SparseFormat::TwoFour => "2:4",
        }
    }

    fn from_name(s: &str) -> Option<Self> {
        match s {
            "sparse-bitmask" => Some(SparseFormat::Bitmask),
            "sparse-24-bitmask" => Some(SparseFormat::TwoFour),
            _ => None,
        }
    }
}

/// What a compression or decompression wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CompressReport {
    pub format: SparseFormat,
    /// Weights stored compressed.
    pub compressed_tensors: usize,
    /// Zeros over the compressed weights.
    pub global_sparsity: f64,
    /// Tensor bytes of the input and of the output.
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub out: PathBuf,
}

/// Whether `name` is a sparsity target (a decoder linear's weight).
fn is_target(name: &str) -> bool {
    name.starts_with("model.layers.")
        && LAYER_LINEARS
            .iter()
            .any(|l| name.ends_with(&format!(".{l}.weight")))
}

/// Whether each stored value is non-zero (`-0.0` counts as zero, as `!= 0`).
fn nonzero(bytes: &[u8], dtype: Dtype) -> Vec<bool> {
    match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) & 0x7fff_ffff != 0)
            .collect(),
        Dtype::F16 | Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]) & 0x7fff != 0)
            .collect(),
        _ => bytes.iter().map(|b| *b != 0).collect(),
    }
}

/// 2:4's kept positions: the non-zeros of every group of four, topped up
/// with its first zeros to two. Errors when a group has more than two.
fn two_four_mask(nz: &[bool], name: &str) -> Result<Vec<bool>, ModelError> {
    let mut mask = vec![false; nz.len()];
    for (g, (group, out)) in nz.chunks(4).zip(mask.chunks_mut(4)).enumerate() {
        let kept = group.iter().filter(|k| **k).count();
        if kept > 2 {
            return Err(ModelError::Checkpoint(format!(
                "{name}: group {g} keeps {kept} of 4 weights; sparse-24-bitmask needs 2:4 sparsity (use sparse-bitmask)"
            )));
        }
        let mut fill = 2 - kept;
        for (o, k) in out.iter_mut().zip(group) {
            *o = *k
                || (fill > 0 && {
                    fill -= 1;
                    true
                });
        }
    }
    Ok(mask)
}

/// numpy `packbits(axis=-1, bitorder="little")` of a `[rows, cols]` mask.
fn pack_bits(mask: &[bool], cols: usize) -> Vec<u8> {
    let per_row = cols.div_ceil(8);
    let mut out = vec![0u8; mask.len() / cols.max(1) * per_row];
    for (row, packed) in mask.chunks(cols).zip(out.chunks_mut(per_row)) {
        for (j, k) in row.iter().enumerate() {
            if *k {
                packed[j / 8] |= 1 << (j % 8);
            }
        }
    }
    out
}

/// A tensor whose bytes are made when the writer asks for them.
struct Lazy<'a> {
    dtype: Dtype,
    shape: Vec<usize>,
    len: usize,
    make: Box<dyn Fn() -> Vec<u8> + 'a>,
}

impl View for &Lazy<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Owned((self.make)())
    }
    fn data_len(&self) -> usize {
        self.len
    }
}

/// A tensor copied as it is stored.
fn copied<'a>(shards: &'a [Shard], e: &TensorEntry) -> Lazy<'a> {
    let e2 = e.clone();
    Lazy {
        dtype: e.dtype,
        shape: e.shape.clone(),
        len: e.end - e.start,
        make: Box::new(move || copy_releasing(&shards[e2.shard].mmap, e2.start, e2.end)),
    }
}

fn i64_bytes(values: impl IntoIterator<Item = usize>) -> Vec<u8> {
    values
        .into_iter()
        .flat_map(|v| (v as i64).to_le_bytes())
        .collect()
}

/// The kept positions of a target weight, from its non-zeros `nz`.
fn kept_of(nz: Vec<bool>, name: &str, format: SparseFormat) -> Result<Vec<bool>, ModelError> {
    match format {
        SparseFormat::Bitmask => Ok(nz),
        SparseFormat::TwoFour => two_four_mask(&nz, name),
    }
}

/// The kept positions of a target weight.
fn kept_mask(ckpt: &dyn Dense, name: &str, format: SparseFormat) -> Result<Vec<bool>, ModelError> {
    let e = entry(ckpt, name)?;
    kept_of(nonzero(ckpt.bytes(name)?, e.dtype), name, format)
}

/// The values at `mask`'s positions, in their stored bytes.
fn gather(bytes: &[u8], mask: &[bool], width: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(mask.iter().filter(|k| **k).count() * width);
    for (v, k) in bytes.chunks_exact(width).zip(mask) {
        if *k {
            out.extend_from_slice(v);
        }
    }
    out
}

/// The compressed tensors replacing target `name` (one pass over it now to
/// size them; their bytes are made again when written).
fn compressed_views<'a>(
    ckpt: &'a dyn Dense,
    name: &str,
    e: &TensorEntry,
    format: SparseFormat,
) -> Result<(Vec<(String, Lazy<'a>)>, u64), ModelError> {
    let [rows, cols] = e.shape[..] else {
        return Err(ModelError::Checkpoint(format!("{name}: not a matrix")));
    };
    if format == SparseFormat::TwoFour && cols % 4 != 0 {
        return Err(ModelError::Checkpoint(format!(
            "{name}: {cols} columns are not groups of four"
        )));
    }
    let width = (e.dtype.bitsize() / 8).max(1);
    let nz = nonzero(ckpt.bytes(name)?, e.dtype);
    ckpt.release(name);
    let zeros = nz.iter().filter(|k| !**k).count() as u64;
    let kept = kept_of(nz, name, format)?.iter().filter(|k| **k).count();
    let prefix = name.trim_end_matches(".weight").to_string();
    let (dtype, owned) = (e.dtype, name.to_string());
    let shape_tensor = match format {
        SparseFormat::Bitmask => (vec![2], i64_bytes([rows, cols])),
        SparseFormat::TwoFour => (vec![2, 1], i64_bytes([rows, cols])),
    };
    let values_shape = match format {
        SparseFormat::Bitmask => vec![kept],
        SparseFormat::TwoFour => vec![rows, cols / 2],
    };
    let bits = {
        let n = owned.clone();
        move || {
            let m = kept_mask(ckpt, &n, format).unwrap_or_default();
            ckpt.release(&n);
            pack_bits(&m, cols)
        }
    };
    let values = {
        let n = owned.clone();
        move || {
            let m = kept_mask(ckpt, &n, format).unwrap_or_default();
            let out = gather(ckpt.bytes(&n).unwrap_or_default(), &m, width);
            ckpt.release(&n);
            out
        }
    };
    let mut views = vec![
        (
            format!("{prefix}.shape"),
            Lazy {
                dtype: Dtype::I64,
                shape: shape_tensor.0,
                len: 16,
                make: Box::new(move || shape_tensor.1.clone()),
            },
        ),
        (
            format!("{prefix}.compressed"),
            Lazy {
                dtype,
                shape: values_shape,
                len: kept * width,
                make: Box::new(values),
            },
        ),
        (
            format!("{prefix}.bitmask"),
            Lazy {
                dtype: Dtype::U8,
                shape: vec![rows, cols.div_ceil(8)],
                len: rows * cols.div_ceil(8),
                make: Box::new(bits),
            },
        ),
    ];
    if format == SparseFormat::Bitmask {
        let n = owned;
        views.push((
            format!("{prefix}.row_offsets"),
            Lazy {
                dtype: Dtype::I64,
                shape: vec![rows],
                len: rows * 8,
                make: Box::new(move || {
                    let m = kept_mask(ckpt, &n, format).unwrap_or_default();
                    ckpt.release(&n);
                    let mut at = 0;
                    i64_bytes(m.chunks(cols).map(|r| {
                        let start = at;
                        at += r.iter().filter(|k| **k).count();
                        start
                    }))
                }),
            },
        ));
    }
    Ok((views, zeros))
}

/// Writes `views` as `out_dir/model.safetensors`, one tensor's bytes made
/// at a time; returns the tensor bytes written.
fn write_views(views: &[(String, Lazy<'_>)], out_dir: &Path) -> Result<u64, ModelError> {
    let path = out_dir.join(SINGLE_FILE);
    let mut meta = std::collections::HashMap::new();
    meta.insert("format".to_string(), "pt".to_string());
    let refs: Vec<(String, &Lazy<'_>)> = views.iter().map(|(n, v)| (n.clone(), v)).collect();
    safetensors::serialize_to_file(refs, Some(meta), &path)
        .map_err(|e| ModelError::io(&path, format!("{e:?}")))?;
    Ok(views.iter().map(|(_, v)| v.len as u64).sum())
}

/// Writes `ckpt` compressed as `format` into `out_dir` (which must exist):
/// `model.safetensors` and `config.json` with the sparsity section; other
/// `.json`/`.txt` files are the caller's to copy.
pub fn compress(
    ckpt: &dyn Dense,
    out_dir: &Path,
    format: SparseFormat,
) -> Result<CompressReport, ModelError> {
    let mut views: Vec<(String, Lazy<'_>)> = Vec::new();
    let (mut zeros, mut total, mut targets) = (0u64, 0u64, 0usize);
    for (name, e) in ckpt.tensors() {
        if is_target(name) {
            let (v, z) = compressed_views(ckpt, name, e, format)?;
            zeros += z;
            total += e.shape.iter().product::<usize>() as u64;
            targets += 1;
            views.extend(v);
        } else {
            views.push((name.clone(), copied(ckpt.shards(), e)));
        }
    }
    let bytes_out = write_views(&views, out_dir)?;
    let global_sparsity = zeros as f64 / total.max(1) as f64;
    write_config(ckpt.folder(), out_dir, Some((format, global_sparsity)))?;
    Ok(CompressReport {
        format,
        compressed_tensors: targets,
        global_sparsity,
        bytes_in: ckpt.stored_bytes(),
        bytes_out,
        out: out_dir.to_path_buf(),
    })
}

/// `config.json` of `src` written to `out_dir`, with the sparsity section
/// set (`Some`) or removed (`None`).
fn write_config(
    src: &Path,
    out_dir: &Path,
    sparsity: Option<(SparseFormat, f64)>,
) -> Result<(), ModelError> {
    let path = src.join("config.json");
    let text = crate::input::read_string(&path, crate::input::JSON_LIMIT, "a config.json")?;
    let mut v: Value = serde_json::from_str(&text)
        .map_err(|e| ModelError::Checkpoint(format!("{}: {e}", path.display())))?;
    let Some(obj) = v.as_object_mut() else {
        return Err(ModelError::Checkpoint(format!(
            "{}: not a JSON object",
            path.display()
        )));
    };
    match sparsity {
        Some((format, global)) => {
            obj.insert(
                "quantization_config".into(),
                json!({
                    "quant_method": "compressed-tensors",
                    "version": COMPRESSED_TENSORS_VERSION,
                    "sparsity_config": {
                        "format": format.name(),
                        "global_sparsity": global,
                        "sparsity_structure": format.structure(),
                        "targets": ["Linear"],
                        "ignore": ["lm_head"],
                        "registry_requires_subclass": false,
                    },
                    "transform_config": {},
                }),
            );
        }
        None => {
            obj.remove("quantization_config");
        }
    }
    let out = out_dir.join("config.json");
    let text = serde_json::to_string_pretty(&v).unwrap_or_default();
    std::fs::write(&out, text).map_err(|e| ModelError::io(&out, e))
}

/// Copies `src`'s other `.json`/`.txt`/`tokenizer.model` files (not
/// `config.json`, not a shard index) into `out_dir`.
pub fn copy_side_files(src: &Path, out_dir: &Path) -> Result<(), ModelError> {
    let entries = std::fs::read_dir(src).map_err(|e| ModelError::io(src, e))?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let n = name.to_string_lossy();
        let wanted = (n.ends_with(".json") || n.ends_with(".txt") || n == "tokenizer.model")
            && n != "config.json"
            && n != super::shard::INDEX_FILE;
        if wanted && entry.path().is_file() {
            std::fs::copy(entry.path(), out_dir.join(&name))
                .map_err(|e| ModelError::io(&entry.path(), e))?;
        }
    }
    Ok(())
}

/// The format that fits `ckpt`'s targets: 2:4 when every group of four of
/// every target keeps at most two, else the bitmask.
pub fn fitting_format(ckpt: &dyn Dense) -> Result<SparseFormat, ModelError> {
    for (name, e) in ckpt.tensors() {
        if !is_target(name) {
            continue;
        }
        let cols = e.shape.last().copied().unwrap_or(0);
        let nz = nonzero(ckpt.bytes(name)?, e.dtype);
        ckpt.release(name);
        let fits = cols % 4 == 0 && nz.chunks(4).all(|g| g.iter().filter(|k| **k).count() <= 2);
        if !fits {
            return Ok(SparseFormat::Bitmask);
        }
    }
    Ok(SparseFormat::TwoFour)
}

/// Writes `out` under a temporary name, moved into place once complete;
/// an existing `out` only where prunemem wrote it or `overwrite` says so,
/// and then only its own files are replaced (`model::owned`).
fn write_folder(
    out: &Path,
    overwrite: bool,
    write: impl FnOnce(&Path) -> Result<CompressReport, ModelError>,
) -> Result<CompressReport, ModelError> {
    super::owned::check_destination(out, overwrite)?;
    let _lock = super::lock::DestLock::acquire(out)?;
    let tmp = super::convert::tmp_sibling(out);
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| ModelError::io(&tmp, e))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| ModelError::io(&tmp, e))?;
    let guard = crate::scratch::Guard::new(tmp.clone());
    let mut report = write(&tmp)?;
    super::owned::install(&tmp, out, overwrite)?;
    guard.keep();
    report.out = out.to_path_buf();
    Ok(report)
}

/// `convert --model DIR --to compressed|sparse-*`: the folder `model`,
/// opened as `ckpt` (a compressed one decompressed first), written
/// compressed to `out`; `format` `None` picks the one that fits
/// ([`fitting_format`]).
pub fn rewrite_compressed(
    ckpt: &dyn Dense,
    model: &Path,
    out: &Path,
    format: Option<SparseFormat>,
    overwrite: bool,
) -> Result<CompressReport, ModelError> {
    let format = match format {
        Some(f) => f,
        None => fitting_format(ckpt)?,
    };
    write_folder(out, overwrite, |dir| {
        copy_side_files(model, dir)?;
        let mut r = compress(ckpt, dir, format)?;
        // The config comes from the model's folder, not a scratch copy.
        write_config(model, dir, Some((format, r.global_sparsity)))?;
        r.bytes_in = ckpt.stored_bytes();
        Ok(r)
    })
}

/// `convert --model DIR --to dense`: a compressed folder written dense.
pub fn rewrite_dense(
    model: &Path,
    out: &Path,
    overwrite: bool,
) -> Result<CompressReport, ModelError> {
    write_folder(out, overwrite, |dir| {
        copy_side_files(model, dir)?;
        decompress(model, dir)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_pack_little_endian_like_numpy() {
        // numpy.packbits([1,0,0,0,0,0,0,0, 0,1], bitorder="little") == [1, 2]
        let m = [
            true, false, false, false, false, false, false, false, false, true,
        ];
        assert_eq!(pack_bits(&m, 10), vec![1, 2]);
    }

    #[test]
    fn two_four_tops_up_with_zeros_and_refuses_three() {
        let m = two_four_mask(&[false, true, false, false], "w").unwrap();
        assert_eq!(m, vec![true, true, false, false]);
        assert!(two_four_mask(&[true, true, true, false], "w").is_err());
    }

    #[test]
    fn negative_zero_is_zero() {
        let b: Vec<u8> = [0.0f32, -0.0, 1.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(nonzero(&b, Dtype::F32), vec![false, false, true]);
    }
}
