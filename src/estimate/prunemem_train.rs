//! Training on prunemem's engine (`crate::train`, Burn autodiff on the CPU,
//! f32), phase by phase, with constants measured on the training grid
//! (see `docs/estimator.md`).
//!
//! What a step holds, by the order it happens: the parameters; after the
//! first `step()`, the optimizer's moments; for each micro-batch, the graph
//! the forward saves for the backward (every layer's saved tensors, the
//! logits and their log-softmax); at the start of the backward, the
//! gradients of the logits (the backward's peak); from the backward on,
//! the gradients — one per trained parameter, the engine adds each
//! segment's into the held ones (`train::grads`) — which stay through the
//! next micro-batch's forward when accumulating. With checkpointing the
//! forward keeps only each layer's input, and the backward holds one
//! layer's graph at a time beside the logits' graph. Frozen layers below
//! the first trainable one save nothing. The optimizer's update is the
//! other candidate peak: every gradient, the moments, and one update's
//! temporaries for the largest trained tensor — on a real vocabulary (a
//! 49 152 × 576 table beside 3.5 M-parameter layers) it is the step's peak.

use super::prunemem::{CUDA_LINKED, TEXT_FACTOR, TOKENIZER_STRINGS, TOKENIZER_TABLES};
use super::tokenizer;
use super::{Arch, Optimizer, Phase, Workload};
use crate::events::stages;

/// Resident bytes that are not live heap during training (binary, thread
/// stacks, allocator arenas) plus the heap before the model: 21.7-27.5 MB
/// at the grid's peaks (mean 24.9 MB).
const RUNTIME: u64 = (24 << 20) + DEVICE_BACKENDS_LINKED;
/// What linking Burn's device backends adds to a training run's resident
/// set. `wgpu` adds more than to a prune's (autodiff's code pages too):
/// measured on the grid's debug runs, 2026-11-24, the peaks rose by
/// 5.7-6.9 MB against the earlier build's (AdamW h256 from +0.9% to -0.9%
/// of about 110 MB, checkpointing from -2.5% to -4.5%). `cuda` as for a
/// prune ([`CUDA_LINKED`]).
const DEVICE_BACKENDS_LINKED: u64 = WGPU_LINKED + CUDA_LINKED;
const WGPU_LINKED: u64 = if cfg!(feature = "wgpu") { 13 << 19 } else { 0 };
/// A checkpointed run's forward goes through the plain CPU kernels
/// (`model::cpu_ops`), whose worker threads' buffers are resident but not
/// heap, as the pruning engine's compute workspace is. Measured on the
/// grid's two checkpointed cases, 2026-11-24: runtime 35.7 and 35.3 MB
/// against 30.7-33.5 MB for the full-graph cases (predicted 32.0).
const CHECKPOINTED_WORKSPACE: u64 = 7 << 19;
/// f32 elements one decoder layer's graph saves per token: per unit of
/// hidden width (two norms, q and its rotary products, k and v after their
/// heads are repeated to the query's, the attention output), of
/// intermediate width (gate, its sigmoid and SiLU, up, their product), and
/// per attended position and head (scores, their masked and softmaxed
/// forms). Nothing is saved at key/value width: a term of 4 per key/value
/// unit with `PER_SCORE` 2.5 until 2026-11-26, which over-counted the grid's
/// 128-wide keys and under-counted its scores; refitted on the training
/// grid's full-graph runs (`docs/estimator.md`, 2026-11-26).
const PER_HIDDEN: f64 = 10.0;
const PER_INTERMEDIATE: f64 = 5.0;
const PER_SCORE: f64 = 3.0;
/// f32 elements the head's graph saves per token beside the logits and
/// their log-softmax, per hidden unit (the final norm's input and what it
/// saves). Refitted 2026-12-01 on the grid's full-graph runs once the
/// rotary tables and the products' packing blocks were counted apart
/// (both had been absorbed here, as 0.096 per vocabulary entry + 6.45 per
/// hidden unit): what remains at the later steps' peak is 3.0 per hidden
/// unit at 512 tokens on both shapes (h256: 1.5 MiB; h384: 2.6 MiB) and
/// 1.0-1.5 at 1 024 tokens, so the larger is taken.
const HEAD_PER_HIDDEN_FULL: f64 = 3.0;
/// The same when the head's graph is rebuilt in a checkpointed backward:
/// nothing per vocabulary entry; per hidden unit and per token. Fitted on
/// two points, 2026-11-24 (release and debug agree): the grid's h256 /
/// vocab 4096 run (4.2 MB of head activations for 512 tokens) and the
/// vocab-49 152 run (5.5 MB, h576).
const HEAD_PER_HIDDEN_CHECKPOINTED: f64 = 2.0;
const HEAD_PER_TOKEN_CHECKPOINTED: f64 = 1536.0;
/// Gradient memory the head's backward holds beyond the table's gradient
/// while it adds the product a block at a time (`train::grads`: blocks of
/// 8 MiB): per block byte, and a constant (the product's packing buffers
/// and the hidden states' host copy). Fitted 2026-11-24 on two points: the
/// grid's h256 / vocab 4096 table (one 4.2 MB block: 13.6 MB) and the
/// SmolLM2 2-layer cut (8 MiB blocks: 18.2 MiB).
const HEAD_BLOCK_FACTOR: f64 = 1.31;
const HEAD_BLOCK_CONSTANT: u64 = 8_090_000;
const HEAD_BLOCK_BYTES: u64 = 8 << 20;
/// Temporaries of one Adam/AdamW update, in units of the tensor updated:
/// the gradient's square, taken while the gradient is still needed (the
/// step's other products reuse their operands' buffers, `train::optim`).
/// Measured on the SmolLM2 2-layer cut: 108 MiB above the moments at the
/// update of its 49 152 × 576 table in later steps (2026-11-24).
const ADAM_UPDATE_TRANSIENT: u64 = 1;
/// The first update creates the moments as it goes: at the largest
/// tensor it holds every gradient beside that tensor's two new moments
/// (the square becomes the second moment; the update is computed in the
/// gradient's buffer): adamw-v49k-b2-s64-acc2's first step, 141.6 MB of
/// gradients and 226.5 MB of state, 2026-11-26. Before the optimizer
/// reused the gradient's buffer it was 3 (fitted on the cut: 645 MiB of
/// heap against 142 + 142 + 3 × 108 MiB). At its end, every moment and
/// almost no gradient (SmolLM2-135M: 1.009 GiB of state, no gradient).
const ADAM_FIRST_UPDATE_AT_LARGEST: u64 = 2;
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
        + PER_SCORE * (a.heads * s) as f64;
    bytes(per_token, tokens)
}

