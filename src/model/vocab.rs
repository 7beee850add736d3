//! The vocabulary-sized tables (the embedding, the head's) of a streamed
//! run, which need not go to the device whole:
//! - the embedding is a lookup: each batch's rows are gathered from the
//!   checkpoint's mapping on the host ([`embed_windows`]) and only the
//!   hidden states go up, `tokens × hidden` values instead of the table
//!   (a Llama-3.2-1B shape's calibration uploaded its 525 MB table to embed
//!   67 MB of windows; an 8B shape's evaluation uploaded 1 GB of embedding
//!   beside its 1 GB head). The same bits as a lookup in the converted
//!   table: each value goes through the same conversion.
//! - the head multiplies by a whole table. On a device whose largest
//!   buffer is smaller than the table (lavapipe: 128 MiB, so SmolLM2's
//!   49 152 × 576 table in f32 at 108 MiB fits but a 49 152 × 768 one at
//!   144 MiB does not; real GPUs allow 2–4 GiB, which LLaMA-3-405B's
//!   128 256 × 16 384 table passes in f16) it goes up as row shards, each
//!   within the limit, and the logits of each shard are concatenated along
//!   the vocabulary: every logit is the same dot product as with one table.
//!   Where one buffer holds it, an evaluation reads and converts it on a
//!   host thread while the device runs the layers ([`LmHead::read_ahead`]).

use burn::nn::{Embedding, Linear};
use burn::prelude::*;
use burn::tensor::{DType, FloatDType};

use super::{Checkpoint, ComputeDtype, ModelError, dtype};
use crate::exec::Compute;

/// A table `[rows, hidden]` in the checkpoint's (PyTorch) orientation, as
/// row shards on the device.
#[derive(Debug, Clone)]
pub struct Shards<B: Backend> {
    /// Each shard and the first row it holds.
    parts: Vec<(usize, Tensor<B, 2>)>,
}

/// The head's table: the untied head, else the embedding (tied), whole
/// or in shards.
pub enum LmHead<B: Backend> {
    /// The CPU backend's untied head, as Burn's `Linear`.
    Whole(Box<Linear<B>>),
    /// The checkpoint's `[vocab, hidden]` rows as they are stored,
    /// multiplied transposed: a tied head, and on a device an untied one
    /// too. Loading an untied head
    /// as a Burn `Linear` transposed 1 GiB on one host core: 5 s of an 8B
    /// shape's evaluation on an H100's host (docs/gpu.md).
    Rows(Embedding<B>),
    Sharded(Shards<B>),
}

