//! Step 6: the pruned model, written tensor by tensor from the read-only
//! checkpoint with the pruned positions zeroed. Every other weight is the
//! checkpoint's own bytes, so restoring is exact by construction. On a
//! device, when nothing is saved, the pruned decoder layers are kept for
//! the evaluation instead (`model::kept`): no scratch checkpoint.

use super::resident::Resident;
use super::{Masks, Target, on_device, select};
use crate::exec::Compute;
use crate::model::Checkpoint;
use crate::model::kept::Kept;
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
    let _phase = crate::timing::phase(crate::timing::Phase::Write);
    for t in targets {
        let start = std::time::Instant::now();
        let mut w = ckpt.read_f32(&t.name)?;
        if let Some(m) = masks.get(&t.name) {
            select::scale_at(&mut w, m, 0.0);
        }
        let zeros = w.iter().filter(|v| **v == 0.0).count() as u64;
        writer.write_f32(ckpt, &t.name, &w)?;
        let report = LinearReport::counts(&t.name, zeros, w.len() as u64);
        match layer_index(&t.name) {
            Some(i) if i < layers.len() => {
                layers[i].linears.push(report);
                layers[i].seconds += start.elapsed().as_secs_f64();
            }
            _ => others.push(report),
        }
    }
    for i in 0..ckpt.config.num_layers {
        writer.copy_rest(ckpt, &format!("model.layers.{i}."))?;
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

/// Step 6 on a device without a save: each decoder layer in f32 (the
/// evaluation's dtype), its pruned positions zeroed where it is, and kept
/// in `kept` (on the device or in host memory) for the evaluation. The
/// values are the scratch checkpoint's: the checkpoint's own, zeroed at the
/// same positions. A layer the probe kept on the device is taken from
/// `resident` and zeroed in place (no second copy, no upload); the others
/// are read from the checkpoint. Returns the per-layer reports; every
/// target must be a decoder linear (without `include_embeddings`).
pub(super) fn keep_pruned<B: Compute>(
    ckpt: &Checkpoint,
    targets: &[Target],
    masks: &Masks,
    kept: &mut Kept<B>,
    device: &B::Device,
    resident: Option<&Resident<B>>,
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
        let mut layer = match resident.and_then(|r| r.take(index)) {
            Some(layer) => layer,
            None => super::pass::load_layer_f32::<B>(ckpt, index, device)?,
        };
        let mut linears = Vec::new();
        for name in LAYER_LINEARS {
            let full = format!("model.layers.{index}.{name}.weight");
            if !targets.iter().any(|t| t.name == full) {
                continue;
            }
            let positions = masks.get(&full).map_or(&[][..], Vec::as_slice);
            let (zeros, params) = on_device::zero_at(&mut layer, name, positions);
            linears.push(LinearReport::counts(&full, zeros, params));
        }
        kept.push(layer)?;
        // Each linear's positions went up at a length of their own: their
        // pages go back before the next layer's.
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
