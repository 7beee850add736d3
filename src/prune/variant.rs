//! Wanda's α-variant (`--use-variant`, the authors' `return_given_alpha`
//! and its bisection) on the host. Per output row, the metric is sorted
//! ascending and summed as it goes (an f32 running sum, one add at a
//! time, as `torch.cumsum` on the CPU); for a given α the row prunes every
//! entry at or below the last sorted value whose running sum stays within
//! α of the row's total. α is halved towards the target until the
//! matrix's sparsity is within 0.001 of it.
//!
//! The tables ([`VariantTables`]), one α's mask ([`given_alpha`]) and the
//! search ([`bisect_alpha`]) are separate so that the device path
//! (`variant_device`) runs the same search over the same numbers: its
//! kernels build the tables in the same order and its thresholds are
//! these.

use rayon::prelude::*;

/// Per-row stable ascending order of the metric (what `torch.sort(..., stable=True)` gives),
/// row after row in one buffer: per-row vectors were small blocks in the
/// worker threads' malloc arenas, which kept them resident after the mask
/// was built (2.5 MiB of a 4-layer grid run's peak, 2026-11-26).
pub(super) fn sorted_rows(metric: &[f32], cols: usize) -> Vec<u32> {
    let mut order = vec![0u32; metric.len()];
    order
        .par_chunks_mut(cols)
        .zip(metric.par_chunks(cols))
        .for_each(|(idx, row)| {
            idx.iter_mut().zip(0u32..).for_each(|(i, j)| *i = j);
            idx.sort_by(|a, b| row[*a as usize].total_cmp(&row[*b as usize]));
        });
    order
}

/// One matrix's tables, `[out, in]` row-major like the metric: each row's
/// values ascending (a stable sort by `total_cmp`), their f32 running
/// sums, and each row's sum in column order.
#[derive(Debug, Clone, PartialEq)]
pub struct VariantTables {
    pub sorted: Vec<f32>,
    pub cum: Vec<f32>,
    pub totals: Vec<f32>,
}

/// The tables of `metric` (`[out, cols]`, row-major), whose per-row
/// stable ascending order is `order` ([`sorted_rows`]).
pub fn tables_in_order(metric: &[f32], cols: usize, order: &[u32]) -> VariantTables {
    let mut sorted = vec![0f32; metric.len()];
    let mut cum = vec![0f32; metric.len()];
    sorted
        .par_chunks_mut(cols)
        .zip(cum.par_chunks_mut(cols))
        .zip(metric.par_chunks(cols).zip(order.par_chunks(cols)))
        .for_each(|((s, c), (row, idx))| {
            let mut acc = 0f32;
            for ((s, c), j) in s.iter_mut().zip(c.iter_mut()).zip(idx) {
                *s = row[*j as usize];
                acc += *s;
                *c = acc;
            }
        });
    let totals = metric
        .par_chunks(cols)
        .map(|r| r.iter().sum::<f32>())
        .collect();
    VariantTables {
        sorted,
        cum,
        totals,
    }
}

/// The tables of `metric` (`[out, cols]`, row-major).
pub fn tables(metric: &[f32], cols: usize) -> VariantTables {
    tables_in_order(metric, cols, &sorted_rows(metric, cols))
}

/// Each row's threshold for `alpha`: the last sorted value whose running
/// sum is at most `total · α` (the product in f32, as torch), or `None`
/// where no running sum is (torch would index -1 there; the row prunes
/// nothing).
pub fn thresholds(t: &VariantTables, cols: usize, alpha: f64) -> Vec<Option<f32>> {
    t.sorted
        .par_chunks(cols)
        .zip(t.cum.par_chunks(cols))
        .zip(&t.totals)
        .map(|((sorted, cum), total)| {
            let limit = *total * alpha as f32;
            let count = cum.iter().filter(|c| **c <= limit).count();
            count.checked_sub(1).map(|i| sorted[i])
        })
        .collect()
}

