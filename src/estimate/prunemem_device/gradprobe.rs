//! GradProbe's device pool (`prune::gradprobe` on `--device wgpu|cuda`):
//! what its two gradient passes hold and reserve, and its evaluation.
//!
//! A pass keeps every decoder-layer boundary of every batch (`x_0 … x_L`,
//! f32), and at its two largest moments holds, beside them:
//! - **the head** (`prune::gradprobe::head`): the head's table in f32, each
//!   batch's normed input, `dL/dh` and its new term, and one block of
//!   logits (`T × rows`, the loss and its gradient written over it);
//! - **a layer's backward** (the last layer first, when most boundaries are
//!   still held): the layer in f32 and its seven weight gradients, each
//!   batch's upstream gradient, and per linear the candidates' indices and
//!   running maxima (`on_device::Maxima`).
//!
//! The engine gives the pool's free buffers back between layers and after
//! each original-pass selection (`Pass::trim`), so what a pass reserves is
//! what it holds plus one layer's pages: those of its backward, or of the
//! head's blocks. They were counted from cubecl's memory log (`[memory.logger]
//! level = "basic"`) on lavapipe for the 256-wide fixture and SmolLM2-135M
//! (2 batches of 32 and of 128 tokens), where they agree to 0.7% and 0.01%:
//! per weight shape its weights, their gradients and one more; per
//! candidate count its indices and maxima and two more; nine more
//! `T × hidden` pages, six `T × intermediate`, four `T × kv` and four of
//! attention scores, the causal mask and five `T × heads`. The head's
//! pages are its full block and the last, shorter one; with the
//! embeddings probed, also each block's head-weight gradient and its
//! gather at the candidates (one length for the full blocks, one for the
//! last), counted the same way on SmolLM2 (−0.1% reserved).
//!
//! The moments' parts carry the categories the run measures them in
//! (`memory::held`): the layer and the table as weights, the boundaries
//! as activations, the candidates' maxima as statistics, the upstream
//! gradients as gradients, and the head's working set as logits.
//!
//! GradProbe computes in f32 whatever dtype the run names; its evaluation
//! is the device evaluation's (`eval_phase`), in f32. Evaluated as step 6
//! zeroes each layer (`jobs::gradprobe`), step 6 is a phase of its own
//! ([`step6`]) and the evaluation's phase is the head alone.

use super::super::device_pool::CUDA_CONTEXT;
use super::{Sizes, eval_phase, evaluation_forward, rope};
use crate::estimate::{Arch, Device, Phase, Workload};
use crate::events::stages;
use crate::model::ComputeDtype;
use crate::prune::gradprobe::block_rows;
use crate::prune::gradprobe::select::candidate_count;

/// The sizes a pass's moments share, in bytes.
struct Probe {
    /// One batch's `T × hidden` f32 activations.
    a: u64,
    /// Batches per pass.
    nb: u64,
    /// Tokens per batch.
    t: u64,
    /// The layer in f32, and its linears alone.
    layer: u64,
    linears: u64,
    /// The head's table in f32.
    table: u64,
    /// Rotary tables for the passes' batch shape.
    rope: u64,
}

/// The seven linears' `(inputs, outputs)`, in `LAYER_LINEARS` order.
fn shapes(a: &Arch) -> [(u64, u64); 7] {
    let (h, q, kv, i) = (a.hidden, a.q_dim(), a.kv_dim(), a.intermediate);
    [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]
}

