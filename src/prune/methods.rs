//! Magnitude and Wanda masks, as `lib/prune.py` of the Wanda authors
//! computes them, on a weight matrix in PyTorch orientation (`[out, in]`,
//! row-major: one row per output).
//!
//! - magnitude, unstructured: one threshold per matrix,
//!   `sort(|W|.flatten())[int(numel * ratio)]`, prune `|W| <= threshold`;
//! - Wanda: metric `|W| * sqrt(scaler_row)`, compared within each output
//!   row: the `int(in * ratio)` smallest of each row (stable sort order for
//!   ties), or the α-bisection variant (`--use-variant`, `variant`);
//! - N:M (both): in every group of M consecutive input columns of a row, the
//!   N smallest.

use rayon::prelude::*;

use super::Pattern;

/// Zeroes `w` where `mask` is set; returns how many were zeroed.
pub fn apply_mask(w: &mut [f32], mask: &[bool]) -> usize {
    let mut n = 0;
    for (v, m) in w.iter_mut().zip(mask) {
        if *m {
            *v = 0.0;
            n += 1;
        }
    }
    n
}

/// The `n` smallest of each group of `m` columns, per row (stable: among
/// equal values the lower column goes first).
pub fn nm_mask(metric: &[f32], cols: usize, n: usize, m: usize) -> Vec<bool> {
    let mut mask = vec![false; metric.len()];
    mask.par_chunks_mut(cols)
        .zip(metric.par_chunks(cols))
        .for_each(|(mrow, row)| {
            for g in (0..cols).step_by(m) {
                let end = (g + m).min(cols);
                let mut idx: Vec<usize> = (g..end).collect();
                idx.sort_by(|a, b| row[*a].total_cmp(&row[*b]));
                for &j in idx.iter().take(n) {
                    mrow[j] = true;
                }
            }
        });
    mask
}

/// One threshold over the whole matrix, as magnitude and RIA take it:
/// `sort(metric.flatten())[int(numel * ratio)]`, prune `metric <= threshold`.
fn threshold_mask(metric: &[f32], ratio: f64) -> Vec<bool> {
    let k = ((metric.len() as f64) * ratio) as usize;
    if k >= metric.len() {
        return vec![true; metric.len()];
    }
    let mut sorted = metric.to_vec();
    let (_, thresh, _) = sorted.select_nth_unstable_by(k, |a, b| a.total_cmp(b));
    let thresh = *thresh;
    metric.iter().map(|v| *v <= thresh).collect()
}

/// Magnitude pruning of one matrix.
pub fn magnitude_mask(w: &[f32], cols: usize, ratio: f64, pattern: Pattern) -> Vec<bool> {
    let metric: Vec<f32> = w.iter().map(|v| v.abs()).collect();
    match pattern {
        Pattern::NM { n, m } => nm_mask(&metric, cols, n, m),
        Pattern::Unstructured => threshold_mask(&metric, ratio),
    }
}

/// RIA's metric (relative importance times activations, the authors'
/// `lib/prune.py`): `(|W_ij| / Σ_i |W_ij| + |W_ij| / Σ_j |W_ij|) *
/// sqrt(scaler_row_j)^a` — each weight's share of its input column's and of
/// its output row's absolute sum, scaled by the input's norm to the power
/// `a` (0.5 in the paper). Sums are taken in f64 and rounded once.
pub fn ria_metric(w: &[f32], cols: usize, scaler_row: &[f32], a: f64) -> Vec<f32> {
    let rows = w.len() / cols.max(1);
    let mut col_sum = vec![0f64; cols];
    for row in w.chunks(cols) {
        for (c, v) in col_sum.iter_mut().zip(row) {
            *c += v.abs() as f64;
        }
    }
    let col_sum: Vec<f32> = col_sum.into_iter().map(|c| c as f32).collect();
    let scale: Vec<f32> = scaler_row.iter().map(|s| s.sqrt().powf(a as f32)).collect();
    let mut metric = vec![0f32; w.len()];
    metric
        .par_chunks_mut(cols)
        .zip(w.par_chunks(cols))
        .take(rows)
        .for_each(|(out, row)| {
            let row_sum = row.iter().map(|v| v.abs() as f64).sum::<f64>() as f32;
            for (j, (o, v)) in out.iter_mut().zip(row).enumerate() {
                let x = v.abs();
                *o = (x / col_sum[j] + x / row_sum) * scale[j];
            }
        });
    metric
}

