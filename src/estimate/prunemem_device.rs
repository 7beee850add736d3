//! Device memory of prunemem's own engine on a GPU (`--device wgpu|cuda`):
//! the bytes cubecl's pool holds, phase by phase, from the buffers the
//! engine puts on the device.
//!
//! cubecl's `bytes_in_use` is the sum of the live buffers' sizes, so every
//! term below is a tensor the engine holds, at the moment the profiler reads
//! the pool: after every linear's output exists beside its input, after each
//! statistic's update, after each pruned weight is uploaded beside the one it
//! replaces, and between passes (`exec::watch`). What the device holds for
//! the whole run:
//! - the calibration hidden states, `nsamples · seqlen · hidden` in the
//!   compute dtype (one batch with `--offload-activations`);
//! - the rotary tables: cos and sin `[seqlen, head_dim]`, the `head_dim²`
//!   rotation, and cos and sin expanded to q's and k's shapes for each batch
//!   shape (full batches and the last, shorter one);
//! - one decoder layer (all of them with `--resident`);
//! - the statistics in f32: one value per input column for Wanda, RIA and
//!   DSnoT (two more for DSnoT's moments), an `in × in` Hessian per linear
//!   input for SparseGPT.
//!
//! And the largest moment inside a pass, on top: the MLP's gate and up
//! projections beside the residual stream and the normed input,
//! `T · (2h + 2i)` values for `T` batch tokens; for SparseGPT, the widest
//! input's f32 copy and its `Xᵀ X` beside the running Hessian; at the
//! evaluation's head, the head's table, the normed batch and a logits
//! chunk in the compute dtype (each row's loss is a kernel over it: no f32
//! copy). The embedding table never goes up: each batch's rows are read on
//! the host (`model::vocab`; logs from before it, without the plan's
//! `embedding: rows`, held the table while the windows were embedded and
//! through the evaluation).
//!
//! What the pool *reserves* beyond these bytes — the pages a layer's
//! forward leaves in cubecl's persistent pool, the buffers the device
//! selection frees — is each phase's `reserved` (`device_pool`).
//!
//! GradProbe's passes are [`gradprobe`]'s; OWL's outlier pass is its own
//! phase (`owl_phase`). Not estimated here: the CUDA context, which lives
//! outside the pool (nvidia-smi counts it; the profiler's device figures do
//! not; the GPU table subtracts it from each card).

mod dsnot;
mod eval;
mod gradprobe;
mod moments;
use eval::{Inline, eval_phase, evaluation_forward, inline_eval};
pub use gradprobe::phases as gradprobe_phases;
use moments::{factor_step, kept_beside, prune_reserve, pruning_moment, statistics};

use super::device_pool::{self, Beside};
use super::{Arch, Device, Phase, Workload};
use crate::events::stages;
use crate::prune::Method;

/// The sizes every phase shares.
struct Sizes {
    c: u64,
    hidden: u64,
    inter: u64,
    seqlen: u64,
}

impl Sizes {
    fn of(a: &Arch, w: &Workload) -> Self {
        Self {
            c: w.dtype.size(),
            hidden: a.hidden,
            inter: a.intermediate,
            seqlen: w.seqlen,
        }
    }

    /// A layer's forward at its fullest, for `tokens` tokens: the residual
    /// stream's new copy, the normed input, gate and up.
    fn forward(&self, tokens: u64) -> u64 {
        tokens * (2 * self.hidden + 2 * self.inter) * self.c
    }

    /// Hidden states of `windows` windows.
    fn hidden_states(&self, windows: u64) -> u64 {
        windows * self.seqlen * self.hidden * self.c
    }
}

/// Rotary tables on the device: the `[seqlen, head_dim]` pair and the
/// rotation, and the pair expanded to q's and k's shapes for batches of
/// `batch` windows and for the last, shorter batch of `windows`.
fn rope(a: &Arch, w: &Workload, batch: u64, windows: u64) -> u64 {
    // On a device the expanded tables are always cached.
    rope_base(a, w) + super::prunemem::rope_tables(a, w, batch, windows)
}

/// The `[seqlen, head_dim]` cos and sin and the `head_dim²` rotation.
fn rope_base(a: &Arch, w: &Workload) -> u64 {
    (2 * w.seqlen * a.head_dim + a.head_dim * a.head_dim) * w.dtype.size()
}

/// What a CUDA estimate of the device pool leaves out, and what checked it.
fn cuda_note(w: &Workload, notes: &mut Vec<String>) {
    if w.device == Device::Cuda {
        notes.push(
            "device figures are cubecl's pool; the CUDA context lives outside it (nvidia-smi counts it, \
             the GPU table subtracts it); checked against the logs of H100 runs (docs/gpu.md: 1B and 8B shapes, \
             in use within 0.6%, reserved within 0.11%) and on lavapipe"
                .into(),
        );
    }
}

