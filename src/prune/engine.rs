//! The sequential, layer-by-layer pruning engine (the shape of Wanda's and
//! SparseGPT's `prune_*` loops).
//!
//! Calibration windows are embedded once and their hidden states kept
//! (`inps`). For each decoder layer: load it (streaming: from the mapped
//! checkpoint, so only this layer is resident), run every window through it
//! in batches while the statistics its method needs are collected, prune its
//! seven linears, run the windows through the pruned layer to get the next
//! layer's inputs (in place: no second `outs` buffer), write the pruned
//! tensors out, and drop it. Embeddings and the LM head are never pruned.
//!
//! Stage snapshots ([`stages`]): `03_before_pruning`, per layer
//! `layer_NN_stats` and `layer_NN_pruned` inside a `layer_NN` scope,
//! `04_after_pruning`.

use crate::exec::Compute;
use std::collections::BTreeMap;
use std::time::Instant;

use burn::prelude::*;

use super::activations::Activations;
use super::reallocation::ReallocationReport;
use super::stats::{LayerStats, Needs};
use super::{LayerMethod, PruneError};
use crate::events::stages;
use crate::memory::held::Held;
use crate::memory::tag::{self, Category};
use crate::model::kept::PrunedLayers;
use crate::model::llama::DecoderLayer;
use crate::model::perplexity::token_tensor;
use crate::model::prefetch;
use crate::model::save::PrunedWriter;
use crate::model::vocab;
use crate::model::{Checkpoint, ComputeDtype, Llama, Rope};
use crate::profiler::Profiler;
use crate::timing::{self, Work};

pub use super::config::{LinearReport, PruneConfig};
use super::linear::{LayerTarget, prune_linears};
pub use super::linear::{set_weight, weight_out_in};

/// What pruning one decoder layer did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LayerReport {
    pub index: usize,
    pub seconds: f64,
    pub linears: Vec<LinearReport>,
    /// Across MPI ranks: bytes this rank moved in the layer's reductions
    /// and seconds it spent in them (waiting for the slowest rank
    /// included); zero in one process.
    pub reduced_bytes: u64,
    pub reduction_seconds: f64,
}

/// Fraction of zeros over `linears`.
pub fn sparsity_of<'a>(linears: impl IntoIterator<Item = &'a LinearReport>) -> f64 {
    let (z, p) = linears
        .into_iter()
        .fold((0u64, 0u64), |(z, p), l| (z + l.zeros, p + l.params));
    z as f64 / p.max(1) as f64
}

impl LayerReport {
    pub fn sparsity(&self) -> f64 {
        sparsity_of(&self.linears)
    }
}

/// The result of a pruning run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PruneOutcome {
    pub layers: Vec<LayerReport>,
    pub seconds: f64,
}

/// What DSnoT did over a whole run.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct DsnotSummary {
    /// Linears it refined (not skipped).
    pub refined_linears: usize,
    /// Weights whose state differs from the first masks.
    pub changed_weights: u64,
    /// The most swaps a row made.
    pub max_swaps_per_row: usize,
}

impl PruneOutcome {
    /// What `f` reads from every linear that has it.
    fn per_linear<T>(&self, f: impl Fn(&LinearReport) -> Option<T>) -> Vec<T> {
        self.layers
            .iter()
            .flat_map(|l| &l.linears)
            .filter_map(f)
            .collect()
    }

    /// DSnoT's totals, when it ran.
    pub fn dsnot(&self) -> Option<DsnotSummary> {
        let refined = self.per_linear(|l| l.dsnot);
        (!refined.is_empty()).then(|| DsnotSummary {
            refined_linears: refined.len(),
            changed_weights: refined.iter().map(|d| d.changed).sum(),
            max_swaps_per_row: refined.iter().map(|d| d.cycles).max().unwrap_or(0),
        })
    }

    /// Wanda's α-variant: the α each linear's search stopped at, in
    /// pruning order (empty without `--use-variant`).
    pub fn alphas(&self) -> Vec<f64> {
        self.per_linear(|l| l.alpha)
    }

    /// RIA's channel reallocation over the whole run: metric kept by
    /// direct N:M and with the permutation, summed over the linears.
    pub fn reallocation(&self) -> Option<ReallocationReport> {
        let all = self.per_linear(|l| l.reallocation);
        (!all.is_empty()).then(|| ReallocationReport {
            kept_before: all.iter().map(|r| r.kept_before).sum(),
            kept_after: all.iter().map(|r| r.kept_after).sum(),
        })
    }

