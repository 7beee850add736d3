//! SparseGPT's factorisation where its Hessian is: `Hinv`, the upper
//! Cholesky factor of the dampened inverse Hessian, made on the device in
//! blocks, so that neither the `in × in` Hessian comes back nor its
//! inverse goes up. On an 8B shape's down projection (14 336 inputs) that
//! is 822 MB each way and about 2·10¹² flops of host factorisation per
//! layer ([`super::linalg`] on the host cores), against two matrix
//! products per block on the device.
//!
//! The arithmetic is [`super::linalg::inverse_upper_cholesky`]'s: with
//! `H = R Rᵀ` (`R` upper triangular), `Hinv = R⁻¹`. Both steps walk blocks
//! of `nb` inputs (SparseGPT's `--blocksize`, so that the sweep's diagonal
//! blocks of `Hinv` are the ones the host made):
//!
//! 1. from the last block to the first, the block `C` on the diagonal
//!    comes to the host (`nb² · 4` bytes), is dampened there (and a dead
//!    input's diagonal set to 1, as the reference does before its
//!    factorisation: nothing earlier touches a dead input's row, which
//!    stays exactly zero) and factored in f64: `X = R_kk⁻¹`, which goes
//!    up. On the device the block column above it becomes `R_ik = H_ik ·
//!    Xᵀ`, and the Hessian left of it loses `R_ik R_ikᵀ`;
//! 2. from the first block column to the last, `Hinv`'s column `j` is
//!    `−Hinv · R[:, j] · X_jj`, with `X_jj` on its diagonal.
//!
//! Every product runs over all `in` rows (the rows past the block take
//! zeros): the arithmetic is `2 in³` instead of `in³ · 2/3`, but each
//! step's buffers have one shape, which cubecl's pool reuses (the same
//! choice as the device sweep's). At its widest the
//! device holds the Hessian and one `in × in` product (step 1), or the
//! factor and `Hinv` (step 2). The products are exact f32
//! ([`Compute::matmul_f32`]): TF32 would round what the reference keeps.

use burn::prelude::*;
use burn::tensor::{Bool, DType, FloatDType};

use super::linalg::{NotPositiveDefinite, inverse_upper_cholesky};
use super::sparsegpt::dampening;
use crate::exec::Compute;

/// `Hinv` on the device, with what the sweep reads on the host: its
/// diagonal blocks (each `nb × nb`, the last one shorter) and the dead
/// inputs.
pub struct DeviceFactor<B: Compute> {
    pub hinv: Tensor<B, 2>,
    pub blocks: Vec<Vec<f32>>,
    pub dead: Vec<bool>,
}

/// Factors the Hessian `h` (`[in, in]`, f32, consumed) in blocks of `nb`.
pub fn factor<B: Compute>(
    h: Tensor<B, 2>,
    percdamp: f64,
    nb: usize,
) -> Result<DeviceFactor<B>, NotPositiveDefinite> {
    let nb = nb.clamp(1, h.dims()[0].max(1));
    let (r, blocks, dead) = reduce(h, percdamp, nb)?;
    // The pool keeps a freed buffer for a tensor of its own size only
    // (`exec::cube`): the update's product goes back before Hinv is made.
    crate::exec::release_free::<B>(&r.device());
    let hinv = inverse(r, &blocks, nb);
    Ok(DeviceFactor { hinv, blocks, dead })
}

/// `diag(Hinv)` of the Hessian `h` (`[in, in]`, f32, consumed) and its
/// dead inputs, on the host: step 1 only, since `Hinv`'s diagonal blocks
/// are step 1's inverse blocks (DSnoT's SparseGPT saliency, `W² /
/// diag(Hinv)²`, reads nothing else). `nb` is SparseGPT's block size, so
/// that the blocks are the ones the sweep's factorisation makes.
pub fn hinv_diagonal<B: Compute>(
    h: Tensor<B, 2>,
    percdamp: f64,
    nb: usize,
) -> Result<(Vec<f32>, Vec<bool>), NotPositiveDefinite> {
    let n = h.dims()[0];
    let nb = nb.clamp(1, n.max(1));
    let (r, blocks, dead) = reduce(h, percdamp, nb)?;
    let device = r.device();
    drop(r);
    crate::exec::release_free::<B>(&device);
    Ok((block_diagonal(&blocks, nb, n), dead))
}

