//! Step 6: the pruned model, written tensor by tensor from the read-only
//! checkpoint with the pruned positions zeroed. Every other weight is the
//! checkpoint's own bytes, so restoring is exact by construction. When
//! nothing is saved, the pruned decoder layers go to the evaluation
//! instead, each as it is zeroed (`model::inline_eval`) or kept for it
//! (`model::kept`): no scratch checkpoint.

use super::resident::Resident;
use super::{Masks, Target, on_device, select};
use crate::exec::Compute;
use crate::memory::held::Held;
use crate::memory::tag::Category;
use crate::model::Checkpoint;
use crate::model::Rope;
use crate::model::kept::PrunedLayers;
use crate::model::llama::LAYER_LINEARS;
use crate::model::save::PrunedWriter;
use crate::prune::PruneError;
use crate::prune::engine::{LayerReport, LinearReport};

/// Writes every target with `masks` zeroed (and copies the rest); returns
/// per-layer reports of the decoder linears and the reports of the other
/// targets (embeddings, head).
pub fn write_pruned(
    ckpt: &Checkpoint,
    targets: &[Target],
    masks: &Masks,
    writer: &mut PrunedWriter,
) -> Result<(Vec<LayerReport>, Vec<LinearReport>), PruneError> {
    pruned_reports(ckpt, targets, masks, Some(writer))
}

/// The reports [`write_pruned`] returns, with nothing written: for a
/// model neither saved nor evaluated (`--iterative` measured its steps).
pub fn count_pruned(
    ckpt: &Checkpoint,
    targets: &[Target],
    masks: &Masks,
) -> Result<(Vec<LayerReport>, Vec<LinearReport>), PruneError> {
    pruned_reports(ckpt, targets, masks, None)
}

fn pruned_reports(
    ckpt: &Checkpoint,
    targets: &[Target],
    masks: &Masks,
    mut writer: Option<&mut PrunedWriter>,
) -> Result<(Vec<LayerReport>, Vec<LinearReport>), PruneError> {
    let mut layers: Vec<LayerReport> = (0..ckpt.config.num_layers)
        .map(|index| LayerReport {
            index,
            seconds: 0.0,
            linears: Vec::new(),
            reduced_bytes: 0,
            reduction_seconds: 0.0,
        })
        .collect();
    let mut others = Vec::new();
    let phase = match writer {
        Some(_) => crate::timing::Phase::Write,
        None => crate::timing::Phase::Prune,
    };
    let _phase = crate::timing::phase(phase);
    for t in targets {
        let start = std::time::Instant::now();
        let mut w = ckpt.read_f32(&t.name)?;
        if let Some(m) = masks.get(&t.name) {
            select::scale_at(&mut w, m, 0.0);
        }
        let zeros = w.iter().filter(|v| **v == 0.0).count() as u64;
        if let Some(writer) = writer.as_deref_mut() {
            writer.write_f32(ckpt, &t.name, &w)?;
        }
        let report = LinearReport::counts(&t.name, zeros, w.len() as u64);
        match layer_index(&t.name) {
            Some(i) if i < layers.len() => {
                layers[i].linears.push(report);
                layers[i].seconds += start.elapsed().as_secs_f64();
            }
            _ => others.push(report),
        }
    }
    if let Some(writer) = writer {
        for i in 0..ckpt.config.num_layers {
            writer.copy_rest(ckpt, &format!("model.layers.{i}."))?;
        }
    }
    Ok((layers, others))
}

/// A pruned model written to a scratch folder (removed on every exit path), for
/// evaluating masks nobody asked to save.
pub struct Scratch {
    _dir: crate::scratch::Guard,
    /// The complete model folder.
    pub path: std::path::PathBuf,
    /// Per-layer reports of the decoder linears.
    pub layers: Vec<LayerReport>,
    /// Reports of the other targets (embeddings, head).
    pub others: Vec<LinearReport>,
}

impl Scratch {
    /// Zeros over every probed tensor: decoder linears and the others.
    pub fn sparsity(&self) -> f64 {
        crate::prune::engine::sparsity_of(
            self.layers
                .iter()
                .flat_map(|l| &l.linears)
                .chain(&self.others),
        )
    }
}

