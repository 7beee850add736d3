//! The train job: open the model, tokenise the text, cut it into windows,
//! run the training steps (`crate::train`) with their stages, and report
//! both profiling approaches and the gap between them.

use serde_json::json;

use super::context::{Run, RunOptions};
use super::{JobError, TextSource, base_plan, text};
use crate::events::{Level, RunStatus, RunSummary, stages};
use crate::exec::{Compute, OnDevice};
use crate::memory::MemorySnapshot;
use crate::model::Checkpoint;
use crate::profiler::Profiler;
use crate::train::analysis::{self, Gap};
use crate::train::{self, StepRecord, TrainConfig, TrainError};

/// The training loop on the run's backend.
struct Train<'a> {
    ckpt: &'a Checkpoint,
    windows: &'a [Vec<u32>],
    config: &'a TrainConfig,
    p: &'a Profiler,
}

/// What the job keeps of a training run (the trained model is dropped on
/// the device it lives on).
struct Trained {
    steps: Vec<StepRecord>,
    params: u64,
    trainable_params: u64,
    steps_per_epoch: usize,
    stages: Vec<MemorySnapshot>,
}

impl OnDevice for Train<'_> {
    type Output = Result<Trained, TrainError>;
    fn run<B: Compute>(self, device: &B::Device) -> Self::Output {
        let o = train::train_on::<B>(self.ckpt, self.windows, self.config, self.p, device)?;
        Ok(Trained {
            steps: o.steps,
            params: o.params,
            trainable_params: o.trainable_params,
            steps_per_epoch: o.steps_per_epoch,
            stages: o.stages,
        })
    }
}

/// A training run, as a front end asks for it.
#[derive(Debug, Clone)]
pub struct TrainJob {
    pub model: String,
    pub revision: String,
    pub text: TextSource,
    /// Requested window length (capped at the model's positions).
    pub seqlen: Option<usize>,
    pub config: TrainConfig,
    pub force: bool,
    pub argv: Vec<String>,
}

/// What a training run did.
#[derive(Debug)]
pub struct Outcome {
    pub steps: Vec<StepRecord>,
    pub params: u64,
    pub trainable_params: u64,
    pub seqlen: usize,
    pub gap: Option<Gap>,
    pub summary: RunSummary,
    pub sink_errors: Vec<String>,
    pub logs: Option<std::path::PathBuf>,
}

impl From<TrainError> for JobError {
    fn from(e: TrainError) -> Self {
        match e {
            TrainError::Invalid(m) => JobError::Config(super::ConfigError::new(&m, &[])),
            TrainError::Model(m) => JobError::Model(m),
        }
    }
}

/// Parameters `freeze` leaves trainable, and the lowest trainable layer
/// (for the plan, so estimates made from it count what is trained).
fn trainable_of(
    c: &crate::model::LlamaConfig,
    freeze: &crate::train::Freeze,
) -> Result<(u64, usize), JobError> {
    let arch = crate::estimate::Arch::from_config("", c);
    let layers = freeze.resolve(c.num_layers).map_err(TrainError::Invalid)?;
    let mut frozen = layers.len() as u64 * arch.layer_params();
    if freeze.embeddings {
        frozen += arch.embedding_params();
    }
    if freeze.head && !arch.tied {
        frozen += arch.embedding_params();
    }
    if freeze.norm {
        frozen += arch.hidden;
    }
    let floor = freeze
        .backward_floor(c.num_layers)
        .map_err(TrainError::Invalid)?;
    Ok((arch.params.saturating_sub(frozen), floor))
}

