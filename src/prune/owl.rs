//! OWL: outlier-weighted layer-wise sparsity (Yin et al., `luuyin/OWL`,
//! `lib/prune_all.py`). A dense pass over the calibration windows measures,
//! per decoder layer, the share of Wanda-metric entries (`|W| ·
//! sqrt(scaler_row)`, all seven linears together) above `M` times their
//! mean; layers with more outliers keep more weights. The ratios are
//! min-max scaled to `[0, 2λ]`, centred on the target density `1 − s`, and
//! each layer is then pruned at `1 − density` by the chosen method.
//!
//! The authors' code lifts a sparsity at or below 0 to 0.01; prunemem also
//! caps one at or above 1 to 0.99, and says which layers were clamped. With
//! every layer's ratio equal (their code divides by zero) every layer keeps
//! the target.

use burn::prelude::*;

use super::engine::{PruneConfig, Source, embed_windows, streamed_layer, weight_out_in};
use super::methods::wanda_metric;
use super::stats::{LayerStats, Needs};
use super::{LayerMethod, PruneError, on_device};
use crate::events::stages;
use crate::exec::{Compute, copies, reduce};
use crate::memory::held::{self, Held};
use crate::memory::tag::{self, Category};
use crate::model::llama::{DecoderLayer, LinearInput};
use crate::model::{Checkpoint, Rope, prefetch};
use crate::profiler::Profiler;
use crate::timing::{self, Phase};

/// OWL's hyper-parameters, with the authors' defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OwlConfig {
    /// λ: half the spread of the layer densities around the target.
    pub lambda: f64,
    /// M: an entry is an outlier above M times the layer's mean metric.
    pub m: f64,
}

impl Default for OwlConfig {
    fn default() -> Self {
        Self {
            lambda: 0.08,
            m: 3.0,
        }
    }
}

/// Percent of `metrics`' entries (taken together) above `m` × their mean.
pub fn outlier_ratio(metrics: &[Vec<f32>], m: f64) -> f64 {
    let n: usize = metrics.iter().map(Vec::len).sum();
    if n == 0 {
        return 0.0;
    }
    let sum: f64 = metrics.iter().flatten().map(|v| *v as f64).sum();
    let threshold = (sum / n as f64 * m) as f32;
    let count = metrics.iter().flatten().filter(|v| **v > threshold).count();
    100.0 * count as f64 / n as f64
}

/// Per-layer sparsities from outlier ratios, and the layers whose
/// sparsity had to be clamped into (0, 1).
pub fn layer_sparsities(ratios: &[f64], sparsity: f64, lambda: f64) -> (Vec<f64>, Vec<usize>) {
    let (lo, hi) = ratios
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), r| {
            (a.min(*r), b.max(*r))
        });
    if ratios.is_empty() || hi.partial_cmp(&lo) != Some(std::cmp::Ordering::Greater) {
        return (vec![sparsity; ratios.len()], Vec::new());
    }
    let scaled: Vec<f64> = ratios
        .iter()
        .map(|r| (r - lo) / (hi - lo) * lambda * 2.0)
        .collect();
    let mean = scaled.iter().sum::<f64>() / scaled.len() as f64;
    let mut clamped = Vec::new();
    let out = scaled
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let s = 1.0 - (d - mean + (1.0 - sparsity));
            if s <= 0.0 {
                clamped.push(i);
                0.01
            } else if s >= 1.0 {
                clamped.push(i);
                0.99
            } else {
                s
            }
        })
        .collect();
    (out, clamped)
}

/// The dense pass: each layer's outlier ratio, layer by layer (streamed or
/// resident), the calibration activations carried through the unpruned
/// layers. Streamed on a device, the next layer is read and converted on a
/// host thread meanwhile (`model::prefetch`, the prune's reader), and the
/// ratio is computed where the weights are ([`device_ratio`]).
pub fn outlier_pass<B: Compute>(
    ckpt: &Checkpoint,
    source: &Source<'_, B>,
    config: &PruneConfig,
    calibration: &[Vec<u32>],
    owl: OwlConfig,
    device: &B::Device,
    profiler: &Profiler,
) -> Result<Vec<f64>, PruneError> {
    let c = &ckpt.config;
    let _scope = profiler.scope(stages::OWL_SCOPE);
    let nsamples = crate::exec::dist::global_count(calibration.len());
    let mut inps = tag::tagged(Category::Activations, || {
        embed_windows(
            ckpt,
            source,
            calibration,
            config.batch_size,
            config.dtype,
            device,
        )
    })?;
    // Same shapes in, same shapes out: the batches' bytes hold steady.
    let _inps_held = Held::new(
        Category::Activations,
        inps.iter().map(held::tensor_bytes).sum(),
    );
    let rope = Rope::<B>::new(c, config.seqlen, config.dtype.burn(), device);
    let mut ratios = Vec::with_capacity(c.num_layers);
    let ahead = matches!(source, Source::Streamed) && B::is_device();
    prefetch::for_each_layer(ckpt, config.dtype, ahead, |i, ready| {
        crate::exec::give_back::<B>(device);
        let owned;
        let mut _held = None;
        let layer = match source {
            Source::Resident(m) => &m.model.layers[i],
            Source::Streamed => {
                let (layer, held) = streamed_layer::<B>(ckpt, i, ready, config.dtype, device)?;
                (owned, _held) = (layer, Some(held));
                &owned
            }
        };
        let _phase = timing::phase(Phase::Outliers);
        let mut stats = LayerStats::<B>::new(Needs::NORMS);
        {
            let _tag = tag::tag(Category::Activations);
            let mut shapes = crate::exec::BatchShapes::default();
            for x in inps.iter_mut() {
                shapes.next::<B>(&x.dims(), device);
                *x = layer.forward_traced(x.clone(), &rope, &mut |k, t| {
                    let _tag = tag::tag(Category::Statistics);
                    stats.observe(k, t)
                });
            }
        }
        // The forward's pages go back before the metrics make their own
        // (cubecl's pool keeps a freed buffer for its size only).
        crate::exec::release_free::<B>(device);
        let _tag = tag::tag(Category::Statistics);
        let _work = timing::work(timing::Work::Selection);
        ratios.push(match B::is_device() {
            true => device_ratio(layer, &mut stats, nsamples, owl.m),
            false => host_ratio(layer, &mut stats, nsamples, owl.m),
        });
        profiler.progress(
            "OWL outliers",
            i,
            c.num_layers,
            &format!("OWL outliers, model.layers.{i}"),
        );
        Ok::<_, PruneError>(())
    })?;
    // The pass's hidden states go, and the blocks the allocator cached for
    // them: they had stayed resident while calibration read the embedding
    // (2.3 MiB over the pass's own peak on owl-wanda-h768-l3, 2026-11-26).
    drop((inps, _inps_held, rope));
    crate::memory::alloc::trim();
    profiler.stage(stages::OWL_RATIOS);
    Ok(ratios)
}

