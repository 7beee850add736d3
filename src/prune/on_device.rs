//! Pruning math on the device: magnitude's, Wanda's and RIA's metrics, the
//! per-matrix, per-output and N:M selections, and the mask, computed where
//! the weight already is. Nothing weight-sized crosses the bus: one count
//! per linear comes back (the zeros, for the report), and one flag when a
//! per-output selection meets ties.
//!
//! Burn 0.21's CubeCL backends sort on the host, so selection is a
//! threshold found by bisection over the metric's f32 bit patterns (for
//! non-negative floats their order is the values' order,
//! [`Compute::float_bits`]): 31 halvings of the integer range find, for each
//! output or for the whole matrix, the smallest key with at least `k` keys
//! at or below it — the `k`-th smallest value exactly. Where a per-output
//! selection must take exactly `k` and the threshold value repeats, a
//! second bisection over input positions takes the first ties in column
//! order, as the host path's stable sort does, so the masks are the host
//! path's to the position (`tests/device/` compares them). GradProbe's
//! candidates, exactly `k` of a whole matrix, take their ties in row-major
//! order too (`smallest_exactly`: the ties' positions searched by the same
//! threshold) and come back as one bit per weight (`set_positions`).
//!
//! On cubecl's backends the per-output selection is one kernel launch
//! (`Compute::smallest_per_column`) and the per-matrix threshold one to
//! nine (`Compute::kth_smallest`): radix selects in `exec::kernels` that
//! read each key 10 and 8 times where the bisection kernels read it 44 to
//! 47 times (at Llama shapes) and 31, and find the same threshold and the
//! same ties. The Burn-ops bisection below is what other backends run and
//! what the kernels are tested against.
//!
//! Layout: Burn keeps a linear's weight `[in, out]`; a PyTorch row (one
//! output) is a column here, so "per row" reductions run over dim 0 and N:M
//! groups are `m` consecutive inputs of one output.
//!
//! DSnoT's first mask is selected here (from SparseGPT's saliency too,
//! `factor_device::Saliency`), its loop is
//! `dsnot_device`'s, SparseGPT's sweep `sparsegpt_device`'s and RIA's
//! channel reallocation `reallocation_device`'s, Wanda's α-variant
//! `variant_device`'s. On the host path (`linear`): N:M with an input
//! width that `m` does not divide.

use burn::prelude::*;
use burn::tensor::Bool;

use super::config::PruneConfig;
use super::{LayerMethod, Pattern};
use crate::exec::{Compute, reduce};

/// Whether the device path computes `config`'s masks.
pub fn handles(config: &PruneConfig, inputs: usize) -> bool {
    let pattern_ok = match config.pattern {
        Pattern::Unstructured => true,
        Pattern::NM { n, m } => m > 0 && n <= m && inputs.is_multiple_of(m),
    };
    let method_ok = match config.method {
        LayerMethod::Magnitude => true,
        // With `--use-variant`: `variant_device`.
        LayerMethod::Wanda => true,
        // With `--reallocation`: `reallocation_device`.
        LayerMethod::Ria => true,
        // DSnoT's first mask from SparseGPT's saliency
        // (`factor_device::Saliency`);
        // SparseGPT itself sweeps in `sparsegpt_device`.
        LayerMethod::SparseGpt => config.dsnot.is_some(),
    };
    pattern_ok && method_ok
}

/// The metric of `w` (`[in, out]`, any float dtype) in f32: `|W|`,
/// Wanda's `|W| · sqrt(scaler_row)`, or RIA's relative importance times
/// `sqrt(scaler_row)^a`. `norms` is `scaler_row` (`[in]`, f32), needed by
/// Wanda and RIA.
pub fn metric<B: Compute>(
    w: &Tensor<B, 2>,
    norms: Option<&Tensor<B, 1>>,
    method: LayerMethod,
    ria_a: f64,
) -> Tensor<B, 2> {
    let [inp, _] = w.dims();
    let abs = crate::model::dtype::to_f32(w.clone()).abs();
    let scale = |a: Option<f64>| {
        norms.map(|n| {
            let s = n.clone().sqrt();
            let s = match a {
                Some(a) => s.powf_scalar(a),
                None => s,
            };
            s.reshape([inp, 1])
        })
    };
    match method {
        LayerMethod::Wanda => match scale(None) {
            Some(s) => abs * s,
            None => abs,
        },
        LayerMethod::Ria => {
            // Each weight's share of its input's and its output's absolute
            // sums (PyTorch: column sums over outputs, row sums over inputs).
            let per_input = reduce::sum_dim(abs.clone(), 1);
            let per_output = reduce::sum_dim(abs.clone(), 0);
            let m = abs.clone() / per_input + abs / per_output;
            match scale(Some(ria_a)) {
                Some(s) => m * s,
                None => m,
            }
        }
        LayerMethod::Magnitude | LayerMethod::SparseGpt => abs,
    }
}

