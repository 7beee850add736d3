//! Vocabulary-sized tables (the embedding, an untied head) on a device whose
//! largest buffer is smaller than the table. One buffer cannot hold them
//! there (lavapipe: 128 MiB, so SmolLM2's 49 152 × 576 table in f32 at
//! 108 MiB fits but a 49 152 × 768 one at 144 MiB does not; real GPUs allow
//! 2–4 GiB, which LLaMA-3-405B's 128 256 × 16 384 table passes in f16), so
//! the table is uploaded as row shards, each within the limit:
//! - the lookup gathers every token from the shard that holds it (the
//!   others' rows are masked out), so the hidden states are the same bits as
//!   a one-table lookup;
//! - the head multiplies by each shard and concatenates the logits along the
//!   vocabulary: every logit is the same dot product as with one table.
//!
//! A table that fits one buffer keeps Burn's `Embedding` / `Linear` (the
//! streamed engines' path before this module existed).

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

/// The embedding table, whole or in shards.
pub enum Embed<B: Backend> {
    Whole(Embedding<B>),
    Sharded(Shards<B>),
}

/// An untied output head, whole or in shards.
pub enum LmHead<B: Backend> {
    Whole(Box<Linear<B>>),
    /// On a device: the checkpoint's `[vocab, hidden]` rows as they are
    /// stored, multiplied transposed (the tied head's product). Loading it
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
    /// Rows of the table for `tokens` `[batch, seq]` → `[batch, seq, hidden]`.
    pub fn lookup(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        let [b, s] = tokens.dims();
        let flat = tokens.reshape([b * s]);
        let mut out: Option<Tensor<B, 2>> = None;
        for (first, shard) in &self.parts {
            let n = shard.dims()[0] as i64;
            let local = flat.clone().sub_scalar(*first as i64);
            let rows = shard.clone().select(0, local.clone().clamp(0, n - 1));
            crate::exec::watch::after_op();
            let hidden = rows.dims()[1];
            out = Some(match out {
                None => rows,
                Some(acc) => {
                    let here = local
                        .clone()
                        .greater_equal_elem(0)
                        .bool_and(local.lower_elem(n));
                    let here = here.reshape([b * s, 1]).expand([b * s, hidden]);
                    acc.mask_where(here, rows)
                }
            });
        }
        let out = out.expect("a table has at least one shard");
        let hidden = out.dims()[1];
        out.reshape([b, s, hidden])
    }

    /// `h [n, hidden]` times the table's transpose: logits `[n, rows]`.
    pub fn logits(&self, h: Tensor<B, 2>) -> Tensor<B, 2> {
        let parts: Vec<Tensor<B, 2>> = self
            .parts
            .iter()
            .map(|(_, shard)| h.clone().matmul(shard.clone().transpose()))
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

/// The embedding table for a device, converted on every core
/// (`dtype::convert_parallel`): the serial conversion the CPU backend keeps
/// (it holds less at once) took 2.45 s of a 1B-shape run's 3.8 s before
/// its first layer on an H100.
fn device_table<B: Compute>(
    ckpt: &Checkpoint,
    name: &str,
    dtype: ComputeDtype,
    device: &B::Device,
) -> Result<Embedding<B>, ModelError> {
    let c = &ckpt.config;
    let data = {
        let _tag = crate::memory::tag::tag(crate::memory::tag::Category::Weights);
        let _io = crate::timing::work(crate::timing::Work::Io);
        ckpt.read_converted(name, dtype)?
    };
    crate::exec::transfer::uploaded(data.bytes.len() as u64);
    let mut e = burn::nn::EmbeddingConfig::new(c.vocab_size, c.hidden_size).init(device);
    e.weight = burn::module::Param::from_tensor(Tensor::from_data(data, (device, dtype.burn())));
    Ok(e)
}

impl<B: Compute> Embed<B> {
    /// The embedding table of `ckpt`, sharded when it passes the device's
    /// largest buffer.
    pub fn load(
        ckpt: &Checkpoint,
        dtype: ComputeDtype,
        device: &B::Device,
    ) -> Result<Self, ModelError> {
        Ok(match shard_limit::<B>(ckpt, dtype, device) {
            Some(limit) => Embed::Sharded(load_shards(
                ckpt,
                "model.embed_tokens.weight",
                dtype,
                limit,
                device,
            )?),
            None if B::is_device() => Embed::Whole(device_table(
                ckpt,
                "model.embed_tokens.weight",
                dtype,
                device,
            )?),
            None => Embed::Whole(ckpt.load_embedding(dtype, device)?),
        })
    }

    /// Hidden states `[batch, seq, hidden]` for `tokens`.
    pub fn forward(&self, tokens: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        match self {
            Embed::Whole(e) => e.forward(tokens),
            Embed::Sharded(s) => s.lookup(tokens),
        }
    }
}

impl<B: Compute> LmHead<B> {
    /// The untied output head of `ckpt` (`None` when tied), sharded when it
    /// passes the device's largest buffer.
    pub fn load(
        ckpt: &Checkpoint,
        dtype: ComputeDtype,
        device: &B::Device,
    ) -> Result<Option<Self>, ModelError> {
        let untied = !ckpt.config.tie_word_embeddings && ckpt.entry("lm_head.weight").is_ok();
        match shard_limit::<B>(ckpt, dtype, device).filter(|_| untied) {
            Some(limit) => Ok(Some(LmHead::Sharded(load_shards(
                ckpt,
                "lm_head.weight",
                dtype,
                limit,
                device,
            )?))),
            None if untied && B::is_device() => Ok(Some(LmHead::Rows(device_table(
                ckpt,
                "lm_head.weight",
                dtype,
                device,
            )?))),
            None => Ok(ckpt
                .load_lm_head(dtype, device)?
                .map(|l| LmHead::Whole(Box::new(l)))),
        }
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
    fn a_sharded_table_looks_up_and_multiplies_as_one_table() {
        let t = table(23, 5);
        let tokens: Vec<i64> = vec![0, 22, 7, 8, 15, 16, 3, 21];
        let ids =
            Tensor::<Cpu, 2, Int>::from_data(TensorData::new(tokens, [2, 4]), &Default::default());
        let whole = t
            .clone()
            .select(0, ids.clone().reshape([8]))
            .reshape([2, 4, 5]);
        let h = table(3, 5);
        let logits = h.clone().matmul(t.clone().transpose());
        for step in [1, 4, 8, 23] {
            let s = sharded(&t, step);
            assert_eq!(s.len(), 23usize.div_ceil(step));
            let got = s.lookup(ids.clone());
            assert_eq!(
                got.into_data(),
                whole.clone().into_data(),
                "lookup, {step} rows per shard"
            );
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
