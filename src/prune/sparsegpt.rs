//! SparseGPT's `fasterprune` (IST-DASLab, `sparsegpt.py`), on a weight in
//! PyTorch orientation (`[rows = out, cols = in]`) and its input Hessian
//! `H = 2/N Σ x xᵀ` (`[cols, cols]`, f32).
//!
//! Same steps as the reference: dead inputs (`diag(H) == 0`) get `H_ii = 1`
//! and their weight column zeroed; dampening `percdamp · mean(diag(H))` on the
//! diagonal; `Hinv` = upper Cholesky factor of `H⁻¹`; columns processed in
//! blocks of 128 with the Optimal Brain Surgeon update inside the block and
//! the lazy batch update `W[:, i2:] -= Err1 · Hinv[i1:i2, i2:]` after it; the
//! unstructured mask chosen per block (`W1² / diag(Hinv1)²` at or below its
//! `int(numel · sparsity)`-th smallest value), N:M chosen every M columns.
//!
//! Differences: `Hinv` comes from one factorisation of the reversed `H` and a
//! triangular inverse instead of cholesky → cholesky_inverse → cholesky
//! (same matrix, different rounding; see `linalg`); within a block each row's
//! column sweep runs on its own thread (rows are independent in the
//! reference's updates too).

use rayon::prelude::*;

use super::Pattern;
use super::linalg::{NotPositiveDefinite, inverse_upper_cholesky};

/// Result of pruning one matrix.
pub struct SparseGptResult {
    /// The pruned and updated weights, `[rows, cols]`.
    pub weight: Vec<f32>,
    /// Σ over rows of the OBS loss (what the reference prints as `error`).
    pub error: f64,
}

/// The reference's `fasterprune` arguments.
#[derive(Debug, Clone, Copy)]
pub struct SparseGptOptions {
    pub sparsity: f64,
    pub pattern: Pattern,
    /// Dampening as a fraction of the mean Hessian diagonal (0.01).
    pub percdamp: f64,
    /// Columns per block (128).
    pub blocksize: usize,
}

/// The dampening the reference applies: a dead input (a zero diagonal,
/// an input never active) gets 1 on its diagonal, then every diagonal
/// entry gains `percdamp` times their mean. Returns the dead flags and
/// what each diagonal entry gains.
pub fn dampening(diag: &[f32], percdamp: f64) -> (Vec<bool>, Vec<f32>) {
    let dead: Vec<bool> = diag.iter().map(|d| *d == 0.0).collect();
    let n = diag.len().max(1) as f64;
    let mean = diag
        .iter()
        .zip(&dead)
        .map(|(d, dead)| if *dead { 1.0 } else { *d as f64 })
        .sum::<f64>()
        / n;
    let damp = (percdamp * mean) as f32;
    let add = dead
        .iter()
        .map(|dead| if *dead { 1.0 + damp } else { damp })
        .collect();
    (dead, add)
}

/// SparseGPT's `Hinv` from the Hessian `h` (`cols × cols`, consumed):
/// dead inputs (zero diagonal) get a 1 there, the diagonal is dampened by
/// `percdamp` of its mean ([`dampening`]), then the upper Cholesky factor
/// of the inverse. Also returns which inputs were dead (their weights count
/// as zero).
pub fn dampened_hinv(
    mut h: Vec<f32>,
    cols: usize,
    percdamp: f64,
) -> Result<(Vec<f32>, Vec<bool>), NotPositiveDefinite> {
    let diag: Vec<f32> = (0..cols).map(|j| h[j * cols + j]).collect();
    let (dead, add) = dampening(&diag, percdamp);
    for (j, a) in add.iter().enumerate() {
        h[j * cols + j] += a;
    }
    Ok((inverse_upper_cholesky(&h, cols)?, dead))
}