/// The head's saved graph beside the logits.
fn head_graph(a: &Arch, tokens: u64, checkpointed: bool) -> u64 {
    let per_token = if checkpointed {
        HEAD_PER_HIDDEN_CHECKPOINTED * a.hidden as f64 + HEAD_PER_TOKEN_CHECKPOINTED
    } else {
        HEAD_PER_HIDDEN_FULL * a.hidden as f64
    };
    bytes(per_token, tokens)
}

/// The trainable parameters: the plan's count, else all.
fn trainable(a: &Arch, w: &Workload) -> u64 {
    w.trainable_params.unwrap_or(a.params)
}

/// Whether the vocabulary table (or an untied head) trains: the trained
/// parameters reach past the trained layers by a table.
fn table_trains(a: &Arch, w: &Workload) -> bool {
    let layers = a.layers.saturating_sub(w.first_trainable_layer) * a.layer_params();
    trainable(a, w) >= layers + a.embedding_params()
}

/// The largest tensor the optimizer updates (elements): the vocabulary
/// table when it trains, else the largest linear.
fn largest_trained(a: &Arch, w: &Workload) -> u64 {
    if table_trains(a, w) {
        a.embedding_params().max(a.largest_linear())
    } else {
        a.largest_linear()
    }
}

/// What a step holds at every moment: the runtime (with the checkpointed
/// forward's workspace), the parameters, the rotary tables the autodiff
/// forward expands to each batch's heads (`model::Rope`: cos and sin for
/// the queries' and the keys' heads, kept for the run), and the products'
/// packing blocks (`model::matmul::thread_block_bytes`: one per rayon
/// thread and one for the training thread itself, which multiplies too —
/// made in the first forward, so its tag is the activations'; a grid run
/// holds 3 × 2 MiB on a 2-core, 2 MiB-L2 machine from its first step to
/// its end, 2026-12-01).
fn held_by_every_moment(a: &Arch, w: &Workload, name: &str, stages: [&str; 2]) -> Phase {
    let workspace = if w.checkpointing {
        CHECKPOINTED_WORKSPACE
    } else {
        0
    };
    let tokens = w.batch_size * w.seqlen;
    Phase::new(name, &stages)
        .add("runtime (binary, threads, allocator)", RUNTIME + workspace)
        .add("weights", a.params * 4)
        .add(
            "rotary tables, expanded to the batch's heads (activations)",
            rotary_tables(a, tokens),
        )
        .add(
            "the products' packing blocks, one a multiplying thread (activations)",
            w.matmul_workspace + crate::model::matmul::thread_block_bytes(),
        )
}