pub fn run(job: &TrainJob, options: RunOptions) -> Result<Outcome, JobError> {
    if crate::exec::dist::world().1 > 1 {
        return Err(crate::exec::ExecError::Distributed(
            "train does not run across MPI ranks: run it as one process".into(),
        )
        .into());
    }
    let (ckpt, tok) = super::open_model(&job.model, &job.revision)?;
    let (seqlen, capped) =
        crate::data::windows::resolve_seqlen(job.seqlen, ckpt.config.max_position_embeddings)?;
    let mut config = job.config.clone();
    config.seqlen = seqlen;
    config.validate()?;
    let mut plan = plan_of(job, &ckpt, &config)?;
    let text_path = Some(job.text.path.as_path());
    super::preflight(&mut plan, &tok, text_path, None, None, seqlen, job.force)?;
    let mut run = Run::start(plan, options)?;
    if let Err(e) = run.exec.check_dtype(config.dtype.burn()) {
        return Err(run.fail(e.into()));
    }
    let exec = run.exec.clone();
    let p = run.profiler.clone();
    if let Some(w) = capped {
        p.message(Level::Warn, w);
    }
    p.stage(stages::TRAIN_START);
    let result = (|| -> Result<_, JobError> {
        let (tokens, text_bytes) = text::tokenize(&tok, &job.text)?;
        let windows = train::windows(&tokens, seqlen);
        drop(tokens);
        p.stage(stages::TRAIN_DATA_PREPARED);
        let outcome = exec.run(Train {
            ckpt: &ckpt,
            windows: &windows,
            config: &config,
            p: &p,
        })?;
        Ok((outcome, text_bytes))
    })();
    let (outcome, text_bytes) = match result {
        Ok(o) => o,
        Err(e) => return Err(run.fail(e)),
    };
    p.stage(stages::TRAIN_END);
    record(&mut run, &outcome, text_bytes);
    let gap = analysis::analyze(&outcome.stages);
    if let Some(g) = &gap {
        run.result("training_gap", json!(g));
    }
    let logs = run.log_dir.clone();
    let (summary, sink_errors) = run.finish(RunStatus::Ok);
    Ok(Outcome {
        steps: outcome.steps,
        params: outcome.params,
        trainable_params: outcome.trainable_params,
        seqlen,
        gap,
        summary,
        sink_errors,
        logs,
    })
}

/// The run's plan: the model, and the training settings
/// `estimate --against` rebuilds the workload from.
fn plan_of(
    job: &TrainJob,
    ckpt: &Checkpoint,
    c: &TrainConfig,
) -> Result<crate::events::RunPlan, JobError> {
    let mut plan = base_plan("train", job.argv.clone());
    let stored = crate::model::dtype::stored_name(ckpt.stored_dtype());
    plan.model = Some(ckpt.config.model_info(&job.model, &stored));
    plan.method = Some("train".into());
    let s = &mut plan.settings;
    s.insert("dtype".into(), json!(c.dtype.name()));
    s.insert("batch_size".into(), json!(c.batch_size));
    s.insert("grad_accum".into(), json!(c.grad_accum));
    s.insert("seqlen".into(), json!(c.seqlen));
    s.insert("optimizer".into(), json!(c.optimizer.kind.name()));
    s.insert("lr".into(), json!(c.lr));
    s.insert("weight_decay".into(), json!(c.optimizer.weight_decay));
    s.insert("checkpointing".into(), json!(c.checkpointing));
    s.insert("epochs".into(), json!(c.epochs));
    if let Some(n) = c.steps {
        s.insert("steps".into(), json!(n));
    }
    s.insert(
        "train_text".into(),
        json!(job.text.path.display().to_string()),
    );
    let (trainable, first) = trainable_of(&ckpt.config, &c.freeze)?;
    s.insert("trainable_params".into(), json!(trainable));
    s.insert("first_trainable_layer".into(), json!(first));
    Ok(plan)
}

/// The finished loop's results: its losses and step times, the model's
/// sizes, and the text tokenised (the selected lines, for
/// `estimate --against`).
fn record(run: &mut Run, outcome: &Trained, text_bytes: u64) {
    let first = outcome.steps.first().map(|r| r.loss);
    let last = outcome.steps.last().map(|r| r.loss);
    run.result("steps", outcome.steps.len());
    run.result("text_bytes", text_bytes);
    run.result("first_loss", json!(first));
    run.result("last_loss", json!(last));
    run.result(
        "losses",
        json!(outcome.steps.iter().map(|r| r.loss).collect::<Vec<_>>()),
    );
    run.result(
        "step_seconds",
        json!(outcome.steps.iter().map(|r| r.seconds).collect::<Vec<_>>()),
    );
    run.result("params", outcome.params);
    run.result("trainable_params", outcome.trainable_params);
    run.result("steps_per_epoch", outcome.steps_per_epoch);
}
