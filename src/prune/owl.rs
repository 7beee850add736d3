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

use crate::exec::Compute;

use super::PruneError;
use super::engine::{PruneConfig, Source, embed_windows, weight_out_in};
use super::methods::wanda_metric;
use super::stats::{LayerStats, Needs};
use crate::events::stages;
use crate::memory::held::{self, Held};
use crate::memory::tag::{self, Category};
use crate::model::llama::LinearInput;
use crate::model::{Checkpoint, Rope};
use crate::profiler::Profiler;

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
/// layers.
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
    for i in 0..c.num_layers {
        crate::memory::alloc::trim();
        let owned;
        let mut _held = None;
        let layer = match source {
            Source::Resident(m) => &m.model.layers[i],
            Source::Streamed => {
                owned = ckpt.load_layer::<B>(i, config.dtype, device)?;
                let bytes = c.layer_param_count() * config.dtype.size();
                _held = Some(Held::new(Category::Weights, bytes));
                &owned
            }
        };
        let mut stats = LayerStats::<B>::new(Needs::NORMS);
        {
            let _tag = tag::tag(Category::Activations);
            for x in inps.iter_mut() {
                *x = layer.forward_traced(x.clone(), &rope, &mut |k, t| {
                    let _tag = tag::tag(Category::Statistics);
                    stats.observe(k, t)
                });
            }
        }
        let _tag = tag::tag(Category::Statistics);
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
        ratios.push(outlier_ratio(&metrics, owl.m));
        drop(metrics);
        profiler.progress(
            "OWL outliers",
            i,
            c.num_layers,
            &format!("OWL outliers, model.layers.{i}"),
        );
    }
    // The pass's hidden states go, and the blocks the allocator cached for
    // them: they had stayed resident while calibration read the embedding
    // (2.3 MiB over the pass's own peak on owl-wanda-h768-l3, 2026-11-26).
    drop((inps, _inps_held, rope));
    crate::memory::alloc::trim();
    profiler.stage(stages::OWL_RATIOS);
    Ok(ratios)
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
