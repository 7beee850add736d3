//! RIA's channel permutation for N:M (the authors' `prune_ria` with
//! `--reallocation` and `--lsa`): the input columns of a matrix are
//! reordered before its N:M groups are formed, so important columns do not
//! compete inside one group, and the mask is mapped back to the original
//! order.
//!
//! - Heuristic channel reallocation: columns sorted by their summed metric
//!   (ascending, the authors' `importance_score == "sum"`), cut into M equal
//!   runs, and the `k`-th run dealt to slot `k` of every group (every second
//!   run reversed);
//! - linear sum assignment (`--ria-lsa`), once per slot `c` of the group:
//!   which group's slot-`c` column should join each group's other columns,
//!   scored by the metric the group then keeps, solved exactly (scipy's
//!   algorithm, the `lsap` crate).
//!
//! The mask is N:M in the permuted order only. Realising the speed-up needs
//! the same permutation of the inputs (the previous layer's outputs), which
//! the authors leave to deployment; a saved model stays in the original
//! order, so it is unstructured to everyone else (saved compressed as
//! `sparse-bitmask`, not 2:4).

use rayon::prelude::*;

use super::methods::nm_mask;

/// What reallocation did to one matrix.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct ReallocationReport {
    /// Metric kept by direct N:M, and with the permutation.
    pub kept_before: f64,
    pub kept_after: f64,
}

/// `metric[:, index]` (row-major `[rows, cols]`).
fn permute_columns(metric: &[f32], cols: usize, index: &[usize]) -> Vec<f32> {
    let mut out = vec![0f32; metric.len()];
    out.par_chunks_mut(cols)
        .zip(metric.par_chunks(cols))
        .for_each(|(o, row)| {
            for (v, j) in o.iter_mut().zip(index) {
                *v = row[*j];
            }
        });
    out
}

/// The metric N:M keeps (the sum of every group's `m - n` largest).
fn kept(metric: &[f32], cols: usize, n: usize, m: usize) -> f64 {
    let mask = nm_mask(metric, cols, n, m);
    metric
        .iter()
        .zip(&mask)
        .filter(|(_, p)| !**p)
        .map(|(v, _)| *v as f64)
        .sum()
}

/// Each column's summed metric (`metric` row-major `[rows, cols]`), in
/// f32, row after row: the order the device's kernel keeps
/// (`Compute::ordered_row_sums`), so both sort the same sums.
pub fn column_sums(metric: &[f32], cols: usize) -> Vec<f32> {
    let mut sums = vec![0f32; cols];
    for row in metric.chunks(cols) {
        for (s, v) in sums.iter_mut().zip(row) {
            *s += v;
        }
    }
    sums
}

/// The heuristic order from the columns' summed metric: columns by
/// ascending sum, run `k` of M dealt to slot `k` of each group, even runs
/// (1-based) reversed.
pub(super) fn heuristic_from_sums(sums: &[f32], m: usize) -> Vec<usize> {
    let cols = sums.len();
    let mut sorted: Vec<usize> = (0..cols).collect();
    sorted.sort_by(|a, b| sums[*a].total_cmp(&sums[*b]));
    let mut index = vec![0usize; cols];
    for k in 0..m {
        let run = &sorted[cols * k / m..cols * (k + 1) / m];
        let dealt: Vec<usize> = if k % 2 == 1 {
            run.iter().rev().copied().collect()
        } else {
            run.to_vec()
        };
        for (g, col) in dealt.into_iter().enumerate() {
            index[k + g * m] = col;
        }
    }
    index
}

fn heuristic_order(metric: &[f32], cols: usize, m: usize) -> Vec<usize> {
    heuristic_from_sums(&column_sums(metric, cols), m)
}

/// The scores of slot `c`, `[target group][source group]` (row-major):
/// the metric kept when source's slot-`c` column joins target's other
/// columns, summed over the rows of `permuted` (`[rows, cols]`, the
/// metric in the current order) in f32, row after row. The device's
/// kernel (`Compute::slot_scores`) adds in the same order.
pub fn slot_scores(permuted: &[f32], cols: usize, n: usize, m: usize, c: usize) -> Vec<f32> {
    let groups = cols / m;
    let rows = permuted.len() / cols;
    (0..groups)
        .into_par_iter()
        .flat_map_iter(|target| {
            // Per row: the target's other columns, sorted, and their sum.
            let others: Vec<(Vec<f32>, f32)> = permuted
                .chunks(cols)
                .map(|row| {
                    let mut o: Vec<f32> = (0..m)
                        .filter(|s| *s != c)
                        .map(|s| row[target * m + s])
                        .collect();
                    o.sort_by(|a, b| a.total_cmp(b));
                    let sum = o.iter().sum::<f32>();
                    (o, sum)
                })
                .collect();
            (0..groups).map(move |source| {
                let mut total = 0f32;
                for (r, (o, sum)) in others.iter().enumerate().take(rows) {
                    let v = permuted[r * cols + source * m + c];
                    // The n smallest of `o ∪ {v}`.
                    let (mut small, mut taken, mut used_v) = (0f32, 0, false);
                    let mut it = o.iter().peekable();
                    while taken < n {
                        let next_o = it.peek().copied().copied();
                        match next_o {
                            Some(x) if used_v || x <= v => {
                                small += x;
                                it.next();
                            }
                            _ => {
                                small += v;
                                used_v = true;
                            }
                        }
                        taken += 1;
                    }
                    total += sum + v - small;
                }
                total
            })
        })
        .collect()
}

