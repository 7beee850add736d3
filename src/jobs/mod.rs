//! Jobs: the library's way to *run* something — a prune (GradProbe
//! included), an evaluation, the demo, a training run, a watch of another
//! process or log, a memory snapshot — from a typed
//! configuration to an outcome, with the sinks the caller chose.
//!
//! A front end (the CLI today) builds a config ([`PruneJob`], [`EvalJob`],
//! …) once, hands it and its [`RunOptions`] (the UI sinks, the log folder,
//! the sampler rate) to the job, and prints the outcome. The job validates
//! the config ([`ConfigError`] names settings as [`Field`]s, which the
//! front end maps to its own flag names), opens the model, starts the run
//! context ([`Run`]: profiler, emitter, signal handling), drives the engines
//! (`prune`, `model::perplexity`) and returns what happened. Jobs know the
//! engines and the sinks; the engines know neither jobs nor sinks.

mod checks;
pub mod config;
pub mod context;
pub mod demo;
pub mod eval;
mod gradprobe;
pub mod preflight;
pub mod prune;
pub mod prune_output;
mod pruned;
mod ranks;
pub mod snapshot;
pub mod text;
pub mod train;
mod waiting;
pub mod watch;

use thiserror::Error;

pub use config::{ConfigError, EvalJob, Field, GradProbeSettings, PruneJob, TextSource};
pub use context::{Run, RunError, RunOptions, request_interrupt};

use crate::data::DataError;
use crate::events::{HostInfo, RunPlan};
use crate::model::ModelError;
use crate::prune::PruneError;

/// Why a job did not finish.
#[derive(Debug, Error)]
pub enum JobError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Run(#[from] RunError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Data(#[from] DataError),
    #[error(transparent)]
    Prune(#[from] PruneError),
    #[error(transparent)]
    WontFit(#[from] preflight::WontFit),
    #[error(transparent)]
    Exec(#[from] crate::exec::ExecError),
    #[error(transparent)]
    Watch(#[from] crate::watch::WatchError),
    /// A device run past its memory cap, with the largest sizes that fit
    /// the cap (the estimator's).
    #[error("{error}")]
    OutOfMemory {
        error: Box<JobError>,
        fit: crate::estimate::fit::FitLimits,
    },
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl JobError {
    /// The device's out-of-memory report, when that is what ended the job.
    pub fn device_oom(&self) -> Option<&crate::memory::DeviceOom> {
        match self {
            JobError::Model(ModelError::DeviceOom(e))
            | JobError::Prune(PruneError::Model(ModelError::DeviceOom(e))) => Some(e),
            JobError::OutOfMemory { error, .. } => error.device_oom(),
            _ => None,
        }
    }

    /// True when the job ended because device memory ran out: the run's
    /// cap passed, or the driver refused an allocation.
    pub fn is_out_of_memory(&self) -> bool {
        self.device_oom().is_some() || matches!(self, JobError::Exec(e) if e.is_out_of_memory())
    }

    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        JobError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

/// With `--resident`, the whole model loaded onto `device`, and its bytes
/// held there for as long as the guard lives (`memory::held`); else none.
fn resident_model<B: crate::exec::Compute>(
    ckpt: &crate::model::Checkpoint,
    resident: bool,
    dtype: crate::model::ComputeDtype,
    device: &B::Device,
) -> Result<(Option<crate::model::Llama<B>>, crate::memory::held::Held), ModelError> {
    let category = crate::memory::tag::Category::Weights;
    if !resident {
        return Ok((None, crate::memory::held::Held::none(category)));
    }
    // Burn's resident model keeps the embedding as one tensor: past the
    // device's largest buffer (lavapipe: 128 MiB) the runtime would fail
    // deep in its server thread. Said here, in one line, before uploading.
    let table = ckpt.config.vocab_table_params() * dtype.size();
    if crate::model::vocab::max_buffer::<B>(device).is_some_and(|limit| table > limit) {
        return Err(ModelError::Checkpoint(format!(
            "--resident: one tensor of {} passes the device's largest buffer; a smaller --dtype (f16), streaming (no --resident) or a device with larger buffers is needed",
            crate::units::format_bytes(table)
        )));
    }
    let model = ckpt.load_model::<B>(dtype, device)?;
    let bytes = ckpt.config.param_count() * dtype.size();
    Ok((Some(model), crate::memory::held::Held::new(category, bytes)))
}

/// Opens a model folder (or Hub id) and its tokenizer, checked against
/// each other.
pub fn open_model(
    model: &str,
    revision: &str,
) -> Result<(crate::model::Checkpoint, crate::model::tokenizer::Tokenizer), JobError> {
    let dir = crate::model::hub::resolve(model, revision)?;
    let ckpt = crate::model::Checkpoint::open(&dir)?;
    let tok = crate::model::tokenizer::Tokenizer::from_file(&dir.join("tokenizer.json"))?;
    tok.check_vocab(ckpt.config.vocab_size)?;
    Ok((ckpt, tok))
}

/// Refuses `plan` when it will not fit in the memory available now (unless
/// `force`). `calib` and `eval` are the texts it will read: their sizes
/// bound the text tokenised at once, and the evaluation text's size gives
/// its windows of `seqlen` tokens, roughly (English BPE averages about 4
/// bytes a token), at most `eval_limit`. Both guesses go into the plan's
/// settings (`expected_text_bytes`, `expected_eval_windows`) for the
/// estimates made while the run goes, with what the tokenizer holds
/// (`tokenizer`: its entries, merges and string bytes).
pub fn preflight(
    plan: &mut RunPlan,
    tokenizer: &crate::model::tokenizer::Tokenizer,
    calib: Option<&std::path::Path>,
    eval: Option<&std::path::Path>,
    eval_limit: Option<usize>,
    seqlen: usize,
    force: bool,
) -> Result<(), JobError> {
    let size = |p: Option<&std::path::Path>| {
        p.and_then(|p| std::fs::metadata(p).ok())
            .map_or(0, |m| m.len())
    };
    let (calib_bytes, eval_bytes) = (size(calib), size(eval));
    let windows = eval_bytes / 4 / seqlen.max(1) as u64;
    let extra = preflight::Extra {
        text_bytes: calib_bytes.max(eval_bytes),
        eval_windows: eval_limit.map_or(windows, |l| windows.min(l as u64)),
    };
    // The live view's forecast estimates the same plan.
    let s = &mut plan.settings;
    s.insert("expected_text_bytes".into(), extra.text_bytes.into());
    s.insert("expected_eval_windows".into(), extra.eval_windows.into());
    if let Some(size) = tokenizer.size() {
        s.insert("tokenizer".into(), serde_json::json!(size));
    }
    if force {
        return Ok(());
    }
    let available = crate::memory::process::available_memory();
    Ok(preflight::check(plan, extra, available)?)
}

/// A plan with the fields every job fills.
pub fn base_plan(command: &str, argv: Vec<String>) -> RunPlan {
    RunPlan {
        command: command.into(),
        argv,
        host: HostInfo {
            // What the estimator counts for this machine's products.
            matmul_workspace: Some(crate::model::matmul::workspace_bytes()),
            ..HostInfo::current()
        },
        ..Default::default()
    }
}