/// The expanded rotary tables for `tokens` tokens: cos and sin at the
/// queries' and the keys' widths, in f32.
fn rotary_tables(a: &Arch, tokens: u64) -> u64 {
    2 * (a.q_dim() + a.kv_dim()) * tokens * 4
}

/// The optimizer's update. Later steps: every gradient, the moments and
/// one update's temporaries for the largest tensor. The first, which
/// creates the moments as it consumes the gradients: the larger of its
/// moment at the largest tensor and its end.
fn update(a: &Arch, w: &Workload, name: &str, stages: [&str; 2], first: bool) -> Phase {
    let largest = largest_trained(a, w) * 4;
    let grads = trainable(a, w) * 4;
    let moments = grads * optimizer_buffers(w);
    let base = held_by_every_moment(a, w, name, stages);
    match w.optimizer {
        Optimizer::Sgd => base.add("gradients consumed by the update", grads),
        Optimizer::AdamW if !first => base
            .add("gradients consumed by the update", grads)
            .add("optimizer state", moments)
            .add(
                "optimizer update's temporaries",
                ADAM_UPDATE_TRANSIENT * largest,
            ),
        Optimizer::AdamW if grads + ADAM_FIRST_UPDATE_AT_LARGEST * largest > moments => {
            base.add("gradients consumed by the update", grads).add(
                "optimizer state and temporaries of the largest tensor's first update",
                ADAM_FIRST_UPDATE_AT_LARGEST * largest,
            )
        }
        Optimizer::AdamW => base.add("optimizer state, every moment created", moments),
    }
}

/// One step's peak: the larger of the backward's (with `held` bytes of
/// optimizer state: none in the first step) and the update's.
fn step(a: &Arch, w: &Workload, name: &str, stages: [&str; 2], first: bool) -> Phase {
    let moments = trainable(a, w) * 4 * optimizer_buffers(w);
    let backward = backward(a, w, name, stages, if first { 0 } else { moments });
    let update = update(a, w, name, stages, first);
    if update.total() > backward.total() {
        update
    } else {
        backward
    }
}