/// The mask (`true`: prune) of `metric` (`[in, out]`, f32) for the
/// configuration's pattern: per matrix for magnitude and RIA, per output
/// for Wanda (and RIA's `per_outneuron`), per group of `m` inputs for N:M.
pub fn mask<B: Compute>(metric: Tensor<B, 2>, config: &PruneConfig) -> Tensor<B, 2, Bool> {
    let keys = B::float_bits(metric);
    match config.pattern {
        Pattern::NM { n, m } => nm_mask(keys, n, m),
        Pattern::Unstructured => {
            let per_output = match config.method {
                LayerMethod::Wanda => true,
                LayerMethod::Ria => config.per_outneuron,
                _ => false,
            };
            let k = ((keys.dims()[0] as f64) * config.sparsity) as usize;
            match per_output {
                true => smallest_per_output(keys, k),
                false => matrix_mask(keys, config.sparsity),
            }
        }
    }
}

/// SparseGPT's block mask: one threshold over `metric` (f32), every
/// entry at or below the `int(numel · ratio)`-th smallest pruned.
pub(super) fn block_threshold_mask<B: Compute>(
    metric: Tensor<B, 2>,
    ratio: f64,
) -> Tensor<B, 2, Bool> {
    matrix_mask(B::float_bits(metric), ratio)
}

/// The `n` smallest rows of each column of `metric` (one N:M group of
/// `rows` inputs; ties to the lower row).
pub(super) fn group_smallest<B: Compute>(metric: Tensor<B, 2>, n: usize) -> Tensor<B, 2, Bool> {
    let [rows, _] = metric.dims();
    nm_mask(B::float_bits(metric), n, rows)
}

/// Zeroes `w` where `mask` is set; returns the pruned weight (in `w`'s
/// dtype) and how many of its entries are zero (one count read back).
pub fn apply<B: Compute>(w: Tensor<B, 2>, mask: Tensor<B, 2, Bool>) -> (Tensor<B, 2>, u64) {
    let pruned = w.mask_fill(mask, 0.0);
    let zeros = reduce::sum_all(pruned.clone().equal_elem(0.0).int()).reshape([1]);
    (pruned, read_count(zeros))
}

/// Integers read back from the device, counted as traffic.
pub(super) fn read_ints<B: Compute, const D: usize>(t: Tensor<B, D, Int>) -> Vec<i64> {
    let data = t.into_data();
    crate::exec::transfer::read_back(data.bytes.len() as u64);
    data.iter::<i64>().collect()
}

/// One integer read back from the device, counted as traffic.
pub(super) fn read_count<B: Compute>(t: Tensor<B, 1, Int>) -> u64 {
    read_ints(t).first().map_or(0, |c| (*c).max(0) as u64)
}

/// One flag read back from the device, counted as traffic.
pub(super) fn read_flag<B: Compute>(t: Tensor<B, 1, Bool>) -> bool {
    let data = t.into_data();
    crate::exec::transfer::read_back(data.bytes.len() as u64);
    data.iter::<bool>().next().unwrap_or(false)
}

/// Where a selection counts: per column of `[rows, cols]` (one output), or
/// over the whole matrix.
#[derive(Clone, Copy, PartialEq)]
enum Over {
    Columns,
    Matrix,
}

/// How many of `flags` are set, per column or over the matrix (`[1, cols]`
/// or `[1, 1]`); long axes in pieces (`exec::reduce`).
fn count<B: Compute>(flags: Tensor<B, 2, Int>, over: Over) -> Tensor<B, 2, Int> {
    let per_column = reduce::sum_dim(flags, 0);
    match over {
        Over::Columns => per_column,
        Over::Matrix => reduce::sum_dim(per_column, 1),
    }
}