/// The largest buffer a table may take on `device`: the backend's binding
/// limit, lowered by `PRUNEMEM_MAX_BUFFER` (bytes) when set — to rehearse a
/// smaller card's limits on a larger one, and to test the sharded path.
pub fn max_buffer<B: Compute>(device: &B::Device) -> Option<u64> {
    let set = std::env::var("PRUNEMEM_MAX_BUFFER")
        .ok()
        .and_then(|v| crate::units::parse_size(&v).ok());
    match (B::max_buffer(device), set) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Rows per shard of a `hidden`-wide table within `limit` bytes; shards are
/// uploaded in f32 before any cast, so f32 rows are what must fit.
fn rows_per_shard(limit: u64, hidden: usize) -> usize {
    ((limit / (hidden as u64 * 4)) as usize).max(1)
}

/// Reads `name` (`[rows, hidden]`) into shards of at most `limit` bytes.
fn load_shards<B: Backend>(
    ckpt: &Checkpoint,
    name: &str,
    dtype: ComputeDtype,
    limit: u64,
    device: &B::Device,
) -> Result<Shards<B>, ModelError> {
    let e = ckpt.entry(name)?;
    let [rows, hidden] = match e.shape[..] {
        [r, h] => [r, h],
        _ => {
            return Err(ModelError::Checkpoint(format!(
                "tensor '{name}' is not a table (shape {:?})",
                e.shape
            )));
        }
    };
    let width = (e.dtype.bitsize() / 8).max(1);
    let bytes = ckpt.bytes(name)?;
    let step = rows_per_shard(limit, hidden);
    let _tag = crate::memory::tag::tag(crate::memory::tag::Category::Weights);
    let mut parts = Vec::new();
    for first in (0..rows).step_by(step) {
        let last = (first + step).min(rows);
        let raw = &bytes[first * hidden * width..last * hidden * width];
        if let Some(i) = dtype::first_non_finite(raw, e.dtype) {
            return Err(ModelError::Checkpoint(format!(
                "tensor '{name}' holds NaN or infinity (element {}); the checkpoint is damaged",
                first * hidden + i
            )));
        }
        let values = dtype::decode_f32(raw, e.dtype);
        let t = Tensor::<B, 2>::from_data(
            TensorData::new(values, [last - first, hidden]),
            (device, DType::F32),
        );
        let t = match dtype.burn() {
            DType::F32 => t,
            DType::BF16 => t.cast(FloatDType::BF16),
            _ => t.cast(FloatDType::F16),
        };
        parts.push((first, t));
    }
    ckpt.release(name);
    Ok(Shards { parts })
}

impl<B: Compute> Shards<B> {
    /// `h [n, hidden]` times the table's transpose: logits `[n, rows]`.
    pub fn logits(&self, h: Tensor<B, 2>) -> Tensor<B, 2> {
        let parts: Vec<Tensor<B, 2>> = self
            .parts
            .iter()
            .map(|(_, shard)| crate::exec::matmul::times_rows(h.clone(), shard.clone()))
            .collect();
        Tensor::cat(parts, 1)
    }

    /// Shards on the device.
    pub fn len(&self) -> usize {
        self.parts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }
}

/// The device's largest buffer when `ckpt`'s vocabulary table passes it
/// in `dtype` (the table must go up in shards), else `None`.
fn shard_limit<B: Compute>(
    ckpt: &Checkpoint,
    dtype: ComputeDtype,
    device: &B::Device,
) -> Option<u64> {
    let bytes = ckpt.config.vocab_table_params() * dtype.size();
    max_buffer::<B>(device).filter(|limit| bytes > *limit)
}

/// The table `name` converted on every core (`dtype::convert_parallel`),
/// on the host, ready to go up: the serial conversion the CPU backend keeps
/// (it holds less at once) took 2.45 s of a 1B-shape run's 3.8 s before its
/// first layer on an H100.
fn read_table(
    ckpt: &Checkpoint,
    name: &str,
    dtype: ComputeDtype,
) -> Result<TensorData, ModelError> {
    let _tag = crate::memory::tag::tag(crate::memory::tag::Category::Weights);
    let _io = crate::timing::work(crate::timing::Work::Io);
    ckpt.read_converted(name, dtype)
}

/// The hidden states of `windows` (all of one length) after the embedding,
/// `[windows, seqlen, hidden]` in `dtype`: each token's row read from the
/// checkpoint and converted on the host, then the batch uploaded (one
/// transfer of `tokens × hidden` values; no token ids, no table).
pub fn embed_windows<B: Compute>(
    ckpt: &Checkpoint,
    windows: &[Vec<u32>],
    dtype: ComputeDtype,
    device: &B::Device,
) -> Result<Tensor<B, 3>, ModelError> {
    let s = windows.first().map_or(0, Vec::len);
    let tokens: Vec<u32> = windows.iter().flatten().copied().collect();
    let data = {
        let _io = crate::timing::work(crate::timing::Work::Io);
        read_rows(ckpt, EMBEDDING, &tokens, dtype)?
    };
    if B::is_device() {
        crate::exec::transfer::uploaded(data.bytes.len() as u64);
    }
    let hidden = ckpt.config.hidden_size;
    let rows = crate::exec::copies::to_device::<B, 2>(std::borrow::Cow::Owned(data), device);
    Ok(rows.reshape([windows.len(), s, hidden]))
}

/// Rows `rows` of the table `name` (`[rows, cols]`) converted to `target`,
/// `[rows.len(), cols]`: only those rows are read from the mapping. A row
/// past the table is an error (the tokenizer is not the checkpoint's).
pub fn read_rows(
    ckpt: &Checkpoint,
    name: &str,
    rows: &[u32],
    target: ComputeDtype,
) -> Result<TensorData, ModelError> {
    use rayon::prelude::*;
    let e = ckpt.entry(name)?;
    let [n, cols] = e.shape[..] else {
        return Err(ModelError::Checkpoint(format!(
            "tensor '{name}' has shape {:?}, not a table",
            e.shape
        )));
    };
    if let Some(r) = rows.iter().find(|r| **r as usize >= n) {
        return Err(ModelError::Checkpoint(format!(
            "token {r} is past the {n} rows of '{name}': the tokenizer does not match the checkpoint"
        )));
    }
    let table = ckpt.bytes(name)?;
    let mmap = &ckpt.shards[e.shard].mmap;
    let row = cols * dtype::stored_size(e.dtype).max(1);
    // Copied on every core, each row's pages released once copied: a row
    // faults in its fault-around window (64 KiB, or a whole large folio),
    // and the windows of a calibration's tokens covered the table (SmolLM2's
    // 113 MB f32 table: the calibration phase's peak RSS rose 65 MiB above
    // its heap, 4 × 256 tokens, 2026-11-29).
    let mut gathered = bytemuck::allocation::zeroed_vec::<u8>(rows.len() * row);
    if row > 0 {
        gathered
            .par_chunks_mut(row)
            .zip(rows.par_iter())
            .for_each(|(out, r)| {
                let at = *r as usize * row;
                out.copy_from_slice(&table[at..][..row]);
                super::shard::release_range(mmap, e.start + at, e.start + at + row);
            });
    }
    ckpt.release(name);
    ckpt.count_read(gathered.len() as u64);
    dtype::convert_parallel(&gathered, e.dtype, target, vec![rows.len(), cols]).map_err(|at| {
        let element = rows[at / cols] as usize * cols + at % cols;
        ModelError::Checkpoint(dtype::non_finite(name, element))
    })
}

/// Every value of the table `name` finite, checked on every core without
/// converting or keeping anything: a prune that embeds only its windows'
/// rows still refuses a damaged table, as it did when it loaded it whole.
/// Each piece's pages are dropped once scanned, so the table is never
/// resident whole (the CPU estimate's calibration counts no table).
pub fn check_finite(ckpt: &Checkpoint, name: &str) -> Result<(), ModelError> {
    use rayon::prelude::*;
    let e = ckpt.entry(name)?;
    let mmap = &ckpt.shards[e.shard].mmap;
    let width = dtype::stored_size(e.dtype).max(1);
    let piece = (1 << 20) * width;
    let starts: Vec<usize> = (e.start..e.end).step_by(piece).collect();
    let bad = starts.par_iter().find_map_first(|&a| {
        let b = (a + piece).min(e.end);
        let found = dtype::first_non_finite(&mmap[a..b], e.dtype);
        super::shard::release_range(mmap, a, b);
        found.map(|i| (a - e.start) / width + i)
    });
    match bad {
        Some(at) => Err(ModelError::Checkpoint(dtype::non_finite(name, at))),
        None => Ok(()),
    }
}

/// The embedding table's name in a checkpoint.
pub const EMBEDDING: &str = "model.embed_tokens.weight";

impl<B: Compute> LmHead<B> {
    /// The name of the table the head multiplies by: the untied head's,
    /// else the embedding's.
    fn table(ckpt: &Checkpoint) -> &'static str {
        match !ckpt.config.tie_word_embeddings && ckpt.entry("lm_head.weight").is_ok() {
            true => "lm_head.weight",
            false => EMBEDDING,
        }
    }

    /// The head of `ckpt`, sharded when its table passes the device's
    /// largest buffer.
    pub fn load(
        ckpt: &Checkpoint,
        dtype: ComputeDtype,
        device: &B::Device,
    ) -> Result<Self, ModelError> {
        let name = Self::table(ckpt);
        Ok(match shard_limit::<B>(ckpt, dtype, device) {
            Some(limit) => LmHead::Sharded(load_shards(ckpt, name, dtype, limit, device)?),
            None if B::is_device() => {
                Self::from_host(read_table(ckpt, name, dtype)?, dtype, device)?
            }
            None if name == EMBEDDING => LmHead::Rows(ckpt.load_embedding(dtype, device)?),
            None => match ckpt.load_lm_head(dtype, device)? {
                Some(l) => LmHead::Whole(Box::new(l)),
                None => LmHead::Rows(ckpt.load_embedding(dtype, device)?),
            },
        })
    }

    /// On a device whose largest buffer holds the table, a thread's work
    /// that reads and converts it on the host while the device runs the
    /// layers ([`LmHead::from_host`] uploads it); `None` elsewhere (the CPU
    /// backend, a sharded table: [`LmHead::load`]).
    pub fn read_ahead<'c>(
        ckpt: &'c Checkpoint,
        dtype: ComputeDtype,
        device: &B::Device,
    ) -> Option<impl FnOnce() -> Result<TensorData, ModelError> + Send + 'c> {
        let name = Self::table(ckpt);
        let whole = B::is_device() && shard_limit::<B>(ckpt, dtype, device).is_none();
        whole.then_some(move || read_table(ckpt, name, dtype))
    }

    /// The table read on the host (`[vocab, hidden]`, in `dtype`), uploaded.
    pub fn from_host(
        data: TensorData,
        dtype: ComputeDtype,
        device: &B::Device,
    ) -> Result<Self, ModelError> {
        let [vocab, hidden] = data.shape[..] else {
            return Err(ModelError::Checkpoint(format!(
                "the head's table has shape {:?}, not [vocab, hidden]",
                data.shape
            )));
        };
        if B::is_device() {
            crate::exec::transfer::uploaded(data.bytes.len() as u64);
        }
        let _upload = crate::timing::work(crate::timing::Work::Upload);
        let mut e = burn::nn::EmbeddingConfig::new(vocab, hidden).init(device);
        // Read in `dtype` (`read_table`); converted only if it was not.
        let data = match data.dtype == dtype.burn() {
            true => data,
            false => data.convert_dtype(dtype.burn()),
        };
        let table = crate::exec::copies::to_device::<B, 2>(std::borrow::Cow::Owned(data), device);
        e.weight = burn::module::Param::from_tensor(table);
        Ok(LmHead::Rows(e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::Cpu;

    fn table(rows: usize, hidden: usize) -> Tensor<Cpu, 2> {
        let v: Vec<f32> = (0..rows * hidden)
            .map(|i| (i as f32 * 0.37).sin())
            .collect();
        Tensor::from_data(TensorData::new(v, [rows, hidden]), &Default::default())
    }

    fn sharded(t: &Tensor<Cpu, 2>, step: usize) -> Shards<Cpu> {
        let [rows, hidden] = t.dims();
        let parts = (0..rows)
            .step_by(step)
            .map(|a| (a, t.clone().slice([a..(a + step).min(rows), 0..hidden])))
            .collect();
        Shards { parts }
    }

    #[test]
    fn a_sharded_table_multiplies_as_one_table() {
        let t = table(23, 5);
        let h = table(3, 5);
        let logits = h.clone().matmul(t.clone().transpose());
        for step in [1, 4, 8, 23] {
            let s = sharded(&t, step);
            assert_eq!(s.len(), 23usize.div_ceil(step));
            let got = s.logits(h.clone());
            assert_eq!(
                got.into_data(),
                logits.clone().into_data(),
                "logits, {step} rows per shard"
            );
        }
    }

    #[test]
    fn shards_hold_whole_rows_within_the_limit() {
        assert_eq!(rows_per_shard(128 << 20, 768), 43690);
        assert_eq!(rows_per_shard(10, 768), 1);
    }
}
