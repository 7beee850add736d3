//! Memory of the Python reference scripts, term by term from their code:
//! the Wanda authors' `lib/prune.py` (which also drives SparseGPT's
//! `sparsegpt.py`) and GradProbe's `gradprobe/pruner.py`. They keep the whole
//! model resident; the lines each term models are named beside it. The terms
//! were read off traces of those scripts (`scripts/reference/trace_peak.py`:
//! fake tensors on a faked CUDA device, live bytes as `memory_allocated`
//! counts them), which `tests/reference_traces.rs` checks them against.

use super::{Arch, Device, Phase, Task, Workload};
use crate::events::stages;

/// PyTorch + transformers process footprint on the CPU before the model
/// loads: RSS after the imports, measured by `trace_peak.py --real-model`
/// (torch 2.15.0, PyPI's default CUDA wheel, which maps its CUDA libraries
/// even on a CPU-only machine; transformers 5.23.0): 752 MB.
const TORCH_RUNTIME_CPU: u64 = 752_000_000;
/// The rest of a reference run's RSS beyond its tensors on the CPU: the
/// tokenizer and text, interpreter objects, allocator slack. Measured as
/// peak RSS − RSS after imports − traced tensor peak on SmolLM2-135M
/// (`run_reference.py`, 32 × 512, 4 eval windows): Wanda 154 MB,
/// magnitude 149 MB.
const PROCESS_CPU: u64 = 150_000_000;
/// glibc's heap keeps what GradProbe frees between its gradient passes:
/// with `MALLOC_MMAP_THRESHOLD_=65536` its peak RSS fell by 832 MB on
/// SmolLM2-135M (4.69 → 3.86 GB), about two fp32 sets of its trained
/// parameters (850 MB) — the zeros dict and the per-batch copies it
/// replaces. Fitted on that one model.
const GLIBC_RETAINED_GRAD_SETS: u64 = 2;
/// The device memory a PyTorch process holds outside its caching allocator:
/// the CUDA context with the kernels and library handles loaded by the end
/// of a run. Measured on an H100 (driver 580.159.04, torch 2.11.0+cu130,
/// `scripts/reference/cuda_check.py`, `mem_get_info` used − reserved):
/// 527 MiB after the first tensor, 695 MiB at the end of Wanda and
/// magnitude runs, 793 MiB after SparseGPT (cuSOLVER's kernels); the Wanda
/// figure is taken.
pub const CUDA_CONTEXT: u64 = 695 << 20;
/// The component name the context goes by, in every estimate that has one
/// (the GPU table subtracts each card's own: `Estimate::device_need`).
pub const CUDA_CONTEXT_NAME: &str = "CUDA context";
/// cuBLAS' workspace, which PyTorch allocates through its caching allocator
/// (so `memory_allocated` counts it, a trace of tensor ops does not): the
/// default `CUBLAS_WORKSPACE_CONFIG` ":4096:8:16:8" on Hopper is 8 × 4 MiB
/// plus 8 × 16 KiB. Measured on the H100: 32–33 MiB allocated outside any
/// tensor at the end of every run (`allocated_outside_tensors`).
pub const CUBLAS_WORKSPACE: u64 = 8 * (4 << 20) + 8 * (16 << 10);
/// The name of the sort's buffers in an estimate: inside
/// `memory_allocated`, invisible to a trace of op outputs.
pub const SORT_BUFFERS_NAME: &str = "pruning transient (sort buffers)";
/// Bytes per element `torch.sort(W_metric, dim=-1, stable=True)` allocates
/// on CUDA beyond its outputs while it runs (an f32 key copy and two int64
/// index buffers of the segmented radix sort): Wanda's prune-phase peak on
/// the H100 exceeded the fake trace by 19.8–20.0 bytes per element of the
/// largest linear on LLaMA-3.2-1B, LLaMA-2-7B, LLaMA-3.1-8B and a LLaMA-2-70B
/// layer (`cuda_check.py`, cuBLAS' workspace subtracted).
pub const CUDA_SORT_BYTES_PER_ELEMENT: u64 = 20;
/// GradProbe on CUDA: the allocator's blocks outside any tensor at the end
/// of its run, 93.3 MB (89 MiB) on the H100 for SmolLM2-135M, f32 —
/// cuBLAS' workspace for the forward's thread and another for autograd's
/// backward thread, whose handle is its own. One run measured
/// (`cuda_check.py`, case smollm2-gradprobe).
pub const GRADPROBE_CUDA_WORKSPACES: u64 = 93_340_160;
/// What the caching allocator reserves above `memory_allocated` at the peak
/// (2 MiB segment rounding, freed blocks kept cached), as a fraction of the
/// allocated bytes. Measured on the H100 (`max_memory_reserved` /
/// `max_memory_allocated`): 1.0–5.2% on the 1B–13B runs, 14.4% on a
/// LLaMA-2-70B layer (its 4.4 GiB sort buffers fragment the cache), 13.9%
/// on GradProbe; 5% is kept, above every pruning run but the 70B layer.
/// Where the row sort's buffers are larger than 5%, the reserve is their
/// size instead (see [`with_reserve`]).
pub const ALLOCATOR_RESERVE: f64 = 0.05;
/// The component name the allocator's reserve goes by.
pub const ALLOCATOR_RESERVE_NAME: &str = "allocator reserve";

