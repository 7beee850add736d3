//! The GradProbe part of the prune job: calibration windows cut the way the
//! reference cuts them, one GradProbe step (or the engine's iteration),
//! step 6 from the checkpoint — each layer handed to the evaluation as it
//! is zeroed, or kept for it, or the model written — and the evaluation;
//! stages named as GradProbe's profiling script names them.

use crate::exec::Compute;
use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::JobError;
use super::config::PruneJob;
use super::context::Run;
use super::pruned::{Opened, Pruned, eval_results, layer_results};
use super::text;
use crate::events::{Level, stages};
use crate::model::ComputeDtype;
use crate::model::inline_eval::Evaluated;
use crate::model::kept::{Kept, Place, PrunedLayers, all_layers_bytes};
use crate::model::perplexity::{Perplexity, Weights};
use crate::model::save::PrunedWriter;
use crate::prune::engine::{LinearReport, PruneOutcome, sparsity_of};
use crate::prune::gradprobe::iterate::{self, Schedule};
use crate::prune::gradprobe::{
    GradProbe, GradProbeConfig, Masks, StepOutcome, count_pruned, scratch_model, write_pruned,
};

/// GradProbe's settings, recorded in the run's plan.
pub(super) fn plan_settings(job: &PruneJob, s: &mut BTreeMap<String, Value>) {
    let g = &job.gradprobe;
    s.insert("strategy".into(), json!(g.strategy.to_string()));
    s.insert("reduction_factor".into(), json!(g.reduction_factor));
    s.insert("gradient_threshold".into(), json!(g.gradient_threshold));
    s.insert("num_batches".into(), json!(g.num_batches));
    s.insert("include_embeddings".into(), json!(g.include_embeddings));
    s.insert("grad_precision".into(), json!(g.grad_precision));
    s.insert("iterative".into(), json!(g.iterative));
    if g.iterative {
        s.insert("initial_sparsity".into(), json!(g.initial_sparsity));
        s.insert("sparsity_step".into(), json!(g.sparsity_step));
        s.insert("max_ppl_increase".into(), json!(g.max_ppl_increase));
    }
}

/// Probes, writes the pruned model and evaluates it.
pub(super) fn prune_and_eval<B: Compute>(
    job: &PruneJob,
    opened: &Opened,
    writer: Option<&mut PrunedWriter>,
    run: &mut Run,
    device: &B::Device,
) -> Result<Pruned, JobError> {
    let Opened { ckpt, tok, seqlen } = opened;
    let g = &job.gradprobe;
    let p = run.profiler.clone();
    p.stage(stages::GP_MODEL_LOADED);
    let src = job.calib.as_ref().ok_or_else(|| {
        super::ConfigError::new(
            "{} is required for {} gradprobe",
            &[super::Field::CalibText, super::Field::Method],
        )
    })?;
    let count = g.num_batches * job.batch_size();
    let stride = g.stride.unwrap_or((seqlen / 2).max(1));
    let calib = text::sliding(tok, src, *seqlen, stride, count)?;
    let eval_wins = match &job.eval {
        Some(src) => Some(text::evaluation(tok, src, *seqlen, job.eval_windows)?.0),
        None => None,
    };
    p.stage(stages::GP_DATA_PREPARED);
    let config = GradProbeConfig {
        strategy: g.strategy,
        sparsity: if g.iterative {
            g.initial_sparsity
        } else {
            job.sparsity
        },
        reduction_factor: g.reduction_factor,
        gradient_threshold: g.gradient_threshold,
        include_embeddings: g.include_embeddings,
        precision: g.grad_precision,
    };
    let mut probe =
        GradProbe::<B>::new(ckpt, config, &calib, job.batch_size(), &p, device.clone())?;
    drop(calib);
    if resident_fits::<B>(opened, run) {
        probe.keep_layers_resident();
    }
    let layers = if probe.layers_resident() {
        "device"
    } else {
        "streamed"
    };
    run.result("gradprobe_layers", layers);
    let started = std::time::Instant::now();
    let windows = eval_wins.as_deref().unwrap_or_default();
    let (masks, perplexity) = probe_masks(job, opened, &mut probe, windows, run)?;
    let last = eval_wins.as_deref().filter(|_| perplexity.is_none());
    let (written, waiting) = step6(job, opened, &probe, &masks, writer, last, run, device)?;
    let super::waiting::Waiting { kept, inline, .. } = waiting;
    // The evaluation's seconds inside step 6 are the evaluation's.
    let inline_seconds = inline.as_ref().map_or(0.0, |e| e.seconds());
    let outcome = PruneOutcome {
        layers: written.layers,
        seconds: started.elapsed().as_secs_f64() - inline_seconds,
    };
    let mut components = BTreeMap::new();
    let positions = masks.values().map(|m| m.len() as u64 * 4).sum();
    components.insert("pruned positions (u32)".to_string(), positions);
    p.components(stages::GP_PRUNING_APPLIED, components);
    p.stage(stages::GP_PRUNING_APPLIED);
    // Step 6 is done: its positions and the probe's state (56.8 MiB on
    // SmolLM2 at 10%, held through the evaluation until 2026-11-26) are not
    // needed by what is left of the evaluation.
    drop(masks);
    drop(probe);
    let pruned = match (kept.as_ref(), inline, &written.path) {
        (Some(k), _, _) => Some(Step6::Kept(k)),
        (None, Some(e), _) => Some(Step6::Evaluated(e.finish()?)),
        (None, None, Some(path)) => Some(Step6::Folder(path)),
        (None, None, None) => None,
    };
    let perplexity = match (&eval_wins, pruned, perplexity) {
        (Some(wins), Some(pruned), None) => Some(evaluate_step6(ckpt, pruned, wins, &p, device)?),
        (_, _, known) => known,
    };
    step6_results(run, &outcome, &written.others, perplexity.as_ref());
    Ok(Pruned {
        prune: outcome,
        perplexity,
    })
}

