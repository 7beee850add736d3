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
use dsnot::{dsnot_loop, saliency_moment};
use eval::{Inline, eval_phase, evaluation_forward, inline_eval};
pub use gradprobe::phases as gradprobe_phases;

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

/// The f32 statistics of one layer, and the largest moment of their update
/// beyond the forward's own (SparseGPT: the widest input's f32 copy and,
/// from the second of `batches` on, its `Xᵀ X` beside the Hessian: the
/// first batch's product becomes the Hessian).
fn statistics(a: &Arch, w: &Workload, m: Method, tokens: u64, batches: u64) -> (u64, u64) {
    let (h, q, i) = (a.hidden, a.q_dim(), a.intermediate);
    let columns = 2 * h + q + i;
    let norms = match m {
        Method::Wanda | Method::Ria => columns * 4,
        _ if w.dsnot => columns * 4,
        _ => 0,
    };
    let moments = if w.dsnot { 2 * columns * 4 } else { 0 };
    // The widest input's f32 copy: none in f32, none where the norms'
    // kernel reads the input as it is and nothing else needs the copy.
    let kernel_only = w.norms_kernel && !w.dsnot && m != Method::SparseGpt;
    let cast = if w.dtype.size() == 4 || kernel_only {
        0
    } else {
        tokens * i * 4
    };
    match m {
        Method::SparseGpt => {
            let hessians = hessians(a);
            // At the down projection's input: the residual stream, the
            // input, its f32 copy and the new product.
            let product = if batches > 1 { i * i * 4 } else { 0 };
            let update = tokens * (h + i) * w.dtype.size() + cast + product;
            (hessians + norms + moments, update)
        }
        _ => (norms + moments, tokens * (h + i) * w.dtype.size() + cast),
    }
}

/// Every input's Hessian of a layer (f32): q/k/v's, o's, gate/up's, down's.
fn hessians(a: &Arch) -> u64 {
    let (h, q, i) = (a.hidden, a.q_dim(), a.intermediate);
    (2 * h * h + q * q + i * i) * 4
}

/// The device factorisation of an `n`-input Hessian at its widest
/// (`prune::factor_device`, step 1): in use, the Hessian beside an `n × n`
/// product, a block column (`n × 128`) and its diagonal block; and what
/// the pool keeps freed beside them for the next block (the block
/// column's panel, the diagonal block's copy, a row mask).
fn factor_step(n: u64) -> (u64, u64) {
    let b = n.min(128);
    (
        2 * n * n * 4 + n * b * 4 + b * b * 4,
        n * b * 4 + b * b * 4 + n * 4,
    )
}

