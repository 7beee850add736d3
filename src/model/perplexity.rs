//! Perplexity, as the Wanda/SparseGPT evaluation computes it: for each
//! window of `seqlen` tokens, the mean next-token cross-entropy over its
//! `seqlen - 1` predictions; perplexity is `exp` of the mean over windows.
//!
//! Two ways to hold the model, same numbers: [`Weights::Resident`] runs each
//! batch of windows through every layer; [`Weights::Streamed`] keeps the
//! hidden states of all windows and loads one decoder layer at a time from
//! the checkpoint, so only one layer is ever resident. The logits and their
//! losses, in row chunks, are [`nll`]'s.

use crate::exec::Compute;
use std::time::Instant;

use crate::timing::{self, Work};
use burn::prelude::*;

use crate::memory::held::{self, Held};
use crate::memory::tag::{self, Category};
use crate::model::inline_eval::Evaluated;
use crate::model::kept::{Kept, LayerRef};
use crate::model::llama::Head;
use crate::model::prefetch;
use crate::model::vocab::{self, LmHead};
use crate::model::{Checkpoint, ComputeDtype, Llama, LlamaConfig, ModelError, Rope};
use crate::profiler::Profiler;

mod nll;
pub use nll::{chunk_rows, device_chunk_rows, window_nll};

/// Where the weights come from.
pub enum Weights<'a, B: Compute> {
    Resident(&'a Llama<B>, &'a LlamaConfig),
    Streamed(&'a Checkpoint),
    /// The decoder layers a device prune kept (`model::kept`); the
    /// embedding, final norm and head from the checkpoint.
    Kept(&'a Checkpoint, &'a Kept<B>),
    /// Every batch already through the pruned layers, inside the prune
    /// (`model::inline_eval`): the final norm and the head are left.
    Evaluated(Evaluated<'a, B>),
}

/// How to evaluate.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    pub batch_size: usize,
    pub dtype: ComputeDtype,
}

/// A perplexity and how it was obtained.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Perplexity {
    pub perplexity: f64,
    pub mean_loss: f64,
    pub windows: usize,
    pub seqlen: usize,
    pub seconds: f64,
    pub tokens_per_second: f64,
}

/// Token ids `[batch, seq]` as a Burn int tensor.
pub fn token_tensor<B: Compute>(windows: &[Vec<u32>], device: &B::Device) -> Tensor<B, 2, Int> {
    let s = windows.first().map_or(0, Vec::len);
    let ids: Vec<i64> = windows.iter().flatten().map(|t| *t as i64).collect();
    Tensor::from_data(TensorData::new(ids, [windows.len(), s]), device)
}

/// Perplexity of `windows` (all of one length).
pub fn perplexity<B: Compute>(
    weights: Weights<'_, B>,
    windows: &[Vec<u32>],
    options: &EvalOptions,
    device: &B::Device,
    profiler: Option<&Profiler>,
) -> Result<Perplexity, ModelError> {
    let seqlen = windows.first().map_or(0, Vec::len);
    if windows.is_empty() || seqlen < 2 {
        return Err(ModelError::Checkpoint(
            "evaluation needs at least one window of 2 or more tokens".into(),
        ));
    }
    // In a distributed run each rank evaluates its share of the windows and
    // the losses are summed across ranks.
    crate::exec::dist::check_share("evaluation windows", windows.len(), "--eval-windows")
        .map_err(|e| ModelError::Checkpoint(e.to_string()))?;
    let shared = crate::exec::dist::share_cow(windows);
    let windows = &shared[..];
    let t = Instant::now();
    let _phase = timing::phase(timing::Phase::Eval);
    let bs = options.batch_size.max(1);
    let batches: Vec<&[Vec<u32>]> = windows.chunks(bs).collect();
    let run = Run {
        batches: &batches,
        seqlen,
        options,
        device,
        profiler,
    };
    let (nll, before) = run.nll(weights)?;
    // The head's freed logits chunks and table go back when the evaluation
    // ends: cached, they kept the process's resident set at the
    // evaluation's peak after it (SmolLM2 Wanda, 8 windows of 256: 220.6
    // MiB resident for 12.3 MiB live, to the end of the run).
    crate::exec::give_back::<B>(device);
    // A perplexity of NaN is not an answer: finite weights can still
    // overflow the forward pass (f16's range ends at 65 504).
    if let Some(k) = nll.iter().position(|n| !n.is_finite()) {
        return Err(ModelError::Checkpoint(format!(
            "evaluation window {} gave a loss of {}: the forward pass overflowed in {} (try --dtype f32, or check the weights)",
            k + 1,
            nll[k],
            options.dtype
        )));
    }
    let mut sums = [
        nll.iter().map(|n| n / (seqlen - 1) as f64).sum::<f64>(),
        nll.len() as f64,
    ];
    crate::exec::dist::reducer().sum_f64(&mut sums);
    let (mean_loss, evaluated) = (sums[0] / sums[1], sums[1] as usize);
    let seconds = before + t.elapsed().as_secs_f64();
    Ok(Perplexity {
        perplexity: mean_loss.exp(),
        mean_loss,
        windows: evaluated,
        seqlen,
        seconds,
        tokens_per_second: (evaluated * seqlen) as f64 / seconds.max(1e-9),
    })
}