/// Step 6: without a save, one step evaluated and only decoder linears
/// pruned, the layers go to the evaluation as they are zeroed, or wait in
/// memory (`waiting::step6`); else the model is written, into the save
/// folder or a scratch one (`eval`: the windows, where the last step is
/// evaluated).
#[allow(clippy::too_many_arguments)]
fn step6<'a, B: Compute>(
    job: &PruneJob,
    opened: &'a Opened,
    probe: &GradProbe<'_, B>,
    masks: &Masks,
    writer: Option<&mut PrunedWriter>,
    eval: Option<&[Vec<u32>]>,
    run: &mut Run,
    device: &B::Device,
) -> Result<(Written, super::waiting::Waiting<'a, B>), JobError> {
    let refused = not_handed(job, writer.is_some());
    let asked = job.keep_pruned.is_some_and(|p| p != Place::Disk);
    if let (Some(why), Some(_), true) = (refused, &job.eval, asked) {
        run.profiler.message(Level::Warn, why);
    }
    let handed = eval.filter(|_| refused.is_none());
    let mut waiting = super::waiting::step6::<B>(job, opened, handed, run, device);
    let to: Option<&mut dyn PrunedLayers<B>> = match (&mut waiting.kept, &mut waiting.inline) {
        (Some(k), _) => Some(k),
        (None, Some(e)) => Some(e),
        (None, None) => None,
    };
    let written = match to {
        Some(to) => Written {
            layers: probe.keep_pruned(masks, to, opened.seqlen)?,
            others: Vec::new(),
            path: None,
            _scratch: None,
        },
        None => write_step6(opened, probe, masks, writer, eval.is_some())?,
    };
    Ok((written, waiting))
}

/// One GradProbe step, or the engine's iteration: the masks, and the
/// perplexity the iteration already measured.
fn probe_masks<B: Compute>(
    job: &PruneJob,
    opened: &Opened,
    probe: &mut GradProbe<'_, B>,
    windows: &[Vec<u32>],
    run: &mut Run,
) -> Result<(Masks, Option<Perplexity>), JobError> {
    let g = &job.gradprobe;
    if !g.iterative {
        let step = probe.step(&Masks::new())?;
        report_step(run, &step, job.sparsity);
        return Ok((step.pruned, None));
    }
    let schedule = Schedule {
        initial_sparsity: g.initial_sparsity,
        sparsity_step: g.sparsity_step,
        max_ppl_increase: g.max_ppl_increase,
    };
    // Each step's model evaluated as its layers are zeroed, where it can
    // be (not with the embeddings probed).
    let eval = Some(windows).filter(|_| !g.include_embeddings);
    let inline = super::waiting::iteration_inline::<B>(job, opened, eval, run);
    let it = iterate::run(&opened.ckpt, probe, windows, schedule, inline)?;
    run.result("dense_perplexity", it.dense.perplexity);
    run.result("iterations", json!(it.history));
    Ok((it.masks, Some(it.perplexity)))
}

