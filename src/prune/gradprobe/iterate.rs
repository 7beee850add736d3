//! GradProbe's `iterative_prune` with perplexity as the metric: raise the
//! target sparsity step by step, each step probing the model with the
//! earlier steps' pruning applied, and keep the best step whose perplexity
//! stays within a budget of the dense model's.

use crate::exec::Compute;
use serde::Serialize;

use super::{GradProbe, Masks, scratch_model, select};
use crate::events::Level;
use crate::model::Checkpoint;
use crate::model::inline_eval::InlineEval;
use crate::model::perplexity::{self, EvalOptions, Perplexity};
use crate::profiler::Profiler;
use crate::prune::PruneError;

/// How to iterate (the reference's `iterative_prune` settings).
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    pub initial_sparsity: f64,
    pub sparsity_step: f64,
    /// Stop when perplexity exceeds the dense one by more than this
    /// (absolute, as the reference's `--max-perplexity-increase`).
    pub max_ppl_increase: f64,
}

/// One step, as the run's results record it.
#[derive(Debug, Clone, Serialize)]
pub struct StepRecord {
    pub target: f64,
    pub sparsity: f64,
    pub perplexity: f64,
    pub tentative: u64,
    pub pruned: u64,
    pub restored: u64,
    pub seconds: f64,
}

/// What the iteration kept.
#[derive(Debug, Clone)]
pub struct Iteration {
    /// The best valid step's masks (empty: the model stays dense).
    pub masks: Masks,
    /// Its perplexity (the dense one when no step was kept).
    pub perplexity: Perplexity,
    pub dense: Perplexity,
    pub history: Vec<StepRecord>,
}

/// GradProbe's evaluation: f32, 8 windows a batch (whatever the passes'
/// batch; the estimator reads it too).
pub const EVAL: EvalOptions = EvalOptions {
    batch_size: 8,
    dtype: crate::model::ComputeDtype::F32,
};

/// Streams the model folder `dir` through `windows`.
pub fn evaluate<B: Compute>(
    dir: &std::path::Path,
    windows: &[Vec<u32>],
    profiler: &Profiler,
    device: &B::Device,
) -> Result<Perplexity, PruneError> {
    Ok(perplexity::of_folder::<B>(
        dir, windows, &EVAL, device, profiler,
    )?)
}

/// The pruned model through `windows` from what step 6 left: its decoder
/// layers kept (`perplexity::Weights::Kept`, the embedding, final norm and
/// head from the checkpoint), or already run inside it
/// (`Weights::Evaluated`: the final norm and the head are left).
pub fn evaluate_pruned<B: Compute>(
    weights: perplexity::Weights<'_, B>,
    windows: &[Vec<u32>],
    profiler: &Profiler,
    device: &B::Device,
) -> Result<Perplexity, PruneError> {
    Ok(perplexity::perplexity::<B>(
        weights,
        windows,
        &EVAL,
        device,
        Some(profiler),
    )?)
}

/// The model with `masks` applied, through `windows`: each decoder layer
/// zeroed and run through every batch at once (`model::inline_eval`), the
/// probe's kept layers left kept. Returns the probed linears' sparsity
/// and the perplexity: the scratch checkpoint's, to the bit.
fn evaluate_lent<B: Compute>(
    ckpt: &Checkpoint,
    probe: &GradProbe<'_, B>,
    masks: &Masks,
    windows: &[Vec<u32>],
) -> Result<(f64, Perplexity), PruneError> {
    let (p, device) = (probe.profiler, probe.device());
    let seqlen = windows.first().map_or(0, Vec::len);
    let mut eval = InlineEval::<B>::new(
        ckpt,
        windows,
        EVAL.batch_size,
        EVAL.dtype,
        device,
        Some(p.clone()),
    );
    let layers = probe.lend_pruned(masks, &mut eval, seqlen)?;
    let sparsity = crate::prune::engine::sparsity_of(layers.iter().flat_map(|l| &l.linears));
    let weights = perplexity::Weights::Evaluated(eval.finish()?);
    let ppl = evaluate_pruned::<B>(weights, windows, p, device)?;
    Ok((sparsity, ppl))
}

/// `base` with `new`'s positions added, each linear's list exactly sized
/// and tagged as masks: the next step's base, or the best step's masks.
fn merged(base: &Masks, new: Masks) -> Masks {
    let _tag = crate::memory::tag::tag(crate::memory::tag::Category::Masks);
    let mut out: Masks = (base.iter())
        .filter(|(name, _)| !new.contains_key(*name))
        .map(|(name, v)| (name.clone(), v.clone()))
        .collect();
    for (name, v) in new {
        let m = select::union(base.get(&name).map_or(&[][..], |b| b), &v);
        drop(v);
        out.insert(name, m);
    }
    out
}

