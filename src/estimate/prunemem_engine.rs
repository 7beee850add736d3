//! Memory of prunemem's own engine, phase by phase.
//!
//! Every term names a buffer the engine holds (see `prune::engine`,
//! `eval`, `model::checkpoint`). Buffer sizes follow from the shapes; the
//! constants below cover what shapes alone do not tell — the process's own
//! footprint, how many activation-sized tensors are alive at once inside a
//! layer, and allocator slack — and were fitted on measured runs of the
//! engine on this CPU backend (see `CALIBRATION`).

use super::{Arch, Component, Device, Phase, Workload};
use crate::prune::Method;

/// The runs the constants were fitted on, and how well they fit.
pub const CALIBRATION: &str = "placeholder";

/// Process footprint before model work: binary, libraries, thread pools,
/// tokenizer, profiler.
const RUNTIME: u64 = 24 << 20;
/// Activation-sized f32 tensors alive inside one layer's forward, per token:
/// this many hidden-width rows...
const ACT_PER_HIDDEN: f64 = 12.0;
/// ...and this many intermediate-width rows.
const ACT_PER_INTER: f64 = 4.0;
/// Logits materialised per evaluation chunk (elements; see `eval::chunk_rows`)
/// times the copies alive while the chunk is reduced.
const LOGIT_CHUNK_ELEMS: u64 = 1 << 23;
const LOGIT_CHUNK_COPIES: u64 = 2;
/// Live heap to resident bytes (allocator slack, retained free blocks).
const SLACK: f64 = 1.0;

fn method(w: &Workload) -> Option<Method> {
    match w.task {
        super::Task::Magnitude => Some(Method::Magnitude),
        super::Task::Wanda => Some(Method::Wanda),
        super::Task::SparseGpt => Some(Method::SparseGpt),
        _ => None,
    }
}

/// Activations of one batch through one layer.
fn activations(a: &Arch, w: &Workload) -> u64 {
    let tokens = (w.batch_size.min(w.nsamples.max(1)) * w.seqlen) as f64;
    (tokens * (ACT_PER_HIDDEN * a.hidden as f64 + ACT_PER_INTER * a.intermediate as f64) * 4.0)
        as u64
}

/// Cached full-shape rotary tables for q and k (`model::llama::Rope`).
fn rope_tables(a: &Arch, w: &Workload, batch: u64) -> u64 {
    2 * batch * w.seqlen * (a.q_dim() + a.kv_dim()) * w.dtype.size()
}

/// Transient while one linear is pruned on the host.
fn prune_transient(a: &Arch, m: Method) -> u64 {
    let big = a.largest_linear();
    let widest_in = a.intermediate.max(a.hidden);
    match m {
        // |W| metric, the selection copy, the mask, W itself.
        Method::Magnitude => big * (4 + 4 + 1 + 4),
        // W, metric, per-row sorted indices, mask, the weight set back.
        Method::Wanda => big * (4 + 4 + 4 + 1 + 4),
        // W, its update, and H, its reversed factor, the inverse and Hinv.
        Method::SparseGpt => big * 8 + 4 * widest_in * widest_in * 4,
    }
}

/// Per-layer statistics (`prune::stats`): four inputs per layer.
fn statistics(a: &Arch, m: Method) -> u64 {
    let (h, q, i) = (a.hidden, a.q_dim(), a.intermediate);
    match m {
        Method::Magnitude => 0,
        Method::Wanda => (2 * h + q + i) * 4,
        Method::SparseGpt => (2 * h * h + q * q + i * i) * 4,
    }
}

fn with_slack(p: Phase) -> Phase {
    if SLACK == 1.0 {
        return p;
    }
    let extra = ((SLACK - 1.0) * p.total() as f64) as u64;
    p.add("allocator slack", extra)
}

