//! What a backend offers beyond Burn's ops: prunemem's hand-written CPU
//! kernels (fused RMSNorm, rotary, SwiGLU, one GEMM per linear, attention)
//! replace Burn's ops on the CPU backend in f32. The model asks its backend
//! through this trait, so the choice is made by the type the execution
//! context runs ([`super::Exec::run`]), never by a downcast.
//!
//! Every backend gets Burn's ops by default; the CPU backend's kernels are
//! implemented beside them, in `model::host`.

use burn::nn::Linear;
use burn::prelude::*;

/// A Burn backend prunemem computes on.
pub trait Compute: Backend {
    /// True when `t` takes the fused CPU kernels (RMSNorm, rotary, SwiGLU).
    fn fused<const D: usize>(_t: &Tensor<Self, D>) -> bool {
        false
    }

    /// True when attention takes the hand-written CPU kernel.
    fn host_attention() -> bool {
        false
    }

    /// A linear layer's forward.
    fn linear(linear: &Linear<Self>, x: Tensor<Self, 3>) -> Tensor<Self, 3> {
        linear.forward(x)
    }
}

/// Autodiff keeps Burn's ops (and their backward) on every backend.
impl<B: Backend> Compute for burn::backend::Autodiff<B> {}
