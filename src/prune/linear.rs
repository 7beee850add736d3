//! Pruning one decoder layer's linears on the host: each weight in PyTorch
//! orientation, the method's metric and mask (or SparseGPT's sweep, or
//! DSnoT's refinement), the write, and the weight put back into the layer.

use crate::exec::Compute;
use burn::module::Param;
use burn::prelude::*;

use super::config::{LinearReport, PruneConfig};
use super::dsnot::{self, DsnotInputs, DsnotOptions, DsnotReport};
use super::dsnot_device;
use super::factor_device::Saliency;
use super::methods::{apply_mask, magnitude_mask, ria_mask, ria_metric, wanda_mask, wanda_metric};
use super::on_device;
use super::reallocation::reallocated_nm_mask;
use super::reallocation_device::nm_mask_reallocated;
use super::sparsegpt::{SparseGptOptions, fasterprune};
use super::sparsegpt_device::Factored;
use super::stats::{LayerStats, Stat};
use super::variant_device::wanda_variant_mask;
use super::{LayerMethod, Pattern, PruneError};
use crate::memory::tag::{self, Category, tagged};
use crate::model::llama::{DecoderLayer, LinearInput};
use crate::model::save::PrunedWriter;
use crate::model::{Checkpoint, ComputeDtype};
use crate::timing::{self, Work};

mod group;
use group::Group;

/// Where a layer's linears come from and go.
pub(super) struct LayerTarget<'a, B: Compute> {
    pub ckpt: &'a Checkpoint,
    pub index: usize,
    pub config: &'a PruneConfig,
    pub device: &'a B::Device,
}

/// Prunes a layer's seven linears, input group by input group (each
/// group's statistics are finished, used and dropped in turn).
pub(super) fn prune_linears<B: Compute>(
    layer: &mut DecoderLayer<B>,
    t: &LayerTarget<'_, B>,
    mut stats: Option<LayerStats<B>>,
    nsamples: usize,
    mut writer: Option<&mut PrunedWriter>,
) -> Result<Vec<LinearReport>, PruneError> {
    let mut linears = Vec::with_capacity(7);
    for input in LinearInput::ALL {
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
        let inputs = input
            .linears()
            .first()
            .and_then(|n| layer.linear(n))
            .map_or(0, |l| l.weight.dims()[0]);
        let group = Group {
            target: t,
            input,
            config,
            nsamples,
        };
        let w = writer.as_deref_mut();
        let reports = if B::is_device() && on_device::handles(config, inputs) {
            group.on_device(layer, stats.as_mut(), w)?
        } else if B::is_device()
            && config.method == LayerMethod::SparseGpt
            && config.dsnot.is_none()
        {
            group.sparsegpt_on_device(layer, stats.as_mut(), w)?
        } else {
            group.on_host(layer, stats.as_mut(), w)?
        };
        linears.extend(reports);
    }
    Ok(linears)
}

/// `input`'s `Hinv` for SparseGPT's device sweep, factored on the device
/// (`None`: no Hessian was collected).
fn factored<B: Compute>(
    stats: Option<&mut LayerStats<B>>,
    input: LinearInput,
    nsamples: usize,
    config: &PruneConfig,
) -> Option<Result<Factored<B>, super::linalg::NotPositiveDefinite>> {
    let h = stats?.finish_hessian(input, nsamples)?;
    Some(Factored::on_device(h, config.percdamp, config.blocksize))
}

/// The weight of a linear as host f32 in PyTorch orientation `[out, in]`.
pub fn weight_out_in<B: Compute>(layer: &DecoderLayer<B>, name: &str) -> (Vec<f32>, usize, usize) {
    let Some(lin) = layer.linear(name) else {
        return (Vec::new(), 0, 0);
    };
    let w = lin.weight.val();
    let [inp, out] = w.dims();
    let data = w.transpose().into_data();
    if B::is_device() {
        crate::exec::transfer::read_back(data.bytes.len() as u64);
    }
    let data = data.convert_dtype(burn::tensor::DType::F32);
    (data.into_vec().unwrap_or_default(), out, inp)
}