/// Which attention the pool model assumes, and what Burn's keeps: one
/// `[batch, heads, seq, seq]` page of scores per pass, which the flash
/// kernel (`PRUNEMEM_ATTENTION`, f16) does without.
fn attention_note(a: &Arch, w: &Workload, batch: u64, notes: &mut Vec<String>) {
    if !w.device.is_gpu() {
        return;
    }
    let scores = batch * a.heads * w.seqlen * w.seqlen * w.dtype.size();
    notes.push(
        match (
            w.fused_attention,
            w.dtype == crate::model::ComputeDtype::F16,
        ) {
            (true, _) => {
                "attention in cubek's flash kernel (PRUNEMEM_ATTENTION): no scores in the pool"
                    .into()
            }
            (false, true) => format!(
                "attention in Burn's separate kernels: a {} page of scores per batch in the pool; \
             PRUNEMEM_ATTENTION=unit (cubek's flash kernel, f16) keeps none",
                crate::units::format_bytes(scores)
            ),
            (false, false) => format!(
                "attention in Burn's separate kernels: a {} page of scores per batch in the pool \
             (the flash kernel takes f16 only)",
                crate::units::format_bytes(scores)
            ),
        },
    );
}

/// The load: a resident model uploaded, nothing for a streamed one.
fn load_phase(a: &Arch, w: &Workload, s: &Sizes) -> Phase {
    Phase::new("load", &[stages::START, stages::MODEL_LOADED]).add(
        "weights (resident)",
        if w.resident { a.params * s.c } else { 0 },
    )
}

/// The phases of a prunemem pruning run on a GPU device.
pub fn phases(a: &Arch, w: &Workload, m: Method, notes: &mut Vec<String>) -> Vec<Phase> {
    let s = Sizes::of(a, w);
    let calibrated = m != Method::Magnitude || w.owl || w.dsnot;
    let n = if calibrated { w.nsamples } else { 0 };
    let batch = w.batch_size.min(n.max(1));
    let tokens = batch * w.seqlen;
    let weights = match (w.resident, w.kept_on_device) {
        (true, _) => ("weights (resident)", a.params * s.c),
        // At the last layer: every layer before it kept, and it.
        (false, true) => (
            "weights (pruned layers kept, and one layer)",
            a.layers * a.layer_params() * s.c,
        ),
        (false, false) => ("weights (one layer)", a.layer_params() * s.c),
    };
    cuda_note(w, notes);
    attention_note(a, w, batch, notes);
    let mut out = vec![load_phase(a, w, &s)];
    if w.owl {
        out.push(owl_phase(a, w, &s));
    }
    let acts = s.hidden_states(n);
    if calibrated {
        out.push(
            super::calibration_phase(w)
                .add(
                    "weights (resident)",
                    if w.resident { a.params * s.c } else { 0 },
                )
                .add(
                    "embeddings",
                    if w.resident || w.embedding_rows {
                        0
                    } else {
                        a.embedding_params() * s.c
                    },
                )
                // Made once the windows are embedded, before the first
                // layer: the phase's peak when no table was held.
                .add(
                    "rotary tables",
                    if w.embedding_rows && !w.resident {
                        rope_base(a, w)
                    } else {
                        0
                    },
                )
                .add(
                    if w.offload_activations {
                        "calibration buffers (one batch; the rest on the host)"
                    } else {
                        "calibration buffers"
                    },
                    match w.offload_activations {
                        true => s.hidden_states(batch.min(n)),
                        false => acts,
                    },
                ),
        );
    }
    let inline = inline_eval(a, w, &s, n);
    out.push(prune_phase(a, w, m, &s, weights, tokens, n, inline));
    if w.eval_windows > 0 {
        out.push(eval_phase(
            a,
            w,
            &s,
            "eval",
            [stages::BEFORE_EVAL, stages::AFTER_EVAL],
            w.resident,
        ));
    }
    if w.eval_dense && w.eval_windows > 0 {
        let stages = [stages::BEFORE_DENSE_EVAL, stages::AFTER_DENSE_EVAL];
        out.insert(0, eval_phase(a, w, &s, "dense eval", stages, false));
    }
    out
}

