//! The evaluation run inside a streamed device prune: each pruned layer
//! takes every evaluation batch as soon as it is pruned, and is dropped.
//! No pruned layer waits anywhere — not on the device (its bytes beside
//! the prune's), not in host memory (uploaded again), not on disk — and
//! after the last layer only the head is left
//! (`perplexity::Weights::Evaluated`).
//!
//! The numbers are the kept evaluation's: the same windows (this rank's
//! share) in the same batches, each embedded from the checkpoint's rows,
//! through the same pruned layers with the same rotary tables (the
//! prune's), then the same head. What it costs is the evaluation's hidden
//! states held through the prune, where they were held through the
//! evaluation alone (`kept::Place::choose` weighs that against the
//! layers).

use std::time::Instant;

use burn::prelude::*;

use super::kept::PrunedLayers;
use super::llama::DecoderLayer;
use super::vocab::{self, LmHead};
use super::{Checkpoint, ComputeDtype, ModelError, Rope};
use crate::exec::Compute;
use crate::memory::held::{self, Held};
use crate::memory::tag::{self, Category};
use crate::profiler::Profiler;
use crate::timing::{self, Work};

/// The evaluation's state between pruned layers.
pub struct InlineEval<'a, B: Compute> {
    ckpt: &'a Checkpoint,
    /// This rank's windows, in the evaluation's batches.
    batches: Vec<Vec<Vec<u32>>>,
    dtype: ComputeDtype,
    device: B::Device,
    profiler: Option<Profiler>,
    /// Each batch's hidden states after the layers taken so far (embedded
    /// when the first layer arrives, so the calibration runs without them).
    xs: Vec<Tensor<B, 3>>,
    held: Held,
    /// Layers run so far.
    layers: usize,
    /// The head's table, read on a host thread while the device runs the
    /// last layer.
    table: Option<TensorData>,
    seconds: f64,
}

/// What the head needs once every layer has run.
pub struct Evaluated<'a, B: Compute> {
    pub ckpt: &'a Checkpoint,
    pub batches: Vec<Vec<Vec<u32>>>,
    /// Each batch's hidden states after the last layer, and their bytes.
    pub xs: Vec<Tensor<B, 3>>,
    pub held: Held,
    pub table: Option<TensorData>,
    /// Seconds the layers' part took, inside the prune.
    pub seconds: f64,
}

impl<'a, B: Compute> InlineEval<'a, B> {
    /// An evaluation of `windows` (every rank's: this rank takes its
    /// share, `exec::dist::share_cow`) in batches of `batch_size`.
    pub fn new(
        ckpt: &'a Checkpoint,
        windows: &[Vec<u32>],
        batch_size: usize,
        dtype: ComputeDtype,
        device: &B::Device,
        profiler: Option<Profiler>,
    ) -> Self {
        let mine = crate::exec::dist::share_cow(windows);
        Self {
            ckpt,
            batches: mine.chunks(batch_size.max(1)).map(<[_]>::to_vec).collect(),
            dtype,
            device: device.clone(),
            profiler,
            xs: Vec::new(),
            held: Held::none(Category::Activations),
            layers: 0,
            table: None,
            seconds: 0.0,
        }
    }

    /// Device bytes of this rank's hidden states in `dtype`, held from
    /// the first pruned layer to the head.
    pub fn hidden_bytes(windows: &[Vec<u32>], hidden: usize, dtype: ComputeDtype) -> u64 {
        let tokens: usize = crate::exec::dist::share_cow(windows)
            .iter()
            .map(Vec::len)
            .sum();
        (tokens * hidden) as u64 * dtype.size()
    }

    /// Seconds the layers' part has taken so far (inside the prune's).
    pub fn seconds(&self) -> f64 {
        self.seconds
    }

    /// The head's part, once every layer has run.
    pub fn finish(self) -> Result<Evaluated<'a, B>, ModelError> {
        let n = self.ckpt.config.num_layers;
        if self.layers != n {
            return Err(ModelError::Checkpoint(format!(
                "the evaluation ran {} of {n} layers",
                self.layers
            )));
        }
        Ok(Evaluated {
            ckpt: self.ckpt,
            batches: self.batches,
            xs: self.xs,
            held: self.held,
            table: self.table,
            seconds: self.seconds,
        })
    }

    /// Every batch embedded from the checkpoint's rows on the host.
    fn embed(&mut self) -> Result<(), ModelError> {
        let _tag = tag::tag(Category::Activations);
        self.xs = self
            .batches
            .iter()
            .map(|b| vocab::embed_windows::<B>(self.ckpt, b, self.dtype, &self.device))
            .collect::<Result<_, _>>()?;
        self.held.set(self.xs.iter().map(held::tensor_bytes).sum());
        Ok(())
    }

    /// Every batch through `layer`.
    fn run(&mut self, i: usize, layer: &DecoderLayer<B>, rope: &Rope<B>) -> Result<(), ModelError> {
        let _tag = tag::tag(Category::Activations);
        // The output pass's buffers are kept for its batch shape: another
        // shape gives them back first.
        let mut shapes = crate::exec::BatchShapes::after_last_pass();
        self.xs = std::mem::take(&mut self.xs)
            .into_iter()
            .map(|x| {
                shapes.next::<B>(&x.dims(), &self.device);
                layer.forward(x, rope)
            })
            .collect();
        // No progress of its own: the prune's progress for this layer
        // follows, and one pass's pace keeps the live view's ETA steady.
        if let Some(p) = &self.profiler {
            p.device_tick(|| format!("eval model.layers.{i}"))?;
        }
        Ok(())
    }
}

impl<B: Compute> PrunedLayers<B> for InlineEval<'_, B> {
    fn take(&mut self, i: usize, layer: DecoderLayer<B>, rope: &Rope<B>) -> Result<(), ModelError> {
        if i != self.layers {
            return Err(ModelError::Checkpoint(format!(
                "the evaluation was handed layer {i} after {} layers",
                self.layers
            )));
        }
        let t = Instant::now();
        let _phase = timing::phase(timing::Phase::Eval);
        // The layer's bytes stay counted while its last use runs.
        let bytes = self.ckpt.config.layer_param_count() * self.dtype.size();
        let _weights = Held::new(Category::Weights, bytes);
        if self.xs.is_empty() {
            self.embed()?;
        }
        let last = i + 1 == self.ckpt.config.num_layers;
        let ahead = match last {
            true => LmHead::<B>::read_ahead(self.ckpt, self.dtype, &self.device),
            false => None,
        };
        let table = std::thread::scope(|scope| {
            // The device runs the last layer while a host thread reads the
            // head's table.
            let read = ahead.map(|read| scope.spawn(read));
            self.run(i, &layer, rope)?;
            // Its kernels finish here, so their time is the evaluation's
            // and not the next layer's (the device's queue is
            // asynchronous).
            B::sync(&self.device).map_err(|e| {
                ModelError::Checkpoint(format!("evaluating model.layers.{i}: {e:?}"))
            })?;
            read.map(|r| {
                timing::timed(Work::ReaderWait, || r.join())
                    .map_err(|_| ModelError::Checkpoint("reading the head's table failed".into()))?
            })
            .transpose()
        })?;
        if table.is_some() {
            self.table = table;
        }
        self.layers += 1;
        self.seconds += t.elapsed().as_secs_f64();
        Ok(())
    }
}