/// One evaluation's windows, in batches, and how to run them.
struct Run<'r, B: Compute> {
    batches: &'r [&'r [Vec<u32>]],
    seqlen: usize,
    options: &'r EvalOptions,
    device: &'r B::Device,
    profiler: Option<&'r Profiler>,
}

impl<B: Compute> Run<'_, B> {
    /// Each window's summed negative log-likelihood through `weights`, and
    /// the seconds an evaluation inside the prune already spent on them.
    fn nll(&self, weights: Weights<'_, B>) -> Result<(Vec<f64>, f64), ModelError> {
        Ok(match weights {
            Weights::Resident(model, config) => (self.resident(model, config)?, 0.0),
            Weights::Streamed(ckpt) => (self.streamed(ckpt, None)?, 0.0),
            Weights::Kept(ckpt, kept) => (self.streamed(ckpt, Some(kept))?, 0.0),
            Weights::Evaluated(e) => {
                let before = e.seconds;
                (self.evaluated(e)?, before)
            }
        })
    }

    /// A resident model: each batch through every layer and the head.
    fn resident(&self, model: &Llama<B>, config: &LlamaConfig) -> Result<Vec<f64>, ModelError> {
        let rope = Rope::new(config, self.seqlen, self.options.dtype.burn(), self.device);
        let mut nll = Vec::new();
        for (k, batch) in self.batches.iter().enumerate() {
            let h = {
                let _tag = tag::tag(Category::Activations);
                model.hidden(token_tensor(batch, self.device), &rope)
            };
            nll.extend(window_nll(h, batch, &model.head(), config.vocab_size));
            if let Some(p) = self.profiler {
                p.device_tick(|| format!("eval batch {}", k + 1))?;
                let name = format!("eval batch {}", k + 1);
                p.progress("evaluation", k, self.batches.len(), &name);
            }
        }
        Ok(nll)
    }

    /// The batches already through the pruned layers (inside the prune):
    /// the final norm and the head are left.
    fn evaluated(&self, e: Evaluated<'_, B>) -> Result<Vec<f64>, ModelError> {
        let ran: Vec<&[Vec<u32>]> = e.batches.iter().map(Vec::as_slice).collect();
        if ran != self.batches {
            return Err(ModelError::Checkpoint(
                "the evaluation inside the prune ran other windows".into(),
            ));
        }
        // The layers' freed buffers (the prune's last layer's, cached by
        // the allocator) go back before the head's table and logits, as in
        // `Run::streamed`.
        crate::exec::give_back::<B>(self.device);
        let dtype = self.options.dtype;
        let head = match e.table {
            Some(data) => LmHead::from_host(data, dtype, self.device)?,
            None => LmHead::load(e.ckpt, dtype, self.device)?,
        };
        let at_head = AtHead {
            ckpt: e.ckpt,
            dtype,
            device: self.device,
            profiler: self.profiler,
        };
        at_head.nll(e.xs, e.held, head, self.batches)
    }
}

