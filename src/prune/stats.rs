//! Per-linear input statistics collected while calibration windows flow
//! through a decoder layer.
//!
//! Linears that read the same input share one accumulator (q/k/v read the
//! normed hidden states, gate/up the post-attention normed states), so a
//! layer keeps four, not seven:
//! - Wanda: `scaler_row[j] = Σ_samples ‖x_j‖² / N` (the squared L2 norm of
//!   input column j over a sample's tokens, averaged over samples), as
//!   `WrappedGPT.add_batch`;
//! - SparseGPT: `H = 2/N Σ_samples Xᵀ X`, as `SparseGPT.add_batch`;
//! - DSnoT: `Σ_samples Σ_tokens x_j / N` and the population variance of
//!   `x_j` over each window's tokens averaged over windows (its
//!   `WrappedGPT.add_batch` folds one window at a time into these).
//!
//! Sums run on the device in f32, one batch of windows at a time; the
//! division by N happens once at the end (the reference folds it into a
//! running mean, which is the same quantity up to rounding).

use crate::exec::{Compute, reduce};
use std::collections::HashMap;

use burn::prelude::*;
use burn::tensor::{DType, FloatDType};

use crate::memory::held::Held;
use crate::memory::tag::Category;
use crate::model::llama::LinearInput;

/// Which statistics a run needs (a method's, plus DSnoT's moments).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Needs {
    /// Column norms (Wanda, RIA, GradProbe's Wanda strategy, DSnoT).
    pub norms: bool,
    /// Input Hessians (SparseGPT).
    pub hessian: bool,
    /// Per-input mean and per-window variance (DSnoT).
    pub moments: bool,
}

impl Needs {
    pub const NORMS: Needs = Needs {
        norms: true,
        hessian: false,
        moments: false,
    };

    /// Whether anything is collected at all.
    pub fn any(self) -> bool {
        self.norms || self.hessian || self.moments
    }
}

/// Running sums of one input.
#[derive(Default)]
struct Acc<B: Compute> {
    norms: Option<Tensor<B, 1>>,
    hessian: Option<Tensor<B, 2>>,
    /// `Σ x` over every token.
    sum: Option<Tensor<B, 1>>,
    /// `Σ_windows var(x)` (population variance over a window's tokens).
    var: Option<Tensor<B, 1>>,
}

/// Accumulators for one decoder layer.
pub struct LayerStats<B: Compute> {
    needs: Needs,
    acc: HashMap<LinearInput, Acc<B>>,
    /// The accumulators' bytes, for the device's composition.
    held: Held,
}

/// DSnoT's per-input moments, on the host.
pub struct Moments {
    /// `Σ x_j / N` (the authors' `sum_metric_row`).
    pub mean: Vec<f32>,
    /// The windows' variances of `x_j`, averaged.
    pub var: Vec<f32>,
}

/// Finished statistics of one input, on the host.
#[derive(Default)]
pub struct Stat {
    /// `scaler_row`, length `in`.
    pub norms: Option<Vec<f32>>,
    /// `H`, `in × in` row-major.
    pub hessian: Option<Vec<f32>>,
    pub moments: Option<Moments>,
}

/// Rows squared per step of [`column_square_sums`] (a 4 MiB f32 slab).
pub(crate) const SQUARE_CHUNK_ELEMS: usize = 1 << 20;

/// `Σ_rows x²` per column of the f32 `x` (`[rows, d]`), a slab of rows at
/// a time, with Burn's ops (a backend without the kernel): squaring the
/// whole batch at once would hold a second copy of the widest input
/// (`tokens × intermediate`) at the layer's peak.
fn column_square_sums<B: Compute>(x: Tensor<B, 2>) -> Tensor<B, 1> {
    let [rows, d] = x.dims();
    let step = (SQUARE_CHUNK_ELEMS / d.max(1)).max(1);
    let mut sum: Option<Tensor<B, 2>> = None;
    let mut r0 = 0;
    while r0 < rows {
        let r1 = (r0 + step).min(rows);
        let part = reduce::sum_dim(x.clone().slice([r0..r1, 0..d]).square(), 0);
        sum = Some(match sum {
            Some(s) => s + part,
            None => part,
        });
        r0 = r1;
    }
    match sum {
        Some(s) => s.reshape([d]),
        None => Tensor::zeros([d], &x.device()),
    }
}

