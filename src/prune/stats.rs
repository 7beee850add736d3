//! Per-linear input statistics collected while calibration windows flow
//! through a decoder layer.
//!
//! Linears that read the same input share one accumulator (q/k/v read the
//! normed hidden states, gate/up the post-attention normed states), so a
//! layer keeps four, not seven:
//! - Wanda: `scaler_row[j] = Σ_samples ‖x_j‖² / N` (the squared L2 norm of
//!   input column j over a sample's tokens, averaged over samples), as
//!   `WrappedGPT.add_batch`;
//! - SparseGPT: `H = 2/N Σ_samples Xᵀ X`, as `SparseGPT.add_batch`.
//!
//! Sums run on the device in f32, one batch of windows at a time; the
//! division by N happens once at the end (the reference folds it into a
//! running mean, which is the same quantity up to rounding).

use std::collections::HashMap;

use burn::prelude::*;
use burn::tensor::{DType, FloatDType};

use crate::model::llama::LinearInput;

/// Which statistic a method needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatKind {
    /// Column norms (Wanda, GradProbe's Wanda strategy).
    ColumnNorms,
    /// Input Hessians (SparseGPT).
    Hessian,
}

enum Acc<B: Backend> {
    Norms(Tensor<B, 1>),
    Hessian(Tensor<B, 2>),
}

/// Accumulators for one decoder layer.
pub struct LayerStats<B: Backend> {
    kind: StatKind,
    acc: HashMap<LinearInput, Acc<B>>,
}

/// Finished statistics of one input, on the host.
pub enum Stat {
    /// `scaler_row`, length `in`.
    Norms(Vec<f32>),
    /// `H`, `in × in` row-major.
    Hessian(Vec<f32>),
}

/// Rows squared per step of [`column_square_sums`] (a 4 MiB f32 slab).
pub(crate) const SQUARE_CHUNK_ELEMS: usize = 1 << 20;

/// `Σ_rows x²` per column of `x` (`[rows, d]`), a slab of rows at a time:
/// squaring the whole batch at once would hold a second copy of the
/// widest input (`tokens × intermediate`) at the layer's peak.
fn column_square_sums<B: Backend>(x: Tensor<B, 2>) -> Tensor<B, 1> {
    let [rows, d] = x.dims();
    let step = (SQUARE_CHUNK_ELEMS / d.max(1)).max(1);
    let mut sum: Option<Tensor<B, 2>> = None;
    let mut r0 = 0;
    while r0 < rows {
        let r1 = (r0 + step).min(rows);
        let part = x.clone().slice([r0..r1, 0..d]).square().sum_dim(0);
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

impl<B: Backend> LayerStats<B> {
    pub fn new(kind: StatKind) -> Self {
        Self {
            kind,
            acc: HashMap::new(),
        }
    }

    /// Adds a batch of inputs `[batch, seq, in]` of the linears fed by `input`.
    pub fn observe(&mut self, input: LinearInput, x: &Tensor<B, 3>) {
        let [b, s, d] = x.dims();
        let mut x2 = x.clone().reshape([b * s, d]);
        if x2.dtype() != DType::F32 {
            x2 = x2.cast(FloatDType::F32);
        }
        let update = match self.kind {
            StatKind::ColumnNorms => Acc::Norms(column_square_sums(x2)),
            StatKind::Hessian => Acc::Hessian(x2.clone().transpose().matmul(x2)),
        };
        let merged = match (self.acc.remove(&input), update) {
            (Some(Acc::Norms(a)), Acc::Norms(u)) => Acc::Norms(a + u),
            (Some(Acc::Hessian(a)), Acc::Hessian(u)) => Acc::Hessian(a + u),
            (_, u) => u,
        };
        self.acc.insert(input, merged);
    }

    /// Bytes the accumulators hold (for the run's accounting).
    ///
    /// (The squares of a batch are never all materialised: see
    /// [`column_square_sums`].)
    pub fn bytes(&self) -> u64 {
        self.acc
            .values()
            .map(|a| match a {
                Acc::Norms(t) => t.dims()[0] as u64 * 4,
                Acc::Hessian(t) => (t.dims()[0] * t.dims()[1]) as u64 * 4,
            })
            .sum()
    }

    /// The statistics of `input` over `nsamples` windows, on the host.
    pub fn finish(&mut self, input: LinearInput, nsamples: usize) -> Option<Stat> {
        let n = nsamples.max(1) as f64;
        match self.acc.remove(&input)? {
            Acc::Norms(t) => Some(Stat::Norms(t.div_scalar(n).into_data().into_vec().ok()?)),
            Acc::Hessian(t) => Some(Stat::Hessian(
                t.mul_scalar(2.0 / n).into_data().into_vec().ok()?,
            )),
        }
    }
}
