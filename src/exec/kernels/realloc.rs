//! RIA's channel reallocation where the metric is (`prune::reallocation_device`):
//! the inputs' summed metric, which orders the heuristic permutation, and
//! the linear-sum-assignment scores of one slot, each summed in f32 one
//! add at a time in the host's order (`prune::reallocation`), so the
//! permutation and the assignment come out the host's to the bit and the
//! masks to the position. Only additions: no product a compiler could
//! contract into a fused multiply-add.
//!
//! `ordered_row_sums`: one unit per row of a contiguous `[rows, cols]`
//! f32 buffer (one input of Burn's `[in, out]` metric), its columns left
//! to right. `slot_scores`: one unit per (target group, source group) of
//! the permuted metric laid out as the host's (`[out, in]`, row-major),
//! its rows in order; per row the target's other slots sorted in a local
//! array of [`MAX_M`], then the host's merge of the `n` smallest.
//! `nm_kept_sums`: the report's metric kept by N:M, one unit per output of
//! Burn's `[in, out]` metric (either layout), each group's `m` inputs
//! sorted in the same local array and all but its `n` smallest added, so
//! no mask or masked copy of the metric is made.

use cubecl::prelude::*;

/// Units per cube.
pub(super) const UNITS: u32 = 256;
/// The largest group (`m`) the scores' local array holds.
pub const MAX_M: usize = 16;

/// `sums[r] = x[r, 0] + x[r, 1] + … + x[r, cols - 1]`, left to right in
/// f32, for the contiguous `[rows, cols]` `x`.
#[cube(launch_unchecked)]
pub(super) fn ordered_row_sums(x: &Array<f32>, sums: &mut Array<f32>, rows: u32, cols: u32) {
    let cube = CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X;
    let row = (cube * UNITS + UNIT_POS) as usize;
    if row < rows as usize {
        let c = cols as usize;
        let base = row * c;
        let mut acc = f32::new(0.0);
        for j in 0..c {
            acc += x[base + j];
        }
        sums[row] = acc;
    }
}

/// `scores[t · groups + s]`: the metric N:M keeps when source group `s`'s
/// slot-`slot` input joins target group `t`'s other `m - 1` inputs,
/// summed over the rows of `p` (`[rows, groups · m]`, row-major: the
/// permuted metric, one output a row) in order. Per row, as the host:
/// the others sorted and summed, the `n` smallest of them and the
/// newcomer `v` merged (an other first where it is `<= v`), and
/// `total += sum + v - small`.
#[cube(launch_unchecked)]
// The merge's two tests stay nested: cubecl's `&&` evaluates both sides,
// and the inner one reads `others[next]`.
#[allow(clippy::too_many_arguments, clippy::collapsible_if)]
pub(super) fn slot_scores(
    p: &Array<f32>,
    scores: &mut Array<f32>,
    groups: u32,
    rows: u32,
    n: u32,
    m: u32,
    slot: u32,
) {
    let cube = CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X;
    let id = (cube * UNITS + UNIT_POS) as usize;
    let g = groups as usize;
    if id < g * g {
        let target = id / g;
        let source = id % g;
        let mm = m as usize;
        let s = slot as usize;
        let cols = g * mm;
        let mut others = Array::<f32>::new(MAX_M);
        let mut total = f32::new(0.0);
        for r in 0..rows as usize {
            let base = r * cols + target * mm;
            // The target's other slots, ascending (insertion).
            let mut len = 0usize;
            for j in 0..mm {
                if j != s {
                    let x = p[base + j];
                    let mut i = len;
                    while i > 0 {
                        let prev = others[i - 1];
                        if prev <= x {
                            break;
                        }
                        others[i] = prev;
                        i -= 1;
                    }
                    others[i] = x;
                    len += 1;
                }
            }
            let mut sum = f32::new(0.0);
            for i in 0..len {
                sum += others[i];
            }
            let v = p[r * cols + source * mm + s];
            let mut small = f32::new(0.0);
            let mut next = 0usize;
            let mut used = false;
            for _t in 0..n as usize {
                let mut other = false;
                if next < len {
                    if used || others[next] <= v {
                        other = true;
                    }
                }
                if other {
                    small += others[next];
                    next += 1;
                } else {
                    small += v;
                    used = true;
                }
            }
            total += sum + v - small;
        }
        scores[id] = total;
    }
}

