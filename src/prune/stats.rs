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
            StatKind::ColumnNorms => Acc::Norms(x2.square().sum_dim(0).reshape([d])),
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
