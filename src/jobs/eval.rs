//! The eval job: perplexity of a model on a text, streamed one layer at a
//! time (or resident), with stage snapshots around it.

use crate::exec::Compute;
use serde_json::json;

use super::config::EvalJob;
use super::context::{Run, RunOptions};
use super::{JobError, base_plan, text};
use crate::events::{Level, RunStatus, RunSummary, stages};
use crate::exec::OnDevice;
use crate::model::Checkpoint;
use crate::model::perplexity::{self, EvalOptions, Perplexity, Weights};

/// What an eval run found.
#[derive(Debug)]
pub struct Outcome {
    pub perplexity: Perplexity,
    pub seqlen: usize,
    pub summary: RunSummary,
    pub sink_errors: Vec<String>,
}

/// The JSON line `eval --json` prints: the perplexity and its pace, the
/// peaks, and the run's recorded results as prune's line has them (on a
/// device the pool's reserved peak, bytes and kernels by phase, which of
/// prunemem's kernels ran, NVML's utilisation; the seconds by phase).
pub fn json_line(o: &Outcome) -> serde_json::Value {
    let (r, s) = (&o.perplexity, &o.summary);
    let mut line = json!({
        "perplexity": r.perplexity, "windows": r.windows, "seqlen": o.seqlen,
        "tokens": r.windows * o.seqlen, "seconds": r.seconds,
        "tokens_per_second": r.tokens_per_second, "rss_peak": s.rss_peak,
        "device_peak": s.device_peak,
    });
    super::prune_output::recorded_results(&mut line, s);
    line
}

pub fn run(job: &EvalJob, options: RunOptions) -> Result<Outcome, JobError> {
    job.validate()?;
    let (ckpt, tok) = super::open_model(&job.model, &job.revision)?;
    let mut plan = base_plan("eval", job.argv.clone());
    let stored = crate::model::dtype::stored_name(ckpt.stored_dtype());
    plan.model = Some(ckpt.config.model_info(&job.model, &stored));
    let s = &mut plan.settings;
    s.insert("dtype".into(), json!(job.dtype.name()));
    s.insert("batch_size".into(), json!(job.batch_size));
    s.insert("resident".into(), json!(job.resident));
    let text_path = job.text.path.display().to_string();
    s.insert("eval_text".into(), json!(text_path));
    let (seqlen, capped) =
        crate::data::windows::resolve_seqlen(job.seqlen, ckpt.config.max_position_embeddings)?;
    plan.settings.insert("seqlen".into(), json!(seqlen));
    let text = Some(job.text.path.as_path());
    super::preflight(&mut plan, &tok, None, text, job.windows, seqlen, job.force)?;
    let mut run = Run::start(plan, options)?;
    let p = run.profiler.clone();
    if let Some(w) = capped {
        p.message(Level::Warn, w);
    }
    p.stage(stages::START);
    if let Err(e) = run.exec.check_dtype(job.dtype.burn()) {
        return Err(run.fail(e.into()));
    }
    let (windows, text_bytes) = text::evaluation(&tok, &job.text, seqlen, job.windows)?;
    let exec = run.exec.clone();
    let result = exec.run_caught(Evaluate {
        job,
        ckpt: &ckpt,
        windows: &windows,
        run: &mut run,
    });
    let result = match result {
        Ok(r) => r,
        Err(e) => return Err(run.fail(e)),
    };
    p.stage(stages::END);
    run.result("perplexity", result.perplexity);
    run.result("eval_windows", result.windows);
    run.result("seqlen", result.seqlen);
    run.result("eval_seconds", result.seconds);
    run.result("tokens_per_second", result.tokens_per_second);
    // The text tokenised (the selected lines), for `estimate --against`.
    run.result("text_bytes", text_bytes);
    let (summary, sink_errors) = run.finish(RunStatus::Ok);
    Ok(Outcome {
        perplexity: result,
        seqlen,
        summary,
        sink_errors,
    })
}

/// The evaluation on the run's backend.
struct Evaluate<'a> {
    job: &'a EvalJob,
    ckpt: &'a Checkpoint,
    windows: &'a [Vec<u32>],
    run: &'a mut Run,
}

impl OnDevice for Evaluate<'_> {
    type Output = Result<Perplexity, JobError>;
    fn run<B: Compute>(self, device: &B::Device) -> Self::Output {
        evaluate::<B>(self, device)
    }
}

/// Loads (when resident) and evaluates, between the eval stages.
fn evaluate<B: Compute>(e: Evaluate<'_>, device: &B::Device) -> Result<Perplexity, JobError> {
    let Evaluate {
        job,
        ckpt,
        windows,
        run,
    } = e;
    let p = run.profiler.clone();
    let (model, _model_held) = super::resident_model::<B>(ckpt, job.resident, job.dtype, device)?;
    p.stage(stages::MODEL_LOADED);
    let options = EvalOptions {
        batch_size: job.batch_size,
        dtype: job.dtype,
    };
    p.stage(stages::BEFORE_EVAL);
    let weights = match &model {
        Some(m) => Weights::Resident(m, &ckpt.config),
        None => Weights::Streamed(ckpt),
    };
    let result = {
        let _scope = p.scope(stages::EVAL_SCOPE);
        perplexity::perplexity::<B>(weights, windows, &options, device, Some(&p))?
    };
    p.stage(stages::AFTER_EVAL);
    drop(model);
    Ok(result)
}
