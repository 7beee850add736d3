//! Memory of prunemem's own engine on the CPU backend, phase by phase.
//!
//! Every term names buffers the engine holds (`prune::engine`, `eval`,
//! `model::checkpoint`) and was checked in isolation with the counting
//! allocator (heap bytes, exact):
//! - a decoder layer's forward peaks at `T·(2h + 3i)` f32 values for `T`
//!   batch tokens (the residual input and normed input, and three MLP-wide
//!   buffers); q/k/v widths do not matter;
//! - SparseGPT's statistics add three `h²` f32 accumulators during the
//!   forward, or peak while `Xᵀ X` of the MLP input is formed
//!   (`T·(h + 2.4·i)` values plus `i² + 3h²`);
//! - loading a layer holds its largest linear twice more (stored bytes and
//!   the transposed copy);
//! - pruning one linear on the host holds 13 bytes per weight for magnitude
//!   and Wanda (W, metric, u32 sort indices, bool mask), and for SparseGPT
//!   five `in²` f32 matrices (the statistic, its working copy, the reversed
//!   factor, its inverse and `Hinv`) plus 2.2 weight copies;
//! - these transients never coexist (each is freed before the next begins),
//!   so a phase holds its resident buffers plus the largest of them.
//!
//! Resident memory is then the live heap plus the process's own footprint:
//! prunemem maps every buffer of 4 MiB or more separately and returns it on
//! free (`memory::alloc`), so RSS follows the heap closely. The two constants
//! below are measured, see `docs/estimator.md`.

use super::{Arch, Component, Device, Phase, Workload};
use crate::events::stages;
use crate::model::ComputeDtype;
use crate::prune::Method;

mod eval;
mod gradprobe;
use eval::eval_phase;
use gradprobe::gradprobe_phases;

