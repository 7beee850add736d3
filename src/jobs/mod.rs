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

/// A plan with the fields every job fills.
pub fn base_plan(command: &str, argv: Vec<String>) -> RunPlan {
    RunPlan {
        command: command.into(),
        argv,
        host: HostInfo::current(),
        ..Default::default()
    }
}