/// RIA's mask: N:M per group of each row; unstructured with one threshold
/// over the matrix (the authors' default), or per output row like Wanda
/// (`per_outneuron`).
pub fn ria_mask(
    metric: &[f32],
    cols: usize,
    ratio: f64,
    pattern: Pattern,
    per_outneuron: bool,
) -> Vec<bool> {
    match pattern {
        Pattern::NM { n, m } => nm_mask(metric, cols, n, m),
        Pattern::Unstructured if per_outneuron => wanda_mask(metric, cols, ratio, pattern, false).0,
        Pattern::Unstructured => threshold_mask(metric, ratio),
    }
}

/// Wanda's metric: `|W_ij| * sqrt(scaler_row_j)`.
pub fn wanda_metric(w: &[f32], cols: usize, scaler_row: &[f32]) -> Vec<f32> {
    let norms: Vec<f32> = scaler_row.iter().map(|s| s.sqrt()).collect();
    let mut metric = vec![0f32; w.len()];
    metric
        .par_chunks_mut(cols)
        .zip(w.par_chunks(cols))
        .for_each(|(out, row)| {
            for ((o, v), s) in out.iter_mut().zip(row).zip(&norms) {
                *o = v.abs() * s;
            }
        });
    metric
}

/// Wanda's mask. Returns the mask and, for the variant, the α it found.
pub fn wanda_mask(
    metric: &[f32],
    cols: usize,
    ratio: f64,
    pattern: Pattern,
    variant: bool,
) -> (Vec<bool>, Option<f64>) {
    if let Pattern::NM { n, m } = pattern {
        return (nm_mask(metric, cols, n, m), None);
    }
    let order = super::variant::sorted_rows(metric, cols);
    if !variant {
        let k = ((cols as f64) * ratio) as usize;
        let mut mask = vec![false; metric.len()];
        mask.par_chunks_mut(cols)
            .zip(order.par_chunks(cols))
            .for_each(|(mrow, idx)| {
                for &j in idx.iter().take(k) {
                    mrow[j as usize] = true;
                }
            });
        return (mask, None);
    }
    let (mask, alpha) = super::variant::wanda_variant(metric, cols, &order, ratio);
    (mask, Some(alpha))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magnitude_threshold_is_per_matrix() {
        // 10 weights, ratio 0.3: sorted index int(3) = 4th smallest; ties pruned too.
        let w = [0.9, -0.1, 0.5, 0.2, -0.3, 0.8, 0.3, 0.05, 0.7, -0.6];
        let mask = magnitude_mask(&w, 5, 0.3, Pattern::Unstructured);
        let pruned: Vec<f32> = w
            .iter()
            .zip(&mask)
            .filter(|(_, m)| **m)
            .map(|(v, _)| *v)
            .collect();
        assert_eq!(pruned, vec![-0.1, 0.2, -0.3, 0.3, 0.05]);
    }

    #[test]
    fn wanda_prunes_exactly_k_per_row() {
        let cols = 8;
        let metric: Vec<f32> = (0..32).map(|i| ((i * 37) % 11) as f32).collect();
        let (mask, alpha) = wanda_mask(&metric, cols, 0.5, Pattern::Unstructured, false);
        assert!(alpha.is_none());
        for row in mask.chunks(cols) {
            assert_eq!(row.iter().filter(|m| **m).count(), 4);
        }
        // Ties: the stable order prunes the earlier column.
        let (mask, _) = wanda_mask(&[1.0, 1.0, 2.0, 0.5], 4, 0.5, Pattern::Unstructured, false);
        assert_eq!(mask, vec![true, false, false, true]);
    }

    #[test]
    fn nm_groups() {
        let metric = [4.0, 1.0, 3.0, 2.0, 0.1, 0.2, 0.3, 0.4];
        let mask = nm_mask(&metric, 8, 2, 4);
        assert_eq!(
            mask,
            vec![false, true, false, true, true, true, false, false]
        );
    }

    #[test]
    fn variant_reaches_the_target() {
        let mut rng = crate::model::synthetic::Normal::new(4);
        let metric: Vec<f32> = (0..64 * 128).map(|_| rng.sample().abs()).collect();
        let (mask, alpha) = wanda_mask(&metric, 128, 0.5, Pattern::Unstructured, true);
        let s = mask.iter().filter(|m| **m).count() as f64 / mask.len() as f64;
        assert!((s - 0.5).abs() <= 0.001 || alpha.is_some(), "{s}");
        assert!((s - 0.5).abs() < 0.01, "sparsity {s} alpha {alpha:?}");
    }
}
