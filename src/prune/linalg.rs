//! Dense linear algebra SparseGPT needs, on row-major f32 matrices: a
//! blocked Cholesky factorisation, the inverse of a lower-triangular matrix,
//! and the upper Cholesky factor of an inverse.
//!
//! SparseGPT computes `U = cholesky(cholesky_inverse(cholesky(H)), upper)`,
//! i.e. the upper factor with `Uᵀ U = H⁻¹`. The same `U` comes from one
//! factorisation and one triangular inverse: with `P` the index reversal,
//! `P H P = L' L'ᵀ` gives `H = R Rᵀ` with `R = P L' P` upper, so
//! `H⁻¹ = R⁻ᵀ R⁻¹` and `U = R⁻¹ = P L'⁻¹ P`. Both steps are blocked so the
//! bulk of the work runs in `gemm`, like LAPACK's `spotrf`/`strtri`.

use rayon::prelude::*;

const NB: usize = 96;

/// `c[m×n] -= a[m×k] · b[k×n]` with explicit row strides (column stride 1),
/// or `b` read transposed when `b_transposed` (then `b` is `n×k`).
#[allow(clippy::too_many_arguments)]
pub(super) fn gemm_sub(
    m: usize,
    n: usize,
    k: usize,
    c: *mut f32,
    c_rs: usize,
    a: *const f32,
    a_rs: usize,
    b: *const f32,
    b_rs: usize,
    b_transposed: bool,
) {
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    let (b_rs_eff, b_cs_eff) = if b_transposed {
        (1isize, b_rs as isize)
    } else {
        (b_rs as isize, 1isize)
    };
    // SAFETY: callers pass pointers into live buffers sized for m, n, k and
    // the given strides.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c,
            1,
            c_rs as isize,
            true,
            a,
            1,
            a_rs as isize,
            b,
            b_cs_eff,
            b_rs_eff,
            1.0,
            -1.0,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(0),
        );
    }
}

/// Error: the matrix is not positive definite (pivot `index` is `value`).
#[derive(Debug, Clone, PartialEq)]
pub struct NotPositiveDefinite {
    pub index: usize,
    pub value: f64,
}

/// In-place lower Cholesky factor of the symmetric positive-definite `a`
/// (`n × n`, row-major; the strict upper triangle is zeroed).
pub fn cholesky_lower(a: &mut [f32], n: usize) -> Result<(), NotPositiveDefinite> {
    assert_eq!(a.len(), n * n);
    let mut k = 0;
    while k < n {
        let kb = NB.min(n - k);
        // Factor the diagonal block (accumulating in f64).
        for j in k..k + kb {
            let mut d = a[j * n + j] as f64;
            for p in k..j {
                d -= (a[j * n + p] as f64).powi(2);
            }
            if d <= 0.0 || !d.is_finite() {
                return Err(NotPositiveDefinite { index: j, value: d });
            }
            let d = d.sqrt();
            a[j * n + j] = d as f32;
            for i in j + 1..k + kb {
                let mut s = a[i * n + j] as f64;
                for p in k..j {
                    s -= a[i * n + p] as f64 * a[j * n + p] as f64;
                }
                a[i * n + j] = (s / d) as f32;
            }
        }
        let below = n - k - kb;
        if below > 0 {
            // A21 <- A21 · L11⁻ᵀ: each row solves x · L11ᵀ = a (forward).
            let diag: Vec<f32> = (0..kb * kb)
                .map(|t| a[(k + t / kb) * n + k + t % kb])
                .collect();
            a[(k + kb) * n..].par_chunks_mut(n).for_each(|row| {
                for j in 0..kb {
                    let mut s = row[k + j] as f64;
                    for p in 0..j {
                        s -= row[k + p] as f64 * diag[j * kb + p] as f64;
                    }
                    row[k + j] = (s / diag[j * kb + j] as f64) as f32;
                }
            });
            // A22 <- A22 - A21 · A21ᵀ
            let base = a.as_mut_ptr();
            // SAFETY: A21 (rows k+kb.., cols k..k+kb) and A22 (rows and cols
            // k+kb..) do not overlap.
            unsafe {
                gemm_sub(
                    below,
                    below,
                    kb,
                    base.add((k + kb) * n + k + kb),
                    n,
                    base.add((k + kb) * n + k),
                    n,
                    base.add((k + kb) * n + k),
                    n,
                    true,
                );
            }
        }
        k += kb;
    }
    for i in 0..n {
        for j in i + 1..n {
            a[i * n + j] = 0.0;
        }
    }
    Ok(())
}

