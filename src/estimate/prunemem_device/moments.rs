//! The device prune phase's widest moments (a layer's statistics, SparseGPT's
//! factorisation and sweep, the selection's metric, RIA's reallocation,
//! Wanda's α-variant) and what the pool reserves around them, apart from the
//! phases that add them up (`super`).

use super::device_pool::{self, Beside};
use super::dsnot::{dsnot_loop, saliency_moment};
use super::{Arch, Device, Sizes, Workload};
use crate::prune::Method;

/// The f32 statistics of one layer, and the largest moment of their update
/// beyond the forward's own (SparseGPT: the widest input's f32 copy and,
/// from the second of `batches` on, its `Xᵀ X` beside the Hessian: the
/// first batch's product becomes the Hessian).
pub(super) fn statistics(
    a: &Arch,
    w: &Workload,
    m: Method,
    tokens: u64,
    batches: u64,
) -> (u64, u64) {
    let (h, q, i) = (a.hidden, a.q_dim(), a.intermediate);
    let columns = 2 * h + q + i;
    let norms = match m {
        Method::Wanda | Method::Ria => columns * 4,
        _ if w.dsnot => columns * 4,
        _ => 0,
    };
    let moments = if w.dsnot { 2 * columns * 4 } else { 0 };
    // The widest input's f32 copy: none in f32, none where the norms'
    // kernel reads the input as it is and nothing else needs the copy.
    let kernel_only = w.norms_kernel && !w.dsnot && m != Method::SparseGpt;
    let cast = if w.dtype.size() == 4 || kernel_only {
        0
    } else {
        tokens * i * 4
    };
    match m {
        Method::SparseGpt => {
            let hessians = hessians(a);
            // At the down projection's input: the residual stream, the
            // input, its f32 copy and the new product.
            let product = if batches > 1 { i * i * 4 } else { 0 };
            let update = tokens * (h + i) * w.dtype.size() + cast + product;
            (hessians + norms + moments, update)
        }
        _ => (norms + moments, tokens * (h + i) * w.dtype.size() + cast),
    }
}

/// Every input's Hessian of a layer (f32): q/k/v's, o's, gate/up's, down's.
pub(super) fn hessians(a: &Arch) -> u64 {
    let (h, q, i) = (a.hidden, a.q_dim(), a.intermediate);
    (2 * h * h + q * q + i * i) * 4
}

/// The device factorisation of an `n`-input Hessian at its widest
/// (`prune::factor_device`, step 1): in use, the Hessian beside an `n × n`
/// product, a block column (`n × 128`) and its diagonal block; and what
/// the pool keeps freed beside them for the next block (the block
/// column's panel, the diagonal block's copy, a row mask).
pub(super) fn factor_step(n: u64) -> (u64, u64) {
    let b = n.min(128);
    (
        2 * n * n * 4 + n * b * 4 + b * b * 4,
        n * b * 4 + b * b * 4 + n * 4,
    )
}

/// SparseGPT on the device at its widest, in use and reserved: for each
/// linear input in turn, the Hessians not yet finished, then the larger of
/// - its factorisation (`prune::factor_device`): the Hessian beside an `in
///   × in` product (the block's update), a block column (`in × 128`) and
///   its diagonal block; the pool keeps the block column's panel, the
///   diagonal block's copy and a row mask freed beside them, for the next
///   block (before the plan's `factor: device`, the host factored it);
/// - its sweep (`prune::sparsegpt_device`): `Hinv`, the f32 working copy
///   of its widest linear beside the lazy update's product of the same
///   size, the block's rows of `Hinv` (128 × inputs) and its errors (128 ×
///   outputs).
pub(super) fn sparsegpt_moment(a: &Arch, w: &Workload) -> (u64, u64) {
    let (h, q, i) = (a.hidden, a.q_dim(), a.intermediate);
    // (inputs, widest output) of q/k/v, o, gate/up, down, in sweep order.
    let inputs = [(h, q), (q, h), (h, i), (i, h)];
    let each = |k: usize| {
        let remaining: u64 = inputs[k + 1..].iter().map(|(n, _)| n * n * 4).sum();
        let (n, o) = inputs[k];
        // Logs without the plan's `factor: device` factored on the host.
        let (factor, freed) = match w.factor_on_device {
            true => factor_step(n),
            false => (0, 0),
        };
        let sweep = n * n * 4 + 2 * n * o * 4 + 128 * (n + o) * 4;
        (
            remaining + factor.max(sweep),
            remaining + (factor + freed).max(sweep),
        )
    };
    let all: Vec<(u64, u64)> = (0..inputs.len()).map(each).collect();
    (
        all.iter().map(|m| m.0).max().unwrap_or(0),
        all.iter().map(|m| m.1).max().unwrap_or(0),
    )
}