    /// Fraction of zeros over every decoder linear (`check_sparsity`).
    pub fn sparsity(&self) -> f64 {
        sparsity_of(self.layers.iter().flat_map(|l| &l.linears))
    }
}

/// Where the layers live while pruning.
pub enum Source<'a, B: Compute> {
    /// Read one layer at a time from the mapped checkpoint.
    Streamed,
    /// The whole model, loaded; pruned in place.
    Resident(&'a mut Llama<B>),
}

/// The statistics `config` needs (`None`: no calibration pass at all).
fn needs(config: &PruneConfig) -> Option<Needs> {
    let dsnot = config.dsnot.is_some();
    let needs = Needs {
        norms: matches!(config.method, LayerMethod::Wanda | LayerMethod::Ria) || dsnot,
        hessian: config.method == LayerMethod::SparseGpt,
        moments: dsnot,
    };
    needs.any().then_some(needs)
}

/// Hidden states of the calibration windows after the embedding, in
/// batches of `batch_size` windows.
pub fn embed_windows<B: Compute>(
    ckpt: &Checkpoint,
    source: &Source<'_, B>,
    windows: &[Vec<u32>],
    batch_size: usize,
    dtype: ComputeDtype,
    device: &B::Device,
) -> Result<Vec<Tensor<B, 3>>, PruneError> {
    let mut hidden = Vec::new();
    embed_each(ckpt, source, windows, batch_size, dtype, device, &mut |t| {
        hidden.push(t)
    })?;
    Ok(hidden)
}

/// A streamed pass's layer `i` (`ready` when the reader thread read it
/// ahead, `prefetch::load_layer`), in `load_layer`'s phase, its upload
/// counted on a device, and its bytes held as weights while it lives: the
/// prune's layer loop and OWL's outlier pass.
pub(super) fn streamed_layer<B: Compute>(
    ckpt: &Checkpoint,
    i: usize,
    ready: Option<prefetch::HostLayer>,
    dtype: ComputeDtype,
    device: &B::Device,
) -> Result<(DecoderLayer<B>, Held), PruneError> {
    let layer = counted_layer::<B>(ckpt, i, ready, dtype, device)?;
    let bytes = ckpt.config.layer_param_count() * dtype.size();
    Ok((layer, Held::new(Category::Weights, bytes)))
}

/// [`streamed_layer`] without the guard, for a caller that holds the
/// layer's bytes its own way (GradProbe's layers kept on the device).
pub(super) fn counted_layer<B: Compute>(
    ckpt: &Checkpoint,
    i: usize,
    ready: Option<prefetch::HostLayer>,
    dtype: ComputeDtype,
    device: &B::Device,
) -> Result<DecoderLayer<B>, PruneError> {
    let _phase = timing::phase(timing::Phase::Load);
    let layer = prefetch::load_layer::<B>(ckpt, i, ready, dtype, device)?;
    if B::is_device() {
        crate::exec::transfer::uploaded(ckpt.config.layer_param_count() * dtype.size());
    }
    Ok(layer)
}

/// Each batch's hidden states after the embedding, handed to `keep` as it
/// is made (so that offloaded batches leave the device one at a time).
fn embed_each<B: Compute>(
    ckpt: &Checkpoint,
    source: &Source<'_, B>,
    windows: &[Vec<u32>],
    batch_size: usize,
    dtype: ComputeDtype,
    device: &B::Device,
    keep: &mut dyn FnMut(Tensor<B, 3>),
) -> Result<(), PruneError> {
    // Streamed, each batch's rows are read from the checkpoint on the host
    // and only the hidden states go up (`model::vocab`); the table is
    // never loaded (`prune` checks it once).
    for batch in windows.chunks(batch_size.max(1)) {
        let hidden = match source {
            Source::Resident(m) => m.model.embed_tokens.forward(token_tensor(batch, device)),
            Source::Streamed => vocab::embed_windows::<B>(ckpt, batch, dtype, device)?,
        };
        // This batch's hidden states beside the batches kept on the device
        // before it.
        crate::exec::watch::after_op();
        keep(hidden);
    }
    Ok(())
}