/// What step 6 left to evaluate.
enum Step6<'a, B: Compute> {
    Kept(&'a Kept<B>),
    /// Every window already through the pruned layers: the head is left.
    Evaluated(Evaluated<'a, B>),
    Folder(&'a std::path::Path),
}

/// Why the pruned model is not evaluated from its step-6 layers (and
/// `--keep-pruned` not obeyed), if it is not. (The iteration's steps are
/// evaluated on their own: `waiting::iteration_inline`.)
fn not_handed(job: &PruneJob, saved: bool) -> Option<&'static str> {
    if saved && !job.gradprobe.iterative {
        Some("--keep-pruned: with --save the pruned model is evaluated from the save folder")
    } else if job.gradprobe.include_embeddings {
        Some(
            "--keep-pruned: with --include-embeddings the pruned model is evaluated from a scratch checkpoint",
        )
    } else {
        None
    }
}

fn evaluate_step6<B: Compute>(
    ckpt: &crate::model::Checkpoint,
    pruned: Step6<'_, B>,
    wins: &[Vec<u32>],
    p: &crate::profiler::Profiler,
    device: &B::Device,
) -> Result<Perplexity, JobError> {
    // What the probing freed goes back to the system first: the
    // evaluation's peak is then its own, not the probe's leftovers.
    crate::exec::give_back::<B>(device);
    p.stage(stages::GP_BEFORE_EVAL);
    let r = match pruned {
        Step6::Kept(k) => iterate::evaluate_pruned::<B>(Weights::Kept(ckpt, k), wins, p, device)?,
        Step6::Evaluated(e) => {
            iterate::evaluate_pruned::<B>(Weights::Evaluated(e), wins, p, device)?
        }
        Step6::Folder(path) => iterate::evaluate::<B>(path, wins, p, device)?,
    };
    p.stage(stages::GP_AFTER_EVAL);
    Ok(r)
}

/// Whether every decoder layer in f32 can stay on the device between the
/// passes: the device's memory is known (`--device-memory`, or a CUDA
/// card's) and holds the run's predicted peak, the layers and the head's
/// table. The pruned layers kept for the evaluation are these layers,
/// handed over and zeroed in place (`GradProbe::keep_pruned`).
fn resident_fits<B: Compute>(opened: &Opened, run: &Run) -> bool {
    let c = &opened.ckpt.config;
    let layers = all_layers_bytes(c, ComputeDtype::F32);
    let head = c.vocab_table_params() * 4;
    let need = run.predicted_peak().unwrap_or(0) + layers + head;
    B::is_device() && run.exec.memory_cap().is_some_and(|cap| need <= cap)
}

/// The model written with the masks applied: into the save folder, or a
/// scratch folder when nothing is saved and it is evaluated; or only
/// counted.
struct Written {
    layers: Vec<crate::prune::engine::LayerReport>,
    others: Vec<LinearReport>,
    /// A complete model folder to evaluate, when one is needed.
    path: Option<std::path::PathBuf>,
    _scratch: Option<crate::prune::gradprobe::Scratch>,
}

fn write_step6<B: Compute>(
    opened: &Opened,
    probe: &GradProbe<'_, B>,
    masks: &Masks,
    writer: Option<&mut PrunedWriter>,
    needs_eval: bool,
) -> Result<Written, JobError> {
    let ckpt = &opened.ckpt;
    Ok(match writer {
        Some(w) => {
            let (layers, others) = write_pruned(ckpt, probe.targets(), masks, w)?;
            let path = match needs_eval {
                true => Some(w.complete(ckpt)?),
                false => None,
            };
            Written {
                layers,
                others,
                path,
                _scratch: None,
            }
        }
        // Neither saved nor evaluated (`--iterative` measured its steps):
        // counted, not written.
        None if !needs_eval => {
            let (layers, others) = count_pruned(ckpt, probe.targets(), masks)?;
            Written {
                layers,
                others,
                path: None,
                _scratch: None,
            }
        }
        None => {
            let mut s = scratch_model(ckpt, probe.targets(), masks)?;
            Written {
                layers: std::mem::take(&mut s.layers),
                others: std::mem::take(&mut s.others),
                path: Some(s.path.clone()),
                _scratch: Some(s),
            }
        }
    })
}

fn step6_results(
    run: &mut Run,
    outcome: &PruneOutcome,
    others: &[LinearReport],
    perplexity: Option<&Perplexity>,
) {
    layer_results(run, outcome);
    let all = outcome.layers.iter().flat_map(|l| &l.linears).chain(others);
    run.result("sparsity_all_probed", sparsity_of(all));
    for o in others {
        let s = o.zeros as f64 / o.params.max(1) as f64;
        run.result(&format!("sparsity_{}", o.name), s);
    }
    if let Some(r) = perplexity {
        eval_results(run, r);
    }
}

fn report_step(run: &mut Run, step: &StepOutcome, target: f64) {
    run.profiler.message(
        Level::Info,
        format!(
            "gradprobe at {:.3}: {} candidates, {} pruned, {} restored (gradient rose); loss {:.4} → {:.4} with candidates × reduction",
            target,
            step.tentative,
            step.pruned_count(),
            step.restored,
            step.loss_original,
            step.loss_modified
        ),
    );
    run.result("tentative", step.tentative);
    run.result("pruned", step.pruned_count());
    run.result("restored", step.restored);
    run.result("calibration_loss", step.loss_original);
    run.result("calibration_loss_reduced", step.loss_modified);
}
