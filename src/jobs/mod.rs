//! Jobs: the library's way to *run* something — a prune (GradProbe
//! included), an evaluation, the demo, a memory snapshot — from a typed
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

pub mod config;
pub mod context;
pub mod demo;
pub mod eval;
mod gradprobe;
pub mod preflight;
pub mod prune;
pub mod snapshot;
pub mod text;

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
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl JobError {
    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        JobError::Io {
            path: path.display().to_string(),
            source,
        }
    }
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
/// `force`); `texts` are the files it will read (their sizes bound the text
/// tokenised at once) and `eval_windows` the windows it will evaluate.
pub fn preflight(
    plan: &RunPlan,
    texts: &[&std::path::Path],
    eval_windows: u64,
    force: bool,
) -> Result<(), JobError> {
    if force {
        return Ok(());
    }
    let text_bytes = texts
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok().map(|m| m.len()))
        .max()
        .unwrap_or(0);
    let extra = preflight::Extra {
        text_bytes,
        eval_windows,
    };
    let available = crate::memory::process::available_memory();
    Ok(preflight::check(plan, extra, available)?)
}

/// Windows of `seqlen` tokens in a text file of `bytes` bytes, roughly
/// (English BPE averages about 4 bytes a token), capped at `limit`.
pub fn approx_windows(bytes: u64, seqlen: usize, limit: Option<usize>) -> u64 {
    let n = bytes / 4 / seqlen.max(1) as u64;
    limit.map_or(n, |l| n.min(l as u64))
}

/// A plan with the fields every job fills.
pub fn base_plan(command: &str, argv: Vec<String>) -> RunPlan {
    RunPlan {
        command: command.into(),
        argv,
        host: HostInfo::current(),
        ..Default::default()
    }
}
