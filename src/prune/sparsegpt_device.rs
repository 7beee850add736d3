//! SparseGPT's sweep on the device: the same blocked Optimal Brain Surgeon
//! update as [`super::sparsegpt::fasterprune`], with the weight kept where
//! it is. `Hinv` is factored on the device ([`super::factor_device`]:
//! only its diagonal blocks cross the bus; a distributed run's Hessian,
//! summed across ranks on the host, goes up once per linear input first).
//! Everything weight-sized is a device op:
//!
//! - per block of 128 inputs, the unstructured mask is one threshold over
//!   the block's `W1² / diag(Hinv1)²` ([`super::on_device`]'s bisection);
//!   N:M takes the `n` smallest of every `m` inputs as the sweep reaches
//!   them;
//! - per input, the OBS step `W1[i:] -= Hinv1[i, i:]ᵀ ⊗ err` is one outer
//!   product;
//! - after a block, the lazy update `W[i2:] -= Hinv[i1:i2, i2:]ᵀ · Err1` is
//!   one matrix product, in exact f32 ([`Compute::matmul_f32`]).
//!
//! Both products run over every row of their block or matrix: `Hinv` is
//! upper triangular, so rows already swept take zeros (and are overwritten
//! with their quantised values). That doubles their arithmetic, but keeps
//! every step's buffers one shape, which cubecl's pool reuses instead of
//! keeping one buffer of each size until the layer ends.
//!
//! Burn keeps a linear `[in, out]`, so PyTorch's column `i` (one input) is
//! row `i` here, and the sweep walks rows. The arithmetic is f32 as on the
//! host; the order of the sums differs (the device's matrix products), so
//! weights agree to rounding and masks to near-ties (`tests/device/`).

use burn::prelude::*;
use burn::tensor::{Bool, DType, FloatDType};

use super::Pattern;
use super::factor_device::upload;
use super::linalg::NotPositiveDefinite;
use super::sparsegpt::{SparseGptOptions, dampened_hinv};
use crate::exec::{Compute, reduce};

/// The pruned weight (`[in, out]`, in `w`'s dtype), its zeros and the OBS
/// error the reference prints.
pub struct DevicePruned<B: Compute> {
    pub weight: Tensor<B, 2>,
    pub zeros: u64,
    pub error: f64,
}

/// An input's `Hinv` (the upper Cholesky factor of the dampened inverse
/// Hessian, `in × in`, on the device), its diagonal blocks of the sweep's
/// block size on the host, and its dead inputs: factored once for every
/// linear that reads the input.
pub struct Factored<B: Compute> {
    hinv: Tensor<B, 2>,
    blocks: Vec<Vec<f32>>,
    block: usize,
    dead: Vec<bool>,
    cols: usize,
}

impl<B: Compute> Factored<B> {
    /// Factors the host Hessian `h` (`cols × cols`, consumed) on the host
    /// and uploads `Hinv`: what the engine did before `on_device`, kept as
    /// the reference the device factorisation is tested against.
    pub fn of(
        h: Vec<f32>,
        cols: usize,
        percdamp: f64,
        block: usize,
        device: &B::Device,
    ) -> Result<Self, NotPositiveDefinite> {
        let (hinv, dead) = dampened_hinv(h, cols, percdamp)?;
        let block = block.clamp(1, cols.max(1));
        let blocks = (0..cols)
            .step_by(block)
            .map(|i1| {
                let i2 = (i1 + block).min(cols);
                (i1..i2)
                    .flat_map(|r| hinv[r * cols + i1..r * cols + i2].iter().copied())
                    .collect()
            })
            .collect();
        if B::is_device() {
            crate::exec::transfer::uploaded(hinv.len() as u64 * 4);
        }
        let hinv = Tensor::from_data(TensorData::new(hinv, [cols, cols]), device);
        Ok(Self {
            hinv,
            blocks,
            block,
            dead,
            cols,
        })
    }

    /// Factors the Hessian `h` (`[cols, cols]`, f32, consumed) where it is
    /// ([`super::factor_device`]), in blocks of the sweep's size.
    pub fn on_device(
        h: Tensor<B, 2>,
        percdamp: f64,
        block: usize,
    ) -> Result<Self, NotPositiveDefinite> {
        let cols = h.dims()[0];
        let block = block.clamp(1, cols.max(1));
        let f = super::factor_device::factor(h, percdamp, block)?;
        Ok(Self {
            hinv: f.hinv,
            blocks: f.blocks,
            block,
            dead: f.dead,
            cols,
        })
    }

    /// `Hinv`'s diagonal, from its diagonal blocks.
    fn diagonal(&self) -> Vec<f32> {
        super::factor_device::block_diagonal(&self.blocks, self.block, self.cols)
    }
}

