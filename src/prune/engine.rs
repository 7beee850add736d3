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

use std::collections::BTreeMap;
use std::time::Instant;

use burn::module::Param;
use burn::prelude::*;

use super::dsnot::{self, DsnotInputs, DsnotOptions, DsnotReport};
use super::methods::{apply_mask, magnitude_mask, ria_mask, ria_metric, wanda_mask, wanda_metric};
use super::reallocation::{ReallocationReport, reallocated_nm_mask};
use super::sparsegpt::{SparseGptOptions, fasterprune};
use super::stats::{LayerStats, Needs, Stat};
use super::{LayerMethod, Pattern, PruneError};
use crate::events::stages;
use crate::memory::tag::{self, Category, tagged};
use crate::model::llama::{DecoderLayer, LinearInput};
use crate::model::perplexity::token_tensor;
use crate::model::save::PrunedWriter;
use crate::model::{Checkpoint, ComputeDtype, Llama, Rope};
use crate::profiler::Profiler;
use crate::timing::{self, Work};

/// How to prune.
#[derive(Debug, Clone)]
pub struct PruneConfig {
    pub method: LayerMethod,
    pub sparsity: f64,
    pub pattern: Pattern,
    pub use_variant: bool,
    pub seqlen: usize,
    /// Windows per forward pass.
    pub batch_size: usize,
    pub dtype: ComputeDtype,
    /// SparseGPT dampening (fraction of the mean Hessian diagonal).
    pub percdamp: f64,
    /// SparseGPT column block size.
    pub blocksize: usize,
    /// RIA: the activation exponent `a` (0.5 in the paper).
    pub ria_a: f64,
    /// RIA, unstructured: per output row (Wanda's comparison group)
    /// instead of one threshold over the matrix.
    pub per_outneuron: bool,
    /// Per-layer sparsities (OWL); `None`: `sparsity` everywhere.
    pub layer_sparsity: Option<Vec<f64>>,
    /// DSnoT's mask refinement after the method's metric.
    pub dsnot: Option<DsnotOptions>,
    /// RIA, N:M: channel reallocation (`Some(lsa)`: with the assignment rounds).
    pub reallocation: Option<bool>,
}

impl PruneConfig {
    /// The sparsity of decoder layer `i`.
    pub fn sparsity_of(&self, i: usize) -> f64 {
        self.layer_sparsity
            .as_ref()
            .and_then(|v| v.get(i).copied())
            .unwrap_or(self.sparsity)
    }
}

/// What pruning one linear did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LinearReport {
    pub name: String,
    pub zeros: u64,
    pub params: u64,
    /// Wanda variant: the α found.
    pub alpha: Option<f64>,
    /// SparseGPT: the reconstruction error it reports.
    pub error: Option<f64>,
    /// DSnoT: cycles run and weights swapped (absent where it skipped).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dsnot: Option<DsnotReport>,
    /// RIA's channel reallocation: metric kept before and after.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reallocation: Option<ReallocationReport>,
}

/// What pruning one decoder layer did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LayerReport {
    pub index: usize,
    pub seconds: f64,
    pub linears: Vec<LinearReport>,
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
pub enum Source<'a, B: Backend> {
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
pub fn embed_windows<B: Backend>(
    ckpt: &Checkpoint,
    source: &Source<'_, B>,
    windows: &[Vec<u32>],
    batch_size: usize,
    dtype: ComputeDtype,
    device: &B::Device,
) -> Result<Vec<Tensor<B, 3>>, PruneError> {
    let loaded;
    let embed = match source {
        Source::Resident(m) => &m.model.embed_tokens,
        Source::Streamed => {
            loaded = ckpt.load_embedding::<B>(dtype, device)?;
            &loaded
        }
    };
    Ok(windows
        .chunks(batch_size.max(1))
        .map(|batch| embed.forward(token_tensor(batch, device)))
        .collect())
}