/// `sums[c]`: the metric N:M (`n` of every `m` pruned) keeps in column
/// `c` of `metric` (`[rows, cols]`, element `(r, c)` at `r · row_stride +
/// c · col_stride`; `rows` a multiple of `m`): per group of `m` rows,
/// its values sorted ascending and all but the `n` smallest added, in
/// f32, group after group. Ties do not matter: equal values add the same.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(super) fn nm_kept_sums(
    metric: &Array<f32>,
    sums: &mut Array<f32>,
    rows: u32,
    cols: u32,
    row_stride: u32,
    col_stride: u32,
    n: u32,
    m: u32,
) {
    let cube = CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X;
    let col = (cube * UNITS + UNIT_POS) as usize;
    if col < cols as usize {
        let mm = m as usize;
        let (rs, cs) = (row_stride as usize, col_stride as usize);
        let mut sorted = Array::<f32>::new(MAX_M);
        let mut acc = f32::new(0.0);
        for g in 0..(rows as usize) / mm {
            for j in 0..mm {
                let x = metric[(g * mm + j) * rs + col * cs];
                let mut i = j;
                while i > 0 {
                    let prev = sorted[i - 1];
                    if prev <= x {
                        break;
                    }
                    sorted[i] = prev;
                    i -= 1;
                }
                sorted[i] = x;
            }
            for i in n as usize..mm {
                acc += sorted[i];
            }
        }
        sums[col] = acc;
    }
}

/// Launches [`nm_kept_sums`] over `metric` (its buffer's `len` f32, the
/// `[rows, cols]` laid out by `strides`) into the `cols` f32 of `sums`
/// (`1 <= n < m <= MAX_M`, `rows` a multiple of `m`, `len < u32::MAX`).
pub fn launch_nm_kept_sums<R: Runtime>(
    client: &ComputeClient<R>,
    (metric, len): (cubecl::server::Handle, usize),
    sums: cubecl::server::Handle,
    (rows, cols): (usize, usize),
    strides: (usize, usize),
    (n, m): (usize, usize),
) {
    // SAFETY: unit `c < cols` reads `metric[r · row_stride + c ·
    // col_stride]` for `r < rows` (inside its `len`, which the caller
    // checked against the layout) and writes `sums[c]` only; its local
    // array is indexed below `m <= MAX_M`.
    unsafe {
        nm_kept_sums::launch_unchecked(
            client,
            super::grid(cols, UNITS),
            CubeDim::new_1d(UNITS),
            ArrayArg::from_raw_parts(metric, len),
            ArrayArg::from_raw_parts(sums, cols),
            rows as u32,
            cols as u32,
            strides.0 as u32,
            strides.1 as u32,
            n as u32,
            m as u32,
        );
    }
}

/// Launches [`ordered_row_sums`] over the contiguous f32 `[rows, cols]`
/// buffer `x` into the `rows` f32 of `sums` (`rows · cols < u32::MAX`).
pub fn launch_ordered_row_sums<R: Runtime>(
    client: &ComputeClient<R>,
    x: cubecl::server::Handle,
    sums: cubecl::server::Handle,
    rows: usize,
    cols: usize,
) {
    // SAFETY: unit `r < rows` reads `x[r · cols + j]` for `j < cols` and
    // writes `sums[r]` only: inside both buffers, one writer an element.
    unsafe {
        ordered_row_sums::launch_unchecked(
            client,
            super::grid(rows, UNITS),
            CubeDim::new_1d(UNITS),
            ArrayArg::from_raw_parts(x, rows * cols),
            ArrayArg::from_raw_parts(sums, rows),
            rows as u32,
            cols as u32,
        );
    }
}

/// Launches [`slot_scores`] over `p`, the contiguous f32 `[rows, groups ·
/// m]`, into `scores`, the contiguous f32 `[groups, groups]`
/// (`1 <= n < m <= MAX_M`, `slot < m`, `rows · groups · m < u32::MAX`,
/// `groups² < u32::MAX`).
pub fn launch_slot_scores<R: Runtime>(
    client: &ComputeClient<R>,
    p: cubecl::server::Handle,
    scores: cubecl::server::Handle,
    (rows, groups): (usize, usize),
    (n, m, slot): (usize, usize, usize),
) {
    // SAFETY: unit `id < groups²` reads `p[r · groups · m + g · m + j]`
    // for `r < rows`, `g < groups`, `j < m`, and writes `scores[id]` only;
    // its local array is indexed below `m - 1 < MAX_M`.
    unsafe {
        slot_scores::launch_unchecked(
            client,
            super::grid(groups * groups, UNITS),
            CubeDim::new_1d(UNITS),
            ArrayArg::from_raw_parts(p, rows * groups * m),
            ArrayArg::from_raw_parts(scores, groups * groups),
            groups as u32,
            rows as u32,
            n as u32,
            m as u32,
            slot as u32,
        );
    }
}