/// The backward's peak, with `optimizer` bytes of state held.
fn backward(a: &Arch, w: &Workload, name: &str, stages: [&str; 2], optimizer: u64) -> Phase {
    let tokens = w.batch_size * w.seqlen;
    let grads = trainable(a, w) * 4;
    let logits = tokens * a.vocab * 4;
    // Gradients stay through the next micro-batch when accumulating.
    let held = if w.grad_accum > 1 { grads } else { 0 };
    let base = held_by_every_moment(a, w, name, stages).add("optimizer state", optimizer);
    let head = head_point(a, w, held, logits);
    if !w.checkpointing {
        let layers = a.layers.saturating_sub(w.first_trainable_layer);
        // A frozen layer saves no graph, but its segment keeps its input
        // (`train::step::Segment`): one hidden state a frozen layer below
        // the first trained one (the grid's two frozen layers: 1 MiB).
        let frozen = w.first_trainable_layer.min(a.layers) * tokens * a.hidden * 4;
        let base = base
            .add(
                "activations saved by the forward",
                layers * layer_graph(a, tokens, w.seqlen) + head_graph(a, tokens, false),
            )
            .add("the frozen layers' inputs (activations)", frozen);
        return head.into_iter().fold(base, |p, (name, b)| p.add(name, b));
    }
    // Checkpointed: every layer's input (the rotary tables, counted at
    // every moment, are the recomputing autodiff forward's: the plain CPU
    // forward rotates with `model::cpu_ops` and caches none); then the
    // larger of the head's (first) and a recomputed layer's: every
    // gradient but the layer's own, made by this backward, and the
    // embedding's, added at the end.
    let inputs = (a.layers + 1) * tokens * a.hidden * 4;
    let base = base.add("checkpointed layer inputs (activations)", inputs);
    let at_head = head.iter().map(|(_, b)| b).sum::<u64>() + head_graph(a, tokens, true);
    let graph = layer_graph(a, tokens, w.seqlen);
    let made = grads.saturating_sub(a.layer_params() * 4);
    let at_layer = made + graph + (LAYER_BACKWARD * graph as f64) as u64;
    if at_head >= at_layer {
        let base = base.add("activations saved by the head", head_graph(a, tokens, true));
        head.into_iter().fold(base, |p, (name, b)| p.add(name, b))
    } else {
        base.add(
            "gradients made so far",
            made + (LAYER_BACKWARD * graph as f64) as u64,
        )
        .add("activations saved by one recomputed layer", graph)
    }
}

/// Logits-sized buffers at the head's forward: the logits and, while the
/// product that makes them runs, a second buffer of its output's size
/// inside the CPU matrix multiply (measured 2026-11-24: twice the logits
/// in the forward windows of SmolLM2-135M and of the grid's runs).
const LOGITS_AT_FORWARD: u64 = 2;

/// The head's gradients and logits at the larger of its two moments: its
/// forward's product (the held gradients beside twice the logits) and its
/// backward (the logits, which become their own gradient in place —
/// `train::head` —, the held gradients, and the head's weight gradient,
/// made a block at a time when none is held yet).
fn head_point(a: &Arch, w: &Workload, held: u64, logits: u64) -> [(&'static str, u64); 2] {
    let table = if table_trains(a, w) {
        a.embedding_params() * 4
    } else {
        0
    };
    let block = if table > 0 {
        (HEAD_BLOCK_FACTOR * HEAD_BLOCK_BYTES.min(table) as f64) as u64 + HEAD_BLOCK_CONSTANT
    } else {
        0
    };
    if held + LOGITS_AT_FORWARD * logits >= held.max(table) + block + logits {
        [
            ("gradients held across micro-batches", held),
            (
                "logits and their product's output-sized buffer",
                LOGITS_AT_FORWARD * logits,
            ),
        ]
    } else {
        [
            (
                "gradients held, the head's weight gradient made a block at a time",
                held.max(table) + block,
            ),
            ("logits, becoming their own gradient", logits),
        ]
    }
}

/// f32 state buffers per trained parameter (the estimate's SGD has no
/// momentum).
fn optimizer_buffers(w: &Workload) -> u64 {
    match w.optimizer {
        Optimizer::AdamW => 2,
        Optimizer::Sgd => 0,
    }
}

pub fn phases(a: &Arch, w: &Workload, notes: &mut Vec<String>) -> Vec<Phase> {
    let first_step = stages::step_end(1, "zero_grad");
    let later = stages::micro_batch(2, 1, "forward");
    // The tokenizer is held by every moment of every phase.
    let (tables, strings) = tokenizer::held_by_run(a, w, notes);
    let with_tokenizer = |p: Phase| {
        p.add(TOKENIZER_TABLES, tables)
            .add(TOKENIZER_STRINGS, strings)
    };
    [
        Phase::new("load", &[stages::TRAIN_START, stages::TRAIN_MODEL_LOADED])
            .add("runtime (binary, threads, allocator)", RUNTIME)
            .add("text and tokens", w.text_bytes * TEXT_FACTOR)
            .add("weights", a.params * 4),
        step(
            a,
            w,
            "first step",
            [&stages::epoch_start(1), &first_step],
            true,
        ),
        step(a, w, "later steps", [&later, stages::TRAIN_END], false),
    ]
    .into_iter()
    .map(with_tokenizer)
    .collect()
}