/// SparseGPT on `w` (`[in, out]` on the device) with its input's `Hinv`
/// (factored at `options.blocksize`).
pub fn prune<B: Compute>(
    w: Tensor<B, 2>,
    factored: &Factored<B>,
    options: SparseGptOptions,
) -> DevicePruned<B> {
    let [cols, out] = w.dims();
    assert_eq!(cols, factored.cols, "Hinv of another input");
    assert_eq!(
        factored.block,
        options.blocksize.clamp(1, cols.max(1)),
        "Hinv factored at another block size"
    );
    let dtype = w.dtype();
    let device = w.device();
    let dead = factored.dead.clone();
    let diag = factored.diagonal();
    if B::is_device() {
        crate::exec::transfer::uploaded(diag.len() as u64 * 4);
    }
    let hinv = factored.hinv.clone();
    let diag = Tensor::<B, 2>::from_data(TensorData::new(diag, [cols, 1]), &device);
    // A working copy in f32 that nothing else holds (the kernel sweeps it
    // in place).
    let mut wf = match dtype {
        DType::F32 => w.mul_scalar(1.0),
        _ => w.cast(FloatDType::F32),
    };
    if dead.iter().any(|d| *d) {
        let dead = Tensor::<B, 2, Bool>::from_bool(TensorData::new(dead, [cols, 1]), &device);
        wf = wf.mask_fill(dead.expand([cols, out]), 0.0);
    }
    // The f32 working copy and Hinv beside the layer's weights.
    crate::exec::watch::after_op();
    let columns = Tensor::<B, 1, Int>::arange(0..cols as i64, &device).reshape([1, cols]);
    let mut error: Option<Tensor<B, 1>> = None;
    let mut i1 = 0;
    while i1 < cols {
        let i2 = (i1 + options.blocksize.max(1)).min(cols);
        // `Hinv[i1:i2, i1:i2]`, from the host's copy.
        let hinv1 = upload::<B>(&factored.blocks[i1 / factored.block], i2 - i1, &device);
        let diag1 = diag.clone().slice([i1..i2, 0..1]);
        let err1;
        (wf, err1) = sweep(wf, i1, &hinv1, diag1, options);
        let loss = reduce::sum_all(err1.clone().square())
            .reshape([1])
            .div_scalar(2.0);
        error = Some(match error {
            Some(e) => e + loss,
            None => loss,
        });
        if i2 < cols {
            // W[i2:] -= Hinv[i1:i2, i2:]ᵀ · Err1, as one product over every
            // row: Hinv's block rows are zero before column i1 (upper
            // triangular) and are zeroed up to i2 here, so the rows already
            // swept stay as they are. Every block's buffers then have the
            // same shapes, and the pool reuses them.
            let h = hinv.clone().slice([i1..i2, 0..cols]).mask_fill(
                columns
                    .clone()
                    .lower_elem(i2 as i64)
                    .expand([i2 - i1, cols]),
                0.0,
            );
            let update = B::matmul_f32(h.transpose(), err1);
            if i1 == 0 {
                // The sweep at its widest: the working copy beside the
                // update's product (every block's is the same size).
                crate::exec::watch::after_op();
            }
            wf = wf - update;
        }
        i1 = i2;
    }
    let weight = match dtype {
        DType::F32 => wf,
        _ => wf.cast(dtype),
    };
    let zeros = reduce::sum_all(weight.clone().equal_elem(0.0).int())
        .reshape([1])
        .into_data();
    let error = error.map(|e| e.into_data());
    crate::exec::transfer::read_back(
        zeros.bytes.len() as u64 + error.as_ref().map_or(0, |e| e.bytes.len() as u64),
    );
    // The sweep's last products and the zero count's flags are freed: they
    // go back before the caller holds the pruned weight beside the one it
    // replaces (the pool would keep them reserved, `exec::cube`).
    crate::exec::release_free::<B>(&device);
    DevicePruned {
        weight,
        zeros: zeros.iter::<i64>().next().unwrap_or(0).max(0) as u64,
        error: error.and_then(|e| e.iter::<f32>().next()).unwrap_or(0.0) as f64,
    }
}

/// Rows `row0 .. row0 + count` of `wf` swept with the block's `hinv1` and
/// its diagonal `diag` (`[count, 1]`): the swept `wf` and the block's
/// errors. The mask is chosen here (unstructured: one threshold over the
/// block's saliencies, before the sweep); the sweep is the backend's kernel
/// where it has one, else Burn's ops column by column.
fn sweep<B: Compute>(
    wf: Tensor<B, 2>,
    row0: usize,
    hinv1: &Tensor<B, 2>,
    diag: Tensor<B, 2>,
    options: SparseGptOptions,
) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let [count, _] = hinv1.dims();
    let [_, out] = wf.dims();
    let diag2 = diag.clone().square();
    let (mask, nm) = match options.pattern {
        Pattern::Unstructured => {
            let w1 = wf.clone().slice([row0..row0 + count, 0..out]);
            let tmp = w1.square() / diag2.clone();
            (
                Some(super::on_device::block_threshold_mask(
                    tmp,
                    options.sparsity,
                )),
                None,
            )
        }
        Pattern::NM { n, m } => (None, Some((n, m))),
    };
    let wf = match B::obs_sweep(wf, row0, hinv1, mask.as_ref(), nm) {
        Ok(done) => return done,
        Err(wf) => wf,
    };
    let w1 = wf.clone().slice([row0..row0 + count, 0..out]);
    let (w1, err1) = sweep_with_ops(w1, hinv1, diag, diag2, mask, options);
    (wf.slice_assign([row0..row0 + count, 0..out], w1), err1)
}