/// Resident bytes that are not heap: binary, libraries, thread stacks,
/// allocator metadata, the pages of small-allocation arenas. 10 MiB is a
/// release build's at its first stage (10.0 MiB on the grid's runs,
/// default features, 2026-11-27).
const RUNTIME_NON_HEAP: u64 = (10 << 20) + DEBUG_BUILD + DEVICE_BACKENDS_LINKED;
/// What a debug build (the profile `cargo test` builds, so CI's grid)
/// maps beyond a release build: its larger code. Measured on the 14 grid
/// cases, one build after the other on one machine, 2026-11-27: the same
/// heap to the byte; RSS minus heap 6.5-8.4 MiB higher at the first stage
/// and 8.0-10.2 MiB higher at the peaks (debug `--features wgpu,mpi`
/// against release, default features), of which [`WGPU_LINKED`] counts 4.5;
/// 3.5 MiB centres the debug grid (-2.2% to +1.2%). A binary just written
/// (by the linker or `cp`) maps a few MiB more of itself until its pages
/// leave the page cache; the tests measure it settled (`docs/estimator.md`,
/// 2026-12-07, later).
const DEBUG_BUILD: u64 = if cfg!(debug_assertions) { 7 << 19 } else { 0 };
/// What linking Burn's device backends adds to every run's resident set
/// before any device is opened: the binary's larger relocated data and its
/// libraries' pages. `wgpu`, measured on the grid's debug runs, 2026-11-24:
/// every case's peak rose by 3.0-6.0 MB with the feature
/// (magnitude-h1024-l6 from +1.2% to -3.1% of 104.1 MB). `cuda`: see
/// [`CUDA_LINKED`].
pub const DEVICE_BACKENDS_LINKED: u64 = WGPU_LINKED + CUDA_LINKED;
const WGPU_LINKED: u64 = if cfg!(feature = "wgpu") { 9 << 19 } else { 0 };
/// What linking Burn's CUDA backend (the `cuda` feature; cubecl-cuda loads
/// the driver only when a device is opened) adds to a CPU run's resident
/// set. Measured on release builds, one run after the other, 2026-11-25
/// (`RUNS="wanda train-cut" scripts/bench/release_estimates.sh`, default
/// features against `--features cuda`): the peaks rose by 1.5 MiB (Wanda,
/// 257.9 to 259.4) and 2.6 MiB (training on SmolLM2's 2-layer cut, 698.3
/// to 700.9); the other phases by 0.4-3.9 MiB.
pub const CUDA_LINKED: u64 = if cfg!(feature = "cuda") { 2 << 20 } else { 0 };
/// Heap added by durable logging and heap attribution: the category table
/// of `memory::tag` (576 KiB once its pages are touched) and the sinks'
/// buffers. The grid's peaks rose by 1.2-3.1 MB with those changes,
/// 2026-11-23; at the peaks of the grid's release runs, 2026-11-27, the
/// heap outside the engine's categories and the tokenizer was 0.9-1.0 MiB.
const OBSERVABILITY: u64 = 1 << 20;
/// Live heap before model work beside the tokenizer's own tables (counted
/// from the model's tokenizer, `super::tokenizer`): the tokenizer's word
/// cache (a BPE's 10 000-word table, 0.8 MB), profiler, sinks,
/// configuration. 2.15 MiB of heap at the grid's first stage, 0.77 of it
/// the tokenizer's counted tables (2026-11-27; it had been 2.5 MiB).
const HEAP_BASE: u64 = 3 << 19;
/// The compute threads' stacks and allocator arenas: RSS minus heap rises
/// from about 10 to about 16 MiB once the worker threads have run and stays
/// there (release builds: 10.0 to 15.4-17.2 MiB at the grid's peaks,
/// 2026-11-27), see `docs/estimator.md`.
const THREAD_WORKSPACE: u64 = 6 << 20;
/// Resident memory added once compute has run: [`THREAD_WORKSPACE`] and
/// the `gemm` crate's packing block in each pool thread, which the first
/// product allocates and keeps (`model::matmul::workspace_bytes`: 2 MiB on
/// the 1 MiB-L2 machine the constants were first fitted on, where it was a
/// constant; 4 MiB on a 2 MiB-L2 one, whose grid read 2 MiB under).
fn compute_workspace(w: &Workload) -> u64 {
    THREAD_WORKSPACE + w.matmul_workspace
}
/// The same for a run without calibration (magnitude): no matmul, only
/// the pruning threads' sorts. It was `THREAD_WORKSPACE` until the sorts
/// stopped leaving a vector per row in those threads' arenas (7122d62);
/// since, magnitude-h1024-l6's RSS minus heap rises by 2.9-3.4 MiB from
/// its start to its peak (four debug runs, 2026-11-26), and the case read
/// +1.4% to +2.4%.
const PRUNING_THREADS_WORKSPACE: u64 = 13 << 18;
/// What every phase of a run holds before any model work: the process's
/// non-heap footprint, its base heap and the observability it carries.
const RUNTIME: u64 = RUNTIME_NON_HEAP + HEAP_BASE + OBSERVABILITY;
/// Resident bytes per byte of text while it is read and tokenised: the
/// file, the selected lines, the tokenizer's per-word encodings and the id
/// vector (fitted on the grid's 1.2 MB text, see `docs/estimator.md`).
pub(super) const TEXT_FACTOR: u64 = 13;
/// Logits computed per evaluation chunk (`eval::chunk_rows`), f32 elements.
const LOGIT_CHUNK_ELEMS: u64 = 1 << 23;

/// The layer method a pruning task runs (`None`: not one of the engine's).
pub(super) fn method(w: &Workload) -> Option<Method> {
    match w.task {
        super::Task::Magnitude => Some(Method::Magnitude),
        super::Task::Wanda => Some(Method::Wanda),
        super::Task::Ria => Some(Method::Ria),
        super::Task::SparseGpt => Some(Method::SparseGpt),
        _ => None,
    }
}

