//! GradProbe's CPU phases: its two passes (`estimate::reference`'s
//! `gradprobe_prunemem`) with what every CPU phase holds, step 6 when the
//! evaluation runs inside it (`jobs::gradprobe`), and the evaluation.

use super::{Shape, compute_workspace, eval_phase, evaluates_inline, forward, load_transient};
use crate::estimate::{Arch, Phase, Workload};
use crate::events::stages;

/// GradProbe's passes (`super::reference::gradprobe_prunemem`), each with
/// the process, the compute workspace and the tokenizer, then the engine's
/// evaluation of the pruned model, as a sequential method's. (Its write
/// step copies what it does not prune straight from the mapping and holds
/// less: 138.3 MiB measured on SmolLM2.)
///
/// An `--iterative` step holds the earlier steps' positions throughout
/// (one copy, `prune::gradprobe::iterate`), and evaluates its model inside
/// its step 6, the head after the layers: that phase is the larger of the
/// two moments.
pub(super) fn gradprobe_phases(a: &Arch, w: &Workload, notes: &mut Vec<String>) -> Vec<Phase> {
    let sh = Shape::uncalibrated(a, w, 0, notes);
    let earlier = positions_at(a, w.earlier_sparsity) * 4;
    let held = |p: Phase| match earlier {
        0 => p,
        b => p.add("earlier steps' pruned positions (u32)", b),
    };
    let mut out: Vec<Phase> = crate::estimate::reference::gradprobe_prunemem(a, w, notes)
        .into_iter()
        .map(|p| held(sh.base(p).add("compute workspace", compute_workspace(w))))
        .collect();
    if evaluates_inline(w) {
        let layers = held(gradprobe_step6(a, w, &sh));
        if !w.iterative {
            out.push(layers);
        } else {
            // The step's evaluation, the head after the layers, is inside
            // its step 6: no evaluation phase of its own.
            let stages = [stages::GP_FINAL_MASKS, stages::GP_PRUNING_APPLIED];
            let head = eval_phase(a, w, &sh, "step 6", &stages, w.resident, 0)
                .add("pruned positions (u32)", positions_at(a, w.sparsity) * 4);
            let head = held(head);
            out.push(if head.total() > layers.total() {
                head
            } else {
                layers
            });
            return out;
        }
    }
    if w.eval_windows > 0 {
        out.push(final_eval_phase(a, w, &sh, &out));
    }
    out
}

/// The evaluation after step 6. Inside the prune it is the head alone
/// after a give-back (`jobs::gradprobe::evaluate_step6`), as a sequential
/// method's inline evaluation: with the head step's own freed blocks
/// cached, within the room the heap's high-water mark of the phases before
/// leaves (`eval::inline_eval_phase`), at GradProbe's evaluation batch and
/// dtype. Measured on SmolLM2 (0.1, threshold 2.0, 2 × 128, 8 windows;
/// 2026-12-07): −5.8% without them.
fn final_eval_phase(a: &Arch, w: &Workload, sh: &Shape, before: &[Phase]) -> Phase {
    let stages = [stages::GP_BEFORE_EVAL, stages::GP_AFTER_EVAL];
    if !evaluates_inline(w) {
        return eval_phase(a, w, sh, "eval", &stages, w.resident, 0);
    }
    let high = before.iter().map(super::heap).max().unwrap_or(0);
    let eval = crate::prune::gradprobe::iterate::EVAL;
    let w = Workload {
        batch_size: eval.batch_size as u64,
        dtype: eval.dtype,
        ..w.clone()
    };
    super::eval::inline_eval_phase(a, &w, sh, &stages, high)
}

/// GradProbe's step 6 with the evaluation inside it (`jobs::gradprobe`):
/// each decoder layer read in f32, zeroed at the pruned positions (held
/// from the probe) and run through every evaluation batch of
/// `gradprobe::iterate::EVAL`'s size, the windows' hidden states held from
/// the first layer on. The pruned positions are a bound: every candidate
/// pruned (the probe restores a share no estimate can know; 51% of them on
/// SmolLM2 at 30%, 2026-11-29).
fn gradprobe_step6(a: &Arch, w: &Workload, sh: &Shape) -> Phase {
    let tokens =
        (crate::prune::gradprobe::iterate::EVAL.batch_size as u64).min(w.eval_windows) * w.seqlen;
    let eval_forward = forward(a, tokens) - tokens * a.hidden * 4;
    let (t_name, t) = [
        ("load transient", load_transient(a, w)),
        ("evaluation forward", eval_forward),
    ]
    .into_iter()
    .max_by_key(|(_, b)| *b)
    .unwrap_or(("load transient", 0));
    let pruned = positions_at(a, w.sparsity);
    sh.base(Phase::new(
        "step 6",
        &[stages::GP_FINAL_MASKS, stages::GP_PRUNING_APPLIED],
    ))
    .add("weights (one layer)", a.layer_params() * 4)
    .add("pruned positions (u32)", pruned * 4)
    .add(
        "evaluation hidden states",
        w.eval_windows * w.seqlen * a.hidden * 4,
    )
    .add("compute workspace", compute_workspace(w))
    .add(t_name, t)
    // The trim before each layer empties the allocator's cache, which then
    // keeps a batch's freed buffers for the next (the probe's heap mark is
    // far above): on SmolLM2 (0.1, threshold 2.0, 40 windows of 128,
    // 2026-11-29) 20–30 MiB more resident than live through step 6, for
    // an evaluation forward of 14.3 MiB.
    .add(
        "runtime: the evaluation forward's freed buffers, cached between batches",
        eval_forward,
    )
}

/// The probed linears' positions at `sparsity`: a step's pruned ones at
/// most (every candidate: the probe restores a share no estimate can
/// know), or those the steps before an `--iterative` step reached.
fn positions_at(a: &Arch, sparsity: f64) -> u64 {
    (a.layers as f64 * a.layer_linear_params() as f64 * sparsity) as u64
}