/// The phases of a prunemem pruning run.
pub fn phases(a: &Arch, w: &Workload, notes: &mut Vec<String>) -> Vec<Phase> {
    let Some(m) = method(w) else {
        notes.push("prunemem's engine runs magnitude, Wanda, SparseGPT and GradProbe; estimated as the reference".into());
        return super::reference::phases(a, w, notes);
    };
    if w.task == super::Task::GradProbe {
        return super::reference::gradprobe_prunemem(a, w, notes);
    }
    let c = w.dtype.size();
    let runtime = if w.device == Device::Cuda { 0 } else { RUNTIME };
    let weights_all = a.params * c;
    let layer = a.layer_params() * c;
    let embed = a.embedding_params() * c;
    let calib_n = if m == Method::Magnitude {
        0
    } else {
        w.nsamples
    };
    let calibration = calib_n * w.seqlen * a.hidden * c;
    let batch = w.batch_size.min(calib_n.max(1));
    let resident = if w.resident { weights_all } else { 0 };
    // Loading a layer: the stored bytes of one tensor, the converted copy and
    // the transposed copy (burn-store's adapter), next to the layer so far.
    let load_transient = a.largest_linear() * (w.stored_bytes + 2 * c);
    if w.device == Device::Cuda {
        notes.push("prunemem on CUDA is estimated with the CPU engine's buffers on the device; no GPU run has validated it".into());
    }

    let mut out = Vec::new();
    out.push(with_slack(
        Phase::new("load", &["01_start", "02_model_loaded"])
            .add("runtime", runtime)
            .add("weights (resident)", resident)
            .add(
                "load transient",
                if w.resident { load_transient } else { 0 },
            ),
    ));
    if m != Method::Magnitude {
        out.push(with_slack(
            Phase::new("calibration", &["02_model_loaded", "03_before_pruning"])
                .add("runtime", runtime)
                .add("weights (resident)", resident)
                .add("embeddings", if w.resident { 0 } else { embed })
                .add("calibration buffers", calibration)
                .add("activations", batch * w.seqlen * a.hidden * 4),
        ));
    }
    let prune_act = if m == Method::Magnitude {
        0
    } else {
        activations(a, w)
    };
    out.push(with_slack(
        Phase::new("prune", &["03_before_pruning", "04_after_pruning"])
            .add("runtime", runtime)
            .add("weights (resident)", resident)
            .add(
                "weights (one layer)",
                if w.resident {
                    0
                } else {
                    layer + load_transient
                },
            )
            .add("calibration buffers", calibration)
            .add(
                "rotary tables",
                if m == Method::Magnitude {
                    0
                } else {
                    rope_tables(a, w, batch)
                },
            )
            .add("activations", prune_act)
            .add("statistics", statistics(a, m))
            .add("pruning transient", prune_transient(a, m)),
    ));
    if w.eval_windows > 0 {
        let eval_batch = w.batch_size.min(w.eval_windows);
        let hidden_states = if w.resident {
            0
        } else {
            w.eval_windows * w.seqlen * a.hidden * c
        };
        let head = if a.tied { 0 } else { embed };
        let logits = (LOGIT_CHUNK_ELEMS.min(w.seqlen * a.vocab)) * 4 * LOGIT_CHUNK_COPIES;
        let eval_act = (eval_batch * w.seqlen) as f64
            * (ACT_PER_HIDDEN * a.hidden as f64 + ACT_PER_INTER * a.intermediate as f64)
            * 4.0;
        out.push(with_slack(
            Phase::new("eval", &["05_before_eval", "06_after_eval"])
                .add("runtime", runtime)
                .add("weights (resident)", resident)
                .add(
                    "embeddings and head",
                    if w.resident { 0 } else { embed + head },
                )
                .add(
                    "weights (one layer)",
                    if w.resident {
                        0
                    } else {
                        layer + load_transient
                    },
                )
                .add("hidden states", hidden_states)
                .add("rotary tables", rope_tables(a, w, eval_batch))
                .add("activations", eval_act as u64)
                .add("logits chunk", logits),
        ));
    }
    out
}

/// The components of a phase, largest first (for tables).
pub fn sorted(p: &Phase) -> Vec<Component> {
    let mut c = p.components.clone();
    c.sort_by(|a, b| b.bytes.cmp(&a.bytes));
    c
}
