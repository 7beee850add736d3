//! The f32 matrix product of the CPU forward's linears.
//!
//! Burn's CPU backend multiplies a `[batch, seq, in]` input by a weight as
//! `batch` separate products, run in parallel over the batch, each on one
//! thread. On this project's 2-core AVX-512 machine that reached about 110
//! GFLOP/s in the decoder's forward. One product over all `batch · seq` rows,
//! parallel inside the `gemm` crate, reaches 160–180 GFLOP/s on the same
//! shapes (`cargo run --release --example gemm_rate`, 2026-11-23). Debian's
//! OpenBLAS 0.3.21 (`libopenblas-dev`), measured through `cblas_sgemm` on
//! the same shapes in the same sitting, reached 140–213 GFLOP/s: no better
//! overall, so no BLAS is linked.

/// A read-only matrix: element `(i, j)` is at `ptr[i * rs + j * cs]`.
#[derive(Clone, Copy)]
pub struct MatRef<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a> MatRef<'a> {
    /// A row-major matrix.
    pub fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self {
            data,
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }

    fn fits(&self) -> bool {
        self.rows == 0
            || self.cols == 0
            || (self.rows - 1) * self.rs + (self.cols - 1) * self.cs < self.data.len()
    }
}

/// Heap a thread keeps once it has run part of a product, until it exits:
/// the `gemm` crate's thread-local packing block, as large as the L2 cache
/// it detects on this CPU (`gemm_common::cache::CACHE_INFO`): 1 MiB on the
/// AMD EPYC the CPU estimator was fitted on, 2 MiB on the 2 MiB-L2 Xeon
/// that measured it, 2026-11-27.
pub fn thread_block_bytes() -> u64 {
    gemm_common::cache::CACHE_INFO[1].cache_bytes as u64
}

/// The blocks of every thread the CPU's products run on (rayon's pool):
/// what the first product leaves on the heap for the rest of the run
/// (`tests/matmul_workspace.rs`). The CPU estimator counts it, and a run's
/// plan records it for comparisons with the run's own machine.
pub fn workspace_bytes() -> u64 {
    thread_block_bytes() * rayon::current_num_threads() as u64
}

/// `a · b` as a new row-major `[a.rows, b.cols]` matrix.
pub fn sgemm(a: MatRef<'_>, b: MatRef<'_>) -> Vec<f32> {
    assert_eq!(a.cols, b.rows, "sgemm: inner dimensions differ");
    assert!(a.fits() && b.fits(), "sgemm: strides run past the data");
    if a.rows == 0 || b.cols == 0 || a.cols == 0 {
        return vec![0f32; a.rows * b.cols];
    }
    // Not zeroed first: the product overwrites every element without reading
    // it (a reused buffer then costs no pass over memory).
    let mut out = Vec::with_capacity(a.rows * b.cols);
    gemm_crate(a, b, out.spare_capacity_mut().as_mut_ptr().cast());
    // SAFETY: `gemm_crate` wrote all m×n elements.
    unsafe { out.set_len(a.rows * b.cols) };
    out
}

/// `out = a · b` into `m×n` row-major memory that is written, never read.
fn gemm_crate(a: MatRef<'_>, b: MatRef<'_>, out: *mut f32) {
    let (m, n, k) = (a.rows, b.cols, a.cols);
    // SAFETY: `fits` checked every index the strides reach; `out` has room
    // for m×n values, and `read_dst` is false so it is only written.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out,
            1,
            n as isize,
            false,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(0),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_naive_product_for_every_layout() {
        let (m, k, n) = (37, 53, 29);
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 11) as f32 - 5.0).collect();
        // b stored transposed: element (i, j) at j * k + i.
        let bt: Vec<f32> = (0..n * k).map(|x| b[(x % k) * n + x / k]).collect();
        let want: Vec<f32> = (0..m * n)
            .map(|x| (0..k).map(|p| a[(x / n) * k + p] * b[p * n + x % n]).sum())
            .collect();
        let am = MatRef::row_major(&a, m, k);
        for bm in [
            MatRef::row_major(&b, k, n),
            MatRef {
                data: &bt,
                rows: k,
                cols: n,
                rs: 1,
                cs: k,
            },
        ] {
            assert_eq!(sgemm(am, bm), want);
        }
    }
}
