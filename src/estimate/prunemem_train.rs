//! Training on prunemem's engine (`crate::train`, Burn autodiff on the CPU,
//! f32), phase by phase, with constants measured on the training grid
//! (see `docs/estimator.md`).
//!
//! What a step holds, by the order it happens: the parameters; after the
//! first `step()`, the optimizer's moments; for each micro-batch, the graph
//! the forward saves for the backward (every layer's saved tensors and the
//! logits with their log-softmax); at the start of the backward, the
//! gradients of the logits (the backward's peak); from the backward on,
//! the gradients, which stay through the next micro-batch's forward when
//! accumulating. With checkpointing the forward keeps only each layer's
//! input, and the backward holds one layer's graph at a time beside the
//! logits' graph. Frozen layers below the first trainable one save nothing.

use super::{Arch, Optimizer, Phase, Workload, prunemem::TEXT_FACTOR};
use crate::events::stages;

/// Resident bytes that are not live heap during training (binary, thread
/// stacks, allocator arenas) plus the heap before the model: 21.7-27.5 MB
/// at the grid's peaks (mean 24.9 MB).
const RUNTIME: u64 = (24 << 20) + DEVICE_BACKENDS_LINKED;
/// What linking Burn's wgpu backend adds to a training run's resident set
/// (more than to a prune's: autodiff's code pages too). Measured on the
/// grid's debug runs, 2026-11-24: the peaks rose by 5.7-6.9 MB against the
/// earlier build's (AdamW h256 from +0.9% to -0.9% of about 110 MB,
/// checkpointing from -2.5% to -4.5%).
const DEVICE_BACKENDS_LINKED: u64 = if cfg!(feature = "wgpu") { 13 << 19 } else { 0 };
/// A checkpointed run's forward goes through the plain CPU kernels
/// (`model::cpu_ops`), whose worker threads' buffers are resident but not
/// heap, as the pruning engine's compute workspace is. Measured on the
/// grid's two checkpointed cases, 2026-11-24: runtime 35.7 and 35.3 MB
/// against 30.7-33.5 MB for the full-graph cases (predicted 32.0).
const CHECKPOINTED_WORKSPACE: u64 = 7 << 19;
/// f32 elements one decoder layer's graph saves per token: per unit of
/// hidden width (two norms, q and its rotary products, the attention
/// output), of intermediate width (gate, its sigmoid and SiLU, up, their
/// product), of key/value width, and per attended position and head
/// (scores, probabilities, mask). Fitted: see `docs/estimator.md`.
const PER_HIDDEN: f64 = 10.0;
const PER_INTERMEDIATE: f64 = 5.0;
const PER_KV: f64 = 4.0;
const PER_SCORE: f64 = 2.5;
/// f32 elements the head's graph saves per token beside the logits
/// themselves: per vocabulary entry (the log-softmax's) and per hidden
/// unit (the final norm's).
const HEAD_PER_VOCAB: f64 = 0.307;
/// The same, measured when the head's graph is rebuilt in a checkpointed
/// backward (one fit point, hidden 384 / vocab 8192: 12.06 MB of
/// activations at the peak less the layer inputs and rotary tables).
const HEAD_PER_VOCAB_CHECKPOINTED: f64 = 0.095;
const HEAD_PER_HIDDEN: f64 = 3.98;
/// f32 elements per token and vocabulary entry the backward holds first
/// (the gradients of the log-softmax and of the logits): its peak.
const BACKWARD_PER_LOGIT: u64 = 2;
/// A recomputed layer's backward holds this fraction of its graph again in
/// gradient transients (checkpointing).
const LAYER_BACKWARD: f64 = 0.3;

fn bytes(elements_per_token: f64, tokens: u64) -> u64 {
    (elements_per_token * tokens as f64 * 4.0) as u64
}

/// One decoder layer's saved graph for `tokens` tokens of windows of `s`.
fn layer_graph(a: &Arch, tokens: u64, s: u64) -> u64 {
    let per_token = PER_HIDDEN * a.hidden as f64
        + PER_INTERMEDIATE * a.intermediate as f64
        + PER_KV * a.kv_dim() as f64
        + PER_SCORE * (a.heads * s) as f64;
    bytes(per_token, tokens)
}