/// One layer's forward for `tokens` tokens, f32 values touched at its peak:
/// the residual input and its normed copy, then the gate projection and the
/// up projection (silu and the product run in place). Matmul outputs are
/// zero-allocated and copied by burn-flex, but the zeroed pages are never
/// touched, so they cost heap and not RSS.
///
/// Wanda's column norms (`prune::stats`) square a captured input a 4 MiB
/// slab at a time, but never at this peak: the gate/up input is traced
/// with `T·2h` live and the down input with `T·(h + i)`, so a slab on top
/// stays under `T·(2h + 2i)`. (It had been added on top, 4 MiB over on
/// every Wanda, RIA, OWL and DSnoT-Wanda case; measured 2026-11-26.)
///
/// The `gemm` crate may pack a product's left operand (`m × kc` f32, kc ≤
/// 512) beside it, depending on its cache blocking: on the 1 MiB-L2 EPYC
/// the constants were fitted on, for outputs wider than 2 048 columns
/// (`2048 × 1024 · 1024 × n`: 4 MiB more from n = 2 176, 2026-11-26); on a
/// 2 MiB-L2 Xeon, for none of the grid's shapes (2026-11-27), nor on CI's
/// machine (its dsnot-magnitude-h1024-l2 read as far under that case's
/// estimate as the others). It is not counted: a 7B layer's would be about
/// 1% of its peak. So the forward is its f32 values, `T·(2h + 2i)`.
fn forward(a: &Arch, tokens: u64) -> u64 {
    tokens * (2 * a.hidden + 2 * a.intermediate) * 4
}

/// The forward with SparseGPT's Hessian accumulation: three `h²`
/// accumulators, and in one batch the scaled copy of the widest input
/// (`T·i`) that `Xᵀ X` is formed from; from a second batch on, the down
/// projection's `i²` Hessian instead, held through the forward. Measured on
/// sparsegpt-eval-h640-l3 (3 batches, 2026-11-27): the prune phase peaked
/// at the forward's values beside all four Hessians, 7.8 MiB under the
/// copy's term, which had been hidden while the evaluation held the
/// embedding table from its start and set the run's peak.
fn forward_with_hessians(a: &Arch, tokens: u64, batches: u64) -> u64 {
    let (h, i) = (a.hidden, a.intermediate);
    // Fitted without the up projection's packed operand (sparsegpt-h1024-l2
    // then 262.4 MiB against 262.1 measured; with it, +3.1%).
    let hessians = 3 * h * h * 4
        + if batches > 1 {
            i * i * 4
        } else {
            tokens * i * 4
        };
    let during = forward(a, tokens) + hessians;
    let at_mlp_input = tokens * (10 * h + 24 * i) * 4 / 10 + (i * i + 3 * h * h) * 4;
    during.max(at_mlp_input)
}

/// Cached full-shape rotary tables (`model::llama::Rope`): cos and sin for
/// each input shape seen, q's and k's (one shared when their widths agree),
/// for full batches of `batch` windows and for the last, shorter batch of
/// `windows` when there is one. The CPU's f32 forward rotates with the
/// fused kernel (`model::cpu_ops`) from `[seq, head_dim]` tables and caches
/// none.
pub(super) fn rope_tables(a: &Arch, w: &Workload, batch: u64, windows: u64) -> u64 {
    let rest = if batch > 0 { windows % batch } else { 0 };
    rope_table_rows(a, w, batch.min(windows) + rest)
}

/// The windows of every distinct batch shape a streamed prune's one set
/// of rotary tables sees when the evaluation runs inside it
/// (`model::inline_eval`): the calibration's batches of `nsamples` and the
/// evaluation's.
pub(super) fn inline_rope_rows(w: &Workload, nsamples: u64) -> u64 {
    let eval_batch = w.batch_size.min(w.eval_windows);
    let mut shapes = Vec::new();
    for (batch, total) in [
        (w.batch_size.min(nsamples), nsamples),
        (eval_batch, w.eval_windows),
    ] {
        if total > 0 && batch > 0 {
            shapes.extend([batch, total % batch].into_iter().filter(|b| *b > 0));
        }
    }
    shapes.sort_unstable();
    shapes.dedup();
    shapes.iter().sum()
}