/// The order after slot `c`'s assignment: `scores` (`slot_scores`) solved
/// exactly for the largest total, each target group taking its source's
/// slot-`c` column.
pub(super) fn assign(index: &[usize], scores: &[f32], m: usize, c: usize) -> Vec<usize> {
    let groups = index.len() / m;
    let scores: Vec<f64> = scores.iter().map(|s| *s as f64).collect();
    // Rows: target groups; columns: source groups.
    let assigned = match lsap::solve(groups, groups, &scores, true) {
        Ok((_, cols_of)) => cols_of,
        Err(_) => (0..groups).collect(),
    };
    let mut next = index.to_vec();
    for (target, source) in assigned.into_iter().enumerate() {
        next[target * m + c] = index[source * m + c];
    }
    next
}

/// One assignment round for slot `c` on the host.
fn assign_slot(
    metric: &[f32],
    cols: usize,
    index: &[usize],
    n: usize,
    m: usize,
    c: usize,
) -> Vec<usize> {
    let permuted = permute_columns(metric, cols, index);
    assign(index, &slot_scores(&permuted, cols, n, m, c), m, c)
}

/// RIA's N:M mask with channel reallocation (and the assignment rounds
/// when `lsa`), in the original column order. `cols` must be a multiple
/// of `m`; otherwise the direct N:M mask is returned.
pub fn reallocated_nm_mask(
    metric: &[f32],
    cols: usize,
    n: usize,
    m: usize,
    lsa: bool,
) -> (Vec<bool>, ReallocationReport) {
    let before = kept(metric, cols, n, m);
    if !cols.is_multiple_of(m) || cols < m {
        let report = ReallocationReport {
            kept_before: before,
            kept_after: before,
        };
        return (nm_mask(metric, cols, n, m), report);
    }
    let mut index = heuristic_order(metric, cols, m);
    if lsa {
        for c in 0..m {
            index = assign_slot(metric, cols, &index, n, m, c);
        }
    }
    let permuted = permute_columns(metric, cols, &index);
    let permuted_mask = nm_mask(&permuted, cols, n, m);
    let after = kept(&permuted, cols, n, m);
    let mut mask = vec![false; metric.len()];
    mask.par_chunks_mut(cols)
        .zip(permuted_mask.par_chunks(cols))
        .for_each(|(out, pm)| {
            for (j, p) in index.iter().zip(pm) {
                out[*j] = *p;
            }
        });
    let report = ReallocationReport {
        kept_before: before,
        kept_after: after,
    };
    (mask, report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::synthetic::Normal;

    #[test]
    fn heuristic_deals_runs_to_slots() {
        // Column sums 0..8 ascending: runs [0,1] [2,3] [4,5] [6,7], the
        // second and fourth reversed, dealt to slots 0..4 of two groups.
        let metric: Vec<f32> = (0..8).map(|j| j as f32).collect();
        assert_eq!(heuristic_order(&metric, 8, 4), vec![0, 3, 4, 7, 1, 2, 5, 6]);
    }

    #[test]
    fn permutation_keeps_n_per_permuted_group_and_more_metric() {
        let mut rng = Normal::new(11);
        let (rows, cols) = (32, 64);
        // Columns of very different importance, so placement matters.
        let scale: Vec<f32> = (0..cols).map(|_| rng.sample().abs() * 3.0).collect();
        let metric: Vec<f32> = (0..rows * cols)
            .map(|t| rng.sample().abs() * scale[t % cols])
            .collect();
        for lsa in [false, true] {
            let (mask, r) = reallocated_nm_mask(&metric, cols, 2, 4, lsa);
            assert_eq!(mask.iter().filter(|p| **p).count(), rows * cols / 2);
            let kept: f64 = metric
                .iter()
                .zip(&mask)
                .filter(|(_, p)| !**p)
                .map(|(v, _)| *v as f64)
                .sum();
            assert!(
                (kept - r.kept_after).abs() < 1e-3 * kept,
                "{lsa}: {kept} vs {r:?}"
            );
        }
        // Each assignment round can keep the current placement, so the
        // rounds never lose metric (the heuristic alone can).
        let (_, heuristic) = reallocated_nm_mask(&metric, cols, 2, 4, false);
        let (_, with_lsa) = reallocated_nm_mask(&metric, cols, 2, 4, true);
        assert!(
            with_lsa.kept_after >= heuristic.kept_after - 1e-3,
            "{heuristic:?} {with_lsa:?}"
        );
    }
}