/// One α's mask of `metric` (`[out, cols]`) and its sparsity: each row's
/// entries at or below its threshold ([`thresholds`]).
pub fn given_alpha(metric: &[f32], cols: usize, t: &VariantTables, alpha: f64) -> (Vec<bool>, f64) {
    let thresh = thresholds(t, cols, alpha);
    let mut mask = vec![false; metric.len()];
    mask.par_chunks_mut(cols)
        .zip(metric.par_chunks(cols))
        .zip(&thresh)
        .for_each(|((mrow, row), thresh)| {
            if let Some(thresh) = thresh {
                for (m, v) in mrow.iter_mut().zip(row) {
                    *m = *v <= *thresh;
                }
            }
        });
    let pruned = mask.iter().filter(|m| **m).count();
    let sparsity = pruned as f64 / mask.len().max(1) as f64;
    (mask, sparsity)
}

/// The authors' search: α from 0.4 in `[0, 0.8]`, halving the interval
/// towards `ratio` until one α's sparsity (`given`'s second value) is
/// within 0.001 of it or the interval is narrower than 0.001. Returns the
/// last α's mask (whatever `given` makes) and that α.
pub fn bisect_alpha<M>(ratio: f64, mut given: impl FnMut(f64) -> (M, f64)) -> (M, f64) {
    let mut alpha = 0.4f64;
    let mut hist = [0.0f64, 0.8];
    let (mut mask, mut cur) = given(alpha);
    while (cur - ratio).abs() > 0.001 && hist[1] - hist[0] >= 0.001 {
        let next = if cur > ratio {
            hist[1] = alpha;
            (alpha + hist[0]) / 2.0
        } else {
            hist[0] = alpha;
            (alpha + hist[1]) / 2.0
        };
        alpha = next;
        (mask, cur) = given(alpha);
    }
    (mask, alpha)
}

/// The variant's mask of `metric` (`[out, cols]`) for `ratio`, and the α
/// it found; `order` is the rows' stable ascending order.
pub fn wanda_variant(metric: &[f32], cols: usize, order: &[u32], ratio: f64) -> (Vec<bool>, f64) {
    let t = tables_in_order(metric, cols, order);
    bisect_alpha(ratio, |alpha| given_alpha(metric, cols, &t, alpha))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_prunes_up_to_its_last_running_sum_within_alpha() {
        // One row: sorted 1, 2, 3, 4 (running 1, 3, 6, 10), total 10.
        let metric = [3.0, 1.0, 4.0, 2.0];
        let t = tables(&metric, 4);
        assert_eq!(t.sorted, vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!(t.cum, vec![1.0, 3.0, 6.0, 10.0]);
        assert_eq!(t.totals, vec![10.0]);
        // α 0.35: running sums 1 and 3 are within 3.5; threshold 2.
        assert_eq!(thresholds(&t, 4, 0.35), vec![Some(2.0)]);
        let (mask, s) = given_alpha(&metric, 4, &t, 0.35);
        assert_eq!(mask, vec![false, true, false, true]);
        assert_eq!(s, 0.5);
        // α 0.05: nothing within 0.5; the row prunes nothing.
        assert_eq!(thresholds(&t, 4, 0.05), vec![None]);
        assert_eq!(given_alpha(&metric, 4, &t, 0.05).1, 0.0);
    }

    #[test]
    fn the_search_halves_towards_the_target() {
        // A sparsity that grows with α: the search stops within 0.001.
        let (seen, alpha) = bisect_alpha(0.3, |a| (a, a * 0.9));
        assert!((seen * 0.9 - 0.3).abs() <= 0.001, "{seen}");
        assert_eq!(seen, alpha);
        // Unreachable: the interval closes instead.
        let (_, alpha) = bisect_alpha(0.99, |a| ((), a));
        assert!(alpha > 0.79, "{alpha}");
    }
}
