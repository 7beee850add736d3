//! Where the pruned layers of a streamed prune wait for the evaluation:
//! nowhere (the evaluation runs each as it is pruned, `model::inline_eval`),
//! kept on the device or in host memory in the compute dtype (no trip
//! through disk), else in the save folder, else in a scratch checkpoint —
//! chosen from the run's predicted peak, `--device-memory` and the memory
//! available, and said in the log.

use super::JobError;
use super::config::PruneJob;
use super::context::Run;
use super::pruned::Opened;
use crate::events::Level;
use crate::exec::Compute;
use crate::model::inline_eval::InlineEval;
use crate::model::kept::{Kept, Place};
use crate::model::save::PrunedWriter;
use crate::model::{Checkpoint, ComputeDtype};
use crate::profiler::Profiler;

/// A scratch folder (removed on every exit path) and the writer into it.
pub(super) type Scratch = (crate::scratch::Guard, PrunedWriter);

/// Where the pruned layers will wait (at most one of the three is set).
pub(super) struct Waiting<'a, B: Compute> {
    pub kept: Option<Kept<B>>,
    pub inline: Option<InlineEval<'a, B>>,
    pub scratch: Option<Scratch>,
}

/// Where the pruned layers will wait: evaluated as they are pruned, kept
/// in memory, or a scratch checkpoint when they are evaluated, kept
/// nowhere and not saved. `eval` is the evaluation's windows (every
/// rank's) of a streamed prune.
pub(super) fn choose<'a, B: Compute>(
    job: &PruneJob,
    opened: &'a Opened,
    eval: Option<&[Vec<u32>]>,
    saving: bool,
    run: &mut Run,
    device: &B::Device,
) -> Result<Waiting<'a, B>, JobError> {
    if let Some(windows) = eval {
        // Refused before the prune rather than after it.
        crate::exec::dist::check_share("evaluation windows", windows.len(), "--eval-windows")?;
    }
    let c = &opened.ckpt.config;
    let eval_bytes = eval.map(|w| InlineEval::<B>::hidden_bytes(w, c.hidden_size, job.dtype));
    let place = place::<B>(job, opened, eval.is_some(), eval_bytes, job.dtype, run);
    let mut waiting = Waiting {
        kept: None,
        inline: None,
        scratch: None,
    };
    match (place, eval) {
        (Some(Place::Inline), Some(windows)) => {
            let p = Some(run.profiler.clone());
            let (ckpt, bs) = (&opened.ckpt, job.batch_size());
            waiting.inline = Some(InlineEval::new(ckpt, windows, bs, job.dtype, device, p));
        }
        (Some(Place::Device | Place::Host), _) => waiting.kept = place.map(Kept::new),
        _ => {}
    }
    let in_memory = waiting.kept.is_some() || waiting.inline.is_some();
    if eval.is_some() && !saving && !in_memory {
        waiting.scratch = Some(scratch_writer(&opened.ckpt, &run.profiler)?);
    }
    Ok(waiting)
}

/// The store for a device run's pruned layers in `dtype` while they wait
/// for the evaluation, where it is memory (never inline: GradProbe's
/// evaluation follows its last step), the place recorded
/// (`pruned_layers_kept`) and said in the log. `None`: a CPU run (its own
/// scratch model), nothing to evaluate, or disk.
pub(super) fn keep<B: Compute>(
    job: &PruneJob,
    opened: &Opened,
    evaluates: bool,
    dtype: ComputeDtype,
    run: &mut Run,
) -> Option<Kept<B>> {
    match place::<B>(job, opened, evaluates, None, dtype, run)? {
        place @ (Place::Device | Place::Host) => Some(Kept::new(place)),
        Place::Disk | Place::Inline => None,
    }
}