/// Inverse of a lower-triangular `l` (`n × n`, row-major), itself lower.
/// Each block column of `X = L⁻¹` depends on `L` alone, so the block
/// columns are solved in parallel (one thread each, every core busy: an
/// H100 host spent 10 s of a 1B shape's SparseGPT layer here at 3 of 16
/// cores when they were solved in turn).
pub fn invert_lower(l: &[f32], n: usize) -> Vec<f32> {
    let mut x = vec![0f32; n * n];
    let out = SharedOut(x.as_mut_ptr());
    let starts: Vec<usize> = (0..n).step_by(NB).collect();
    starts.par_iter().for_each(|&j| {
        let out = &out;
        // SAFETY: the task for block column `j` writes only columns
        // `j..j + jb` of `x` (and reads only those), so no two tasks touch
        // the same element; `x` outlives the scope.
        unsafe { invert_block_column(l, n, j, out.0) }
    });
    x
}

/// `x`'s buffer, shared by the block-column tasks of [`invert_lower`].
struct SharedOut(*mut f32);
// SAFETY: the tasks write disjoint columns (see `invert_lower`).
unsafe impl Sync for SharedOut {}

/// Block column `j..j + jb` of `L⁻¹` into `x` (row-major `n × n`): the
/// diagonal block by forward substitution, then each block row below as
/// `X_ij = -L_ii⁻¹ · Σ_{k=j}^{i-1} L_ik X_kj`. Rows are finished in order
/// and each row's entries are updated together (row-wise, cache-friendly);
/// every entry sums its terms in the order of the column-wise recurrence.
///
/// # Safety
/// `x` is a live `n × n` buffer whose columns `j..j + jb` no other thread
/// touches meanwhile.
unsafe fn invert_block_column(l: &[f32], n: usize, j: usize, x: *mut f32) {
    let jb = NB.min(n - j);
    let at = |r: usize, c: usize| r * n + c;
    let mut s = [0f64; NB];
    // Diagonal block: row r of X_jj from rows p < r.
    for r in 0..jb {
        for (c, v) in s.iter_mut().enumerate().take(r + 1) {
            *v = if c == r { 1.0 } else { 0.0 };
        }
        for p in 0..r {
            let coef = l[at(j + r, j + p)] as f64;
            for (c, v) in s.iter_mut().enumerate().take(p + 1) {
                // SAFETY: row j + p < n, column j + c < j + jb.
                *v -= coef * unsafe { *x.add(at(j + p, j + c)) } as f64;
            }
        }
        let d = l[at(j + r, j + r)] as f64;
        for (c, v) in s.iter().enumerate().take(r + 1) {
            // SAFETY: as above.
            unsafe { *x.add(at(j + r, j + c)) = (v / d) as f32 };
        }
    }
    let mut i = j + jb;
    let mut t = vec![0f32; NB * jb];
    while i < n {
        let ib = NB.min(n - i);
        t[..ib * jb].fill(0.0);
        // t = -(L[i, j..i] · X[j..i, j..j+jb])
        gemm_sub(
            ib,
            jb,
            i - j,
            t.as_mut_ptr(),
            jb,
            l[at(i, j)..].as_ptr(),
            n,
            // SAFETY: rows j..i of this task's columns, already written.
            unsafe { x.add(at(j, j)) },
            n,
            false,
        );
        for r in 0..ib {
            for (c, v) in s.iter_mut().enumerate().take(jb) {
                *v = t[r * jb + c] as f64;
            }
            for p in 0..r {
                let coef = l[at(i + r, i + p)] as f64;
                for (c, v) in s.iter_mut().enumerate().take(jb) {
                    // SAFETY: row i + p < n, column j + c < j + jb.
                    *v -= coef * unsafe { *x.add(at(i + p, j + c)) } as f64;
                }
            }
            let d = l[at(i + r, i + r)] as f64;
            for (c, v) in s.iter().enumerate().take(jb) {
                // SAFETY: as above.
                unsafe { *x.add(at(i + r, j + c)) = (v / d) as f32 };
            }
        }
        i += ib;
    }
}

