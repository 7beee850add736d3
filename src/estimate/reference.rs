//! Memory of the Python reference scripts, term by term from their code:
//! the Wanda authors' `lib/prune.py` (which also drives SparseGPT's
//! `sparsegpt.py`) and GradProbe's `gradprobe/pruner.py`. They keep the whole
//! model resident; the lines each term models are named beside it.

use super::{Arch, Device, Phase, Task, Workload};
use crate::events::stages;

/// PyTorch + transformers process footprint on CPU before the model loads
/// (measured: `run_reference.py` on this machine, RSS after imports and
/// loading SmolLM2-135M f32 minus its 538 MB of weights: 267 MB).
const TORCH_RUNTIME_CPU: u64 = 267 << 20;
/// CUDA context with PyTorch's kernels when no GPU is named.
const CUDA_CONTEXT: u64 = 500 << 20;

fn runtime(w: &Workload) -> (&'static str, u64) {
    match w.device {
        Device::Cpu => ("runtime (python, torch)", TORCH_RUNTIME_CPU),
        Device::Cuda | Device::Wgpu => ("CUDA context", CUDA_CONTEXT),
    }
}

/// Activations of one sample through one layer: hidden states, q/k/v/o,
/// and the MLP's gate, up and product (sdpa attention: no score matrix).
fn layer_activations(a: &Arch, w: &Workload, batch: u64) -> u64 {
    batch * w.seqlen * (5 * a.hidden + 2 * a.kv_dim() + 3 * a.intermediate) * w.dtype.size()
}

/// Phases of Wanda / SparseGPT / magnitude as `lib/prune.py` runs them.
pub fn phases(a: &Arch, w: &Workload, notes: &mut Vec<String>) -> Vec<Phase> {
    if w.task == Task::GradProbe {
        return gradprobe_reference(a, w, notes);
    }
    let c = w.dtype.size();
    let (rt_name, rt) = runtime(w);
    let weights = a.params * c;
    let big = a.largest_linear();
    // prepare_calibration_input: inps = torch.zeros((128, seqlen, hidden)),
    // a hard-coded 128 whatever --nsamples says, and outs = zeros_like(inps).
    // prune_sparsegpt sizes its buffers with args.nsamples instead.
    let buffers = match w.task {
        Task::Wanda => {
            if w.nsamples > 128 {
                notes.push("the reference's prepare_calibration_input holds 128 samples: more than 128 fail there".into());
            }
            2 * 128 * w.seqlen * a.hidden * c
        }
        // RIA's prepare_calibration_input sizes inps/outs with args.nsamples.
        Task::SparseGpt | Task::Ria => 2 * w.nsamples * w.seqlen * a.hidden * c,
        _ => 0,
    };
    let (stats, transient) = match w.task {
        // WrappedGPT.scaler_row per linear (f32); prune_wanda: W_metric in
        // f32, torch.sort values (f32) and int64 indices, the bool W_mask.
        // RIA: the same statistics; its metric adds the row and column sums
        // and sorts the flattened metric (values and int64 indices).
        Task::Wanda | Task::Ria => (7 * a.hidden.max(a.intermediate) * 4, big * (4 + 4 + 8 + 1)),
        // SparseGPT.H for all seven linears of the layer at once (f32);
        // fasterprune: W.float() clone, cholesky / cholesky_inverse /
        // cholesky outputs, and the block buffers.
        Task::SparseGpt => {
            let (h, q, i) = (a.hidden, a.q_dim(), a.intermediate);
            let widest = i.max(h);
            (
                (5 * h * h + q * q + i * i) * 4,
                big * 4 + 3 * widest * widest * 4 + 4 * 128 * a.intermediate.max(h) * 4,
            )
        }
        // prune_magnitude: |W|, its flattened sort (values and int64
        // indices) and the bool mask.
        _ => (0, big * (c + c + 8 + 1)),
    };
    let mut out = vec![
        Phase::new("load", &[stages::START, stages::MODEL_LOADED])
            .add(rt_name, rt)
            .add("weights", weights),
    ];
    out.push(
        Phase::new("prune", &[stages::BEFORE_PRUNING, stages::AFTER_PRUNING])
            .add(rt_name, rt)
            .add("weights", weights)
            .add("calibration buffers (inps, outs)", buffers)
            .add(
                "activations",
                if w.task == Task::Magnitude {
                    0
                } else {
                    layer_activations(a, w, 1)
                },
            )
            .add("statistics", stats)
            .add("pruning transient", transient),
    );
    if w.eval_windows > 0 {
        // eval_ppl_wikitext: logits [1, seqlen, vocab], the shifted copy, and
        // the loss's float32 log-softmax.
        let logits = w.seqlen * a.vocab * (2 * c + 4);
        out.push(
            Phase::new("eval", &[stages::BEFORE_EVAL, stages::AFTER_EVAL])
                .add(rt_name, rt)
                .add("weights", weights)
                .add("activations", layer_activations(a, w, 1))
                .add("logits", logits),
        );
    }
    out
}