/// Whether the evaluation runs inside the prune (`model::inline_eval`).
pub(super) fn evaluates_inline(w: &Workload) -> bool {
    w.eval_inline && !w.resident && w.eval_windows > 0
}

/// The expanded rotary tables for batch shapes of `rows` windows in all
/// (the sum of the distinct batch sizes that ran).
pub(super) fn rope_table_rows(a: &Arch, w: &Workload, rows: u64) -> u64 {
    if w.device == Device::Cpu && w.dtype == ComputeDtype::F32 {
        return 0;
    }
    let widths = if a.q_dim() == a.kv_dim() {
        a.q_dim()
    } else {
        a.q_dim() + a.kv_dim()
    };
    2 * rows * w.seqlen * widths * w.dtype.size()
}

/// Loading one layer: its largest linear as stored bytes and as the
/// transposed copy, on top of the layer.
fn load_transient(a: &Arch, w: &Workload) -> u64 {
    a.largest_linear() * (w.stored_bytes + w.dtype.size())
}

/// Pruning one linear with DSnoT (`prune::dsnot`): the weight, Wanda's
/// metric, the method's own metric (not for Wanda), the mask and the first
/// mask's copy. SparseGPT's saliency first holds, beside the weight and
/// Wanda's metric, five `in²` f32 matrices (the statistic, its working copy,
/// the reversed factor, its inverse and `Hinv`). (DSnoT's moments are
/// taken one window at a time while the statistics pass runs; on the grid
/// they did not raise its peak.)
fn dsnot_transient(a: &Arch, m: Method) -> u64 {
    let own = if m == Method::Wanda { 0 } else { 4 };
    let refine = a.largest_linear() * (4 + 4 + own + 2);
    if m == Method::SparseGpt {
        let widest_in = a.intermediate.max(a.q_dim()).max(a.hidden);
        refine.max(5 * widest_in * widest_in * 4 + a.largest_linear() * 8)
    } else {
        refine
    }
}

/// Pruning one linear on the host.
fn prune_transient(a: &Arch, m: Method) -> u64 {
    match m {
        // RIA: Wanda's metric plus its row and column sums, and (one
        // threshold per matrix) magnitude's sorted copy.
        Method::Magnitude | Method::Wanda | Method::Ria => a.largest_linear() * 13,
        // Estimated whole by `reference::gradprobe_prunemem`.
        Method::GradProbe => 0,
        Method::SparseGpt => {
            let widest_in = a.intermediate.max(a.q_dim()).max(a.hidden);
            5 * widest_in * widest_in * 4 + 22 * a.hidden * a.intermediate * 4 / 10
        }
    }
}

/// Text and its tokens while a text is tokenised (`model::tokenizer`):
/// the file, the selected lines, and the growing id vector.
fn text_transient(text_bytes: u64) -> u64 {
    text_bytes * TEXT_FACTOR
}

/// What every phase of a CPU pruning run shares.
struct Shape {
    /// Bytes per weight in the compute dtype.
    c: u64,
    runtime: u64,
    /// Whether the run keeps calibration activations (not plain magnitude).
    calibrated: bool,
    nsamples: u64,
    /// The calibration hidden states.
    calibration: u64,
    batch: u64,
    text: u64,
    /// The tokenizer's tables and its token strings
    /// (`super::tokenizer::resident`).
    tokenizer: (u64, u64),
}

const RUNTIME_NAME: &str = "runtime (process, base heap)";
const OWL_PASS: &str = "owl pass";
pub(super) const TOKENIZER_TABLES: &str = "tokenizer (vocabulary and merge tables)";
pub(super) const TOKENIZER_STRINGS: &str = "runtime: the tokenizer's token strings";