/// What DSnoT's first mask after SparseGPT reads of an input's
/// factorisation, on the device: `diag(Hinv)²` (`[in]`, f32, squared on
/// the host as the host path squares it) and, where there are any, the
/// dead inputs.
pub struct Saliency<B: Compute> {
    diag_squared: Tensor<B, 1>,
    dead: Option<Tensor<B, 1, Bool>>,
}

impl<B: Compute> Saliency<B> {
    /// Of the Hessian `h` ([`hinv_diagonal`]): `in · 4` bytes up, `in`
    /// more where an input is dead.
    pub fn of(h: Tensor<B, 2>, percdamp: f64, nb: usize) -> Result<Self, NotPositiveDefinite> {
        let device = h.device();
        let (diag, dead) = hinv_diagonal(h, percdamp, nb)?;
        let n = diag.len();
        let squared: Vec<f32> = diag.iter().map(|d| d * d).collect();
        let upload = |bytes: usize| {
            if B::is_device() {
                crate::exec::transfer::uploaded(bytes as u64);
            }
        };
        upload(n * 4);
        let diag_squared = Tensor::from_data(TensorData::new(squared, [n]), &device);
        let dead = dead.iter().any(|d| *d).then(|| {
            upload(n);
            Tensor::<B, 1, Bool>::from_bool(TensorData::new(dead, [n]), &device)
        });
        Ok(Self { diag_squared, dead })
    }

    /// SparseGPT's saliency of `w` (`[in, out]`, any float dtype) without
    /// its weight update, `W² / diag(Hinv)²`, in f32 (the authors' DSnoT
    /// with `initial_method == "sparsegpt"`), a dead input's weights taken
    /// as 0: the host's `dsnot::sparsegpt_metric`, one f32 operation at a
    /// time.
    pub fn metric(&self, w: &Tensor<B, 2>) -> Tensor<B, 2> {
        let [inp, out] = w.dims();
        let w = crate::model::dtype::to_f32(w.clone());
        let w = match &self.dead {
            Some(d) => w.mask_fill(d.clone().reshape([inp, 1]).expand([inp, out]), 0.0),
            None => w,
        };
        w.clone() * w / self.diag_squared.clone().reshape([inp, 1])
    }
}

/// The diagonal of a matrix of `n` columns from its diagonal blocks of
/// `nb` (the last one shorter), each row-major.
pub(super) fn block_diagonal(blocks: &[Vec<f32>], nb: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|j| {
            let (k, r) = (j / nb, j % nb);
            let c = (n - k * nb).min(nb);
            blocks[k][r * c + r]
        })
        .collect()
}

/// Step 1: `h`'s block columns become the factor `R`'s (above the
/// diagonal, zero from it down), bottom up, with the host's inverse
/// diagonal blocks `X = R_kk⁻¹` and the dead inputs.
#[allow(clippy::type_complexity)]
fn reduce<B: Compute>(
    h: Tensor<B, 2>,
    percdamp: f64,
    nb: usize,
) -> Result<(Tensor<B, 2>, Vec<Vec<f32>>, Vec<bool>), NotPositiveDefinite> {
    let [n, _] = h.dims();
    let h = match h.dtype() {
        DType::F32 => h,
        _ => h.cast(FloatDType::F32),
    };
    let (dead, add) = dampening(&diagonal(&h), percdamp);
    let device = h.device();
    let starts: Vec<usize> = (0..n).step_by(nb).collect();
    let rows = Tensor::<B, 1, Int>::arange(0..n as i64, &device).reshape([n, 1]);
    let mut h = h;
    let mut blocks = vec![Vec::new(); starts.len()];
    for (k, &k0) in starts.iter().enumerate().rev() {
        let k1 = (k0 + nb).min(n);
        let c = k1 - k0;
        if k + 2 == starts.len() && n - starts[k + 1] != nb {
            // The short last block's buffers go back before the full
            // blocks' shapes take over (the pool reuses a buffer only for
            // a tensor of its size, `exec::cube`).
            crate::exec::release_free::<B>(&device);
        }
        let mut block = read(h.clone().slice([k0..k1, k0..k1]));
        for (j, a) in add[k0..k1].iter().enumerate() {
            block[j * c + j] += a;
        }
        let x = inverse_upper_cholesky(&block, c).map_err(|e| NotPositiveDefinite {
            // The pivot in the whole factorisation's order (last input
            // first), as the host's factorisation reports it.
            index: n - k1 + e.index,
            value: e.value,
        })?;
        if k0 > 0 {
            let panel = h.clone().slice([0..n, k0..k1]).mask_fill(
                rows.clone().greater_equal_elem(k0 as i64).expand([n, c]),
                0.0,
            );
            let r = B::matmul_f32(panel, upload(&x, c, &device).transpose());
            let update = B::matmul_f32(r.clone(), r.clone().transpose());
            // The widest moment: the Hessian beside a product of its size.
            crate::exec::watch::after_op();
            h = (h - update).slice_assign([0..n, k0..k1], r);
        }
        blocks[k] = x;
    }
    Ok((h, blocks, dead))
}