/// The sweep with Burn's ops, one input at a time (backends without a
/// sweep kernel): the quantised block and its `Err1` rows.
fn sweep_with_ops<B: Compute>(
    mut w1: Tensor<B, 2>,
    hinv1: &Tensor<B, 2>,
    diag: Tensor<B, 2>,
    diag2: Tensor<B, 2>,
    block: Option<Tensor<B, 2, Bool>>,
    options: SparseGptOptions,
) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let [count, out] = w1.dims();
    let device = w1.device();
    let mut group: Option<(usize, Tensor<B, 2, Bool>)> = None;
    let mut errs = Vec::with_capacity(count);
    for i in 0..count {
        if let Pattern::NM { n, m } = options.pattern
            && i % m == 0
        {
            let end = (i + m).min(count);
            let tmp =
                w1.clone().slice([i..end, 0..out]).square() / diag2.clone().slice([i..end, 0..1]);
            group = Some((i, super::on_device::group_smallest(tmp, n)));
        }
        let prune_i = match (&block, &group) {
            (Some(b), _) => b.clone().slice([i..i + 1, 0..out]),
            (None, Some((start, g))) => g.clone().slice([i - start..i - start + 1, 0..out]),
            (None, None) => Tensor::<B, 2>::zeros([1, out], &device).equal_elem(1.0),
        };
        let d = diag.clone().slice([i..i + 1, 0..1]);
        let wi = w1.clone().slice([i..i + 1, 0..out]);
        let q = wi.clone().mask_fill(prune_i, 0.0);
        let e = (wi - q.clone()) / d;
        // W1[i:] -= Hinv1[i, i:]ᵀ ⊗ e over the whole block (Hinv1 is upper
        // triangular: the rows before i take zeros), then row i becomes q.
        let h = hinv1.clone().slice([i..i + 1, 0..count]).transpose();
        w1 = w1 - h.matmul(e.clone());
        w1 = w1.slice_assign([i..i + 1, 0..out], q);
        errs.push(e);
    }
    (w1, Tensor::cat(errs, 0))
}

#[cfg(test)]
mod tests {
    //! The device sweep against the host's `fasterprune` on Burn's CPU
    //! backend (the same ops a device runs); `tests/device/` repeats it
    //! on wgpu.
    use super::*;
    use crate::exec::Cpu;
    use crate::prune::sparsegpt::fasterprune;

    fn problem(rows: usize, cols: usize, n: usize) -> (Vec<f32>, Vec<f32>) {
        let mut rng = crate::model::synthetic::Normal::new(5);
        let w = rng.vec(rows * cols, 1.0);
        let (h, _) = crate::model::synthetic::correlated_hessian(&mut rng, cols, n);
        (w, h)
    }

    #[test]
    fn the_device_sweep_gives_the_hosts_weights() {
        let (rows, cols) = (24, 96);
        let (w, h) = problem(rows, cols, 300);
        for pattern in [Pattern::Unstructured, Pattern::NM { n: 2, m: 4 }] {
            let options = SparseGptOptions {
                sparsity: 0.5,
                pattern,
                percdamp: 0.01,
                blocksize: 32,
            };
            let host = fasterprune(&w, rows, cols, h.clone(), options).unwrap();
            let wt = Tensor::<Cpu, 2>::from_data(
                TensorData::new(w.clone(), [rows, cols]),
                &Default::default(),
            )
            .transpose();
            let device = Default::default();
            let on_host = Factored::<Cpu>::of(h.clone(), cols, 0.01, 32, &device).unwrap();
            let hd = Tensor::<Cpu, 2>::from_data(TensorData::new(h.clone(), [cols, cols]), &device);
            let on_device = Factored::<Cpu>::on_device(hd, 0.01, 32).unwrap();
            for factored in [on_host, on_device] {
                let dev = prune(wt.clone(), &factored, options);
                let got: Vec<f32> = dev.weight.transpose().into_data().iter::<f32>().collect();
                let zeros = host.weight.iter().filter(|v| **v == 0.0).count() as u64;
                assert_eq!(dev.zeros, got.iter().filter(|v| **v == 0.0).count() as u64);
                let masks_differ = host
                    .weight
                    .iter()
                    .zip(&got)
                    .filter(|(a, b)| (**a == 0.0) != (**b == 0.0))
                    .count();
                let worst = host
                    .weight
                    .iter()
                    .zip(&got)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(
                    masks_differ <= rows * cols / 500,
                    "{pattern:?}: {masks_differ} positions differ"
                );
                assert!(worst < 1e-3, "{pattern:?}: weights differ by {worst}");
                assert!(dev.zeros.abs_diff(zeros) <= (rows * cols / 500) as u64);
                assert!(
                    (dev.error - host.error).abs() <= 1e-3 * host.error.abs().max(1.0),
                    "{} vs {}",
                    dev.error,
                    host.error
                );
            }
        }
    }
}