impl Shape {
    /// A run without calibration (an evaluation, GradProbe's passes) that
    /// tokenises `text` bytes' worth of transient at once.
    fn uncalibrated(a: &Arch, w: &Workload, text: u64, notes: &mut Vec<String>) -> Self {
        Shape {
            c: w.dtype.size(),
            runtime: RUNTIME,
            calibrated: false,
            nsamples: 0,
            calibration: 0,
            batch: w.batch_size.max(1),
            text,
            tokenizer: super::tokenizer::held_by_run(a, w, notes),
        }
    }

    /// What every phase holds: the process and the tokenizer.
    fn base(&self, p: Phase) -> Phase {
        p.add(RUNTIME_NAME, self.runtime)
            .add(TOKENIZER_TABLES, self.tokenizer.0)
            .add(TOKENIZER_STRINGS, self.tokenizer.1)
    }
}

/// From the model loaded (the text tokenised, a resident model decoded).
fn load_phase(a: &Arch, w: &Workload, sh: &Shape) -> Phase {
    let resident = if w.resident { a.params * sh.c } else { 0 };
    sh.base(Phase::new("load", &[stages::START, stages::MODEL_LOADED]))
        // After `--eval-dense`, compute has already run.
        .add(
            "compute workspace",
            if w.eval_dense && w.eval_windows > 0 {
                compute_workspace(w)
            } else {
                0
            },
        )
        .add("text and tokens", sh.text)
        .add("weights (resident)", resident)
        .add(
            "load transient",
            if w.resident { load_transient(a, w) } else { 0 },
        )
}

/// Streamed, each batch's rows are read from the checkpoint
/// (`model::vocab::embed_windows`) and the calibration buffers filled; the
/// table is never held (before `embedding_rows`, it was decoded whole
/// beside them). The last batch's rows are there twice while they are
/// converted (SmolLM2, 32 × 512 in f32: 45 MiB of activations at the
/// phase's peak for 36 MiB of buffers, 2026-11-29).
fn calibration_phase(a: &Arch, w: &Workload, sh: &Shape) -> Phase {
    sh.base(super::calibration_phase(w))
        .add(
            "weights (resident)",
            if w.resident { a.params * sh.c } else { 0 },
        )
        .add(
            "embeddings",
            if w.resident || w.embedding_rows {
                0
            } else {
                a.embedding_params() * sh.c
            },
        )
        .add("calibration buffers", sh.calibration)
        .add(
            "calibration batch's rows beside their copy",
            if w.resident || !w.embedding_rows {
                0
            } else {
                sh.batch * w.seqlen * a.hidden * sh.c
            },
        )
        .add("compute workspace", compute_workspace(w))
}

/// The layer loop, at the largest of its moments: a layer's load, its
/// forward (with the method's statistics), its pruning, or, with the
/// evaluation inside the prune, an evaluation batch through the pruned
/// layer (every window's hidden states held from the first layer on, each
/// batch's output replacing its input).
fn prune_phase(a: &Arch, w: &Workload, m: Method, sh: &Shape) -> Phase {
    let tokens = sh.batch * w.seqlen;
    let inline = evaluates_inline(w);
    let eval_tokens = w.batch_size.min(w.eval_windows) * w.seqlen;
    let eval_forward = match inline {
        true => forward(a, eval_tokens) - eval_tokens * a.hidden * sh.c,
        false => 0,
    };
    let (transient_name, transient) = [
        ("load transient", load_transient(a, w)),
        (
            "activations",
            match m {
                Method::Magnitude | Method::GradProbe if !sh.calibrated => 0,
                Method::SparseGpt => {
                    forward_with_hessians(a, tokens, sh.nsamples.div_ceil(sh.batch.max(1)))
                }
                _ => forward(a, tokens),
            },
        ),
        match (m, w.dsnot) {
            (_, true) => ("pruning transient", dsnot_transient(a, m)),
            // SparseGPT's sweep runs under the statistics tag.
            (Method::SparseGpt, false) => ("OBS sweep transient", prune_transient(a, m)),
            _ => ("pruning transient", prune_transient(a, m)),
        },
        ("evaluation forward", eval_forward),
    ]
    .into_iter()
    .max_by_key(|(_, b)| *b)
    .unwrap_or(("activations", 0));
    let (weights_name, weights) = if w.resident {
        ("weights (resident)", a.params * sh.c)
    } else {
        ("weights (one layer)", a.layer_params() * sh.c)
    };
    let (rotary, workspace) = match (sh.calibrated, inline) {
        (_, true) => (
            rope_table_rows(a, w, inline_rope_rows(w, sh.nsamples)),
            compute_workspace(w),
        ),
        (true, false) => (
            rope_tables(a, w, sh.batch, sh.nsamples),
            compute_workspace(w),
        ),
        (false, false) => (0, PRUNING_THREADS_WORKSPACE),
    };
    let eval_states = match inline {
        true => w.eval_windows * w.seqlen * a.hidden * sh.c,
        false => 0,
    };
    sh.base(Phase::new(
        "prune",
        &[stages::BEFORE_PRUNING, stages::AFTER_PRUNING],
    ))
    .add(weights_name, weights)
    .add("calibration buffers", sh.calibration)
    .add("evaluation hidden states", eval_states)
    .add("rotary tables", rotary)
    .add("compute workspace", workspace)
    .add(transient_name, transient)
}