/// Prunes every decoder layer of `ckpt` (or of the resident model), writing
/// pruned layers to `writer` when given and, streamed, handing them to
/// `kept` when given (a store for the evaluation that follows, or the
/// evaluation itself).
#[allow(clippy::too_many_arguments)]
pub fn prune<B: Compute>(
    ckpt: &Checkpoint,
    mut source: Source<'_, B>,
    config: &PruneConfig,
    calibration: &[Vec<u32>],
    mut writer: Option<&mut PrunedWriter>,
    mut kept: Option<&mut dyn PrunedLayers<B>>,
    device: &B::Device,
    profiler: &Profiler,
) -> Result<PruneOutcome, PruneError> {
    let start = Instant::now();
    let c = &ckpt.config;
    let kind = needs(config);
    // Statistics are sums over every rank's windows, scaled by the count of
    // all of them (one rank alone: its own).
    let nsamples = crate::exec::dist::global_count(calibration.len());
    let mut inps = Activations::empty(config.offload_activations, device);
    if kind.is_some() {
        // A damaged table is refused, as when it was loaded whole; OWL's
        // pass before this read only its windows' rows, checked as read.
        if let Source::Streamed = source {
            vocab::check_finite(ckpt, vocab::EMBEDDING)?;
        }
        let _tag = tag::tag(Category::Activations);
        embed_each(
            ckpt,
            &source,
            calibration,
            config.batch_size,
            config.dtype,
            device,
            &mut |t| inps.push(t),
        )?;
        // The embedding's intermediates (a resident lookup's token ids) go
        // back.
        crate::exec::release_free::<B>(device);
    }
    let rope = Rope::<B>::new(c, config.seqlen, config.dtype.burn(), device);
    let act_bytes = (nsamples * config.seqlen * c.hidden_size) as u64 * config.dtype.size();
    let mut components = BTreeMap::new();
    let where_ = match inps.offloaded() {
        true => "calibration_inputs (host)",
        false => "calibration_inputs",
    };
    components.insert(where_.to_string(), act_bytes);
    if let Source::Resident(_) = source {
        components.insert("weights".to_string(), c.param_count() * config.dtype.size());
    }
    profiler.components(stages::BEFORE_PRUNING, components.clone());
    profiler.stage(stages::BEFORE_PRUNING);

    let pass = LayerPass {
        ckpt,
        config,
        device,
        profiler,
        rope,
        kind,
        nsamples,
        components,
        streamed: matches!(source, Source::Streamed),
    };
    let mut layers = Vec::with_capacity(c.num_layers);
    // On a device, a reader thread reads and converts the next layer while
    // the device computes this one (`model::prefetch`).
    let prefetch = pass.streamed && B::is_device();
    prefetch::for_each_layer(ckpt, config.dtype, prefetch, |i, ready| {
        let keep = kept.as_deref_mut();
        let w = writer.as_deref_mut();
        layers.push(pass.layer(i, &mut source, &mut inps, w, keep, ready)?);
        Ok::<_, PruneError>(())
    })?;
    drop(inps);
    profiler.stage(stages::AFTER_PRUNING);
    Ok(PruneOutcome {
        layers,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// What every layer of one pruning run shares.
struct LayerPass<'a, B: Compute> {
    ckpt: &'a Checkpoint,
    config: &'a PruneConfig,
    device: &'a B::Device,
    profiler: &'a Profiler,
    rope: Rope<B>,
    kind: Option<Needs>,
    nsamples: usize,
    /// The run-wide components (calibration inputs, resident weights).
    components: BTreeMap<String, u64>,
    streamed: bool,
}

impl<B: Compute> LayerPass<'_, B> {
    /// Layer `i`: statistics pass, pruning, output pass (in place in
    /// `inps`), the rest of its tensors copied to the writer.
    fn layer(
        &self,
        i: usize,
        source: &mut Source<'_, B>,
        inps: &mut Activations<B>,
        mut writer: Option<&mut PrunedWriter>,
        kept: Option<&mut (dyn PrunedLayers<B> + '_)>,
        ready: Option<prefetch::HostLayer>,
    ) -> Result<LayerReport, PruneError> {
        let (ckpt, config, device, profiler) = (self.ckpt, self.config, self.device, self.profiler);
        let c = &ckpt.config;
        let layer_start = Instant::now();
        let traffic = crate::exec::dist::reducer().traffic();
        crate::exec::give_back::<B>(device);
        let _scope = profiler.scope(&stages::layer(i));
        let mut owned = None;
        let mut _held = None;
        let layer: &mut DecoderLayer<B> = match source {
            Source::Resident(m) => &mut m.model.layers[i],
            Source::Streamed => {
                let (layer, held) = streamed_layer::<B>(ckpt, i, ready, config.dtype, device)?;
                _held = Some(held);
                owned.insert(layer)
            }
        };
        let mut stats = self.kind.map(LayerStats::<B>::new);
        if let Some(stats) = stats.as_mut() {
            self.statistics_pass(i, layer, inps, stats)?;
        }
        profiler.components(
            &stages::layer_stats(i),
            self.components_with(stats.as_ref()),
        );
        // What the pass freed goes back before the stage reads the pool
        // (`exec::cube`): reserved follows what is in use.
        crate::exec::release_free::<B>(device);
        profiler.stage(&stages::layer_stats(i));
        let target = LayerTarget {
            ckpt,
            index: i,
            config,
            device,
        };
        let linears = {
            let _phase = timing::phase(timing::Phase::Prune);
            prune_linears(layer, &target, stats, self.nsamples, writer.as_deref_mut())?
        };
        crate::exec::give_back::<B>(device);
        profiler.stage(&stages::layer_pruned(i));
        profiler.device_tick(|| format!("model.layers.{i} pruned"))?;
        if self.kind.is_some() && i + 1 < c.num_layers {
            self.output_pass(i, layer, inps)?;
        }
        if let Some(w) = writer {
            let _phase = timing::phase(timing::Phase::Write);
            let _io = timing::work(Work::Io);
            w.copy_rest(ckpt, &format!("model.layers.{i}."))?;
        }
        if let (Some(kept), Some(layer)) = (kept, owned) {
            // The layer's bytes move from this layer's guard to the
            // store's (or the evaluation's, while it runs the layer).
            drop(_held.take());
            kept.take(i, layer, &self.rope)?;
        }
        // What this layer's passes freed goes back to the driver before
        // the next layer allocates (`exec::cube`).
        crate::exec::release_free::<B>(device);
        profiler.progress("pruning", i, c.num_layers, &format!("model.layers.{i}"));
        let (bytes, seconds) = crate::exec::dist::reducer().traffic();
        Ok(LayerReport {
            index: i,
            seconds: layer_start.elapsed().as_secs_f64(),
            linears,
            reduced_bytes: bytes - traffic.0,
            reduction_seconds: seconds - traffic.1,
        })
    }

    /// Layer `i`'s statistics pass: every calibration batch through the
    /// layer, its linears' inputs observed by `stats`.
    fn statistics_pass(
        &self,
        i: usize,
        layer: &DecoderLayer<B>,
        inps: &mut Activations<B>,
        stats: &mut LayerStats<B>,
    ) -> Result<(), PruneError> {
        self.each_batch(
            i,
            inps,
            (timing::Phase::StatsPass, "statistics pass"),
            |x| {
                let _ = layer.forward_traced(x, &self.rope, &mut |k, t| {
                    let _tag = tag::tag(Category::Statistics);
                    let _span = timing::work(Work::Statistics);
                    stats.observe(k, t)
                });
                None
            },
        )
    }

    /// The run's components at a layer's statistics stage: the run-wide
    /// ones, a streamed layer's weights and the layer's statistics.
    fn components_with(&self, stats: Option<&LayerStats<B>>) -> BTreeMap<String, u64> {
        let (c, config) = (&self.ckpt.config, self.config);
        let mut comp = self.components.clone();
        if self.streamed {
            let bytes = c.layer_param_count() * config.dtype.size();
            comp.insert("weights".to_string(), bytes);
        }
        if let Some(s) = stats {
            comp.insert("statistics".to_string(), s.bytes());
            if config.dsnot.is_some() {
                comp.insert("dsnot_moments".to_string(), s.moment_bytes());
            }
        }
        comp
    }

    /// Layer `i`'s output pass: every batch through the pruned layer, in
    /// place in `inps`, the next layer's inputs.
    fn output_pass(
        &self,
        i: usize,
        layer: &DecoderLayer<B>,
        inps: &mut Activations<B>,
    ) -> Result<(), PruneError> {
        self.each_batch(i, inps, (timing::Phase::OutputPass, "output pass"), |x| {
            Some(layer.forward(x, &self.rope))
        })
    }

    /// One pass of layer `i` over every batch of `inps`: `step`'s output,
    /// where it gives one, replaces the batch. The pool's free buffers go
    /// back when the batch shape changes (`exec::BatchShapes`).
    fn each_batch(
        &self,
        i: usize,
        inps: &mut Activations<B>,
        (phase, what): (timing::Phase, &str),
        mut step: impl FnMut(Tensor<B, 3>) -> Option<Tensor<B, 3>>,
    ) -> Result<(), PruneError> {
        let _phase = timing::phase(phase);
        let _tag = tag::tag(Category::Activations);
        let mut shapes = crate::exec::BatchShapes::default();
        for j in 0..inps.len() {
            let x = inps.get(j);
            shapes.next::<B>(&x.dims(), self.device);
            if let Some(y) = step(x) {
                inps.set(j, y);
            }
            self.profiler
                .device_tick(|| format!("model.layers.{i} {what}"))?;
        }
        Ok(())
    }
}