/// The pruning's widest moment beside what the phase holds. The mask is
/// chosen on the device (`prune::on_device`) for magnitude, Wanda and RIA: at its widest, the largest linear's f32 metric (the
/// selection kernels take it as keys in its own buffer and hand back a
/// mask as the keys go); otherwise the host's pruned weight goes up
/// beside the one it replaces.
pub(super) fn pruning_moment(
    a: &Arch,
    w: &Workload,
    m: Method,
    s: &Sizes,
    calibrated: bool,
    stats: u64,
) -> (&'static str, u64) {
    match (m, w.dsnot) {
        // Wanda's α-variant (`prune::variant_device`): the f32 metric
        // beside its sorted tables.
        (Method::Wanda, false) if w.use_variant => (
            "selection: f32 metric and its sorted tables (α-variant)",
            variant_tables(a),
        ),
        (Method::Magnitude | Method::Wanda | Method::Ria, false) => {
            ("selection: f32 metric (mask)", a.largest_linear() * 4)
        }
        (Method::SparseGpt, false) if calibrated => (
            "SparseGPT: factorisation or sweep (statistics)",
            sparsegpt_moment(a, w).0.saturating_sub(stats),
        ),
        (Method::SparseGpt, true) if calibrated && w.saliency_on_device => (
            "DSnoT: SparseGPT's factorisation or swap loop (statistics)",
            saliency_moment(a, w).0.saturating_sub(hessians(a)),
        ),
        (Method::SparseGpt, true) => ("pruned weight (upload)", a.largest_linear() * s.c),
        _ => ("DSnoT: swap loop (orders and masks)", dsnot_loop(a, w).0),
    }
}

/// What the pool keeps freed beside the pruning's widest moment: SparseGPT's
/// factorisation, DSnoT's swap loop.
pub(super) fn kept_beside(a: &Arch, w: &Workload, m: Method, calibrated: bool) -> u64 {
    match (m, w.dsnot) {
        (Method::SparseGpt, false) if calibrated => {
            let (in_use, reserved) = sparsegpt_moment(a, w);
            reserved - in_use
        }
        (Method::SparseGpt, true) if calibrated && w.saliency_on_device => {
            let (in_use, reserved) = saliency_moment(a, w);
            reserved - in_use
        }
        (Method::SparseGpt, true) => 0,
        (_, true) => {
            let (in_use, reserved) = dsnot_loop(a, w);
            reserved - in_use
        }
        _ => 0,
    }
}

/// Wanda's α-variant at its widest, on the largest of the linears: the
/// f32 metric, each output's running sums (4 bytes a weight each) and
/// its sorted keys, each output's inputs padded to a power of two
/// (`exec::kernels::variant`). Measured on lavapipe: see `variant_bus`.
fn variant_tables(a: &Arch) -> u64 {
    let (h, i) = (a.hidden, a.intermediate);
    let one = |out: u64, inp: u64| out * (8 * inp + 4 * inp.next_power_of_two());
    // gate and up, down, the attention's square projections.
    one(i, h)
        .max(one(h, i))
        .max(one(a.q_dim(), h))
        .max(one(h, a.q_dim()))
}

/// What the pool keeps freed beside RIA's reallocation on the device
/// (`prune::reallocation_device`), past direct N:M's: with `--lsa` the
/// widest input's assignment scores (`(in / m)²` f32). The report's kept
/// metric is one kernel's per-output sums (`Compute::nm_kept_sums`), where
/// Burn's ops on slices of the metric kept a byte a weight more and held
/// half a byte a weight more in use. Its widest moment otherwise, the f32
/// metric beside its permutation, is no wider than RIA's metric itself.
fn reallocation_kept(a: &Arch, w: &Workload) -> u64 {
    if !w.reallocation || !w.lsa {
        return 0;
    }
    (a.hidden.max(a.intermediate) / w.group.max(1)).pow(2) * 4
}

/// What the pool reserves in the prune phase: at the statistics pass, what
/// the phase holds outside it (`held`) and the pages of a layer's forward
/// (`device_pool`); at the device selection, once the largest linear's
/// pruned weight has replaced it, what is held, that weight and, freed but
/// kept, the selection's f32 keys and its mask (on wgpu a 4-byte bool
/// written over the kernel's i32 flags; on CUDA a 1-byte bool beside
/// them; with RIA's reallocation, the pages it keeps past those; with
/// Wanda's α-variant, its tables and the pruned weight); otherwise
/// the phase's bytes in use (`held` and `moment`).
pub(super) fn prune_reserve(
    a: &Arch,
    w: &Workload,
    m: Method,
    n: u64,
    held: u64,
    moment: u64,
) -> u64 {
    let selects = matches!(m, Method::Magnitude | Method::Wanda | Method::Ria) && !w.dsnot;
    let per_weight = match (selects, w.device) {
        (false, _) => 0,
        (true, Device::Cuda) => w.dtype.size() + 4 + 4 + 1,
        (true, _) => w.dtype.size() + 4 + 4,
    };
    let selection = match (selects, m == Method::Wanda && w.use_variant) {
        // The α-variant's tables freed, kept, and the pruned weight in a
        // page of its own beside them.
        (true, true) => variant_tables(a) + a.largest_linear() * w.dtype.size(),
        (true, false) => a.largest_linear() * per_weight + reallocation_kept(a, w),
        (false, _) => 0,
    };
    let outside = (held + moment).max(held + selection);
    if n == 0 {
        return outside;
    }
    let batch = w.batch_size.min(n);
    let beside = match m {
        Method::SparseGpt => Beside::Hessians {
            batches: n.div_ceil(batch),
        },
        _ if m != Method::Magnitude || w.dsnot => Beside::Norms,
        _ => Beside::Nothing,
    };
    outside.max(held + device_pool::forward(a, w, batch, beside))
}