/// OWL's outlier pass on the device (`prune::owl`): its own calibration
/// hidden states (kept on the device, offloaded or not), one layer (the
/// model when resident), the rotary tables and the layer's norms, and the
/// largest of a layer's forward, the norms' update and one linear's Wanda
/// metric beside its outlier flags. The pass gives the forward's pages
/// back before the metrics (`exec::release_free`); the metrics' pages are
/// two f32-wide buffers for every linear size the layer has (the metric
/// and its flags, or the flags and their integers: on wgpu a bool is 4
/// bytes, so all share one size; on CUDA the flags' 1-byte bools beside
/// them), since the pool keeps a freed buffer for its own size only.
fn owl_phase(a: &Arch, w: &Workload, s: &Sizes) -> Phase {
    let pass = Workload {
        dsnot: false,
        offload_activations: false,
        ..w.clone()
    };
    let n = w.nsamples;
    let batch = w.batch_size.min(n.max(1));
    let tokens = batch * w.seqlen;
    let weights = match w.resident {
        true => ("weights (resident)", a.params * s.c),
        false => ("weights (one layer)", a.layer_params() * s.c),
    };
    let acts = s.hidden_states(n);
    let tables = rope(a, w, batch, n);
    let (norms, update) = statistics(a, &pass, Method::Wanda, tokens, n.div_ceil(batch));
    let metric = a.largest_linear() * 8;
    let (t_name, t) = [
        ("activations", s.forward(tokens)),
        ("statistics update", update),
        ("OWL: f32 metric and its outlier flags", metric),
    ]
    .into_iter()
    .max_by_key(|(_, b)| *b)
    .unwrap_or(("activations", 0));
    let held = weights.1 + acts + tables + norms;
    let (h, q, kv, i) = (a.hidden, a.q_dim(), a.kv_dim(), a.intermediate);
    let mut sizes = vec![h * q, h * kv, h * i];
    sizes.sort_unstable();
    sizes.dedup();
    let per_weight = match w.device {
        Device::Cuda => 9,
        _ => 8,
    };
    let pages = sizes.iter().sum::<u64>() * per_weight;
    let reserved = (held + t)
        .max(held + pages)
        .max(held + device_pool::forward(a, &pass, batch, Beside::Norms));
    Phase::new("owl pass", &[stages::MODEL_LOADED, stages::OWL_RATIOS])
        .add(weights.0, weights.1)
        .add("calibration buffers (OWL's)", acts)
        .add("rotary tables", tables)
        .add("statistics", norms)
        .add(t_name, t)
        .reserving(reserved)
}

/// `prunemem eval` on a GPU device: the load (a resident model uploaded)
/// and the evaluation, as a pruning run's evaluation. With no window count
/// given, one batch.
pub fn inference_phases(a: &Arch, w: &Workload, notes: &mut Vec<String>) -> Vec<Phase> {
    let w = super::prunemem::inference_workload(w, notes);
    cuda_note(&w, notes);
    attention_note(a, &w, w.batch_size, notes);
    let s = Sizes::of(a, &w);
    vec![
        load_phase(a, &w, &s),
        eval_phase(
            a,
            &w,
            &s,
            "eval",
            [stages::BEFORE_EVAL, stages::AFTER_EVAL],
            w.resident,
        ),
    ]
}

/// The layer-by-layer pass: what stays for the run, one layer and its
/// statistics, and the largest of the forward, the statistics' update and a
/// pruned weight uploaded beside the one it replaces; with the evaluation
/// inside it, its hidden states too and its forward among the largest.
#[allow(clippy::too_many_arguments)]
fn prune_phase(
    a: &Arch,
    w: &Workload,
    m: Method,
    s: &Sizes,
    weights: (&str, u64),
    tokens: u64,
    n: u64,
    inline: Option<Inline>,
) -> Phase {
    let calibrated = n > 0;
    let batch = w.batch_size.min(n.max(1));
    let acts = match w.offload_activations {
        true => s.hidden_states(batch.min(n)),
        false => s.hidden_states(n),
    };
    // An offloaded batch is uploaded for the pass and held by nothing else,
    // so the residual stream is added into its buffer instead of a new one.
    let in_place = if w.offload_activations {
        tokens * s.hidden * s.c
    } else {
        0
    };
    let (stats, update) = if calibrated {
        let (stats, update) = statistics(a, w, m, tokens, n.div_ceil(batch));
        (stats, update - in_place)
    } else {
        (0, 0)
    };
    let forward = if calibrated {
        s.forward(tokens) - in_place
    } else {
        0
    };
    let moment = pruning_moment(a, w, m, s, calibrated, stats);
    let eval_forward = inline
        .as_ref()
        .map_or(0, |e| e.forward.saturating_sub(stats));
    let (t_name, t) = [
        ("activations", forward),
        ("statistics update", update),
        moment,
        ("activations (evaluation)", eval_forward),
    ]
    .into_iter()
    .max_by_key(|(_, b)| *b)
    .unwrap_or(("activations", 0));
    let rope = match (&inline, calibrated) {
        (Some(e), _) => e.rope,
        (None, true) => rope(a, w, batch, n),
        (None, false) => rope(a, w, 0, 0),
    };
    let eval_states = inline.as_ref().map_or(0, |e| e.hidden_states);
    let kept = kept_beside(a, w, m, calibrated);
    let held = weights.1 + acts + rope + stats + eval_states;
    let eval_pages = inline.as_ref().map_or(0, |e| held - stats + e.pages);
    let reserved = prune_reserve(a, w, m, n, held, t)
        .max(held + moment.1 + kept)
        .max(eval_pages);
    Phase::new("prune", &[stages::BEFORE_PRUNING, stages::AFTER_PRUNING])
        .add(weights.0, weights.1)
        .add(
            if w.offload_activations {
                "calibration buffers (one batch; the rest on the host)"
            } else {
                "calibration buffers"
            },
            acts,
        )
        // Built for every run; expanded per batch shape once windows run.
        .add("rotary tables", rope)
        .add("statistics", stats)
        .add("evaluation hidden states", eval_states)
        .add(t_name, t)
        .reserving(reserved)
}

#[cfg(test)]
mod tests;