/// Component names that are outside the allocator (`memory_allocated`):
/// the process or context, and the allocator's reserve.
pub fn outside_allocator(name: &str) -> bool {
    name.starts_with("runtime") || name == CUDA_CONTEXT_NAME || name == ALLOCATOR_RESERVE_NAME
}

/// The checkpoint's pages stay mapped (transformers loads safetensors by
/// mmap) after a method replaces the weights with new tensors (SparseGPT's
/// `weight.data = W`, GradProbe's `prune.remove`): on the CPU they stay in
/// RSS, the size of the replaced matrices as loaded.
fn mapped_checkpoint(a: &Arch, w: &Workload, bytes_per: u64) -> u64 {
    match w.device {
        Device::Cpu => a.layers * a.layer_linear_params() * bytes_per,
        _ => 0,
    }
}

/// Adds what surrounds the traced bytes on the run's device: the CUDA
/// context, cuBLAS' workspace and the allocator's reserve on a GPU, the
/// Python process on the CPU.
fn surround(p: Phase, w: &Workload) -> Phase {
    match w.device {
        Device::Cpu => p
            .add("runtime (python, torch)", TORCH_RUNTIME_CPU)
            .add("runtime (tokenizer, text, interpreter)", PROCESS_CPU),
        Device::Cuda | Device::Wgpu => with_reserve(
            p.add(CUDA_CONTEXT_NAME, CUDA_CONTEXT)
                .add("cuBLAS workspace", CUBLAS_WORKSPACE),
        ),
    }
}

/// Adds the caching allocator's reserve above a phase's allocated peak:
/// [`ALLOCATOR_RESERVE`] of it, or the row sort's buffers where they are
/// larger. Once freed, their segments stay cached beside the next layer's
/// blocks: on the H100's LLaMA-2-70B layer the reserve was 4.68 GiB over
/// 4.38 GiB of sort buffers, where 5% gives 1.62 GiB (one run; on the
/// 1B–13B runs the larger of the two was above every measured reserve).
fn with_reserve(p: Phase) -> Phase {
    let fraction = (p.allocated() as f64 * ALLOCATOR_RESERVE) as u64;
    let reserve = fraction.max(p.named(SORT_BUFFERS_NAME));
    p.add(ALLOCATOR_RESERVE_NAME, reserve)
}

/// The process (CPU) or context (GPU) GradProbe's phases carry.
fn runtime(w: &Workload) -> (&'static str, u64) {
    match w.device {
        Device::Cpu => ("runtime (python, torch)", TORCH_RUNTIME_CPU),
        Device::Cuda | Device::Wgpu => (CUDA_CONTEXT_NAME, CUDA_CONTEXT),
    }
}