/// The phases of a prunemem pruning run on the CPU backend.
pub fn phases(a: &Arch, w: &Workload, notes: &mut Vec<String>) -> Vec<Phase> {
    if w.task == super::Task::GradProbe {
        return gradprobe_phases(a, w, notes);
    }
    let Some(m) = method(w) else {
        return super::reference::phases(a, w, notes);
    };
    let c = w.dtype.size();
    let calibrated = m != Method::Magnitude || w.owl || w.dsnot;
    let n = if calibrated { w.nsamples } else { 0 };
    let sh = Shape {
        c,
        runtime: RUNTIME,
        calibrated,
        nsamples: n,
        calibration: n * w.seqlen * a.hidden * c,
        batch: w.batch_size.min(n.max(1)),
        text: text_transient(w.text_bytes),
        tokenizer: super::tokenizer::held_by_run(a, w, notes),
    };
    let mut out = vec![load_phase(a, w, &sh)];
    if w.owl {
        out.push(owl_phase(a, w, &sh));
    }
    if calibrated {
        out.push(calibration_phase(a, w, &sh));
    }
    out.push(prune_phase(a, w, m, &sh));
    let inline = evaluates_inline(w);
    if w.eval_windows > 0 && !inline {
        let stages = [stages::BEFORE_EVAL, stages::AFTER_EVAL];
        out.push(eval_phase(a, w, &sh, "eval", &stages, w.resident, 0));
    }
    if w.eval_dense && w.eval_windows > 0 {
        // `--eval-dense`: streamed from the checkpoint before the run's first
        // stage, with the evaluation text tokenised inside it.
        let stages = [stages::BEFORE_DENSE_EVAL, stages::AFTER_DENSE_EVAL];
        out.insert(
            0,
            eval_phase(a, w, &sh, "dense eval", &stages, false, sh.text),
        );
    }
    // OWL's pass ends with a trim (`prune::owl`): what it freed is not
    // cached into the phases after it.
    let after_owl = out.iter().position(|p| p.name == OWL_PASS).map(|i| i + 1);
    let rest = out.split_off(after_owl.unwrap_or(out.len()));
    let mut out = cache_up_to_high_water(out);
    out.extend(cache_up_to_high_water(rest));
    if w.eval_windows > 0 && inline {
        // It trims before its head: the layers' freed blocks are not cached
        // into it, and the heap's high-water mark bounds what it caches.
        let high = out.iter().map(heap).max().unwrap_or(0);
        let stages = [stages::BEFORE_EVAL, stages::AFTER_EVAL];
        out.push(eval::inline_eval_phase(a, w, &sh, &stages, high));
    }
    out
}

