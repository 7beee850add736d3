//! DSnoT's swap loop in the device pool: one linear's loop, the widest
//! refined linear's, and the loop after SparseGPT's saliency beside the
//! factorisation and the Hessians still held.

use super::super::{Arch, Device, Workload};
use crate::prune::dsnot::DsnotSkip;

/// DSnoT's loop on the device (`prune::dsnot_device`) at its widest: in
/// use and reserved. The widest moment is a cursor's window being picked
/// (the prefix sum over its flags); the cycles then read `max_cycles`
/// rows a column. Per weight of the largest refined linear, what is
/// alive then:
/// - unstructured: the products `W·x̄`, Wanda's keys, the flags as
///   integers and their sums (i32), and the first mask, each sign's
///   candidates and the picked flags (bools): 16 bytes and 4 bools;
/// - N:M: the products, the regrowing keys, the first metric, the flags
///   as integers and their sums (4 bytes each), the first mask and the
///   picked flags: 20 bytes and 2 bools.
///
/// Measured on wgpu (bools of 4 bytes; on CUDA 1, not measured), in use,
/// on a 256 × 704 and a 384 × 1024 and 384 × 384 linear: 33.8 and 35.4
/// bytes unstructured, 28.6 and 29.1 N:M, so 2 and 1 bytes more than the
/// named buffers; those are counted, not explained. Reserved, 9 bytes
/// more unstructured and 7 N:M (freed pages the pool keeps; refitted on
/// the same linears when the cycles became one launch, 2026-12-02: N:M
/// had kept 2 more with the cycles as Burn's ops). A linear the loop
/// skips is a plain selection: its f32 metric.
pub(super) fn dsnot_loop(a: &Arch, w: &Workload) -> (u64, u64) {
    let h = a.hidden;
    let attention = h * a.q_dim();
    let mlp = h * a.intermediate;
    let (refined, skipped) = match w.dsnot_skip {
        DsnotSkip::Mlp => (attention, mlp),
        DsnotSkip::SelfAttn => (mlp, attention),
        DsnotSkip::None => (attention.max(mlp), 0),
    };
    let (in_use, reserved) = dsnot_linear(w, refined, true);
    let skipped = dsnot_linear(w, skipped, false).0;
    (in_use.max(skipped), reserved.max(skipped))
}

/// The swap loop over one linear of `weights` weights, in use and
/// reserved; a skipped linear keeps its f32 first metric only.
fn dsnot_linear(w: &Workload, weights: u64, refined: bool) -> (u64, u64) {
    if !refined {
        return (weights * 4, weights * 4);
    }
    let flag = match w.device {
        Device::Cuda => 1,
        _ => 4,
    };
    let per_weight = match w.nm {
        true => 20 + 2 * flag + 1,
        false => 16 + 4 * flag + 2,
    };
    // Freed pages the pool keeps beside them (the cycles in one launch
    // allocate only the mask and N:M's metric copy; Burn's ops, per cycle).
    let kept = match (w.nm, w.dsnot_kernel) {
        (true, true) => 3 + flag,
        _ => 5 + flag,
    };
    (weights * per_weight, weights * (per_weight + kept))
}

/// DSnoT from SparseGPT's saliency on the device at its widest, in use
/// and reserved. For each linear input in turn, the Hessians not yet
/// finished beside its factorisation's first step
/// (`prune::factor_device::hinv_diagonal`, [`super::factor_step`]), then
/// the swap loop
/// over its widest linear. In use, the loop is the widest refined
/// linear's ([`dsnot_loop`]) with no Hessian beside it; reserved, each
/// input's loop beside the Hessians still held. Fitted, not derived: on
/// three lavapipe runs (docs/gpu.md) no loop was measured in use beside
/// the held Hessians (adding them over-predicted by 7% and 26%), while
/// the pool's reserve kept their pages (without them it under-predicted
/// by 7% and 17%).
pub(super) fn saliency_moment(a: &Arch, w: &Workload) -> (u64, u64) {
    let (h, q, i) = (a.hidden, a.q_dim(), a.intermediate);
    // (inputs, widest output, refined) of q/k/v, o, gate/up, down.
    let attention = w.dsnot_skip != DsnotSkip::SelfAttn;
    let mlp = w.dsnot_skip != DsnotSkip::Mlp;
    let inputs = [
        (h, q, attention),
        (q, h, attention),
        (h, i, mlp),
        (i, h, mlp),
    ];
    let each = |k: usize| {
        let remaining: u64 = inputs[k + 1..].iter().map(|(n, _, _)| n * n * 4).sum();
        let (n, o, refined) = inputs[k];
        let (factor, freed) = super::factor_step(n);
        let swap_loop = dsnot_linear(w, n * o, refined).1;
        (
            remaining + factor,
            remaining + (factor + freed).max(swap_loop),
        )
    };
    (0..inputs.len())
        .map(each)
        .fold(dsnot_loop(a, w), |(u, r), (fu, fr)| (u.max(fu), r.max(fr)))
}
