//! Inference and full fine-tuning, for comparison with pruning: the usual
//! PyTorch accounting.
//!
//! - inference: weights, the KV cache for `batch × seqlen`, one layer's
//!   activations, the logits (and their float32 copy);
//! - training: weights, float32 master weights when computing in 16 bits,
//!   gradients, optimizer state (AdamW: two float32 moments; SGD without
//!   momentum, its default: none),
//!   activations saved for backward per micro-batch (per layer
//!   `b·s·(4h + 2·kv + 4i)` elements for a SwiGLU Llama with fused or flash
//!   attention, which keeps no `s²` score matrix), and the logits with their
//!   float32 copy and gradient. Gradient accumulation does not raise the
//!   peak: only one micro-batch's activations exist at a time.

use super::{Arch, Device, Optimizer, Phase, Task, Workload};

fn runtime(w: &Workload) -> (&'static str, u64) {
    match w.device {
        Device::Cpu => ("runtime (python, torch)", 267 << 20),
        Device::Cuda | Device::Wgpu => (
            super::reference::CUDA_CONTEXT_NAME,
            super::reference::CUDA_CONTEXT,
        ),
    }
}

pub fn phases(a: &Arch, w: &Workload) -> Vec<Phase> {
    let c = w.dtype.size();
    let (rt_name, rt) = runtime(w);
    let (b, s) = (w.batch_size, w.seqlen);
    let weights = a.params * c;
    let logits = b * s * a.vocab * (c + 4);
    match w.task {
        Task::Train => {
            let master = if c < 4 { a.params * 4 } else { 0 };
            let grads = a.params * c;
            let optimizer = match w.optimizer {
                Optimizer::AdamW => a.params * 8,
                // torch.optim.SGD keeps a momentum buffer only with momentum.
                Optimizer::Sgd => 0,
            };
            let act = a.layers * b * s * (4 * a.hidden + 2 * a.kv_dim() + 4 * a.intermediate) * c;
            vec![
                Phase::new("load", &[])
                    .add(rt_name, rt)
                    .add("weights", weights)
                    .add("master weights (f32)", master),
                Phase::new("training step", &[])
                    .add(rt_name, rt)
                    .add("weights", weights)
                    .add("master weights (f32)", master)
                    .add("gradients", grads)
                    .add("optimizer state", optimizer)
                    .add("activations", act)
                    .add("logits (and grad)", logits + b * s * a.vocab * 4),
            ]
        }
        _ => {
            let kv_cache = b * s * a.layers * 2 * a.kv_dim() * c;
            let act = b * s * (5 * a.hidden + 2 * a.kv_dim() + 3 * a.intermediate) * c;
            vec![
                Phase::new("load", &[])
                    .add(rt_name, rt)
                    .add("weights", weights),
                Phase::new("forward", &[])
                    .add(rt_name, rt)
                    .add("weights", weights)
                    .add("KV cache", kv_cache)
                    .add("activations", act)
                    .add("logits", logits),
            ]
        }
    }
}
