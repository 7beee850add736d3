//! Where the pruned layers of a streamed prune wait for the evaluation:
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
use crate::model::kept::{Kept, Place};
use crate::model::save::PrunedWriter;
use crate::model::{Checkpoint, ComputeDtype};
use crate::profiler::Profiler;

/// A scratch folder (removed on every exit path) and the writer into it.
pub(super) type Scratch = (crate::scratch::Guard, PrunedWriter);

/// Where the pruned layers will wait: kept in memory, or a scratch
/// checkpoint when they are evaluated, kept nowhere and not saved.
pub(super) fn choose<B: Compute>(
    job: &PruneJob,
    opened: &Opened,
    streamed_eval: bool,
    saving: bool,
    run: &mut Run,
) -> Result<(Option<Kept<B>>, Option<Scratch>), JobError> {
    let kept = keep::<B>(job, opened, streamed_eval, job.dtype, run);
    let p = run.profiler.clone();
    let scratch = match streamed_eval && !saving && kept.is_none() {
        true => Some(scratch_writer(&opened.ckpt, &p)?),
        false => None,
    };
    Ok((kept, scratch))
}

/// The store for a device run's pruned layers in `dtype` while they wait
/// for the evaluation, where it is memory (`keep_place`), the place
/// recorded (`pruned_layers_kept`) and said in the log. `None`: a CPU run,
/// nothing to evaluate, or disk.
pub(super) fn keep<B: Compute>(
    job: &PruneJob,
    opened: &Opened,
    evaluates: bool,
    dtype: ComputeDtype,
    run: &mut Run,
) -> Option<Kept<B>> {
    let place = keep_place::<B>(job, opened, evaluates, dtype, run)?;
    run.result("pruned_layers_kept", place.name());
    run.profiler.message(
        Level::Info,
        format!(
            "the pruned layers wait for the evaluation on the {}",
            place.name()
        ),
    );
    match place {
        Place::Device | Place::Host => Some(Kept::new(place)),
        Place::Disk => None,
    }
}

/// Where a streamed device prune keeps its pruned layers for the
/// evaluation (`None`: nothing to keep — a CPU run, a resident model, or no
/// evaluation): the device when the run's predicted device peak plus every
/// layer in `dtype` fits its memory (`--device-memory`, or a CUDA card's),
/// host memory when they fit what is available, else disk; or where
/// `--keep-pruned` says.
fn keep_place<B: Compute>(
    job: &PruneJob,
    opened: &Opened,
    evaluates: bool,
    dtype: ComputeDtype,
    run: &Run,
) -> Option<Place> {
    if !B::is_device() || !evaluates {
        return None;
    }
    if let Some(place) = job.keep_pruned {
        return Some(place);
    }
    let c = &opened.ckpt.config;
    let layers = crate::model::kept::all_layers_bytes(c, dtype);
    let peak = run.predicted_peak().unwrap_or(0);
    let host = crate::memory::process::available_memory();
    Some(Place::choose(layers, peak, run.exec.memory_cap(), host))
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