fn add<B: Compute, const D: usize>(acc: &mut Option<Tensor<B, D>>, t: Tensor<B, D>) {
    *acc = Some(match acc.take() {
        Some(a) => a + t,
        None => t,
    });
}

/// Bytes of an f32 vector accumulator (0 when not collected).
fn f32_bytes<B: Compute>(t: &Option<Tensor<B, 1>>) -> u64 {
    t.as_ref().map_or(0, |t| t.dims()[0] as u64 * 4)
}

/// `t` times `scale`, left on the device. In a distributed run the ranks'
/// sums meet on the host first ([`host`]'s reduction) and the total goes
/// back up, counted as uploaded.
fn scaled_on_device<B: Compute, const D: usize>(
    t: Tensor<B, D>,
    scale: f64,
) -> Option<Tensor<B, D>> {
    if crate::exec::dist::world().1 == 1 {
        return Some(t.mul_scalar(scale));
    }
    let (dims, device) = (t.dims(), t.device());
    let host = host(Some(t), scale)?;
    crate::exec::transfer::uploaded(host.len() as u64 * 4);
    Some(Tensor::from_data(TensorData::new(host, dims), &device))
}

/// An accumulator on the host, summed across ranks in a distributed run
/// (`exec::dist`), times `scale`.
fn host<B: Compute, const D: usize>(t: Option<Tensor<B, D>>, scale: f64) -> Option<Vec<f32>> {
    let reducer = crate::exec::dist::reducer();
    if reducer.world().1 == 1 {
        let data = t?.mul_scalar(scale).into_data();
        if B::is_device() {
            crate::exec::transfer::read_back(data.bytes.len() as u64);
        }
        return data.into_vec().ok();
    }
    let t = t?;
    let t = if t.dtype() == DType::F32 {
        t
    } else {
        t.cast(FloatDType::F32)
    };
    let data = t.into_data();
    if B::is_device() {
        crate::exec::transfer::read_back(data.bytes.len() as u64);
    }
    let mut v: Vec<f32> = data.into_vec().ok()?;
    reducer.sum_f32(&mut v);
    let scale = scale as f32;
    v.iter_mut().for_each(|x| *x *= scale);
    Some(v)
}

impl<B: Compute> LayerStats<B> {
    pub fn new(needs: Needs) -> Self {
        Self {
            needs,
            acc: HashMap::new(),
            held: Held::none(Category::Statistics),
        }
    }

    /// Adds a batch of inputs `[batch, seq, in]` of the linears fed by `input`.
    ///
    /// The norms come from the input as it is where the backend has the
    /// kernel (`Compute::column_square_sums`); an f32 copy is made only for
    /// what still needs one (the Hessian, DSnoT's moments, a backend
    /// without the kernel).
    pub fn observe(&mut self, input: LinearInput, x: &Tensor<B, 3>) {
        let [b, s, d] = x.dims();
        let acc = self.acc.entry(input).or_default();
        let flat = x.clone().reshape([b * s, d]);
        let mut norms = None;
        if self.needs.norms {
            norms = B::column_square_sums(flat.clone()).ok();
        }
        let norms_left = self.needs.norms && norms.is_none();
        if self.needs.moments || self.needs.hessian || norms_left {
            let mut x2 = flat;
            let half = x2.dtype() != DType::F32;
            if half {
                x2 = x2.cast(FloatDType::F32);
                // The f32 copy beside the input it was cast from.
                crate::exec::watch::after_op();
            }
            if self.needs.moments {
                // One window at a time: the centred copy is one window's size.
                for w in 0..b {
                    let xw = x2.clone().slice([w * s..(w + 1) * s, 0..d]);
                    let sum = reduce::sum_dim(xw.clone(), 0);
                    let centred = xw - sum.clone().div_scalar(s as f64);
                    let var = reduce::sum_dim(centred.square(), 0).div_scalar(s as f64);
                    add(&mut acc.var, var.reshape([d]));
                    add(&mut acc.sum, sum.reshape([d]));
                }
            }
            if norms_left {
                norms = Some(column_square_sums(x2.clone()));
            }
            if self.needs.hessian {
                // f16 and bf16 values are exact in TF32, so Burn's
                // matmul (tensor cores on CUDA) loses nothing on them; an
                // f32 input keeps its 23 bits (`Compute::matmul_f32`).
                let xtx = if half {
                    x2.clone().transpose().matmul(x2.clone())
                } else {
                    B::matmul_f32(x2.clone().transpose(), x2.clone())
                };
                // This batch's `Xᵀ X` beside the sum it joins and its f32 input.
                crate::exec::watch::after_op();
                drop(x2);
                add(&mut acc.hessian, xtx);
            }
        }
        if let Some(n) = norms {
            add(&mut acc.norms, n);
        }
        self.held.set(self.bytes());
    }

