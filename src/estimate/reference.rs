//! Memory of the Python reference scripts, term by term from their code:
//! the Wanda authors' `lib/prune.py` (which also drives SparseGPT's
//! `sparsegpt.py`) and GradProbe's `gradprobe/pruner.py`. They keep the whole
//! model resident; the lines each term models are named beside it.

use super::{Arch, Device, Phase, Task, Workload};

/// PyTorch + transformers process footprint on CPU before the model loads
/// (measured: `run_reference.py` on this machine, RSS after imports and
/// loading SmolLM2-135M f32 minus its 538 MB of weights: 267 MB).
const TORCH_RUNTIME_CPU: u64 = 267 << 20;
/// CUDA context with PyTorch's kernels when no GPU is named.
const CUDA_CONTEXT: u64 = 500 << 20;

fn runtime(w: &Workload) -> (&'static str, u64) {
    match w.device {
        Device::Cpu => ("runtime (python, torch)", TORCH_RUNTIME_CPU),
        Device::Cuda => ("CUDA context", CUDA_CONTEXT),
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
        Task::SparseGpt => 2 * w.nsamples * w.seqlen * a.hidden * c,
        _ => 0,
    };
    let (stats, transient) = match w.task {
        // WrappedGPT.scaler_row per linear (f32); prune_wanda: W_metric in
        // f32, torch.sort values (f32) and int64 indices, the bool W_mask.
        Task::Wanda => (7 * a.hidden.max(a.intermediate) * 4, big * (4 + 4 + 8 + 1)),
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
        Phase::new("load", &["01_start", "02_model_loaded"])
            .add(rt_name, rt)
            .add("weights", weights),
    ];
    out.push(
        Phase::new("prune", &["03_before_pruning", "04_after_pruning"])
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
            Phase::new("eval", &["05_before_eval", "06_after_eval"])
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
        Phase::new("load", &["00_initial", "01_model_loaded"])
            .add(rt_name, rt)
            .add("weights", p * 4),
        Phase::new(
            "original gradients",
            &[
                "04_saved_tentative_values",
                "08_original_gradients_computed",
            ],
        )
        .add(rt_name, rt)
        .add("weights", p * 4)
        .add("saved values (original_state)", p * 4)
        .add("gradients (param.grad)", p * 4)
        .add("gradients (original set)", p * 4)
        .add("activations", activations),
        Phase::new(
            "modified gradients",
            &["10_weights_reduced", "14_modified_gradients_computed"],
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
            &["14_modified_gradients_computed", "16_final_pruning_applied"],
        )
        .add(rt_name, rt)
        .add("weights", p * 4)
        .add("saved values (original_state)", p * 4)
        .add("gradients (original set)", p * 4)
        .add("gradients (modified set)", p * 4)
        .add("masks (tentative, final)", 2 * p),
    ]
}

/// prunemem's GradProbe: layers streamed from the checkpoint; one forward
/// keeps only the decoder-layer boundaries, one layer at a time is
/// recomputed under autodiff for its backward; the original values of
/// tentative weights never need saving (the checkpoint is read-only) and
/// gradient maxima are kept, in f16, only at tentative positions.
pub fn gradprobe_prunemem(a: &Arch, w: &Workload, notes: &mut Vec<String>) -> Vec<Phase> {
    let _ = notes;
    let b = w.batch_size;
    let rt = 24u64 << 20;
    let pruned = if w.include_embeddings {
        a.params
    } else {
        a.layers * a.layer_linear_params()
    };
    let tentative = (pruned as f64 * w.sparsity) as u64;
    let embed = a.embedding_params() * 4 * if a.tied { 1 } else { 2 };
    let boundaries = (a.layers + 1) * b * w.seqlen * a.hidden * 4;
    let layer = a.layer_params() * 4;
    // One layer under autodiff: its saved activations and weight gradients.
    let layer_backward = b * w.seqlen * (8 * a.hidden + 2 * a.kv_dim() + 5 * a.intermediate) * 4
        + b * a.heads * w.seqlen * w.seqlen * 4 * 2
        + layer;
    let logits = 3 * b * w.seqlen * a.vocab * 4;
    let embed_grad = if w.include_embeddings {
        a.embedding_params() * 4
    } else {
        0
    };
    vec![
        Phase::new(
            "gradients",
            &[
                "04_saved_tentative_values",
                "14_modified_gradients_computed",
            ],
        )
        .add("runtime", rt)
        .add("embeddings and head", embed)
        .add("weights (one layer)", layer)
        .add("boundary activations", boundaries)
        .add("layer backward", layer_backward)
        .add("logits and loss", logits)
        .add("embedding gradient", embed_grad)
        .add("masks (tentative bitmap)", pruned.div_ceil(8))
        .add("gradient maxima (f16, two sets)", tentative * 2 * 2),
    ]
}