/// Perplexity of the model folder `dir`, streamed one layer at a time,
/// inside an `eval` scope.
pub fn of_folder<B: Compute>(
    dir: &std::path::Path,
    windows: &[Vec<u32>],
    options: &EvalOptions,
    device: &B::Device,
    profiler: &Profiler,
) -> Result<Perplexity, ModelError> {
    let ckpt = Checkpoint::open(dir)?;
    let _scope = profiler.scope(crate::events::stages::EVAL_SCOPE);
    perplexity::<B>(
        Weights::Streamed(&ckpt),
        windows,
        options,
        device,
        Some(profiler),
    )
}

impl<B: Compute> Run<'_, B> {
    /// The streamed evaluation: every batch embedded, each layer read once and
    /// run over every batch, then the head batch by batch. Returns each
    /// window's summed negative log-likelihood. The layers come from `kept`
    /// when given (a device prune's), else from the checkpoint. On a device,
    /// host threads read the next layer and the head's table while the device
    /// runs this one (`model::prefetch`, `LmHead::read_ahead`).
    fn streamed(&self, ckpt: &Checkpoint, kept: Option<&Kept<B>>) -> Result<Vec<f64>, ModelError> {
        let (batches, seqlen, options) = (self.batches, self.seqlen, self.options);
        let (device, profiler) = (self.device, self.profiler);
        let c = &ckpt.config;
        let dtype = options.dtype;
        let rope = Rope::<B>::new(c, seqlen, dtype.burn(), device);
        // Each batch's rows gathered on the host: the embedding table never
        // goes up (`model::vocab`).
        let activations = tag::tag(Category::Activations);
        let xs = batches
            .iter()
            .map(|batch| vocab::embed_windows::<B>(ckpt, batch, dtype, device))
            .collect::<Result<Vec<_>, _>>()?;
        drop(activations);
        let xs_held = Held::new(
            Category::Activations,
            xs.iter().map(held::tensor_bytes).sum(),
        );
        let layers = Layers {
            ckpt,
            kept,
            rope: &rope,
            dtype,
            device,
            profiler,
        };
        let (xs, head) = std::thread::scope(|scope| -> Result<_, ModelError> {
            let ahead = LmHead::<B>::read_ahead(ckpt, dtype, device).map(|read| scope.spawn(read));
            let xs = layers.run(xs)?;
            // The layers' freed buffers (one forward's, reused from layer to
            // layer since the batches keep their shapes) go back before the
            // head's table and logits.
            crate::exec::give_back::<B>(device);
            let head = match ahead {
                Some(read) => {
                    let data =
                        timing::timed(Work::ReaderWait, || read.join()).map_err(|_| {
                            ModelError::Checkpoint("reading the head's table failed".into())
                        })??;
                    LmHead::from_host(data, dtype, device)?
                }
                None => LmHead::load(ckpt, dtype, device)?,
            };
            Ok((xs, head))
        })?;
        let at_head = AtHead {
            ckpt,
            dtype,
            device,
            profiler,
        };
        at_head.nll(xs, xs_held, head, batches)
    }
}

/// The evaluation's last part: the final norm and the head over every
/// batch's hidden states.
struct AtHead<'a, B: Compute> {
    ckpt: &'a Checkpoint,
    dtype: ComputeDtype,
    device: &'a B::Device,
    profiler: Option<&'a Profiler>,
}