    /// Bytes the accumulators hold (for the run's accounting).
    ///
    /// (The squares of a batch are never all materialised: see
    /// [`column_square_sums`].)
    pub fn bytes(&self) -> u64 {
        self.acc
            .values()
            .map(|a| {
                f32_bytes(&a.norms)
                    + f32_bytes(&a.sum)
                    + f32_bytes(&a.var)
                    + a.hessian
                        .as_ref()
                        .map_or(0, |t| (t.dims()[0] * t.dims()[1]) as u64 * 4)
            })
            .sum()
    }

    /// Bytes of DSnoT's moments (part of [`LayerStats::bytes`]).
    pub fn moment_bytes(&self) -> u64 {
        self.acc
            .values()
            .map(|a| f32_bytes(&a.sum) + f32_bytes(&a.var))
            .sum()
    }

    /// `scaler_row` of `input` over `nsamples` windows, left on the device
    /// (f32, `[in]`): what the device path's metrics read. In a distributed
    /// run the sums meet on the host first (the reduction), then go back up
    /// ([`scaled_on_device`]).
    pub fn finish_norms(&mut self, input: LinearInput, nsamples: usize) -> Option<Tensor<B, 1>> {
        let n = nsamples.max(1) as f64;
        let a = self.acc.remove(&input)?;
        self.held.set(self.bytes());
        scaled_on_device(a.norms?, 1.0 / n)
    }

    /// DSnoT's moments of `input` over `nsamples` windows (the mean and
    /// the per-window variance, f32 `[in]`), left on the device for its
    /// loop there (`prune::dsnot_device`); the norms stay for
    /// [`Self::finish_norms`]. In a distributed run the sums meet on the
    /// host first, then go back up.
    pub fn finish_moments(
        &mut self,
        input: LinearInput,
        nsamples: usize,
    ) -> Option<(Tensor<B, 1>, Tensor<B, 1>)> {
        let n = nsamples.max(1) as f64;
        let a = self.acc.get_mut(&input)?;
        let (sum, var) = (a.sum.take(), a.var.take());
        self.held.set(self.bytes());
        Some((
            scaled_on_device(sum?, 1.0 / n)?,
            scaled_on_device(var?, 1.0 / n)?,
        ))
    }

    /// The Hessian of `input` over `nsamples` windows (SparseGPT's `2/n ·
    /// Σ Xᵀ X`, f32), left on the device, for its factorisation there. In a
    /// distributed run the sums meet on the host first (the reduction),
    /// then go back up ([`scaled_on_device`]).
    pub fn finish_hessian(&mut self, input: LinearInput, nsamples: usize) -> Option<Tensor<B, 2>> {
        let scale = 2.0 / nsamples.max(1) as f64;
        let a = self.acc.get_mut(&input)?;
        let h = a.hessian.take()?;
        if a.norms.is_none() && a.sum.is_none() && a.var.is_none() {
            self.acc.remove(&input);
        }
        self.held.set(self.bytes());
        scaled_on_device(h, scale)
    }

    /// The statistics of `input` over `nsamples` windows, on the host.
    pub fn finish(&mut self, input: LinearInput, nsamples: usize) -> Option<Stat> {
        let n = nsamples.max(1) as f64;
        let a = self.acc.remove(&input)?;
        self.held.set(self.bytes());
        let moments = match (host(a.sum, 1.0 / n), host(a.var, 1.0 / n)) {
            (Some(mean), Some(var)) => Some(Moments { mean, var }),
            _ => None,
        };
        Some(Stat {
            norms: host(a.norms, 1.0 / n),
            hessian: host(a.hessian, 2.0 / n),
            moments,
        })
    }
}
