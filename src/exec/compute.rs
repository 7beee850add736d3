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

    /// Whether Burn's ops may be split across threads. On the CPU backend
    /// an op runs on the calling thread, so splitting one (attention) over
    /// scoped threads uses every core. A cubecl device keeps one stream and
    /// one memory pool per thread: work sent from a short-lived thread gets
    /// a pool of its own that outlives the thread (lavapipe: 11.4 MiB of
    /// RSS per layer forward, `examples/device_rss.rs`) and that the
    /// computing thread's probe never sees. Default: no.
    fn split_across_threads() -> bool {
        false
    }

    /// The largest buffer one tensor may take on `device` (a binding
    /// limit: lavapipe 128 MiB); `None` where there is no such limit (the
    /// CPU backend).
    fn max_buffer(_device: &Self::Device) -> Option<u64> {
        None
    }

    /// A linear layer's forward.
    fn linear(linear: &Linear<Self>, x: Tensor<Self, 3>) -> Tensor<Self, 3> {
        linear.forward(x)
    }
}

/// Autodiff keeps Burn's ops (and their backward) on every backend, and
/// its inner backend's threading.
impl<B: Compute> Compute for burn::backend::Autodiff<B> {
    fn split_across_threads() -> bool {
        B::split_across_threads()
    }
}
