//! What a pruned model weighs on disk: the dense layout (every weight, zeros
//! included) or compressed-tensors' sparse layouts (`model::compressed`),
//! from the architecture alone.

use super::Arch;
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