/// Runs `fasterprune` on `w` (`rows × cols`) with Hessian `h` (`cols × cols`,
/// consumed).
pub fn fasterprune(
    w: &[f32],
    rows: usize,
    cols: usize,
    h: Vec<f32>,
    options: SparseGptOptions,
) -> Result<SparseGptResult, NotPositiveDefinite> {
    let SparseGptOptions {
        sparsity,
        pattern,
        percdamp,
        blocksize,
    } = options;
    let mut w = w.to_vec();
    let (hinv, dead) = dampened_hinv(h, cols, percdamp)?;
    for (j, _) in dead.iter().enumerate().filter(|(_, d)| **d) {
        for r in 0..rows {
            w[r * cols + j] = 0.0;
        }
    }

    let mut error = 0f64;
    let mut i1 = 0;
    while i1 < cols {
        let i2 = (i1 + blocksize).min(cols);
        let count = i2 - i1;
        // Hinv1 = Hinv[i1:i2, i1:i2]
        let hinv1: Vec<f32> = (0..count * count)
            .map(|t| hinv[(i1 + t / count) * cols + i1 + t % count])
            .collect();
        let block = Block {
            cols: i1..i2,
            diag1: (0..count).map(|i| hinv1[i * count + i]).collect(),
            hinv1,
        };
        let threshold = match pattern {
            Pattern::Unstructured => Some(block.threshold(&w, rows, cols, sparsity)),
            Pattern::NM { .. } => None,
        };
        // Each row sweeps its block's columns independently; Err1 is kept
        // for the lazy update of the columns after the block.
        let mut err1 = vec![0f32; rows * count];
        let losses: f64 = w
            .par_chunks_mut(cols)
            .zip(err1.par_chunks_mut(count))
            .map(|(row, err_row)| block.sweep(&mut row[i1..i2], err_row, threshold, pattern))
            .sum();
        error += losses;
        if i2 < cols {
            lazy_update(&mut w, rows, cols, &block.cols, &err1, &hinv);
        }
        i1 = i2;
    }
    Ok(SparseGptResult { weight: w, error })
}

/// One block of columns of the sweep: `Hinv[i1:i2, i1:i2]` and its
/// diagonal.
struct Block {
    cols: std::ops::Range<usize>,
    hinv1: Vec<f32>,
    diag1: Vec<f32>,
}

impl Block {
    /// Unstructured: one threshold for the whole block, the `sparsity`
    /// quantile of `w² / d²` over its columns.
    fn threshold(&self, w: &[f32], rows: usize, cols: usize, sparsity: f64) -> f32 {
        let (i1, count) = (self.cols.start, self.cols.len());
        let mut tmp: Vec<f32> = (0..rows * count)
            .map(|t| {
                let v = w[(t / count) * cols + i1 + t % count];
                let d = self.diag1[t % count];
                v * v / (d * d)
            })
            .collect();
        let k = ((tmp.len() as f64) * sparsity) as usize;
        if k >= tmp.len() {
            f32::INFINITY
        } else {
            let (_, t, _) = tmp.select_nth_unstable_by(k, |a, b| a.total_cmp(b));
            *t
        }
    }

    /// One row's sweep over the block's columns `w1`: each column pruned
    /// (below `threshold`, or the `n` smallest of its N:M group) or kept,
    /// its error spread over the columns after it; `err_row` keeps the
    /// errors for the lazy update. Returns the row's loss.
    fn sweep(
        &self,
        w1: &mut [f32],
        err_row: &mut [f32],
        threshold: Option<f32>,
        pattern: Pattern,
    ) -> f64 {
        let (count, diag1) = (self.cols.len(), &self.diag1);
        let mut mask = vec![false; count];
        if let Some(th) = threshold {
            for (i, m) in mask.iter_mut().enumerate() {
                let d = diag1[i];
                *m = w1[i] * w1[i] / (d * d) <= th;
            }
        }
        let mut loss = 0f64;
        for i in 0..count {
            if let Pattern::NM { n, m } = pattern
                && i % m == 0
            {
                let end = (i + m).min(count);
                let mut idx: Vec<usize> = (i..end).collect();
                let key = |j: usize| w1[j] * w1[j] / (diag1[j] * diag1[j]);
                idx.sort_by(|a, b| key(*a).total_cmp(&key(*b)));
                for &j in idx.iter().take(n) {
                    mask[j] = true;
                }
            }
            let wv = w1[i];
            let q = if mask[i] { 0.0 } else { wv };
            let d = diag1[i];
            loss += ((wv - q) as f64).powi(2) / (d as f64).powi(2);
            let e = (wv - q) / d;
            // W1[:, i:] -= err1 * Hinv1[i, i:] (column i becomes q).
            let hrow = &self.hinv1[i * count..(i + 1) * count];
            for j in i..count {
                w1[j] -= e * hrow[j];
            }
            w1[i] = q;
            err_row[i] = e;
        }
        loss / 2.0
    }
}