/// For each column of `keys` (`[rows, cols]`), or for the whole matrix,
/// the smallest key `t` with at least `k` keys `<= t` (`k >= 1`; where
/// fewer than `k` keys are at or below `i32::MAX`, `i32::MAX`).
fn kth_key<B: Compute>(keys: &Tensor<B, 2, Int>, k: usize, over: Over) -> Tensor<B, 2, Int> {
    let [rows, cols] = keys.dims();
    if over == Over::Matrix && k <= rows * cols {
        // The backend's kernel where it has one (the same threshold).
        if let Some(t) = B::kth_smallest(keys, k) {
            return t;
        }
    }
    let device = keys.device();
    let width = if over == Over::Columns { cols } else { 1 };
    let mut lo = Tensor::<B, 2, Int>::zeros([1, width], &device);
    let mut hi = Tensor::<B, 2, Int>::full([1, width], i32::MAX, &device);
    // Invariant: the answer is in [lo, hi]; 31 halvings close the range.
    for step in 0..31 {
        let mid = lo.clone() + (hi.clone() - lo.clone()).div_scalar(2);
        let at_or_below = keys
            .clone()
            .lower_equal(mid.clone().expand([rows, cols]))
            .int();
        if step == 0 {
            // The selection at its widest: the keys beside one step's
            // counts (every step allocates the same).
            crate::exec::watch::after_op();
        }
        let at_or_below = count(at_or_below, over);
        let enough = at_or_below.greater_equal_elem(k as i64);
        hi = hi.mask_where(enough.clone(), mid.clone());
        lo = lo.mask_where(enough.bool_not(), mid.add_scalar(1));
    }
    lo
}

/// One threshold over the whole matrix, as magnitude and RIA take it:
/// the `int(numel · ratio)`-th smallest (0-based), every key at or below
/// it pruned (ties included).
fn matrix_mask<B: Compute>(keys: Tensor<B, 2, Int>, ratio: f64) -> Tensor<B, 2, Bool> {
    let [rows, cols] = keys.dims();
    let n = rows * cols;
    let k = ((n as f64) * ratio) as usize;
    if k >= n {
        return keys.greater_equal_elem(i32::MIN as i64);
    }
    let t = kth_key(&keys, k + 1, Over::Matrix);
    keys.lower_equal(t.expand([rows, cols]))
}

/// Exactly `k` entries of each column, the smallest, ties taken in row
/// order (the host path's stable sort).
pub(super) fn smallest_per_output<B: Compute>(
    keys: Tensor<B, 2, Int>,
    k: usize,
) -> Tensor<B, 2, Bool> {
    let [rows, _] = keys.dims();
    if k == 0 {
        return keys.lower_elem(i32::MIN as i64);
    }
    if k >= rows {
        return keys.greater_equal_elem(i32::MIN as i64);
    }
    // One launch where the backend has the kernel (the same mask).
    let keys = match B::smallest_per_column(keys, k) {
        Ok(mask) => {
            // The keys beside the kernel's flags and the mask.
            crate::exec::watch::after_op();
            return mask;
        }
        Err(keys) => keys,
    };
    let (below, ties, need) = split(keys, k);
    match need {
        // Every column takes all its ties: exactly k each.
        None => below.bool_or(ties),
        Some(need) => {
            let first = first_ties(&ties, &need);
            below.bool_or(ties.bool_and(first))
        }
    }
}

/// The keys below each column's `k`-th smallest, the keys equal to it,
/// and, where some column has more ties than it needs to reach `k`, how
/// many ties each still needs (one flag read back decides).
#[allow(clippy::type_complexity)]
fn split<B: Compute>(
    keys: Tensor<B, 2, Int>,
    k: usize,
) -> (
    Tensor<B, 2, Bool>,
    Tensor<B, 2, Bool>,
    Option<Tensor<B, 2, Int>>,
) {
    let [rows, cols] = keys.dims();
    let t = kth_key(&keys, k, Over::Columns).expand([rows, cols]);
    let below = keys.clone().lower(t.clone());
    let ties = keys.equal(t);
    let need = count(below.clone().int(), Over::Columns)
        .neg()
        .add_scalar(k as i64);
    let tied = count(ties.clone().int(), Over::Columns);
    let more = read_flag(tied.greater(need.clone()).any());
    (below, ties, more.then_some(need))
}