/// Upper-triangular `U` with `Uᵀ U = H⁻¹`, for symmetric positive-definite
/// `h` (what SparseGPT calls `Hinv`).
pub fn inverse_upper_cholesky(h: &[f32], n: usize) -> Result<Vec<f32>, NotPositiveDefinite> {
    // P H P
    let mut r: Vec<f32> = (0..n * n)
        .map(|t| h[(n - 1 - t / n) * n + (n - 1 - t % n)])
        .collect();
    cholesky_lower(&mut r, n)?;
    let inv = invert_lower(&r, n);
    // U = P inv P
    Ok((0..n * n)
        .map(|t| inv[(n - 1 - t / n) * n + (n - 1 - t % n)])
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spd(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = crate::model::synthetic::Normal::new(seed);
        let x: Vec<f32> = rng.vec(n * (n + 7), 1.0);
        let m = n + 7;
        let mut h = vec![0f32; n * n];
        for i in 0..n {
            for j in 0..n {
                h[i * n + j] = (0..m).map(|t| x[i * m + t] * x[j * m + t]).sum::<f32>() / m as f32;
            }
            h[i * n + i] += 0.1;
        }
        h
    }

    fn matmul(a: &[f32], b: &[f32], n: usize) -> Vec<f64> {
        let mut c = vec![0f64; n * n];
        for i in 0..n {
            for k in 0..n {
                for j in 0..n {
                    c[i * n + j] += a[i * n + k] as f64 * b[k * n + j] as f64;
                }
            }
        }
        c
    }

    fn transpose(a: &[f32], n: usize) -> Vec<f32> {
        (0..n * n).map(|t| a[(t % n) * n + t / n]).collect()
    }

    #[test]
    fn cholesky_reconstructs_across_blocks() {
        let n = 211; // three blocks, ragged last
        let h = spd(n, 1);
        let mut l = h.clone();
        cholesky_lower(&mut l, n).unwrap();
        let llt = matmul(&l, &transpose(&l, n), n);
        let err = llt
            .iter()
            .zip(&h)
            .map(|(a, b)| (a - *b as f64).abs())
            .fold(0.0, f64::max);
        assert!(err < 1e-4, "{err}");
        assert!((0..n).all(|i| (i + 1..n).all(|j| l[i * n + j] == 0.0)));
    }

    #[test]
    fn inverse_upper_factor() {
        let n = 150;
        let h = spd(n, 2);
        let u = inverse_upper_cholesky(&h, n).unwrap();
        assert!((0..n).all(|i| (0..i).all(|j| u[i * n + j] == 0.0)), "upper");
        // H · (Uᵀ U) = I
        let hinv = matmul(&transpose(&u, n), &u, n);
        let hinv: Vec<f32> = hinv.iter().map(|v| *v as f32).collect();
        let eye = matmul(&h, &hinv, n);
        for i in 0..n {
            for j in 0..n {
                let want = if i == j { 1.0 } else { 0.0 };
                assert!(
                    (eye[i * n + j] - want).abs() < 1e-3,
                    "({i},{j}) {}",
                    eye[i * n + j]
                );
            }
        }
        assert!(u[0] > 0.0 && u[n * n - 1] > 0.0);
    }

    #[test]
    fn indefinite_is_reported() {
        let mut a = vec![1.0, 2.0, 2.0, 1.0];
        assert_eq!(cholesky_lower(&mut a, 2).unwrap_err().index, 1);
    }
}