/// SparseGPT on the device at its widest, in use and reserved: for each
/// linear input in turn, the Hessians not yet finished, then the larger of
/// - its factorisation (`prune::factor_device`): the Hessian beside an `in
///   × in` product (the block's update), a block column (`in × 128`) and
///   its diagonal block; the pool keeps the block column's panel, the
///   diagonal block's copy and a row mask freed beside them, for the next
///   block (before the plan's `factor: device`, the host factored it);
/// - its sweep (`prune::sparsegpt_device`): `Hinv`, the f32 working copy
///   of its widest linear beside the lazy update's product of the same
///   size, the block's rows of `Hinv` (128 × inputs) and its errors (128 ×
///   outputs).
fn sparsegpt_moment(a: &Arch, w: &Workload) -> (u64, u64) {
    let (h, q, i) = (a.hidden, a.q_dim(), a.intermediate);
    // (inputs, widest output) of q/k/v, o, gate/up, down, in sweep order.
    let inputs = [(h, q), (q, h), (h, i), (i, h)];
    let each = |k: usize| {
        let remaining: u64 = inputs[k + 1..].iter().map(|(n, _)| n * n * 4).sum();
        let (n, o) = inputs[k];
        // Logs without the plan's `factor: device` factored on the host.
        let (factor, freed) = match w.factor_on_device {
            true => factor_step(n),
            false => (0, 0),
        };
        let sweep = n * n * 4 + 2 * n * o * 4 + 128 * (n + o) * 4;
        (
            remaining + factor.max(sweep),
            remaining + (factor + freed).max(sweep),
        )
    };
    let all: Vec<(u64, u64)> = (0..inputs.len()).map(each).collect();
    (
        all.iter().map(|m| m.0).max().unwrap_or(0),
        all.iter().map(|m| m.1).max().unwrap_or(0),
    )
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
    // The mask is chosen on the device (`prune::on_device`) for magnitude,
    // Wanda and RIA: at its widest, the largest linear's f32 metric (the
    // selection kernels take it as keys in its own buffer and hand back a
    // mask as the keys go); otherwise the host's pruned weight goes up
    // beside the one it replaces.
    let moment = match (m, w.dsnot) {
        // Wanda's α-variant (`prune::variant_device`): the f32 metric
        // beside its sorted tables.
        (Method::Wanda, false) if w.use_variant => (
            "selection: f32 metric and its sorted tables (α-variant)",
            variant_tables(a),
        ),
        (Method::Magnitude | Method::Wanda | Method::Ria, false) => {
            ("selection: f32 metric (mask)", a.largest_linear() * 4)
        }
        (Method::SparseGpt, false) if calibrated => (
            "SparseGPT: factorisation or sweep (statistics)",
            sparsegpt_moment(a, w).0.saturating_sub(stats),
        ),
        (Method::SparseGpt, true) if calibrated && w.saliency_on_device => (
            "DSnoT: SparseGPT's factorisation or swap loop (statistics)",
            saliency_moment(a, w).0.saturating_sub(hessians(a)),
        ),
        (Method::SparseGpt, true) => ("pruned weight (upload)", a.largest_linear() * s.c),
        _ => ("DSnoT: swap loop (orders and masks)", dsnot_loop(a, w).0),
    };
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
    // What the pool keeps freed beside SparseGPT's factorisation.
    let kept = match (m, w.dsnot) {
        (Method::SparseGpt, false) if calibrated => {
            let (in_use, reserved) = sparsegpt_moment(a, w);
            reserved - in_use
        }
        (Method::SparseGpt, true) if calibrated && w.saliency_on_device => {
            let (in_use, reserved) = saliency_moment(a, w);
            reserved - in_use
        }
        (Method::SparseGpt, true) => 0,
        (_, true) => {
            let (in_use, reserved) = dsnot_loop(a, w);
            reserved - in_use
        }
        _ => 0,
    };
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

/// Wanda's α-variant at its widest, on the largest of the linears: the
/// f32 metric, each output's running sums (4 bytes a weight each) and
/// its sorted keys, each output's inputs padded to a power of two
/// (`exec::kernels::variant`). Measured on lavapipe: see `variant_bus`.
fn variant_tables(a: &Arch) -> u64 {
    let (h, i) = (a.hidden, a.intermediate);
    let one = |out: u64, inp: u64| out * (8 * inp + 4 * inp.next_power_of_two());
    // gate and up, down, the attention's square projections.
    one(i, h)
        .max(one(h, i))
        .max(one(a.q_dim(), h))
        .max(one(h, a.q_dim()))
}

/// What the pool keeps freed beside RIA's reallocation on the device
/// (`prune::reallocation_device`), past direct N:M's: with `--lsa` the
/// widest input's assignment scores (`(in / m)²` f32). The report's kept
/// metric is one kernel's per-output sums (`Compute::nm_kept_sums`), where
/// Burn's ops on slices of the metric kept a byte a weight more and held
/// half a byte a weight more in use. Its widest moment otherwise, the f32
/// metric beside its permutation, is no wider than RIA's metric itself.
fn reallocation_kept(a: &Arch, w: &Workload) -> u64 {
    if !w.reallocation || !w.lsa {
        return 0;
    }
    (a.hidden.max(a.intermediate) / w.group.max(1)).pow(2) * 4
}

/// What the pool reserves in the prune phase: at the statistics pass, what
/// the phase holds outside it (`held`) and the pages of a layer's forward
/// (`device_pool`); at the device selection, once the largest linear's
/// pruned weight has replaced it, what is held, that weight and, freed but
/// kept, the selection's f32 keys and its mask (on wgpu a 4-byte bool
/// written over the kernel's i32 flags; on CUDA a 1-byte bool beside
/// them; with RIA's reallocation, the pages it keeps past those; with
/// Wanda's α-variant, its tables and the pruned weight); otherwise
/// the phase's bytes in use (`held` and `moment`).
fn prune_reserve(a: &Arch, w: &Workload, m: Method, n: u64, held: u64, moment: u64) -> u64 {
    let selects = matches!(m, Method::Magnitude | Method::Wanda | Method::Ria) && !w.dsnot;
    let per_weight = match (selects, w.device) {
        (false, _) => 0,
        (true, Device::Cuda) => w.dtype.size() + 4 + 4 + 1,
        (true, _) => w.dtype.size() + 4 + 4,
    };
    let selection = match (selects, m == Method::Wanda && w.use_variant) {
        // The α-variant's tables freed, kept, and the pruned weight in a
        // page of its own beside them.
        (true, true) => variant_tables(a) + a.largest_linear() * w.dtype.size(),
        (true, false) => a.largest_linear() * per_weight + reallocation_kept(a, w),
        (false, _) => 0,
    };
    let outside = (held + moment).max(held + selection);
    if n == 0 {
        return outside;
    }
    let batch = w.batch_size.min(n);
    let beside = match m {
        Method::SparseGpt => Beside::Hessians {
            batches: n.div_ceil(batch),
        },
        _ if m != Method::Magnitude || w.dsnot => Beside::Norms,
        _ => Beside::Nothing,
    };
    outside.max(held + device_pool::forward(a, w, batch, beside))
}

#[cfg(test)]
mod tests;