/// Replaces a linear's weight with `values` (`[out, in]`).
pub fn set_weight<B: Compute>(
    layer: &mut DecoderLayer<B>,
    name: &str,
    values: Vec<f32>,
    out: usize,
    inp: usize,
    dtype: ComputeDtype,
    device: &B::Device,
) {
    if let Some(lin) = layer.linear_mut(name) {
        if B::is_device() {
            crate::exec::transfer::uploaded((out * inp) as u64 * dtype.size());
        }
        let t =
            Tensor::<B, 2>::from_data(TensorData::new(values, [out, inp]), (device, dtype.burn()));
        // The pruned copy is up beside the weight it replaces.
        crate::exec::watch::after_op();
        lin.weight = Param::from_tensor(t.transpose());
    }
}

#[allow(clippy::too_many_arguments)]
fn prune_linear<B: Compute>(
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

/// An input's statistics where the device path reads them: `scaler_row`
/// and, for DSnoT, the inputs' mean and variance.
struct DeviceStat<'a, B: Compute> {
    norms: Option<&'a Tensor<B, 1>>,
    moments: Option<&'a (Tensor<B, 1>, Tensor<B, 1>)>,
    /// DSnoT from SparseGPT's saliency: `diag(Hinv)²` and the dead inputs.
    saliency: Option<&'a Saliency<B>>,
}

/// `input`'s [`Saliency`]: its Hessian factored where it is (step 1).
fn saliency<B: Compute>(
    stats: Option<&mut LayerStats<B>>,
    input: LinearInput,
    nsamples: usize,
    config: &PruneConfig,
    first: &str,
) -> Result<Saliency<B>, PruneError> {
    let h = stats
        .and_then(|s| s.finish_hessian(input, nsamples))
        .ok_or_else(|| PruneError::Invalid(format!("{first}: no statistics were collected")))?;
    Saliency::of(h, config.percdamp, config.blocksize).map_err(|e| not_positive_definite(first, e))
}

/// One linear pruned where its weight is (`on_device`, DSnoT's loop in
/// `dsnot_device`): metric, selection and mask as device ops; a few counts
/// read back, and with `--save` the pruned weight in the compute dtype for
/// the writer.
fn prune_on_device<B: Compute>(
    layer: &mut DecoderLayer<B>,
    name: &str,
    full_name: &str,
    stat: &DeviceStat<'_, B>,
    config: &PruneConfig,
    writer: Option<&mut PrunedWriter>,
    ckpt: &Checkpoint,
) -> Result<LinearReport, PruneError> {
    let Some(lin) = layer.linear_mut(name) else {
        return Err(PruneError::Invalid(format!("{full_name}: no such linear")));
    };
    let needs_norms =
        matches!(config.method, LayerMethod::Wanda | LayerMethod::Ria) || config.dsnot.is_some();
    let missing =
        (needs_norms && stat.norms.is_none()) || (config.dsnot.is_some() && stat.moments.is_none());
    if missing {
        return Err(PruneError::Invalid(format!(
            "{full_name}: no statistics were collected"
        )));
    }
    let w = lin.weight.val();
    let [inp, out] = w.dims();
    let (mut realloc, mut alpha) = (None, None);
    let (pruned, zeros, refined) = {
        let _tag = tag::tag(Category::Masks);
        let _span = timing::work(Work::Selection);
        let (mask, refined) = match (&config.dsnot, stat.moments) {
            (Some(opts), Some((mean, var))) => {
                let skip = opts.skips(name);
                let (mask, report) = dsnot_on_device(&w, stat, mean, var, config, opts, skip);
                (mask, (!skip).then_some(report))
            }
            _ => {
                let metric = on_device::metric(&w, stat.norms, config.method, config.ria_a);
                // The f32 metric beside the weight it was computed from.
                crate::exec::watch::after_op();
                match (config.method, config.pattern, config.reallocation) {
                    (LayerMethod::Ria, Pattern::NM { n, m }, Some(lsa)) => {
                        let (mask, r) = nm_mask_reallocated(metric, n, m, lsa);
                        realloc = Some(r);
                        (mask, None)
                    }
                    (LayerMethod::Wanda, Pattern::Unstructured, _) if config.use_variant => {
                        let (mask, a) = wanda_variant_mask(metric, config.sparsity);
                        alpha = Some(a);
                        (mask, None)
                    }
                    _ => (on_device::mask(metric, config), None),
                }
            }
        };
        let (pruned, zeros) = on_device::apply(w, mask);
        (pruned, zeros, refined)
    };
    // The pruned weight beside the one it replaces.
    crate::exec::watch::after_op();
    if let Some(writer) = writer {
        write_from_device(writer, ckpt, full_name, &pruned)?;
    }
    lin.weight = Param::from_tensor(pruned);
    Ok(LinearReport {
        alpha,
        dsnot: refined,
        reallocation: realloc,
        ..LinearReport::counts(full_name, zeros, (out * inp) as u64)
    })
}

