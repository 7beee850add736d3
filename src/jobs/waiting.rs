//! Where the pruned layers of a streamed prune wait for the evaluation:
//! nowhere (the evaluation runs each as it is pruned, `model::inline_eval`),
//! kept on the device or in host memory in the compute dtype (no trip
//! through disk), else in the save folder, else in a scratch checkpoint —
//! chosen from the run's predicted peak, `--device-memory` and the memory
//! available, and said in the log. GradProbe's step 6 and its iteration's
//! steps are handed the same way (`step6`, `iteration_inline`).

use super::JobError;
use super::config::PruneJob;
use super::context::Run;
use super::pruned::Opened;
use crate::events::Level;
use crate::exec::Compute;
use crate::model::inline_eval::InlineEval;
use crate::model::kept::{Kept, Place};
use crate::model::perplexity::EvalOptions;
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
    let place = place::<B>(job, opened, eval_bytes, job.dtype, run);
    let options = EvalOptions {
        batch_size: job.batch_size(),
        dtype: job.dtype,
    };
    let mut waiting = in_memory(place, eval, opened, &options, run, device);
    let in_memory = waiting.kept.is_some() || waiting.inline.is_some();
    if eval.is_some() && !saving && !in_memory {
        waiting.scratch = Some(scratch_writer(&opened.ckpt, &run.profiler)?);
    }
    Ok(waiting)
}

/// Where GradProbe's step 6 hands its pruned layers when nothing is saved
/// and its last step is evaluated (`eval`: the windows; `None`: nothing
/// to hand over), in its evaluation's batches and dtype
/// (`gradprobe::iterate::EVAL`): evaluated as they are zeroed, or kept on
/// the device or in host memory, as for a streamed prune; with neither set
/// (disk), the caller writes its scratch model.
pub(super) fn step6<'a, B: Compute>(
    job: &PruneJob,
    opened: &'a Opened,
    eval: Option<&[Vec<u32>]>,
    run: &mut Run,
    device: &B::Device,
) -> Waiting<'a, B> {
    let e = crate::prune::gradprobe::iterate::EVAL;
    let hidden = opened.ckpt.config.hidden_size;
    let eval_bytes = eval.map(|w| InlineEval::<B>::hidden_bytes(w, hidden, e.dtype));
    let place = place::<B>(job, opened, eval_bytes, e.dtype, run);
    in_memory(place, eval, opened, &e, run, device)
}

/// The store `place` names for the windows `eval`, in `options`'
/// batches and dtype: the evaluation itself (inline), layers kept on the
/// device or in host memory, or neither (disk).
fn in_memory<'a, B: Compute>(
    place: Option<Place>,
    eval: Option<&[Vec<u32>]>,
    opened: &'a Opened,
    options: &EvalOptions,
    run: &Run,
    device: &B::Device,
) -> Waiting<'a, B> {
    let mut waiting = Waiting {
        kept: None,
        inline: None,
        scratch: None,
    };
    match (place, eval) {
        (Some(Place::Inline), Some(windows)) => {
            let p = Some(run.profiler.clone());
            let (ckpt, bs, dtype) = (&opened.ckpt, options.batch_size, options.dtype);
            waiting.inline = Some(InlineEval::new(ckpt, windows, bs, dtype, device, p));
        }
        (Some(place @ (Place::Device | Place::Host)), _) => waiting.kept = Some(Kept::new(place)),
        _ => {}
    }
    waiting
}

/// [`keep_place`], recorded in the results and said in the log.
fn place<B: Compute>(
    job: &PruneJob,
    opened: &Opened,
    eval_bytes: Option<u64>,
    dtype: ComputeDtype,
    run: &mut Run,
) -> Option<Place> {
    let place = keep_place::<B>(job, opened, eval_bytes, dtype, run)?;
    record(place, run);
    Some(place)
}

/// Whether GradProbe's iteration evaluates each step's model as the
/// step's layers are zeroed (`eval`: the windows, where it can) rather
/// than from a scratch checkpoint: where a streamed prune's rule, in the
/// evaluation's dtype, takes inline. A step's layers are never kept in
/// memory: a device's places fall back to the scratch checkpoint, said
/// when asked for.
pub(super) fn iteration_inline<B: Compute>(
    job: &PruneJob,
    opened: &Opened,
    eval: Option<&[Vec<u32>]>,
    run: &mut Run,
) -> bool {
    let e = crate::prune::gradprobe::iterate::EVAL;
    let hidden = opened.ckpt.config.hidden_size;
    let Some(bytes) = eval.map(|w| InlineEval::<B>::hidden_bytes(w, hidden, e.dtype)) else {
        return false;
    };
    let place = match keep_place::<B>(job, opened, Some(bytes), e.dtype, run) {
        Some(Place::Inline) => Place::Inline,
        Some(Place::Disk) | None => Place::Disk,
        Some(other) => {
            if job.keep_pruned == Some(other) {
                let said = format!(
                    "--keep-pruned {}: --iterative evaluates each step inline or from a scratch checkpoint",
                    other.name()
                );
                run.profiler.message(Level::Warn, said);
            }
            Place::Disk
        }
    };
    record(place, run);
    place == Place::Inline
}

/// `place` recorded in the results (`pruned_layers_kept`) and said in the
/// log.
fn record(place: Place, run: &mut Run) {
    run.result("pruned_layers_kept", place.name());
    let said = match place {
        Place::Inline => "the evaluation runs each pruned layer as it is pruned; none waits".into(),
        other => format!(
            "the pruned layers wait for the evaluation on the {}",
            other.name()
        ),
    };
    run.profiler.message(Level::Info, said);
}

/// Where a streamed prune's pruned layers wait for the evaluation whose
/// hidden states take `eval_bytes` (`None`: nothing is evaluated from
/// them — a resident model, no evaluation, a save or GradProbe's
/// iteration): on a device `kept::Place::choose` from every layer's bytes
/// in `dtype`, the hidden states, the run's predicted device peak, its
/// memory (`--device-memory`, or a CUDA card's) and the host's, or where
/// `--keep-pruned` says; on the CPU [`cpu_place`].
fn keep_place<B: Compute>(
    job: &PruneJob,
    opened: &Opened,
    eval_bytes: Option<u64>,
    dtype: ComputeDtype,
    run: &Run,
) -> Option<Place> {
    let eval_bytes = eval_bytes?;
    if !B::is_device() {
        return Some(cpu_place(job, opened, eval_bytes, dtype, run));
    }
    if let Some(place) = job.keep_pruned {
        return Some(place);
    }
    let c = &opened.ckpt.config;
    let layers = crate::model::kept::all_layers_bytes(c, dtype);
    let peak = run.predicted_peak().unwrap_or(0);
    let host = crate::memory::process::available_memory();
    Some(Place::choose(
        layers,
        Some(eval_bytes),
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