/// Exactly `k` entries of the whole matrix, the smallest, ties taken in
/// row-major order: the host's `gradprobe::select::smallest_by` (a
/// `select_nth` over `(key, position)`), where the keys are.
///
/// Where the threshold repeats past `k` (bf16 weights and quantized
/// checkpoints make that the rule, not the exception), the first ties are
/// found as a second `k`-th smallest: each tie's row-major position, every
/// other entry `i32::MAX`, and the `need`-th smallest of those is the last
/// tie taken. On cubecl's backends both are the threshold kernel's (9
/// launches each where the keys are many). A bisection over positions in
/// Burn's ops took about 13
/// launches a halving, 20 halvings a linear: 59% of GradProbe's backward
/// launches on SmolLM2-135M (76 522 then, 31 543 now).
pub(crate) fn smallest_exactly<B: Compute>(
    keys: Tensor<B, 2, Int>,
    k: usize,
) -> Tensor<B, 2, Bool> {
    let [rows, cols] = keys.dims();
    let n = rows * cols;
    if k == 0 {
        return keys.lower_elem(i32::MIN as i64);
    }
    if k >= n {
        return keys.greater_equal_elem(i32::MIN as i64);
    }
    let t = kth_key(&keys, k, Over::Matrix).expand([rows, cols]);
    let below = keys.clone().lower(t.clone());
    let ties = keys.equal(t);
    // Both counts back in one read: how many are below, how many tie.
    let counts = read_ints(Tensor::cat(
        vec![
            count(below.clone().int(), Over::Matrix),
            count(ties.clone().int(), Over::Matrix),
        ],
        1,
    ));
    let (below_n, tied_n) = match counts[..] {
        [b, t] => (b.max(0) as usize, t.max(0) as usize),
        _ => (0, 0),
    };
    // `t` is the k-th smallest, so 1 <= need <= tied.
    let need = k.saturating_sub(below_n);
    if need == 0 {
        return below;
    }
    if tied_n <= need {
        return below.bool_or(ties);
    }
    let device = ties.device();
    let at = Tensor::<B, 1, Int>::arange(0..n as i64, &device)
        .reshape([rows, cols])
        .mask_fill(ties.bool_not(), i32::MAX as i64);
    // The `need`-th tie's position; every non-tie is above it.
    let last = kth_key(&at, need, Over::Matrix).expand([rows, cols]);
    below.bool_or(at.lower_equal(last))
}

/// The set positions of `mask`, row-major, ascending: read back as one bit
/// each (32 to an integer, packed where the mask is), not as the matrix.
pub(crate) fn set_positions<B: Compute>(mask: Tensor<B, 2, Bool>) -> Vec<u32> {
    let [rows, cols] = mask.dims();
    let n = rows * cols;
    if n == 0 {
        return Vec::new();
    }
    let device = mask.device();
    let words = n.div_ceil(32);
    let mut flat = mask.int().reshape([n]);
    if words * 32 > n {
        let pad = Tensor::<B, 1, Int>::zeros([words * 32 - n], &device);
        flat = Tensor::cat(vec![flat, pad], 0);
    }
    // Distinct bits add without a carry; bit 31 is i32::MIN's.
    let bits: Vec<i64> = (0..32)
        .map(|j| if j == 31 { i32::MIN as i64 } else { 1i64 << j })
        .collect();
    let bits = Tensor::<B, 1, Int>::from_data(TensorData::new(bits, [32]), &device);
    if B::is_device() {
        crate::exec::transfer::uploaded(32 * 4);
    }
    let packed = (flat.reshape([words, 32]) * bits.reshape([1, 32])).sum_dim(1);
    let data = packed.into_data();
    if B::is_device() {
        crate::exec::transfer::read_back(data.bytes.len() as u64);
    }
    let mut out = Vec::new();
    for (w, word) in data.iter::<i64>().enumerate() {
        let mut word = word as u32;
        while word != 0 {
            out.push((w * 32) as u32 + word.trailing_zeros());
            word &= word - 1;
        }
    }
    out
}