/// Writes `ckpt` with `masks` zeroed into a scratch folder.
pub fn scratch_model(
    ckpt: &Checkpoint,
    targets: &[Target],
    masks: &Masks,
) -> Result<Scratch, PruneError> {
    let io = |e: std::io::Error| crate::model::ModelError::io(&std::env::temp_dir(), e);
    let dir = crate::scratch::dir("gradprobe").map_err(io)?;
    let mut w = PrunedWriter::create(ckpt, &dir.path().join("model"), false)?;
    let (layers, others) = write_pruned(ckpt, targets, masks, &mut w)?;
    // Renamed into place: a writer dropped unfinished removes its shards.
    let path = w.finish(ckpt)?;
    Ok(Scratch {
        _dir: dir,
        path,
        layers,
        others,
    })
}

fn layer_index(name: &str) -> Option<usize> {
    name.strip_prefix("model.layers.")?
        .split('.')
        .next()?
        .parse()
        .ok()
}

/// Step 6 without a save: each decoder layer in f32 (the evaluation's
/// dtype), its pruned positions zeroed where it is, and handed to `to`:
/// the evaluation, which runs it at once (`rope`: its rotary tables), or a
/// store that keeps it for the evaluation (on the device or in host
/// memory). The values are the scratch checkpoint's: the checkpoint's own,
/// zeroed at the same positions. A layer the probe kept on the device is
/// taken from `resident` and zeroed in place where the probe is done with
/// it (`resident`'s flag: handed over; no second copy, no upload), or
/// shared with it where another step follows; the others are read from the checkpoint. Returns the per-layer reports; every
/// target must be a decoder linear (without `include_embeddings`).
pub(super) fn keep_pruned<B: Compute>(
    ckpt: &Checkpoint,
    targets: &[Target],
    masks: &Masks,
    to: &mut dyn PrunedLayers<B>,
    rope: &Rope<B>,
    device: &B::Device,
    resident: Option<(&Resident<B>, bool)>,
) -> Result<Vec<LayerReport>, PruneError> {
    if let Some(t) = targets.iter().find(|t| layer_index(&t.name).is_none()) {
        return Err(PruneError::Invalid(format!(
            "{} is not a decoder linear: its pruned model cannot be kept by layers",
            t.name
        )));
    }
    let c = &ckpt.config;
    let mut layers = Vec::with_capacity(c.num_layers);
    // Step 6 is the run's `prune` phase; a layer read again, `load_layer`'s.
    let _phase = crate::timing::phase(crate::timing::Phase::Prune);
    for index in 0..c.num_layers {
        let start = std::time::Instant::now();
        // The layer before's pages go back first, as the engine's loop
        // gives them (`prune::engine`).
        crate::memory::alloc::trim();
        // A layer read here is counted as weights until it is handed over
        // (one taken from `resident` is counted there).
        let mut held = None;
        let bytes = c.layer_param_count() * 4;
        let load = || super::pass::load_layer_f32::<B>(ckpt, index, device);
        let mut layer = match resident {
            // The probe is done with its layers: handed over and zeroed
            // where they are.
            Some((r, true)) => r.take(index),
            // Another step follows: the kept layer is shared, and zeroing
            // it makes new tensors (the passes' scatters do the same).
            Some((r, false)) => Some(r.get_or_load(index, bytes, load)?),
            None => None,
        }
        .map_or_else(
            || {
                held = Some(Held::new(Category::Weights, bytes));
                load()
            },
            Ok,
        )?;
        let mut linears = Vec::new();
        for name in LAYER_LINEARS {
            let full = format!("model.layers.{index}.{name}.weight");
            if !targets.iter().any(|t| t.name == full) {
                continue;
            }
            let positions = masks.get(&full).map_or(&[][..], Vec::as_slice);
            let (zeros, params) = on_device::zero_at(&mut layer, name, positions);
            linears.push(LinearReport::counts(&full, zeros, params));
            // The weight it replaced, the zeros' mask and its count, and
            // the positions (at a length of their own) go back before the
            // next linear's and the evaluation's pages are made: the pool
            // keeps one linear's zeroing at a time, not every size's
            // beside the forward's (the 256-wide fixture with 96 windows:
            // the run's reserved peak, step 6's, 10 820 896 → 9 677 056
            // bytes on lavapipe, 2026-11-29).
            crate::exec::release_free::<B>(device);
        }
        // Handed over, it is counted where it goes.
        drop(held);
        to.take(index, layer, rope)?;
        // The forward's pages go back before the next layer's.
        crate::exec::release_free::<B>(device);
        layers.push(LayerReport {
            index,
            seconds: start.elapsed().as_secs_f64(),
            linears,
            reduced_bytes: 0,
            reduction_seconds: 0.0,
        });
    }
    Ok(layers)
}