/// One step at `target`: probes the model with `base` (the steps before's
/// masks) applied, adds what it prunes to a copy of them, and evaluates
/// the result — `inline` ([`evaluate_lent`]) or from a scratch checkpoint.
/// Returns the step's record, its perplexity and its masks.
fn step<B: Compute>(
    ckpt: &Checkpoint,
    probe: &mut GradProbe<'_, B>,
    base: &Masks,
    windows: &[Vec<u32>],
    target: f64,
    dense: &Perplexity,
    inline: bool,
) -> Result<(StepRecord, Perplexity, Masks), PruneError> {
    let p = probe.profiler;
    // The step before's (or the dense evaluation's) freed pages go back
    // first, as the engines give theirs back at every layer: a step's
    // probe starts from the live heap, not from the last one's high-water.
    crate::memory::alloc::trim();
    probe.set_sparsity(target);
    let mut step = probe.step(base)?;
    let (pruned, restored) = (step.pruned_count(), step.restored);
    let masks = merged(base, std::mem::take(&mut step.pruned));
    let (sparsity, ppl) = match inline {
        true => evaluate_lent(ckpt, probe, &masks, windows)?,
        false => {
            let scratch = scratch_model(ckpt, probe.targets(), &masks)?;
            let ppl = evaluate::<B>(&scratch.path, windows, p, probe.device())?;
            (scratch.sparsity(), ppl)
        }
    };
    p.message(
        Level::Info,
        format!(
            "step at {target:.3}: sparsity {sparsity:.4}, perplexity {:.4} (dense {:.4}), {pruned} pruned, {restored} restored",
            ppl.perplexity, dense.perplexity,
        ),
    );
    let record = StepRecord {
        target,
        sparsity,
        perplexity: ppl.perplexity,
        tentative: step.tentative,
        pruned,
        restored,
        seconds: step.seconds,
    };
    Ok((record, ppl, masks))
}

/// Runs the schedule: stops when sparsity has not risen for two steps or
/// perplexity exceeds the dense one by more than the budget; returns the
/// best valid masks and their perplexity. `inline`: each step's model is
/// evaluated as its layers are zeroed, else from a scratch checkpoint
/// (the only way with the embeddings probed).
pub fn run<B: Compute>(
    ckpt: &Checkpoint,
    probe: &mut GradProbe<'_, B>,
    windows: &[Vec<u32>],
    schedule: Schedule,
    inline: bool,
) -> Result<Iteration, PruneError> {
    let p = probe.profiler;
    let dense = evaluate::<B>(&ckpt.dir, windows, p, probe.device())?;
    p.message(
        Level::Info,
        format!("dense perplexity {:.4}", dense.perplexity),
    );
    // The best step's masks are the next step's base: every step that
    // does not stop the schedule becomes the best, so one copy serves both
    // (the probe borrows it), where a working copy, the best's clone and
    // the probe's own clone held it three times (SmolLM2, 3 steps of 2 × 128
    // tokens: 836.7 MiB of RSS at the last step's peak, 596.3 after).
    let empty = Masks::new();
    let mut best: Option<(Masks, Perplexity)> = None;
    let (mut previous, mut flat_steps) = (0.0, 0);
    let mut history = Vec::new();
    let mut target = schedule.initial_sparsity;
    while target <= 1.0 {
        let base = best.as_ref().map_or(&empty, |(m, _)| m);
        let (record, ppl, masks) = step(ckpt, probe, base, windows, target, &dense, inline)?;
        let sparsity = record.sparsity;
        history.push(record);
        flat_steps = if sparsity - previous <= 0.0 {
            flat_steps + 1
        } else {
            0
        };
        if flat_steps >= 2 {
            p.message(
                Level::Info,
                "sparsity stopped rising for two steps: stopping",
            );
            break;
        }
        if ppl.perplexity - dense.perplexity > schedule.max_ppl_increase {
            p.message(
                Level::Info,
                format!(
                    "perplexity rose {:.4} > {}: keeping the previous step",
                    ppl.perplexity - dense.perplexity,
                    schedule.max_ppl_increase
                ),
            );
            break;
        }
        best = Some((masks, ppl));
        previous = sparsity;
        target += schedule.sparsity_step;
    }
    let (masks, perplexity) = best.unwrap_or_else(|| {
        p.message(
            Level::Warn,
            "no step kept perplexity within the budget (max_ppl_increase): the model is left dense",
        );
        (Masks::new(), dense.clone())
    });
    // The last step's masks (a step past the budget is dropped) and its
    // probe's freed buffers go back: cached, they kept the resident set
    // at the step's evaluation to the end of the run (SmolLM2, 3 steps:
    // 345.3 MiB resident for 13.2 MiB live).
    crate::memory::alloc::trim();
    Ok(Iteration {
        masks,
        perplexity,
        dense,
        history,
    })
}