/// [`keep_place`], recorded in the results and said in the log.
fn place<B: Compute>(
    job: &PruneJob,
    opened: &Opened,
    evaluates: bool,
    eval_bytes: Option<u64>,
    dtype: ComputeDtype,
    run: &mut Run,
) -> Option<Place> {
    let place = keep_place::<B>(job, opened, evaluates, eval_bytes, dtype, run)?;
    run.result("pruned_layers_kept", place.name());
    let said = match place {
        Place::Inline => "the evaluation runs each pruned layer as it is pruned; none waits".into(),
        other => format!(
            "the pruned layers wait for the evaluation on the {}",
            other.name()
        ),
    };
    run.profiler.message(Level::Info, said);
    Some(place)
}

/// Where a streamed prune keeps its pruned layers for the evaluation
/// (`None`: nothing to keep — a resident model, no evaluation, or
/// GradProbe on the CPU; a CPU run: [`cpu_place`]): `kept::Place::choose`
/// from every layer's bytes in `dtype`, the evaluation's hidden states (`eval_bytes`; `None` where it cannot
/// run inline), the run's predicted device peak, its memory
/// (`--device-memory`, or a CUDA card's) and the host's; or where
/// `--keep-pruned` says (`inline` where it cannot run inline: the choice
/// without it, with a warning).
fn keep_place<B: Compute>(
    job: &PruneJob,
    opened: &Opened,
    evaluates: bool,
    eval_bytes: Option<u64>,
    dtype: ComputeDtype,
    run: &Run,
) -> Option<Place> {
    if !evaluates {
        return None;
    }
    let after_last_step = || {
        run.profiler.message(
            Level::Warn,
            "--keep-pruned inline: this method evaluates after its last step, so its pruned layers wait",
        )
    };
    if !B::is_device() {
        // GradProbe on the CPU streams its own scratch model.
        if eval_bytes.is_none() && job.keep_pruned == Some(Place::Inline) {
            after_last_step();
        }
        return eval_bytes.map(|e| cpu_place(job, opened, e, dtype, run));
    }
    match job.keep_pruned {
        Some(Place::Inline) if eval_bytes.is_none() => after_last_step(),
        Some(place) => return Some(place),
        None => {}
    }
    let c = &opened.ckpt.config;
    let layers = crate::model::kept::all_layers_bytes(c, dtype);
    let peak = run.predicted_peak().unwrap_or(0);
    let host = crate::memory::process::available_memory();
    Some(Place::choose(
        layers,
        eval_bytes,
        peak,
        run.exec.memory_cap(),
        host,
    ))
}

/// Where a CPU run's pruned layers wait (`kept::Place::choose_on_host`):
/// inline or disk, as `--keep-pruned` says or as they fit; `device` and
/// `host` are a device run's places (the CPU's layers are already in host
/// memory, and keeping them all would hold the whole model).
fn cpu_place(
    job: &PruneJob,
    opened: &Opened,
    eval_bytes: u64,
    dtype: ComputeDtype,
    run: &Run,
) -> Place {
    match job.keep_pruned {
        Some(place @ (Place::Inline | Place::Disk)) => return place,
        Some(place) => run.profiler.message(
            Level::Warn,
            format!(
                "--keep-pruned {}: a device run's place; on the CPU the pruned layers are evaluated inline or streamed from disk",
                place.name()
            ),
        ),
        None => {}
    }
    let layers = crate::model::kept::all_layers_bytes(&opened.ckpt.config, dtype);
    let peak = run.predicted_peak().unwrap_or(0);
    let host = crate::memory::process::available_memory();
    Place::choose_on_host(layers, eval_bytes, peak, host)
}

/// A writer into a scratch folder (removed on every exit path) for
/// evaluating a streamed prune that is not saved.
fn scratch_writer(ckpt: &Checkpoint, p: &Profiler) -> Result<Scratch, JobError> {
    let dir = crate::scratch::dir("pruned").map_err(|e| JobError::io(&std::env::temp_dir(), e))?;
    let w = PrunedWriter::create(ckpt, &dir.path().join("model"), false)?;
    p.message(
        Level::Info,
        format!(
            "evaluation streams the pruned layers from {}",
            dir.path().display()
        ),
    );
    Ok((dir, w))
}