/// An evaluation's workload as prunemem's engines run it: with no window
/// count given, one batch (said in a note).
pub(super) fn inference_workload(w: &Workload, notes: &mut Vec<String>) -> Workload {
    let mut w = w.clone();
    if w.eval_windows == 0 {
        w.eval_windows = w.batch_size.max(1);
        notes.push(format!(
            "no window count given (--eval-windows): one batch of {} windows",
            w.eval_windows
        ));
    }
    w
}

/// `prunemem eval` on the CPU: the load (the text tokenised, a resident
/// model decoded) and the evaluation, streamed or resident — the phases a
/// pruning run's evaluation has, without calibration or pruning. With no
/// window count given, one batch.
pub fn inference_phases(a: &Arch, w: &Workload, notes: &mut Vec<String>) -> Vec<Phase> {
    let w = inference_workload(w, notes);
    let sh = Shape::uncalibrated(a, &w, text_transient(w.text_bytes), notes);
    let stages = [stages::BEFORE_EVAL, stages::AFTER_EVAL];
    cache_up_to_high_water(vec![
        load_phase(a, &w, &sh),
        eval_phase(a, &w, &sh, "eval", &stages, w.resident, 0),
    ])
}

/// The allocator's mapping cache (`memory::mapping`) keeps freed large
/// blocks resident while live + cached stays under the heap's high-water
/// mark, and a layer reallocates the same shapes over and over: so a phase
/// whose own heap peak lies below an earlier phase's is resident up to
/// that mark before its layer's trim. Measured on SmolLM2-135M Wanda
/// (release, 2026-11-24): the prune phase's heap peaked at 128 MiB per
/// layer, its resident set at 173-181 MiB, the calibration's 175 MiB.
fn cache_up_to_high_water(phases: Vec<Phase>) -> Vec<Phase> {
    let mut high: u64 = 0;
    phases
        .into_iter()
        .map(|p| {
            let heap = heap(&p);
            let cached = high.saturating_sub(heap);
            high = high.max(heap);
            p.add(
                "runtime: freed blocks the allocator caches up to the heap's high-water mark",
                cached,
            )
        })
        .collect()
}

/// A phase's heap: what it holds outside the runtime.
fn heap(p: &Phase) -> u64 {
    p.components
        .iter()
        .filter(|c| c.category != crate::memory::tag::Category::Runtime)
        .map(|c| c.bytes)
        .sum()
}

/// OWL's outlier pass (`prune::owl`): its own copy of the calibration
/// hidden states, one layer, and the larger of the layer's forward and the
/// Wanda metrics of its seven linears (held together to count outliers).
fn owl_phase(a: &Arch, w: &Workload, sh: &Shape) -> Phase {
    let c = w.dtype.size();
    let tokens = w.batch_size.min(w.nsamples.max(1)) * w.seqlen;
    let metrics = (a.layer_params() + a.largest_linear()) * 4;
    let (t_name, t) = [
        ("activations", forward(a, tokens)),
        ("statistics (layer metrics)", metrics),
        ("load transient", load_transient(a, w)),
    ]
    .into_iter()
    .max_by_key(|(_, b)| *b)
    .unwrap_or(("activations", 0));
    sh.base(Phase::new(
        OWL_PASS,
        &[stages::MODEL_LOADED, stages::OWL_RATIOS],
    ))
    .add(
        if w.resident {
            "weights (resident)"
        } else {
            "weights (one layer)"
        },
        if w.resident {
            a.params * c
        } else {
            a.layer_params() * c
        },
    )
    .add("calibration buffers", sh.calibration)
    .add(
        "rotary tables",
        rope_tables(a, w, w.batch_size.min(w.nsamples.max(1)), w.nsamples),
    )
    .add("compute workspace", compute_workspace(w))
    .add(t_name, t)
}

/// The components of a phase, largest first (for tables).
pub fn sorted(p: &Phase) -> Vec<Component> {
    let mut c = p.components.clone();
    c.sort_by_key(|c| std::cmp::Reverse(c.bytes));
    c
}