/// The distinct sizes among `sizes` (equal sizes share the pool's pages).
fn distinct(sizes: impl Iterator<Item = u64>) -> Vec<u64> {
    let mut out: Vec<u64> = sizes.filter(|b| *b > 0).collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Each linear's candidates' bytes: an i32 index and an f32 maximum each.
fn candidates(a: &Arch, w: &Workload) -> Vec<u64> {
    shapes(a)
        .iter()
        .map(|(i, o)| candidate_count(w.sparsity, (i * o) as usize) as u64 * 4)
        .collect()
}

/// The head's logits block (`prune::gradprobe::block_rows`): rows per
/// block and the last block's rows.
fn head_rows(a: &Arch, t: u64) -> (u64, u64) {
    let rows = block_rows(t as usize, a.hidden as usize, a.vocab as usize) as u64;
    (rows, a.vocab % rows)
}

impl Probe {
    fn of(a: &Arch, w: &Workload) -> Self {
        let t = w.batch_size.max(1) * w.seqlen;
        let nb = w.num_batches.max(1);
        Self {
            a: t * a.hidden * 4,
            nb,
            t,
            layer: a.layer_params() * 4,
            linears: a.layer_linear_params() * 4,
            table: a.embedding_params() * 4,
            rope: rope(a, w, w.batch_size.max(1), nb * w.batch_size.max(1)),
        }
    }

    /// The head's moment, in its last batch: every boundary but the
    /// earlier batches' last ones, which their gradients have replaced, and
    /// the table; then the head's working set, tagged logits: the batch's
    /// normed input, `dL/dh` and a block's product with the head beside a
    /// logits block, or, with the embeddings probed, the first two beside
    /// the block's head weight gradient and its candidates' indices
    /// (gathered at the widest block's count), whichever is larger.
    fn head(&self, a: &Arch, w: &Workload) -> Moment {
        let (rows, last) = head_rows(a, self.t);
        let block = self.t * rows * 4;
        let mut parts = vec![
            ("head weight (f32)", self.table),
            (
                "boundary activations",
                ((a.layers + 1) * self.nb - 1) * self.a,
            ),
            (
                "upstream gradients (earlier batches)",
                (self.nb - 1) * self.a,
            ),
        ];
        let product = vec![
            ("logits work: normed batch, dL/dh and its term", 3 * self.a),
            ("logits block", block),
        ];
        // Pages: the last, shorter block's, and with the embeddings probed
        // both blocks' weight gradients and their gathers' indices and
        // values (one length for the full blocks, one for the last).
        let mut reserved = 3 * self.a + block + self.t * last * 4;
        let work = match w.include_embeddings {
            false => product,
            true => {
                let dw = rows * a.hidden * 4;
                let at =
                    |rows: u64| candidate_count(w.sparsity, (rows * a.hidden) as usize) as u64 * 4;
                let (at, at_last) = (at(rows), at(last));
                reserved += dw + last * a.hidden * 4 + 2 * (at + at_last);
                let gather = vec![
                    ("logits work: normed batch and dL/dh", 2 * self.a),
                    ("logits block's head weight gradient", dw),
                    ("logits block's candidate indices", at),
                ];
                let sum = |p: &[(&str, u64)]| p.iter().map(|(_, b)| b).sum::<u64>();
                if sum(&gather) >= sum(&product) {
                    gather
                } else {
                    product
                }
            }
        };
        let held: u64 = work.iter().map(|(_, b)| b).sum();
        parts.extend(work);
        Moment::new(parts, reserved - held)
    }

    /// The first layer's backward: the boundaries below it, its inputs and
    /// gradients, the layer and its weight gradients, the candidates' state.
    fn backward(&self, a: &Arch, w: &Workload) -> Moment {
        let cands = candidates(a, w);
        let parts = vec![
            ("weights (one layer, f32)", self.layer),
            ("boundary activations", a.layers * self.nb * self.a),
            ("rotary tables", self.rope),
            ("weight gradients", self.linears),
            ("upstream gradients", (self.nb + 1) * self.a),
            (
                "candidates' indices and maxima",
                2 * cands.iter().sum::<u64>(),
            ),
        ];
        let weights = distinct(shapes(a).iter().map(|(i, o)| i * o * 4));
        let cand_sizes = distinct(cands.into_iter());
        let t = self.t;
        let scores = w.batch_size.max(1) * a.heads * w.seqlen * w.seqlen * 4;
        let pages = weights.iter().sum::<u64>()
            + 2 * cand_sizes.iter().sum::<u64>()
            + 9 * self.a
            + 6 * t * a.intermediate * 4
            + 4 * t * a.kv_dim() * 4
            + 4 * scores
            + w.seqlen * w.seqlen * 4
            + 5 * t * a.heads * 4;
        Moment::new(parts, pages)
    }
}

/// One of a pass's largest moments: what it holds, and the pages its pool
/// keeps beside them.
struct Moment {
    parts: Vec<(&'static str, u64)>,
    pages: u64,
}

impl Moment {
    fn new(parts: Vec<(&'static str, u64)>, pages: u64) -> Self {
        Self { parts, pages }
    }

    fn total(&self) -> u64 {
        self.parts.iter().map(|(_, b)| b).sum()
    }
}

/// GradProbe's phases on a GPU device: its two passes, step 6 where the
/// evaluation runs inside it, and the evaluation.
pub fn phases(a: &Arch, w: &Workload, notes: &mut Vec<String>) -> Vec<Phase> {
    let mut w = w.clone();
    w.dtype = ComputeDtype::F32;
    let w = &w;
    let p = Probe::of(a, w);
    // Kept on the device between the passes (`gradprobe_layers: device`):
    // every layer and the head's table, and in the modified pass the
    // layer's reduced linears beside the kept ones.
    let resident = w.probe_layers_on_device;
    let kept = if resident {
        (a.layers - 1) * p.layer
    } else {
        0
    };
    // At the head every kept layer is held; at a backward, all but the
    // one the moment counts.
    let mut head = p.head(a, w);
    head.parts.push((
        "weights (the last probed layer kept)",
        match resident {
            true => p.layer,
            false => 0,
        },
    ));
    let table = match resident && !w.include_embeddings {
        true => p.table,
        false => 0,
    };
    let pass = |name: &str, stages: [&str; 2], reduced: u64| {
        let mut back = p.backward(a, w);
        back.parts.push(("head weight (f32, kept)", table));
        back.parts.push(("weights (reduced linears)", reduced));
        let m = if head.total() >= back.total() {
            &head
        } else {
            &back
        };
        // The pool's highest is either moment's, whichever holds more.
        let reserved = (head.total() + head.pages).max(back.total() + back.pages);
        let phase = Phase::new(name, &stages).add("weights (probed layers kept)", kept);
        m.parts
            .iter()
            .fold(phase, |ph, (n, b)| ph.add(n, *b))
            .reserving(kept + reserved)
    };
    if w.device == Device::Cuda {
        notes.push(format!(
            "GradProbe on the device: f32, its pool from the fixture's and SmolLM2's on lavapipe; \
             the CUDA context ({}) lives outside it",
            crate::units::format_bytes(CUDA_CONTEXT)
        ));
    }
    let reduced = if resident { p.linears } else { 0 };
    let mut out = vec![
        pass(
            "original pass",
            [stages::GP_SAVED_TENTATIVE, stages::GP_ORIGINAL_GRADIENTS],
            0,
        ),
        pass(
            "modified pass",
            [stages::GP_WEIGHTS_REDUCED, stages::GP_MODIFIED_GRADIENTS],
            reduced,
        ),
    ];
    // The evaluation's workload: GradProbe's batches (`iterate::EVAL`).
    let mut e = w.clone();
    e.batch_size = crate::prune::gradprobe::iterate::EVAL.batch_size as u64;
    if super::super::prunemem::evaluates_inline(w) {
        out.push(step6(a, &e, kept + p.layer + table));
    }
    if w.eval_windows > 0 {
        let s = Sizes::of(a, &e);
        let eval_stages = [stages::GP_BEFORE_EVAL, stages::GP_AFTER_EVAL];
        out.push(eval_phase(a, &e, &s, "eval", eval_stages, false));
    }
    out
}

/// Step 6 with the evaluation inside it (`jobs::gradprobe::step6`), `e`
/// the evaluation's workload: each
/// decoder layer read in f32 (or taken from those kept on the device),
/// zeroed where it is and run through every evaluation batch of
/// `iterate::EVAL`'s size, every window's hidden states held from the
/// first layer on, and the step's rotary tables (the passes' are gone).
/// `weights`: the layers on the device at the first layer (it and those
/// kept, with the head's table kept beside them). The pool keeps the
/// larger of a linear's zeroing and the forward's pages
/// (`device_pool::zeroed_forward`), the positions bounded as every
/// candidate pruned (the probe restores a share no estimate can know). On
/// lavapipe (2026-11-29) the bytes in use matched the measured to the
/// byte on the 256-wide fixture and on SmolLM2-135M, and the fixture's
/// reserved peak (step 6's, with 96 windows) too.
fn step6(a: &Arch, e: &Workload, weights: u64) -> Phase {
    let s = Sizes::of(a, e);
    let batch = e.batch_size.min(e.eval_windows);
    let states = s.hidden_states(e.eval_windows);
    let forward = evaluation_forward(&s, batch);
    let tables = rope(a, e, batch, e.eval_windows);
    let held = weights + states + tables;
    // The positions as a bound: every candidate pruned.
    let linears: Vec<(u64, u64)> = shapes(a)
        .iter()
        .map(|(i, o)| (i * o, candidate_count(e.sparsity, (i * o) as usize) as u64))
        .collect();
    let pages = super::super::device_pool::zeroed_forward(a, e, batch, &linears);
    Phase::new(
        "step 6",
        &[stages::GP_FINAL_MASKS, stages::GP_PRUNING_APPLIED],
    )
    .add("weights (layers on the device)", weights)
    .add("evaluation hidden states", states)
    .add("rotary tables", tables)
    .add("activations (evaluation)", forward)
    .reserving(held + pages)
}