/// The head's saved graph beside the logits.
fn head_graph(a: &Arch, tokens: u64, checkpointed: bool) -> u64 {
    let per_vocab = if checkpointed {
        HEAD_PER_VOCAB_CHECKPOINTED
    } else {
        HEAD_PER_VOCAB
    };
    bytes(
        per_vocab * a.vocab as f64 + HEAD_PER_HIDDEN * a.hidden as f64,
        tokens,
    )
}

/// The trainable parameters: the plan's count, else all.
fn trainable(a: &Arch, w: &Workload) -> u64 {
    w.trainable_params.unwrap_or(a.params)
}

/// One step's peak, with `optimizer` bytes of state (0 in the first step).
fn step(a: &Arch, w: &Workload, name: &str, stages: [&str; 2], optimizer: u64) -> Phase {
    let tokens = w.batch_size * w.seqlen;
    let grads = trainable(a, w) * 4;
    let logits = tokens * a.vocab * 4;
    // Gradients stay through the next micro-batch when accumulating.
    let held = if w.grad_accum > 1 { grads } else { 0 };
    let workspace = if w.checkpointing {
        CHECKPOINTED_WORKSPACE
    } else {
        0
    };
    let base = Phase::new(name, &stages)
        .add("runtime (binary, threads, allocator)", RUNTIME + workspace)
        .add("weights", a.params * 4)
        .add("optimizer state", optimizer);
    if !w.checkpointing {
        let layers = a.layers.saturating_sub(w.first_trainable_layer);
        return base
            .add("gradients held across micro-batches", held)
            .add(
                "activations saved by the forward",
                layers * layer_graph(a, tokens, w.seqlen) + head_graph(a, tokens, false),
            )
            .add("logits saved by the forward", logits)
            .add(
                "backward transients (gradients of the log-softmax)",
                BACKWARD_PER_LOGIT * logits,
            );
    }
    // Checkpointed: every layer's input, and the autodiff backend's rotary
    // tables (the plain CPU forward rotates with `model::cpu_ops` and caches
    // none); then the larger of the head's backward (first) and a
    // recomputed layer's (with nearly every gradient made).
    let inputs = (a.layers + 1) * tokens * a.hidden * 4;
    let rotary = 2 * (a.q_dim() + a.kv_dim()) * tokens * 4;
    let base = base
        .add("checkpointed layer inputs (activations)", inputs)
        .add("rotary tables (activations)", rotary);
    let head_grads = a.embedding_params() * 4 * if a.tied { 1 } else { 2 };
    let at_head = held.max(head_grads.min(grads))
        + head_graph(a, tokens, true)
        + logits
        + BACKWARD_PER_LOGIT * logits;
    let graph = layer_graph(a, tokens, w.seqlen);
    let at_layer = grads + graph + (LAYER_BACKWARD * graph as f64) as u64;
    if at_head >= at_layer {
        base.add(
            "gradients held across micro-batches",
            held.max(head_grads.min(grads)),
        )
        .add("activations saved by the head", head_graph(a, tokens, true))
        .add("logits saved by the head", logits)
        .add(
            "backward transients (gradients of the log-softmax)",
            BACKWARD_PER_LOGIT * logits,
        )
    } else {
        base.add(
            "gradients made so far",
            grads + (LAYER_BACKWARD * graph as f64) as u64,
        )
        .add("activations saved by one recomputed layer", graph)
    }
}

pub fn phases(a: &Arch, w: &Workload) -> Vec<Phase> {
    let state = match w.optimizer {
        Optimizer::AdamW => 2,
        Optimizer::Sgd => 0,
    };
    let optimizer = trainable(a, w) * 4 * state;
    let first_step = stages::step_end(1, "zero_grad");
    let later = stages::micro_batch(2, 1, "forward");
    vec![
        Phase::new("load", &[stages::TRAIN_START, stages::TRAIN_MODEL_LOADED])
            .add("runtime (binary, threads, allocator)", RUNTIME)
            .add("text and tokens", w.text_bytes * TEXT_FACTOR)
            .add("weights", a.params * 4),
        step(
            a,
            w,
            "first step",
            [&stages::epoch_start(1), &first_step],
            0,
        ),
        step(a, w, "later steps", [&later, stages::TRAIN_END], optimizer),
    ]
}