/// Step 2: `Hinv = R⁻¹`, one block column at a time, left to right, from
/// step 1's factor `r` (its block columns above the diagonal, zero from
/// the diagonal down; consumed) and the host's inverse diagonal blocks.
fn inverse<B: Compute>(r: Tensor<B, 2>, blocks: &[Vec<f32>], nb: usize) -> Tensor<B, 2> {
    let [n, _] = r.dims();
    let device = r.device();
    let mut hinv = Tensor::<B, 2>::zeros([n, n], &device);
    for (j, block) in blocks.iter().enumerate() {
        let j0 = j * nb;
        let j1 = (j0 + nb).min(n);
        let c = j1 - j0;
        if j > 0 && c != nb {
            // The full blocks' buffers go back before the short one's.
            crate::exec::release_free::<B>(&device);
        }
        let xjj = upload(block, c, &device);
        let column = if j0 == 0 {
            Tensor::<B, 2>::zeros([n, c], &device)
        } else {
            // R[:, j] is zero from row j0 on (step 1 wrote it so); Hinv's
            // columns from j0 on are still zero.
            let rj = r.clone().slice([0..n, j0..j1]);
            B::matmul_f32(B::matmul_f32(hinv.clone(), rj), xjj.clone()).neg()
        };
        if j == 0 || j + 1 == blocks.len() {
            // Hinv beside the factor (the first and the last column's
            // moments, where the pool is read).
            crate::exec::watch::after_op();
        }
        let column = column.slice_assign([j0..j1, 0..c], xjj);
        hinv = hinv.slice_assign([0..n, j0..j1], column);
    }
    // The factor goes back before the sweep allocates its own shapes.
    drop(r);
    crate::exec::release_free::<B>(&device);
    hinv
}

/// The diagonal of `h` (`[n, n]`, f32) on the host (`n · 4` bytes): the
/// first `n² − 1` values read as rows of `n + 1` start with a diagonal
/// entry each, the last value is the last one.
fn diagonal<B: Compute>(h: &Tensor<B, 2>) -> Vec<f32> {
    let [n, _] = h.dims();
    if n <= 1 {
        return read(h.clone().reshape([1, n]));
    }
    let flat = h.clone().reshape([n * n]);
    let head = flat
        .clone()
        .slice(0..n * n - 1)
        .reshape([n - 1, n + 1])
        .slice([0..n - 1, 0..1])
        .reshape([1, n - 1]);
    let last = flat.slice(n * n - 1..n * n).reshape([1, 1]);
    read(Tensor::cat(vec![head, last], 1))
}

/// A small f32 tensor's values on the host, counted as read back.
fn read<B: Compute>(t: Tensor<B, 2>) -> Vec<f32> {
    let data = t.into_data();
    if B::is_device() {
        crate::exec::transfer::read_back(data.bytes.len() as u64);
    }
    data.into_vec().unwrap_or_default()
}