/// A layer's outlier ratio on the host: the seven linears' Wanda metrics as
/// f32 vectors ([`outlier_ratio`]), as the authors compute it.
fn host_ratio<B: Compute>(
    layer: &DecoderLayer<B>,
    stats: &mut LayerStats<B>,
    nsamples: usize,
    m: f64,
) -> f64 {
    let mut metrics = Vec::with_capacity(7);
    for input in LinearInput::ALL {
        let Some(norms) = stats.finish(input, nsamples).and_then(|s| s.norms) else {
            continue;
        };
        for name in input.linears() {
            let (w, _, inp) = weight_out_in(layer, name);
            metrics.push(wanda_metric(&w, inp, &norms));
        }
    }
    outlier_ratio(&metrics, m)
}

/// A layer's outlier ratio where its weights are: each linear's Wanda
/// metric (`prune::on_device::metric`) summed per output on the device,
/// the sums read back (4 bytes an output) and added in f64 for the mean,
/// then the metric made again and its entries above `m` × the mean counted
/// there (one count a linear). Nothing weight-sized crosses the bus; the
/// mean differs from the host's f64 sum by the f32 sums' rounding.
fn device_ratio<B: Compute>(
    layer: &DecoderLayer<B>,
    stats: &mut LayerStats<B>,
    nsamples: usize,
    m: f64,
) -> f64 {
    let mut parts = Vec::with_capacity(7);
    for input in LinearInput::ALL {
        let Some(norms) = stats.finish_norms(input, nsamples) else {
            continue;
        };
        for name in input.linears() {
            if let Some(lin) = layer.linear(name) {
                parts.push((lin.weight.val(), norms.clone()));
            }
        }
    }
    let metric = |w: &Tensor<B, 2>, norms: &Tensor<B, 1>| {
        on_device::metric(w, Some(norms), LayerMethod::Wanda, 0.0)
    };
    let (mut sum, mut n) = (0f64, 0u64);
    for (w, norms) in &parts {
        let [inp, out] = w.dims();
        n += (inp * out) as u64;
        let per_output = reduce::sum_dim(metric(w, norms), 0);
        sum += copies::f32s_to_host(per_output)
            .iter()
            .map(|v| *v as f64)
            .sum::<f64>();
    }
    if n == 0 {
        return 0.0;
    }
    let threshold = (sum / n as f64 * m) as f32;
    let mut count = 0u64;
    for (w, norms) in &parts {
        let above = metric(w, norms).greater_elem(threshold).int();
        count += on_device::read_count(reduce::sum_all(above).reshape([1]));
    }
    100.0 * count as f64 / n as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_follow_the_authors_formula() {
        // Three layers, outlier ratios 1, 2, 3 (%): scaled to 0, λ, 2λ,
        // centred on the density 1 − s.
        let (s, clamped) = layer_sparsities(&[1.0, 2.0, 3.0], 0.5, 0.08);
        let want = [0.58, 0.5, 0.42];
        for (a, b) in s.iter().zip(want) {
            assert!((a - b).abs() < 1e-12, "{s:?}");
        }
        assert!(clamped.is_empty());
        // Mean sparsity stays the target.
        assert!((s.iter().sum::<f64>() / 3.0 - 0.5).abs() < 1e-12);
    }

    #[test]
    fn out_of_range_sparsities_are_clamped_and_named() {
        let (s, clamped) = layer_sparsities(&[0.0, 10.0], 0.95, 0.2);
        // 0.95 ± 0.2 → 1.15 (capped 0.99) and 0.75.
        assert_eq!(clamped, vec![0]);
        assert_eq!(s[0], 0.99);
        let (s, clamped) = layer_sparsities(&[0.0, 10.0], 0.05, 0.2);
        assert_eq!(clamped, vec![1]);
        assert_eq!(s[1], 0.01);
        let (s, clamped) = layer_sparsities(&[2.0, 2.0], 0.5, 0.08);
        assert_eq!((s, clamped), (vec![0.5, 0.5], vec![]));
    }

    #[test]
    fn outliers_are_counted_over_every_linear_together() {
        let m = vec![vec![1.0f32, 1.0, 1.0, 9.0], vec![1.0, 1.0, 1.0, 1.0]];
        // mean 2, threshold 3 × 2 = 6: one of eight.
        assert_eq!(outlier_ratio(&m, 3.0), 12.5);
    }
}
