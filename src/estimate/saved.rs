//! What a pruned model weighs on disk: the dense layout (every weight, zeros
//! included) or compressed-tensors' sparse layouts (`model::compressed`),
//! from the architecture alone.

use serde::Serialize;

use super::{Arch, Task, Workload};
use crate::model::compressed::SparseFormat;

/// Tensor bytes of a saved model (the file's header aside), `bytes` per
/// stored element, decoder linears at `sparsity` in `format` (`None`: dense).
pub fn weight_bytes(a: &Arch, bytes: u64, format: Option<SparseFormat>, sparsity: f64) -> u64 {
    let (h, i, q, kv) = (a.hidden, a.intermediate, a.q_dim(), a.kv_dim());
    // (rows, cols) of q, k, v, o, gate, up, down: PyTorch orientation.
    let linears = [(q, h), (kv, h), (kv, h), (h, q), (i, h), (i, h), (h, i)];
    let linear = |rows: u64, cols: u64| -> u64 {
        let numel = rows * cols;
        let bitmask = rows * cols.div_ceil(8);
        match format {
            None => numel * bytes,
            Some(SparseFormat::Bitmask) => {
                let kept = ((numel as f64) * (1.0 - sparsity)).round() as u64;
                kept * bytes + bitmask + rows * 8 + 16
            }
            Some(SparseFormat::TwoFour) => numel / 2 * bytes + bitmask + 16,
        }
    };
    let per_layer: u64 = linears.iter().map(|(r, c)| linear(*r, *c)).sum::<u64>() + 2 * h * bytes;
    let embed = a.vocab * h * bytes;
    let head = if a.tied { 0 } else { embed };
    a.layers * per_layer + embed + head + h * bytes
}

/// A checkpoint's weights on disk, dense and in its sparse layout.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SavedWeights {
    pub dense: u64,
    /// `sparse-bitmask` or `sparse-24-bitmask`.
    pub format: Option<&'static str>,
    pub compressed: Option<u64>,
}

pub(super) fn saved_weights(
    arch: &Arch,
    w: &Workload,
    notes: &mut Vec<String>,
) -> Option<SavedWeights> {
    let pruning = !matches!(w.task, Task::Inference | Task::Train);
    if !pruning && w.compressed.is_none() {
        return None;
    }
    let dense = weight_bytes(arch, w.stored_bytes, None, w.sparsity);
    let compressed = w
        .compressed
        .map(|f| weight_bytes(arch, w.stored_bytes, Some(f), w.sparsity));
    if let (Task::Inference, Some(c), Some(f)) = (w.task, compressed, w.compressed) {
        notes.push(format!(
            "the {} checkpoint holds {} of weights on disk (dense {}); prunemem and transformers decompress it \
             when loading (prunemem into a scratch folder, one weight at a time), so the weights in memory are the dense size",
            f.name(),
            crate::units::format_bytes(c),
            crate::units::format_bytes(dense)
        ));
    }
    Some(SavedWeights {
        dense,
        format: w.compressed.map(|f| f.name()),
        compressed,
    })
}