/// One moment of a phase: named parts and their bytes.
type Moment = Vec<(&'static str, u64)>;

/// The phase at the larger of its moments.
fn phase_at(name: &str, span: &[&str], w: &Workload, moments: Vec<Moment>) -> Phase {
    let best = moments
        .into_iter()
        .max_by_key(|m| m.iter().map(|(_, b)| *b).sum::<u64>())
        .unwrap_or_default();
    let p = best
        .into_iter()
        .fold(Phase::new(name, span), |p, (n, b)| p.add(n, b));
    surround(p, w)
}

/// Samples the calibration buffers hold: prepare_calibration_input's
/// `inps = torch.zeros((128, seqlen, hidden))` is a hard-coded 128 whatever
/// --nsamples says (with `outs = zeros_like(inps)`); prune_sparsegpt (and
/// RIA's copy) size theirs with args.nsamples; magnitude has none.
fn held_samples(w: &Workload, notes: &mut Vec<String>) -> u64 {
    match w.task {
        Task::Wanda => {
            if w.nsamples > 128 {
                notes.push("the reference's prepare_calibration_input holds 128 samples: more than 128 fail there".into());
            }
            128
        }
        Task::SparseGpt | Task::Ria => w.nsamples,
        _ => 0,
    }
}

/// The competing moments of the pruning loop, each on top of `before`
/// (weights, calibration buffers, the cached causal mask).
fn prune_moments(a: &Arch, w: &Workload, before: Moment) -> Vec<Moment> {
    let c = w.dtype.size();
    let (s, h, i) = (w.seqlen, a.hidden, a.intermediate);
    let big = a.largest_linear();
    // down_proj's forward hook: its input (the MLP product), the hook's f32
    // copy of it, and the hidden state, residual and output.
    let hooked = s * (i * (c + 4) + 3 * h * c);
    let with = |more: &[(&'static str, u64)]| {
        let mut m = before.clone();
        m.extend_from_slice(more);
        m
    };
    match w.task {
        // WrappedGPT.scaler_row per linear (f32); prune_wanda: W_metric in
        // f32, torch.sort's values (f32) and int64 indices while the
        // previous linear's are still bound, the bool W_mask. The last
        // linear's metric, sort and mask stay bound through the next
        // layer's forward. N:M: the metric, a zeros_like and two masks.
        Task::Wanda | Task::Ria => {
            let stats = 7 * h.max(i) * 4;
            let (sorting, left) = if w.nm {
                (big * 14, big * 5)
            } else {
                (big * 29, big * 17)
            };
            // The row sort's own buffers (unstructured only), on CUDA.
            let sort_buffers = match w.device {
                Device::Cuda if !w.nm => big * CUDA_SORT_BYTES_PER_ELEMENT,
                _ => 0,
            };
            vec![
                with(&[
                    ("statistics", stats),
                    ("pruning transient", sorting),
                    (SORT_BUFFERS_NAME, sort_buffers),
                ]),
                with(&[
                    ("statistics", stats),
                    ("pruning transient", left),
                    ("activations", hooked),
                ]),
            ]
        }
        // SparseGPT.H for all seven linears (f32) while the layer's forward
        // feeds them, with down_proj's inp·inpᵀ product; then fasterprune
        // on down_proj: its H and Cholesky factor, W in f32 and the
        // trailing-columns update.
        Task::SparseGpt => {
            let q = a.q_dim();
            let hessians = (5 * h * h + q * q + i * i) * 4;
            vec![
                with(&[
                    ("statistics (Hessians)", hessians),
                    ("statistics (inp·inpᵀ)", i * i * 4),
                    ("activations", hooked),
                ]),
                with(&[
                    ("statistics (Hessian, Cholesky)", 2 * i * i * 4),
                    ("pruning transient", 2 * big * 4),
                    (
                        "runtime (checkpoint pages still mapped)",
                        mapped_checkpoint(a, w, c),
                    ),
                ]),
            ]
        }
        // prune_magnitude: |W|, its flattened sort (values and int64
        // indices) and the bool mask.
        _ => vec![with(&[("pruning transient", big * (c + c + 8 + 1))])],
    }
}

/// Phases of Wanda / SparseGPT / RIA / magnitude as `lib/prune.py` runs
/// them with current transformers (sdpa attention: no score matrix).
pub fn phases(a: &Arch, w: &Workload, notes: &mut Vec<String>) -> Vec<Phase> {
    if w.task == Task::GradProbe {
        return gradprobe_reference(a, w, notes);
    }
    let c = w.dtype.size();
    let s = w.seqlen;
    let weights = a.params * c;
    let held = held_samples(w, notes);
    let buffers = 2 * held * s * a.hidden * c;
    // The boolean causal mask transformers builds and the Catcher caches.
    let causal = if held > 0 { s * s } else { 0 };
    let before = vec![
        ("weights", weights),
        ("calibration buffers (inps, outs)", buffers),
        ("causal mask", causal),
    ];
    let mut out = vec![
        phase_at(
            "load",
            &[stages::START, stages::MODEL_LOADED],
            w,
            vec![vec![("weights", weights)]],
        ),
        phase_at(
            "prune",
            &[stages::BEFORE_PRUNING, stages::AFTER_PRUNING],
            w,
            prune_moments(a, w, before),
        ),
    ];
    if w.eval_windows > 0 {
        // eval_ppl_wikitext: the logits [1, seqlen, vocab] and their
        // shifted contiguous copy; use_cache is on again, so the forward
        // builds a KV cache. The Catcher class closes over `inps`: a
        // reference cycle that keeps one buffer alive after pruning until
        // Python's collector runs (it had not in the real runs traced).
        let replaced = if w.task == Task::SparseGpt {
            mapped_checkpoint(a, w, c)
        } else {
            0
        };
        out.push(phase_at(
            "eval",
            &[stages::BEFORE_EVAL, stages::AFTER_EVAL],
            w,
            vec![vec![
                ("weights", weights),
                (
                    "calibration buffer (kept by a reference cycle)",
                    held * s * a.hidden * c,
                ),
                ("KV cache", a.layers * 2 * s * a.kv_dim() * c),
                ("logits", 2 * s * a.vocab * c),
                ("runtime (checkpoint pages still mapped)", replaced),
            ]],
        ));
    }
    out
}

/// GradProbe's `prune()` (the default, not low-memory, path) on an fp32
/// model, as traced (`trace_peak.py --method gradprobe`): pruner.py keeps
/// `original_state` (a clone of every parameter) beside the weights,
/// autograd fills `param.grad` for the trained parameters (the decoder's
/// linears and norms; the embeddings too with `--include-embeddings`), and
/// `_compute_gradients` builds a dict of their absolute gradients twice
/// (original, modified: a zeros dict first, replaced batch by batch), with a
/// bool mask per pruned matrix (tentative, then final). The dicts and masks
/// live on the CPU even when the model is on a GPU.
fn gradprobe_reference(a: &Arch, w: &Workload, notes: &mut Vec<String>) -> Vec<Phase> {
    let (rt_name, rt) = runtime(w);
    let all = a.params * 4;
    let embeddings = a.embedding_params() * if a.tied { 1 } else { 2 };
    let trained = if w.include_embeddings {
        a.params
    } else {
        // The input embedding is frozen; an untied head still trains.
        a.params - a.embedding_params()
    };
    let pruned = if w.include_embeddings {
        a.layers * a.layer_linear_params() + embeddings
    } else {
        a.layers * a.layer_linear_params() + embeddings - a.embedding_params()
    };
    let grads = trained * 4;
    let on_gpu = w.device.is_gpu();
    notes.push(if on_gpu {
        "reference GradProbe: fp32; its gradient dicts and masks are host memory (not in this GPU estimate)".into()
    } else {
        "reference GradProbe: fp32 weights, gradients kept in float32 (use_fp16=False)".into()
    });
    let host = |b: u64| if on_gpu { 0 } else { b };
    // Backward of the whole model (sdpa: no score matrix): per layer the
    // activations autograd saved for the batch (10 hidden-, 2 kv- and 6
    // MLP-wide f32 vectors per token: read off the traces' original-gradients
    // peaks, SmolLM2 at 128 and 512 tokens), plus the logits' log-softmax.
    let b = w.batch_size;
    let per_layer = b * w.seqlen * (10 * a.hidden + 2 * a.kv_dim() + 6 * a.intermediate) * 4;
    let saved = a.layers * per_layer + b * w.seqlen * a.vocab * 4;
    // The backward frees the saved activations as it fills param.grad: the
    // pass peaks at its start (activations) or its end (gradients), and
    // the gradients are counted already.
    let activations = saved.saturating_sub(grads);
    let process = host(PROCESS_CPU);
    let workspaces = if on_gpu { GRADPROBE_CUDA_WORKSPACES } else { 0 };
    let base = |p: Phase| {
        p.add(rt_name, rt)
            .add("runtime (tokenizer, text, interpreter)", process)
            .add(
                "cuBLAS workspaces (forward and backward threads)",
                workspaces,
            )
            .add("weights", all)
            .add("saved values (original_state)", all)
    };
    // After the strategy's prune.remove replaced the pruned matrices.
    let after_select = |p: Phase| {
        p.add("runtime (checkpoint pages still mapped)", host(pruned * 4))
            .add(
                "runtime (glibc's retained heap)",
                host(GLIBC_RETAINED_GRAD_SETS * grads),
            )
    };
    let phases = vec![
        Phase::new("load", &[stages::GP_INITIAL, stages::GP_MODEL_LOADED])
            .add(rt_name, rt)
            .add("runtime (tokenizer, text, interpreter)", process)
            .add("weights", all),
        base(Phase::new(
            "original gradients",
            &[stages::GP_SAVED_TENTATIVE, stages::GP_ORIGINAL_GRADIENTS],
        ))
        .add("gradients (param.grad)", grads)
        .add("gradients (original set)", host(grads))
        .add("activations (beyond the gradients)", activations),
        after_select(base(Phase::new(
            "modified gradients",
            &[stages::GP_WEIGHTS_REDUCED, stages::GP_MODIFIED_GRADIENTS],
        )))
        .add("gradients (param.grad)", grads)
        .add("gradients (original set)", host(grads))
        .add("gradients (modified set)", host(grads))
        .add("masks (tentative)", host(pruned))
        .add("activations (beyond the gradients)", activations),
        after_select(base(Phase::new(
            "decide",
            &[stages::GP_MODIFIED_GRADIENTS, stages::GP_PRUNING_APPLIED],
        )))
        .add("gradients (param.grad)", grads)
        .add("gradients (original set)", host(grads))
        .add("gradients (modified set)", host(grads))
        .add("masks (tentative, final)", host(2 * pruned)),
    ];
    if on_gpu {
        phases.into_iter().map(with_reserve).collect()
    } else {
        phases
    }
}

/// prunemem's GradProbe (`prune::gradprobe`): layers streamed from the
/// checkpoint, one forward keeping the decoder-layer boundaries, one layer at
/// a time recomputed under autodiff for its backward, the loss and head done
/// by hand in vocabulary blocks. Candidate positions are u32 (4 bytes each),
/// original maxima f16 (2 bytes each); the original values are re-read from
/// the read-only checkpoint, never saved. The modified pass holds the f32
/// head, the boundaries, every candidate's position and original maximum,
/// and the larger of a layer (f32) and the head's vocabulary blocks; its end
/// holds the candidates' positions and the positions decided pruned (each
/// tensor's maxima are freed once it is decided). The process, the compute
/// workspace and the tokenizer are added by `prunemem::gradprobe_phases`.
/// Measured on SmolLM2-135M, seqlen 128, 2 batches, 10%, release,
/// 2026-11-26: the modified pass 230.3 predicted against 230.1 MiB, its
/// end 132.0 against 120.4; after the decided positions were made to
/// their length and the consumed maxima left out of the end (2026-11-26,
/// later): 111.7 against 112.9.
pub fn gradprobe_prunemem(a: &Arch, w: &Workload, notes: &mut Vec<String>) -> Vec<Phase> {
    notes.push(
        "prunemem GradProbe: f32 on the host; candidate positions u32, original gradient maxima f16".into(),
    );
    let b = w.batch_size;
    let tokens = b * w.seqlen;
    let probed = if w.include_embeddings {
        a.layers * a.layer_linear_params() + a.embedding_params() * if a.tied { 1 } else { 2 }
    } else {
        a.layers * a.layer_linear_params()
    };
    let tentative = (probed as f64 * w.sparsity) as u64;
    let head = a.embedding_params() * 4;
    let boundaries = (a.layers + 1) * w.num_batches.max(1) * tokens * a.hidden * 4;
    // Head blocks (`prune::gradprobe::head`): at most 4 Mi logits and 2 Mi
    // head weights a block; its logits three times (the product, its
    // exponentials, dlogits) and the hidden states' three buffers, and,
    // with the embeddings probed, the block's weight gradient and its
    // candidates' gather.
    let rows =
        crate::prune::gradprobe::block_rows(tokens as usize, a.hidden as usize, a.vocab as usize)
            as u64;
    let weight_grad = if w.include_embeddings {
        2 * rows * a.hidden * 4
    } else {
        0
    };
    let block = tokens * rows * 4 * 3 + tokens * a.hidden * 4 * 3 + weight_grad;
    // Embedding candidates' running max in f32 through the pass.
    let embed_max = if w.include_embeddings {
        (a.embedding_params() as f64 * w.sparsity) as u64 * 4
    } else {
        0
    };
    // The head's moment: its table beside the logit blocks, or, where a
    // layer is larger, beside the forward's last layer, freed and still
    // cached (SmolLM2, 2 × 128: −0.7% so, 2026-12-07).
    let layer = a.layer_params() * 4;
    let head_moment = [
        ("head weight (f32)", head),
        if block > layer {
            ("logit blocks", block)
        } else {
            ("runtime: the forward's last layer, freed and cached", layer)
        },
    ];
    let layer_moment = gradprobe_backward_layer(a, tokens, w.num_batches.max(1));
    let sum = |m: &[(&'static str, u64)]| m.iter().map(|(_, b)| b).sum::<u64>();
    let moment: &[(&'static str, u64)] = if sum(&head_moment) >= sum(&layer_moment) {
        &head_moment
    } else {
        &layer_moment
    };
    let pass = Phase::new(
        "modified pass",
        &[stages::GP_WEIGHTS_REDUCED, stages::GP_MODIFIED_GRADIENTS],
    );
    vec![
        moment
            .iter()
            .fold(pass, |p, (name, b)| p.add(name, *b))
            .add("boundary activations", boundaries)
            .add("candidate positions (u32)", tentative * 4)
            .add("original gradient peaks (f16)", tentative * 2)
            .add("embedding candidates' gradient peaks (f32)", embed_max),
        Phase::new(
            "end of the modified pass",
            &[stages::GP_MODIFIED_GRADIENTS, stages::GP_FINAL_MASKS],
        )
        .add("candidate positions (u32)", tentative * 4)
        .add("pruned positions (u32)", tentative * 4)
        .add("embedding candidates' gradient peaks (f32)", embed_max),
    ]
}

/// A layer's backward in prunemem's CPU GradProbe (`prune::gradprobe::phases`,
/// `backward_layer`), per batch of `tokens`: the layer in f32, all its weight
/// gradients alive at once, the widest one's contiguous copy read to the
/// host, the upstream gradients (one a batch, and the new one), and the
/// autodiff's saved forward and backward temporaries, three forwards' worth
/// (fitted on five untied shapes, 2026-12-07: 2.5–3.2 on 512- to 1024-wide
/// layers, 5.1 on a 4096-wide one, where the rest is 4% of the moment).
/// The pass's largest moment where a layer outweighs the head: on the
/// 4096-wide one (a Llama-2-7B layer, 2 × 128) the layer scopes rose by
/// 1.76 GiB, estimated at 1.16 GiB from the head's moment before.
fn gradprobe_backward_layer(a: &Arch, tokens: u64, batches: u64) -> [(&'static str, u64); 5] {
    let widest = a.hidden * a.intermediate.max(a.q_dim());
    [
        ("weights (one layer)", a.layer_params() * 4),
        ("weight gradients (one layer)", a.layer_linear_params() * 4),
        (
            "the widest weight gradient's copy read to the host",
            widest * 4,
        ),
        (
            "upstream gradients (each batch's, and the new one)",
            (batches + 1) * tokens * a.hidden * 4,
        ),
        (
            "autodiff: the layer's saved forward and backward temporaries",
            3 * tokens * (2 * a.hidden + 2 * a.intermediate) * 4,
        ),
    ]
}