/// GradProbe's `prune()` (the default, not low-memory, path) on an fp32
/// model: pruner.py keeps `original_state` (a clone of every parameter),
/// `_compute_gradients` builds a full gradient dict twice (original and
/// modified), autograd fills every `param.grad`, and the strategy returns a
/// bool mask per parameter (tentative, then final).
fn gradprobe_reference(a: &Arch, w: &Workload, notes: &mut Vec<String>) -> Vec<Phase> {
    let (rt_name, rt) = runtime(w);
    let p = a.params;
    notes.push(
        "reference GradProbe: fp32 weights, gradients kept in float32 (use_fp16=False)".into(),
    );
    // Backward of the whole model: per layer, the saved activations of the
    // batch (hidden states, q/k/v, attention probabilities, MLP), plus the
    // logits, their log-softmax and its gradient.
    let b = w.batch_size;
    let per_layer = b * w.seqlen * (6 * a.hidden + 2 * a.kv_dim() + 4 * a.intermediate) * 4
        + b * a.heads * w.seqlen * w.seqlen * 4;
    let activations = a.layers * per_layer + 3 * b * w.seqlen * a.vocab * 4;
    vec![
        Phase::new("load", &[stages::GP_INITIAL, stages::GP_MODEL_LOADED])
            .add(rt_name, rt)
            .add("weights", p * 4),
        Phase::new(
            "original gradients",
            &[stages::GP_SAVED_TENTATIVE, stages::GP_ORIGINAL_GRADIENTS],
        )
        .add(rt_name, rt)
        .add("weights", p * 4)
        .add("saved values (original_state)", p * 4)
        .add("gradients (param.grad)", p * 4)
        .add("gradients (original set)", p * 4)
        .add("activations", activations),
        Phase::new(
            "modified gradients",
            &[stages::GP_WEIGHTS_REDUCED, stages::GP_MODIFIED_GRADIENTS],
        )
        .add(rt_name, rt)
        .add("weights", p * 4)
        .add("saved values (original_state)", p * 4)
        .add("gradients (param.grad)", p * 4)
        .add("gradients (original set)", p * 4)
        .add("gradients (modified set)", p * 4)
        .add("masks (tentative)", p)
        .add("activations", activations),
        Phase::new(
            "decide",
            &[stages::GP_MODIFIED_GRADIENTS, stages::GP_PRUNING_APPLIED],
        )
        .add(rt_name, rt)
        .add("weights", p * 4)
        .add("saved values (original_state)", p * 4)
        .add("gradients (original set)", p * 4)
        .add("gradients (modified set)", p * 4)
        .add("masks (tentative, final)", 2 * p),
    ]
}

/// prunemem's GradProbe (`prune::gradprobe`): layers streamed from the
/// checkpoint, one forward keeping the decoder-layer boundaries, one layer at
/// a time recomputed under autodiff for its backward, the loss and head done
/// by hand in vocabulary blocks. Candidate positions are u32 (4 bytes each),
/// original maxima f16 (2 bytes each); the original values are re-read from
/// the read-only checkpoint, never saved. Two moments compete for the peak:
/// the head of the modified pass (the f32 head, every candidate's position
/// and original maximum) and the end of the modified pass (positions of the
/// candidates and of the weights decided pruned). Fitted on SmolLM2-135M,
/// seqlen 128, 2 batches, 10% (measured with and without embeddings).
pub fn gradprobe_prunemem(a: &Arch, w: &Workload, notes: &mut Vec<String>) -> Vec<Phase> {
    notes.push(
        "prunemem GradProbe: f32 on the host; candidate positions u32, original gradient maxima f16".into(),
    );
    let b = w.batch_size;
    let tokens = b * w.seqlen;
    let rt = 24u64 << 20;
    let probed = if w.include_embeddings {
        a.layers * a.layer_linear_params() + a.embedding_params() * if a.tied { 1 } else { 2 }
    } else {
        a.layers * a.layer_linear_params()
    };
    let tentative = (probed as f64 * w.sparsity) as u64;
    let head = a.embedding_params() * 4;
    let boundaries = (a.layers + 1) * w.num_batches.max(1) * tokens * a.hidden * 4;
    // Head blocks: 4 Mi logits (host copy, tensor, dlogits) and the upstream
    // gradient of the final norm.
    let block_logits = (1u64 << 22).min(tokens * a.vocab) * 4 * 3 + tokens * a.hidden * 4 * 3;
    // Embedding candidates' running max in f32 through the pass.
    let embed_max = if w.include_embeddings {
        (a.embedding_params() as f64 * w.sparsity) as u64 * 4
    } else {
        0
    };
    let layer = a.layer_params() * 4;
    // One layer under autodiff: its saved activations, weight gradients and
    // the host copies of its linears while they are prepared.
    let layer_backward = tokens * (8 * a.hidden + 2 * a.kv_dim() + 5 * a.intermediate) * 4
        + b * a.heads * w.seqlen * w.seqlen * 4 * 2
        + 2 * layer;
    vec![
        Phase::new(
            "head of the modified pass",
            &[stages::GP_WEIGHTS_REDUCED, stages::GP_MODIFIED_GRADIENTS],
        )
        .add("runtime", rt)
        .add("head weight (f32)", head)
        .add("logit blocks", block_logits)
        .add("boundary activations", boundaries)
        .add("candidate positions (u32)", tentative * 4)
        .add("original maxima (f16)", tentative * 2)
        .add("embedding maxima (f32)", embed_max),
        Phase::new(
            "end of the modified pass",
            &[stages::GP_MODIFIED_GRADIENTS, stages::GP_FINAL_MASKS],
        )
        .add("runtime", rt)
        .add("weights (one layer)", layer)
        .add("layer backward", layer_backward)
        .add("candidate positions (u32)", tentative * 4)
        .add("pruned positions (u32)", tentative * 4)
        .add("embedding maxima (f32)", embed_max),
    ]
}