/// DSnoT's mask where the weight is: Wanda's metric (the prune order)
/// and the method's (the first mask), then `dsnot_device`'s loop.
fn dsnot_on_device<B: Compute>(
    w: &Tensor<B, 2>,
    stat: &DeviceStat<'_, B>,
    mean: &Tensor<B, 1>,
    var: &Tensor<B, 1>,
    config: &PruneConfig,
    opts: &DsnotOptions,
    skip: bool,
) -> (Tensor<B, 2, burn::tensor::Bool>, DsnotReport) {
    let norms = stat.norms;
    let initial = match stat.saliency {
        Some(s) => s.metric(w),
        None => on_device::metric(w, norms, config.method, config.ria_a),
    };
    // Wanda's metric orders the prune candidates; a skipped linear (first
    // mask only) and Wanda's own first mask need no second one.
    let wanda = match (config.method, skip, config.pattern) {
        (LayerMethod::Wanda, _, _) | (_, true, _) | (_, _, Pattern::NM { .. }) => None,
        _ => Some(on_device::metric(
            w,
            norms,
            LayerMethod::Wanda,
            config.ria_a,
        )),
    };
    let inputs = dsnot_device::DeviceInputs {
        w: crate::model::dtype::to_f32(w.clone()),
        initial,
        wanda,
        mean: mean.clone(),
        var: var.clone(),
    };
    let _refine = timing::work(Work::Refine);
    dsnot_device::refine(inputs, config.pattern, config.sparsity, opts, skip)
}

/// SparseGPT's sweep where the weight is (`sparsegpt_device`), with its
/// input's `Hinv` factored on the host.
fn sparsegpt_on_device<B: Compute>(
    layer: &mut DecoderLayer<B>,
    name: &str,
    full_name: &str,
    hinv: &Factored<B>,
    config: &PruneConfig,
    writer: Option<&mut PrunedWriter>,
    ckpt: &Checkpoint,
) -> Result<LinearReport, PruneError> {
    let Some(lin) = layer.linear_mut(name) else {
        return Err(PruneError::Invalid(format!("{full_name}: no such linear")));
    };
    let w = lin.weight.val();
    let [inp, out] = w.dims();
    let options = SparseGptOptions {
        sparsity: config.sparsity,
        pattern: config.pattern,
        percdamp: config.percdamp,
        blocksize: config.blocksize,
    };
    let r = {
        let _stats = tag::tag(Category::Statistics);
        let _sweep = timing::work(Work::Sweep);
        super::sparsegpt_device::prune(w, hinv, options)
    };
    // The pruned weight beside the one it replaces.
    crate::exec::watch::after_op();
    if let Some(writer) = writer {
        write_from_device(writer, ckpt, full_name, &r.weight)?;
    }
    lin.weight = Param::from_tensor(r.weight);
    Ok(LinearReport {
        error: Some(r.error),
        ..LinearReport::counts(full_name, r.zeros, (out * inp) as u64)
    })
}

/// `--save` on a device: the pruned weight (`[in, out]`) comes back once,
/// in the compute dtype, and is written in the checkpoint's.
fn write_from_device<B: Compute>(
    writer: &mut PrunedWriter,
    ckpt: &Checkpoint,
    full_name: &str,
    weight: &Tensor<B, 2>,
) -> Result<(), PruneError> {
    let _io = timing::work(Work::Io);
    let data = crate::exec::copies::to_host(weight.clone().transpose());
    crate::exec::transfer::read_back(data.bytes.len() as u64);
    let values: Vec<f32> = data
        .convert_dtype(burn::tensor::DType::F32)
        .into_vec()
        .unwrap_or_default();
    Ok(writer.write_f32(ckpt, full_name, &values)?)
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