impl<B: Compute> AtHead<'_, B> {
    /// Each window's summed negative log-likelihood from `xs` (one tensor
    /// per batch, `xs_held` their bytes) through `head`.
    fn nll(
        &self,
        xs: Vec<Tensor<B, 3>>,
        mut xs_held: Held,
        head: LmHead<B>,
        batches: &[&[Vec<u32>]],
    ) -> Result<Vec<f64>, ModelError> {
        let (c, dtype, device) = (&self.ckpt.config, self.dtype, self.device);
        let sizes: Vec<u64> = xs.iter().map(held::tensor_bytes).collect();
        let _head_held = Held::new(Category::Weights, c.vocab_table_params() * dtype.size());
        let norm = self.ckpt.load_norm::<B>(dtype, device)?;
        let head = Head::of(&head);
        // The head over every batch is its own sequence: on a large
        // vocabulary it takes as long as the layers.
        let mut nll = Vec::new();
        let mut shapes = crate::exec::BatchShapes::default();
        for (k, (x, batch)) in xs.into_iter().zip(batches).enumerate() {
            shapes.next::<B>(&x.dims(), device);
            // The batches still waiting stay held; this one is the head's.
            xs_held.set(sizes[k + 1..].iter().sum());
            nll.extend(window_nll(norm.forward(x), batch, &head, c.vocab_size));
            if let Some(p) = self.profiler {
                p.device_tick(|| format!("eval logits batch {}", k + 1))?;
                p.progress(
                    "evaluation logits",
                    k,
                    batches.len(),
                    &format!("eval logits batch {}", k + 1),
                );
            }
        }
        Ok(nll)
    }
}

/// The decoder layers of a streamed evaluation.
struct Layers<'a, B: Compute> {
    ckpt: &'a Checkpoint,
    kept: Option<&'a Kept<B>>,
    rope: &'a Rope<B>,
    dtype: ComputeDtype,
    device: &'a B::Device,
    profiler: Option<&'a Profiler>,
}

impl<B: Compute> Layers<'_, B> {
    /// Every batch through every layer, one watch over all of them (a
    /// layer's first batch follows the last layer's last). Read from the
    /// checkpoint on a device, the next layer is read and converted on a
    /// host thread while the device runs this one.
    fn run(&self, mut xs: Vec<Tensor<B, 3>>) -> Result<Vec<Tensor<B, 3>>, ModelError> {
        let c = &self.ckpt.config;
        let ahead = self.kept.is_none() && B::is_device();
        let mut shapes = crate::exec::BatchShapes::default();
        prefetch::for_each_layer(self.ckpt, self.dtype, ahead, |i, ready| {
            crate::memory::alloc::trim();
            let (layer, _held) = self.layer(i, ready)?;
            let _tag = tag::tag(Category::Activations);
            xs = std::mem::take(&mut xs)
                .into_iter()
                .map(|x| {
                    shapes.next::<B>(&x.dims(), self.device);
                    layer.forward(x, self.rope)
                })
                .collect();
            if let Some(p) = self.profiler {
                p.device_tick(|| format!("eval model.layers.{i}"))?;
                p.progress(
                    "evaluation",
                    i,
                    c.num_layers,
                    &format!("eval model.layers.{i}"),
                );
            }
            Ok::<_, ModelError>(())
        })?;
        Ok(xs)
    }

    /// Layer `i` and what holds its bytes: kept on the device, already in
    /// the store's ledger; brought up from the host or the checkpoint,
    /// this pass's.
    fn layer(
        &self,
        i: usize,
        ready: Option<prefetch::HostLayer>,
    ) -> Result<(LayerRef<'_, B>, Held), ModelError> {
        let c = &self.ckpt.config;
        let bytes = c.layer_param_count() * self.dtype.size();
        let layer = match (self.kept, ready) {
            (Some(k), _) => k.layer(i, c, self.device)?,
            (None, ready) => LayerRef::Owned(Box::new(prefetch::load_layer::<B>(
                self.ckpt,
                i,
                ready,
                self.dtype,
                self.device,
            )?)),
        };
        if self.kept.is_none() && B::is_device() {
            crate::exec::transfer::uploaded(bytes);
        }
        let held = match &layer {
            LayerRef::Borrowed(_) => Held::none(Category::Weights),
            LayerRef::Owned(_) => Held::new(Category::Weights, bytes),
        };
        Ok((layer, held))
    }
}