/// Lazy batch update of the columns after `block`:
/// `W[:, i2:] -= Err1 · Hinv[i1:i2, i2:]`.
fn lazy_update(
    w: &mut [f32],
    rows: usize,
    cols: usize,
    block: &std::ops::Range<usize>,
    err1: &[f32],
    hinv: &[f32],
) {
    let (i1, i2, count) = (block.start, block.end, block.len());
    let rest = cols - i2;
    assert!(w.len() >= rows * cols && err1.len() >= rows * count && hinv.len() >= i2 * cols);
    // W[:, i2..] (row stride cols), Err1 and Hinv's rows i1..i2 from column
    // i2 are disjoint live buffers of these sizes (checked above).
    super::linalg::gemm_sub(
        rows,
        rest,
        count,
        w[i2..].as_mut_ptr(),
        cols,
        err1.as_ptr(),
        count,
        hinv[i1 * cols + i2..].as_ptr(),
        cols,
        false,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::synthetic::Normal;

    fn opts(sparsity: f64, pattern: Pattern, blocksize: usize) -> SparseGptOptions {
        SparseGptOptions {
            sparsity,
            pattern,
            percdamp: 0.01,
            blocksize,
        }
    }

    fn problem(rows: usize, cols: usize, n: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let mut rng = Normal::new(9);
        let w = rng.vec(rows * cols, 1.0);
        let (h, x) = crate::model::synthetic::correlated_hessian(&mut rng, cols, n);
        (w, h, x)
    }

    fn output_error(w0: &[f32], w1: &[f32], x: &[f32], rows: usize, cols: usize) -> f64 {
        let n = x.len() / cols;
        let mut e = 0f64;
        for s in 0..n {
            for r in 0..rows {
                let dot = |w: &[f32]| {
                    (0..cols)
                        .map(|j| (w[r * cols + j] * x[s * cols + j]) as f64)
                        .sum::<f64>()
                };
                e += (dot(w0) - dot(w1)).powi(2);
            }
        }
        e
    }

    #[test]
    fn sparsity_and_compensation() {
        let (rows, cols) = (24, 160);
        let (w, h, x) = problem(rows, cols, 400);
        let r = fasterprune(&w, rows, cols, h, opts(0.5, Pattern::Unstructured, 64)).unwrap();
        let zeros = r.weight.iter().filter(|v| **v == 0.0).count();
        let s = zeros as f64 / r.weight.len() as f64;
        assert!((0.49..0.53).contains(&s), "sparsity {s}");
        assert!(r.error > 0.0);
        // The OBS update beats zeroing the same weights without it.
        let mut plain = w.clone();
        for (p, q) in plain.iter_mut().zip(&r.weight) {
            if *q == 0.0 {
                *p = 0.0;
            }
        }
        let with = output_error(&w, &r.weight, &x, rows, cols);
        let without = output_error(&w, &plain, &x, rows, cols);
        assert!(with < 0.8 * without, "OBS {with} vs mask only {without}");
    }

    #[test]
    fn two_four_pattern_holds() {
        let (rows, cols) = (8, 64);
        let (w, h, _) = problem(rows, cols, 200);
        let r = fasterprune(
            &w,
            rows,
            cols,
            h,
            opts(0.5, Pattern::NM { n: 2, m: 4 }, 128),
        )
        .unwrap();
        for row in r.weight.chunks(cols) {
            for g in row.chunks(4) {
                assert_eq!(g.iter().filter(|v| **v == 0.0).count(), 2, "{g:?}");
            }
        }
    }

    #[test]
    fn dead_inputs_are_zeroed() {
        let (rows, cols) = (4, 32);
        let (w, mut h, _) = problem(rows, cols, 100);
        for j in 0..cols {
            h[3 * cols + j] = 0.0;
            h[j * cols + 3] = 0.0;
        }
        let r = fasterprune(&w, rows, cols, h, opts(0.25, Pattern::Unstructured, 16)).unwrap();
        assert!((0..rows).all(|i| r.weight[i * cols + 3] == 0.0));
    }
}