/// A `c × c` host block on the device (contiguous, as the sweep's kernel
/// reads it), counted as uploaded.
pub(super) fn upload<B: Compute>(x: &[f32], c: usize, device: &B::Device) -> Tensor<B, 2> {
    if B::is_device() {
        crate::exec::transfer::uploaded(x.len() as u64 * 4);
    }
    Tensor::from_data(TensorData::new(x.to_vec(), [c, c]), device)
}

#[cfg(test)]
mod tests {
    //! The blocked device factorisation against the host's on Burn's CPU
    //! backend (the ops a device runs); `tests/device/` repeats it on
    //! wgpu.
    use super::*;
    use crate::exec::Cpu;
    use crate::prune::sparsegpt::dampened_hinv;

    fn hessian(n: usize, dead: &[usize]) -> Vec<f32> {
        let mut rng = crate::model::synthetic::Normal::new(11);
        let (mut h, _) = crate::model::synthetic::correlated_hessian(&mut rng, n, 3 * n);
        for &d in dead {
            for t in 0..n {
                h[d * n + t] = 0.0;
                h[t * n + d] = 0.0;
            }
        }
        h
    }

    #[test]
    fn the_device_factor_is_the_hosts() {
        // Blocks that divide the size, a shorter last block, one block.
        for (n, nb, dead) in [(64, 16, vec![]), (70, 16, vec![3, 41]), (24, 32, vec![0])] {
            let h = hessian(n, &dead);
            let (host, host_dead) = dampened_hinv(h.clone(), n, 0.01).unwrap();
            let device = Default::default();
            let t = Tensor::<Cpu, 2>::from_data(TensorData::new(h, [n, n]), &device);
            let got = factor(t, 0.01, nb).unwrap();
            assert_eq!(got.dead, host_dead);
            let values: Vec<f32> = got.hinv.into_data().into_vec().unwrap();
            let scale = host.iter().fold(0f32, |m, v| m.max(v.abs()));
            let worst = host
                .iter()
                .zip(&values)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst <= 1e-5 * scale, "n {n} nb {nb}: {worst} of {scale}");
            // The diagonal blocks the sweep reads are Hinv's.
            for (k, block) in got.blocks.iter().enumerate() {
                let k0 = k * nb;
                let c = (n - k0).min(nb);
                assert_eq!(block.len(), c * c);
                for r in 0..c {
                    for s in 0..c {
                        let v = values_at(&values, n, k0 + r, k0 + s);
                        assert_eq!(block[r * c + s], v, "block {k} ({r}, {s})");
                    }
                }
            }
        }
    }

    #[test]
    fn the_first_step_alone_gives_the_hosts_diagonal() {
        for (n, nb, dead) in [(64, 16, vec![]), (70, 16, vec![3, 41]), (24, 32, vec![0])] {
            let h = hessian(n, &dead);
            let (host, host_dead) = dampened_hinv(h.clone(), n, 0.01).unwrap();
            let t = Tensor::<Cpu, 2>::from_data(TensorData::new(h, [n, n]), &Default::default());
            let (diag, got_dead) = hinv_diagonal(t, 0.01, nb).unwrap();
            assert_eq!(got_dead, host_dead);
            assert_eq!(diag.len(), n);
            for (j, d) in diag.iter().enumerate() {
                let want = host[j * n + j];
                assert!(
                    (d - want).abs() <= 1e-5 * want.abs(),
                    "n {n} nb {nb} {j}: {d} / {want}"
                );
            }
        }
    }

    fn values_at(v: &[f32], n: usize, r: usize, c: usize) -> f32 {
        v[r * n + c]
    }

    #[test]
    fn a_hessian_that_is_not_positive_definite_is_refused() {
        let n = 8;
        let mut h = hessian(n, &[]);
        h[5 * n + 5] = -1e3;
        let t = Tensor::<Cpu, 2>::from_data(TensorData::new(h, [n, n]), &Default::default());
        let e = factor(t, 0.0, 4).err().expect("refused");
        assert!(e.value <= 0.0, "{e:?}");
        assert!(e.index < n, "{e:?}");
    }
}