/// Positions `0..=c` of each column (its rows), where `c` is the smallest
/// row at which the column has seen `need` of its `ties`.
fn first_ties<B: Compute>(
    ties: &Tensor<B, 2, Bool>,
    need: &Tensor<B, 2, Int>,
) -> Tensor<B, 2, Bool> {
    let [rows, cols] = ties.dims();
    let device = ties.device();
    let index = Tensor::<B, 1, Int>::arange(0..rows as i64, &device)
        .reshape([rows, 1])
        .expand([rows, cols]);
    let last = rows.saturating_sub(1);
    let mut lo = Tensor::<B, 2, Int>::zeros([1, cols], &device);
    let mut hi = Tensor::<B, 2, Int>::full([1, cols], last as i64, &device);
    for _ in 0..usize::BITS - last.max(1).leading_zeros() {
        let mid = lo.clone() + (hi.clone() - lo.clone()).div_scalar(2);
        let upto = index.clone().lower_equal(mid.clone().expand([rows, cols]));
        let seen = count(ties.clone().bool_and(upto).int(), Over::Columns);
        let enough = seen.greater_equal(need.clone());
        hi = hi.mask_where(enough.clone(), mid.clone());
        lo = lo.mask_where(enough.bool_not(), mid.add_scalar(1));
    }
    index.lower_equal(lo.expand([rows, cols]))
}

/// N:M: in every group of `m` consecutive rows of a column, the `n`
/// smallest (ties to the lower row). Each entry's rank in its group is the
/// number of group members strictly smaller plus the equal ones before it.
pub(super) fn nm_mask<B: Compute>(
    keys: Tensor<B, 2, Int>,
    n: usize,
    m: usize,
) -> Tensor<B, 2, Bool> {
    // One launch where the backend has the kernel (the same ranks).
    let keys = match B::smallest_per_group(keys, n, m) {
        Ok(mask) => {
            crate::exec::watch::after_op();
            return mask;
        }
        Err(keys) => keys,
    };
    let [rows, cols] = keys.dims();
    let groups = rows / m;
    let g = keys.reshape([groups, m, cols]);
    let mut ranks = Vec::with_capacity(m);
    for j in 0..m {
        let vj = g.clone().narrow(1, j, 1).expand([groups, m, cols]);
        let mut rank = g.clone().lower(vj.clone()).int().sum_dim(1);
        if j > 0 {
            let before = g.clone().narrow(1, 0, j);
            let vj = vj.narrow(1, 0, j);
            rank = rank + before.equal(vj).int().sum_dim(1);
        }
        ranks.push(rank.lower_elem(n as i64));
    }
    Tensor::cat(ranks, 1).reshape([rows, cols])
}

#[cfg(test)]
mod tests {
    //! The device path against the host path on Burn's CPU backend (the
    //! default `float_bits` goes through the host; the ops are the ones a
    //! device runs). `tests/device/` repeats the comparison on wgpu.
    use super::*;
    use crate::exec::Cpu;
    use crate::prune::methods;

    fn config(method: LayerMethod, pattern: Pattern, sparsity: f64) -> PruneConfig {
        PruneConfig {
            method,
            pattern,
            sparsity,
            use_variant: false,
            seqlen: 8,
            batch_size: 1,
            dtype: crate::model::ComputeDtype::F32,
            percdamp: 0.01,
            blocksize: 128,
            ria_a: 0.5,
            per_outneuron: false,
            layer_sparsity: None,
            dsnot: None,
            reallocation: None,
            offload_activations: false,
        }
    }

    /// Host weights `[out, in]` as a Burn `[in, out]` tensor.
    fn burn_weight(w: &[f32], out: usize, inp: usize) -> Tensor<Cpu, 2> {
        Tensor::<Cpu, 2>::from_data(TensorData::new(w.to_vec(), [out, inp]), &Default::default())
            .transpose()
    }

    /// The device mask back in `[out, in]` order.
    fn device_mask(
        w: &[f32],
        out: usize,
        inp: usize,
        norms: Option<&[f32]>,
        c: &PruneConfig,
    ) -> Vec<bool> {
        let wt = burn_weight(w, out, inp);
        let n = norms.map(|n| Tensor::<Cpu, 1>::from_floats(n, &Default::default()));
        let metric = metric(&wt, n.as_ref(), c.method, c.ria_a);
        let m = mask(metric, c).transpose();
        m.into_data().iter::<bool>().collect()
    }

    fn sample(len: usize, seed: u64, ties: bool) -> Vec<f32> {
        let mut rng = crate::model::synthetic::Normal::new(seed);
        (0..len)
            .map(|_| {
                let v = rng.sample();
                // Quantised values repeat: ties inside rows and groups.
                if ties { (v * 4.0).round() / 4.0 } else { v }
            })
            .collect()
    }