/// Prunes every decoder layer of `ckpt` (or of the resident model), writing
/// pruned layers to `writer` when given.
pub fn prune<B: Backend>(
    ckpt: &Checkpoint,
    mut source: Source<'_, B>,
    config: &PruneConfig,
    calibration: &[Vec<u32>],
    mut writer: Option<&mut PrunedWriter>,
    device: &B::Device,
    profiler: &Profiler,
) -> Result<PruneOutcome, PruneError> {
    let start = Instant::now();
    let c = &ckpt.config;
    let kind = needs(config);
    let nsamples = calibration.len();
    let mut inps = match kind {
        Some(_) => {
            let _tag = tag::tag(Category::Activations);
            embed_windows(
                ckpt,
                &source,
                calibration,
                config.batch_size,
                config.dtype,
                device,
            )?
        }
        None => Vec::new(),
    };
    let rope = Rope::<B>::new(c, config.seqlen, config.dtype.burn(), device);
    let act_bytes = (nsamples * config.seqlen * c.hidden_size) as u64 * config.dtype.size();
    let mut components = BTreeMap::new();
    components.insert("calibration_inputs".to_string(), act_bytes);
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
    for i in 0..c.num_layers {
        layers.push(pass.layer(i, &mut source, &mut inps, writer.as_deref_mut())?);
    }
    drop(inps);
    profiler.stage(stages::AFTER_PRUNING);
    Ok(PruneOutcome {
        layers,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// What every layer of one pruning run shares.
struct LayerPass<'a, B: Backend> {
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

impl<B: Backend> LayerPass<'_, B> {
    /// Layer `i`: statistics pass, pruning, output pass (in place in
    /// `inps`), the rest of its tensors copied to the writer.
    fn layer(
        &self,
        i: usize,
        source: &mut Source<'_, B>,
        inps: &mut [Tensor<B, 3>],
        mut writer: Option<&mut PrunedWriter>,
    ) -> Result<LayerReport, PruneError> {
        let (ckpt, config, device, profiler) = (self.ckpt, self.config, self.device, self.profiler);
        let c = &ckpt.config;
        let layer_start = Instant::now();
        crate::memory::alloc::trim();
        let _scope = profiler.scope(&stages::layer(i));
        let mut owned;
        let layer: &mut DecoderLayer<B> = match source {
            Source::Resident(m) => &mut m.model.layers[i],
            Source::Streamed => {
                let _phase = timing::phase(timing::Phase::Load);
                owned = ckpt.load_layer::<B>(i, config.dtype, device)?;
                &mut owned
            }
        };
        let mut stats = self.kind.map(LayerStats::<B>::new);
        if let Some(stats) = stats.as_mut() {
            let _phase = timing::phase(timing::Phase::StatsPass);
            let _tag = tag::tag(Category::Activations);
            for x in inps.iter() {
                let _ = layer.forward_traced(x.clone(), &self.rope, &mut |k, t| {
                    let _tag = tag::tag(Category::Statistics);
                    let _span = timing::work(Work::Statistics);
                    stats.observe(k, t)
                });
            }
        }
        let mut comp = self.components.clone();
        if self.streamed {
            let bytes = c.layer_param_count() * config.dtype.size();
            comp.insert("weights".to_string(), bytes);
        }
        if let Some(s) = &stats {
            comp.insert("statistics".to_string(), s.bytes());
            if config.dsnot.is_some() {
                comp.insert("dsnot_moments".to_string(), s.moment_bytes());
            }
        }
        profiler.components(&stages::layer_stats(i), comp);
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
        crate::memory::alloc::trim();
        profiler.stage(&stages::layer_pruned(i));
        if self.kind.is_some() && i + 1 < c.num_layers {
            let _phase = timing::phase(timing::Phase::OutputPass);
            let _tag = tag::tag(Category::Activations);
            for x in inps.iter_mut() {
                *x = layer.forward(x.clone(), &self.rope);
            }
        }
        if let Some(w) = writer {
            let _phase = timing::phase(timing::Phase::Write);
            let _io = timing::work(Work::Io);
            w.copy_rest(ckpt, &format!("model.layers.{i}."))?;
        }
        profiler.progress(i, c.num_layers, &format!("model.layers.{i}"));
        Ok(LayerReport {
            index: i,
            seconds: layer_start.elapsed().as_secs_f64(),
            linears,
        })
    }
}

/// Where a layer's linears come from and go.
struct LayerTarget<'a, B: Backend> {
    ckpt: &'a Checkpoint,
    index: usize,
    config: &'a PruneConfig,
    device: &'a B::Device,
}

/// Prunes a layer's seven linears, input group by input group (each
/// group's statistics are finished, used and dropped in turn).
fn prune_linears<B: Backend>(
    layer: &mut DecoderLayer<B>,
    t: &LayerTarget<'_, B>,
    mut stats: Option<LayerStats<B>>,
    nsamples: usize,
    mut writer: Option<&mut PrunedWriter>,
) -> Result<Vec<LinearReport>, PruneError> {
    let mut linears = Vec::with_capacity(7);
    for input in LinearInput::ALL {
        let stat = stats.as_mut().and_then(|s| s.finish(input, nsamples));
        let layer_config;
        let config = match &t.config.layer_sparsity {
            None => t.config,
            Some(_) => {
                layer_config = PruneConfig {
                    sparsity: t.config.sparsity_of(t.index),
                    layer_sparsity: None,
                    ..t.config.clone()
                };
                &layer_config
            }
        };
        for name in input.linears() {
            let full = format!("model.layers.{}.{name}.weight", t.index);
            let w = writer.as_deref_mut();
            let report = prune_linear(
                layer,
                name,
                &full,
                stat.as_ref(),
                config,
                t.device,
                w,
                t.ckpt,
            )?;
            linears.push(report);
        }
    }
    Ok(linears)
}

/// The weight of a linear as host f32 in PyTorch orientation `[out, in]`.
pub fn weight_out_in<B: Backend>(layer: &DecoderLayer<B>, name: &str) -> (Vec<f32>, usize, usize) {
    let Some(lin) = layer.linear(name) else {
        return (Vec::new(), 0, 0);
    };
    let w = lin.weight.val();
    let [inp, out] = w.dims();
    let data = w
        .transpose()
        .into_data()
        .convert_dtype(burn::tensor::DType::F32);
    (data.into_vec().unwrap_or_default(), out, inp)
}

/// Replaces a linear's weight with `values` (`[out, in]`).
pub fn set_weight<B: Backend>(
    layer: &mut DecoderLayer<B>,
    name: &str,
    values: Vec<f32>,
    out: usize,
    inp: usize,
    dtype: ComputeDtype,
    device: &B::Device,
) {
    if let Some(lin) = layer.linear_mut(name) {
        let t =
            Tensor::<B, 2>::from_data(TensorData::new(values, [out, inp]), (device, dtype.burn()));
        lin.weight = Param::from_tensor(t.transpose());
    }
}

#[allow(clippy::too_many_arguments)]
fn prune_linear<B: Backend>(
    layer: &mut DecoderLayer<B>,
    name: &str,
    full_name: &str,
    stat: Option<&Stat>,
    config: &PruneConfig,
    device: &B::Device,
    writer: Option<&mut PrunedWriter>,
    ckpt: &Checkpoint,
) -> Result<LinearReport, PruneError> {
    let (mut w, out, inp) = tagged(Category::Weights, || weight_out_in(layer, name));
    let _tag = tag::tag(Category::Masks);
    // Metrics, sorting, masks; SparseGPT's sweep and the write nest inside.
    let _span = timing::work(Work::Selection);
    let missing = || PruneError::Invalid(format!("{full_name}: no statistics were collected"));
    let norms = stat.and_then(|s| s.norms.as_deref());
    let (mut alpha, mut error, mut refined, mut realloc) = (None, None, None, None);
    if let Some(opts) = &config.dsnot {
        let stat = stat.ok_or_else(missing)?;
        let skip = opts.skips(name);
        let (mask, report) = dsnot_mask(&w, inp, stat, config, opts, skip, full_name)?;
        apply_mask(&mut w, &mask);
        refined = (!skip).then_some(report);
    } else {
        match config.method {
            LayerMethod::Magnitude => {
                let mask = magnitude_mask(&w, inp, config.sparsity, config.pattern);
                apply_mask(&mut w, &mask);
            }
            LayerMethod::Wanda => {
                let norms = norms.ok_or_else(missing)?;
                let metric = tagged(Category::Statistics, || wanda_metric(&w, inp, norms));
                let (mask, a) = wanda_mask(
                    &metric,
                    inp,
                    config.sparsity,
                    config.pattern,
                    config.use_variant,
                );
                apply_mask(&mut w, &mask);
                alpha = a;
            }
            LayerMethod::Ria => {
                let norms = norms.ok_or_else(missing)?;
                let metric = tagged(Category::Statistics, || {
                    ria_metric(&w, inp, norms, config.ria_a)
                });
                let mask = match (config.pattern, config.reallocation) {
                    (Pattern::NM { n, m }, Some(lsa)) => {
                        let (mask, r) = reallocated_nm_mask(&metric, inp, n, m, lsa);
                        realloc = Some(r);
                        mask
                    }
                    _ => ria_mask(
                        &metric,
                        inp,
                        config.sparsity,
                        config.pattern,
                        config.per_outneuron,
                    ),
                };
                apply_mask(&mut w, &mask);
            }
            LayerMethod::SparseGpt => {
                let h = stat.and_then(|s| s.hessian.clone()).ok_or_else(missing)?;
                let options = SparseGptOptions {
                    sparsity: config.sparsity,
                    pattern: config.pattern,
                    percdamp: config.percdamp,
                    blocksize: config.blocksize,
                };
                let _stats = tag::tag(Category::Statistics);
                let _sweep = timing::work(Work::Sweep);
                let r = fasterprune(&w, out, inp, h, options)
                    .map_err(|e| not_positive_definite(full_name, e))?;
                w = r.weight;
                error = Some(r.error);
            }
        }
    }
    let zeros = w.iter().filter(|v| **v == 0.0).count() as u64;
    if let Some(writer) = writer {
        let _io = timing::work(Work::Io);
        writer.write_f32(ckpt, full_name, &w)?;
    }
    set_weight(layer, name, w, out, inp, config.dtype, device);
    Ok(LinearReport {
        name: full_name.to_string(),
        zeros,
        params: (out * inp) as u64,
        alpha,
        error,
        dsnot: refined,
        reallocation: realloc,
    })
}

fn not_positive_definite(name: &str, e: super::linalg::NotPositiveDefinite) -> PruneError {
    PruneError::NotPositiveDefinite {
        name: name.to_string(),
        index: e.index,
        value: e.value,
    }
}

/// DSnoT's mask: the method's metric as the first mask (per row, or per
/// N:M group), refined by the swap loop unless the linear is skipped.
/// SparseGPT contributes its saliency only, as in the authors' code: no
/// weight update.
fn dsnot_mask(
    w: &[f32],
    cols: usize,
    stat: &Stat,
    config: &PruneConfig,
    opts: &DsnotOptions,
    skip: bool,
    full_name: &str,
) -> Result<(Vec<bool>, DsnotReport), PruneError> {
    let missing = || PruneError::Invalid(format!("{full_name}: no statistics were collected"));
    let (norms, moments) = match (&stat.norms, &stat.moments) {
        (Some(n), Some(m)) => (n, m),
        _ => return Err(missing()),
    };
    let _stats = tag::tag(Category::Statistics);
    let wanda = wanda_metric(w, cols, norms);
    let initial = match config.method {
        LayerMethod::Wanda => None,
        LayerMethod::Magnitude => Some(w.iter().map(|v| v.abs()).collect()),
        LayerMethod::Ria => Some(ria_metric(w, cols, norms, config.ria_a)),
        LayerMethod::SparseGpt => {
            let h = stat.hessian.clone().ok_or_else(missing)?;
            Some(
                dsnot::sparsegpt_metric(w, cols, h, config.percdamp)
                    .map_err(|e| not_positive_definite(full_name, e))?,
            )
        }
    };
    let inputs = DsnotInputs {
        w,
        cols,
        initial: initial.as_deref().unwrap_or(&wanda),
        wanda: &wanda,
        mean: &moments.mean,
        var: &moments.var,
    };
    let _refine = timing::work(Work::Refine);
    Ok(match config.pattern {
        Pattern::Unstructured => dsnot::refine_unstructured(&inputs, config.sparsity, opts, skip),
        Pattern::NM { n, m } => dsnot::refine_nm(&inputs, n, m, opts, skip),
    })
}