    #[test]
    fn masks_equal_the_host_paths() {
        let (out, inp) = (24, 32);
        for ties in [false, true] {
            let w = sample(out * inp, 3, ties);
            let norms: Vec<f32> = sample(inp, 9, ties).iter().map(|v| v * v + 0.5).collect();
            for (method, pattern, s) in [
                (LayerMethod::Magnitude, Pattern::Unstructured, 0.5),
                (LayerMethod::Magnitude, Pattern::NM { n: 2, m: 4 }, 0.5),
                (LayerMethod::Wanda, Pattern::Unstructured, 0.5),
                (LayerMethod::Wanda, Pattern::Unstructured, 0.3),
                (LayerMethod::Wanda, Pattern::NM { n: 2, m: 4 }, 0.5),
                (LayerMethod::Wanda, Pattern::NM { n: 4, m: 8 }, 0.5),
                (LayerMethod::Ria, Pattern::Unstructured, 0.5),
                (LayerMethod::Ria, Pattern::NM { n: 2, m: 4 }, 0.5),
            ] {
                let c = config(method, pattern, s);
                let host = match method {
                    LayerMethod::Magnitude => methods::magnitude_mask(&w, inp, s, pattern),
                    LayerMethod::Wanda => {
                        let metric = methods::wanda_metric(&w, inp, &norms);
                        methods::wanda_mask(&metric, inp, s, pattern, false).0
                    }
                    _ => {
                        let metric = methods::ria_metric(&w, inp, &norms, c.ria_a);
                        methods::ria_mask(&metric, inp, s, pattern, false)
                    }
                };
                let dev = device_mask(&w, out, inp, Some(&norms), &c);
                let differ = host.iter().zip(&dev).filter(|(a, b)| a != b).count();
                assert_eq!(differ, 0, "{method:?} {pattern:?} {s} ties {ties}");
            }
        }
    }

    #[test]
    fn per_output_selection_takes_exactly_k_with_ties_in_column_order() {
        // One output row of all-equal metrics: the first k inputs go.
        let (out, inp) = (2, 8);
        let w = vec![1.0f32; out * inp];
        let c = config(LayerMethod::Wanda, Pattern::Unstructured, 0.5);
        let dev = device_mask(&w, out, inp, Some(&[1.0; 8]), &c);
        let row: Vec<bool> = (0..8).map(|j| j < 4).collect();
        assert_eq!(&dev[..8], &row[..]);
        assert_eq!(&dev[8..], &row[..]);
    }

    #[test]
    fn exactly_k_positions_equal_the_hosts_selection() {
        use crate::prune::gradprobe::select::smallest_by;
        // 5 × 7 pads its bits; the tied sample and the zeros (an earlier
        // step's pruning) meet the threshold many times.
        for (rows, cols) in [(24, 32), (5, 7)] {
            let n = rows * cols;
            for sample in [sample(n, 5, false), sample(n, 5, true), {
                let mut v = sample(n, 6, true);
                v.iter_mut().step_by(3).for_each(|x| *x = 0.0);
                v
            }] {
                let abs: Vec<f32> = sample.iter().map(|v| v.abs()).collect();
                let t = Tensor::<Cpu, 2>::from_data(
                    TensorData::new(abs.clone(), [rows, cols]),
                    &Default::default(),
                );
                for k in [0, 1, 17, n / 2, n - 1, n] {
                    let host = smallest_by(n, k, |i| abs[i]);
                    let keys = Cpu::float_bits(t.clone());
                    let dev = set_positions(smallest_exactly(keys, k));
                    assert_eq!(dev, host, "{rows}×{cols}, k {k}");
                }
            }
        }
    }

    #[test]
    fn applying_a_mask_counts_the_zeros() {
        let w = burn_weight(&[0.0, 1.0, 2.0, 3.0, 0.5, -1.0], 2, 3);
        let c = config(LayerMethod::Magnitude, Pattern::Unstructured, 0.5);
        let m = mask(metric(&w, None, c.method, c.ria_a), &c);
        let (pruned, zeros) = apply(w, m);
        // The 4th smallest |w| is 1: both ±1 go with it (ties included).
        assert_eq!(zeros, 4);
        let v: Vec<f32> = pruned.transpose().into_data().iter::<f32>().collect();
        assert_eq!(v, vec![0.0, 0.0, 2.0, 3.0, 0.0, 0.0]);
    }
}
