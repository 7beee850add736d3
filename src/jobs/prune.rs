//! The prune job: open the model, start the run, prune layer by layer (or
//! GradProbe), evaluate, save — with the stage snapshots of the reference
//! scripts around each step.

use crate::exec::Compute;
use std::path::PathBuf;

use serde_json::json;

use super::config::PruneJob;
use super::context::{Run, RunOptions};
use super::pruned::{Opened, Pruned, eval_results, layer_results};
use super::{JobError, base_plan, text};
use crate::events::{Level, RunStatus, RunSummary, stages};
use crate::exec::OnDevice;
use crate::model::Checkpoint;
use crate::model::kept::PrunedLayers;
use crate::model::perplexity::{self, EvalOptions, Perplexity, Weights};
use crate::model::save::PrunedWriter;
use crate::model::tokenizer::Tokenizer;
use crate::profiler::Profiler;
use crate::prune::Method;
use crate::prune::engine::{self, PruneConfig, Source};

/// What a prune run did.
#[derive(Debug)]
pub struct Outcome {
    pub prune: engine::PruneOutcome,
    pub perplexity: Option<Perplexity>,
    pub summary: RunSummary,
    /// Sink failures seen during the run, one line each.
    pub sink_errors: Vec<String>,
    /// Where the pruned model was saved.
    pub saved: Option<PathBuf>,
    /// Bytes of the saved model's weight files.
    pub saved_bytes: Option<u64>,
    /// The compressed layout written, when `--save-format compressed`.
    pub compressed: Option<crate::model::compressed::CompressReport>,
    /// Where the logs are.
    pub logs: Option<PathBuf>,
    /// The model's parameters × 4 bytes.
    pub fp32_model_bytes: u64,
    /// The device it computed on (`cpu`, `wgpu`, `cuda:0`).
    pub device: String,
}

/// Runs `job`, reporting to `options`' sinks (logs default to `SAVE/logs`).
pub fn run(job: &PruneJob, mut options: RunOptions) -> Result<Outcome, JobError> {
    job.validate()?;
    let (ckpt, tok) = super::open_model(&job.model, &job.revision)?;
    let (mut writer, asked_logs) = writer_and_logs(job, &ckpt, &mut options)?;
    let (seqlen, capped) = crate::data::windows::resolve_seqlen(
        job.requested_seqlen(),
        ckpt.config.max_position_embeddings,
    )?;
    let mut plan = plan(job, &ckpt, seqlen);
    let calib = job.calib.as_ref().map(|t| t.path.as_path());
    let eval = job.eval.as_ref().map(|t| t.path.as_path());
    let limit = job.eval_windows;
    super::preflight(&mut plan, &tok, calib, eval, limit, seqlen, job.force)?;
    let mut run = Run::start(plan, options)?;
    let p = run.profiler.clone();
    if let Some(w) = capped {
        p.message(Level::Warn, w);
    }
    if let Err(e) = run.exec.check_dtype(job.dtype.burn()) {
        return Err(run.fail(e.into()));
    }
    let exec = run.exec.clone();
    let dense = DenseEval {
        job,
        ckpt: &ckpt,
        tok: &tok,
        seqlen,
        run: &mut run,
    };
    if let Err(e) = exec.run_caught(dense) {
        return Err(run.fail(e));
    }
    let gradprobe = job.method == Method::GradProbe;
    let closing = if gradprobe {
        p.stage(stages::GP_INITIAL);
        stages::GRADPROBE_CLOSING
    } else {
        p.stage(stages::START);
        stages::SEQUENTIAL_CLOSING
    };
    let opened = Opened { ckpt, tok, seqlen };
    let pruned = exec.run_caught(Pruning {
        job,
        opened: &opened,
        writer: writer.as_mut(),
        run: &mut run,
    });
    let pruned = match pruned {
        Ok(o) => o,
        Err(e) => return Err(run.fail(e)),
    };
    rank_results(&mut run);
    let (saved, compressed) = match writer {
        Some(w) => {
            p.stage(closing[0]);
            let (dir, report) = match save(w, job, &opened.ckpt) {
                Ok(written) => written,
                Err(e) => return Err(run.fail(e.into())),
            };
            p.stage(closing[1]);
            (Some(dir), report)
        }
        None => (None, None),
    };
    let saved_bytes = saved.as_deref().map(weight_file_bytes);
    if let Some(b) = saved_bytes {
        run.result("saved_bytes", b);
        run.result("save_format", json!(job.save_format));
    }
    // What the run freed goes back before its last stage: a library
    // caller's process (the Python module's) goes on after the run.
    crate::memory::alloc::trim();
    p.stage(closing[2]);
    let device = run.exec.spec().to_string();
    let (summary, sink_errors) = run.finish(RunStatus::Ok);
    let logs = match (asked_logs, &saved) {
        (Some(l), _) => Some(l),
        (None, Some(dir)) => Some(dir.join("logs")),
        _ => None,
    };
    Ok(Outcome {
        prune: pruned.prune,
        perplexity: pruned.perplexity,
        summary,
        sink_errors,
        saved,
        saved_bytes,
        compressed,
        logs,
        fp32_model_bytes: opened.ckpt.config.param_count() * 4,
        device,
    })
}

/// The pruned model's writer (rank 0 alone writes it: every rank derives
/// the same) and where the logs go: where asked (returned), else
/// `SAVE/logs`, written inside the partial folder (guarded by the save's
/// own lock) and renamed into place with it at the end.
fn writer_and_logs(
    job: &PruneJob,
    ckpt: &Checkpoint,
    options: &mut RunOptions,
) -> Result<(Option<PrunedWriter>, Option<PathBuf>), JobError> {
    let writer = match &job.save {
        Some(dir) if crate::exec::dist::is_writer() => {
            Some(PrunedWriter::create(ckpt, dir, job.overwrite)?)
        }
        _ => None,
    };
    let asked_logs = options.log_dir.clone();
    options.lock_logs = asked_logs.is_some();
    options.log_dir = asked_logs
        .clone()
        .or_else(|| writer.as_ref().map(|w| w.partial_dir().join("logs")));
    Ok((writer, asked_logs))
}

/// Writes the pruned model: dense, or in the compressed-tensors layout the
/// job asked for (with its report).
fn save(
    w: PrunedWriter,
    job: &PruneJob,
    ckpt: &Checkpoint,
) -> Result<
    (
        std::path::PathBuf,
        Option<crate::model::compressed::CompressReport>,
    ),
    crate::model::ModelError,
> {
    match job.save_format.sparse_format(job.pattern, job.reallocation) {
        None => Ok((w.finish(ckpt)?, None)),
        Some(format) => {
            let (dir, report) = w.finish_compressed(ckpt, format)?;
            Ok((dir, Some(report)))
        }
    }
}

/// The run's plan: the model and every setting that shapes memory.
fn plan(job: &PruneJob, ckpt: &Checkpoint, seqlen: usize) -> crate::events::RunPlan {
    let mut plan = base_plan("prune", job.argv.clone());
    let stored = crate::model::dtype::stored_name(ckpt.stored_dtype());
    plan.model = Some(ckpt.config.model_info(&job.model, &stored));
    plan.method = Some(job.method.to_string());
    let s = &mut plan.settings;
    s.insert("sparsity".into(), json!(job.sparsity));
    s.insert("sparsity_type".into(), json!(job.pattern.to_string()));
    s.insert("nsamples".into(), json!(job.nsamples));
    s.insert("seed".into(), json!(job.seed));
    s.insert("dtype".into(), json!(job.dtype.name()));
    s.insert("batch_size".into(), json!(job.batch_size()));
    s.insert("resident".into(), json!(job.resident));
    s.insert("offload_activations".into(), json!(job.offload_activations));
    s.insert("use_variant".into(), json!(job.use_variant));
    let save = job.save.as_ref().map(|p| p.display().to_string());
    s.insert("save".into(), json!(save));
    s.insert("save_format".into(), json!(job.save_format));
    s.insert("eval_windows".into(), json!(job.eval_windows));
    s.insert("eval_dense".into(), json!(job.eval_dense));
    let keep = job.keep_pruned.map_or("auto", |p| p.name());
    s.insert("keep_pruned".into(), json!(keep));
    if job.method == Method::SparseGpt {
        s.insert("percdamp".into(), json!(job.percdamp));
        s.insert("blocksize".into(), json!(job.blocksize));
    }
    if job.method == Method::GradProbe {
        super::gradprobe::plan_settings(job, s);
    }
    if let Some(owl) = job.owl {
        s.insert("owl_lambda".into(), json!(owl.lambda));
        s.insert("owl_m".into(), json!(owl.m));
    }
    if let Some(d) = job.dsnot {
        s.insert("dsnot_max_cycles".into(), json!(d.max_cycles));
        s.insert("dsnot_threshold".into(), json!(d.update_threshold));
        s.insert("dsnot_pow_var".into(), json!(d.pow_of_var));
        s.insert("dsnot_skip".into(), json!(d.skip.to_string()));
    }
    if job.method == Method::Ria {
        s.insert("ria_a".into(), json!(job.ria_a));
        s.insert("per_outneuron".into(), json!(job.per_outneuron));
        s.insert("reallocation".into(), json!(job.reallocation));
        s.insert("lsa".into(), json!(job.lsa));
    }
    s.insert("seqlen".into(), json!(seqlen));
    plan
}

/// Bytes of a folder's `.safetensors` files.
pub fn weight_file_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// A prune's device part on the run's backend: GradProbe's, or
/// [`prune_and_eval`] for the layer-by-layer methods.
struct Pruning<'a, 'w> {
    job: &'a PruneJob,
    opened: &'a Opened,
    writer: Option<&'w mut PrunedWriter>,
    run: &'a mut Run,
}

impl OnDevice for Pruning<'_, '_> {
    type Output = Result<Pruned, JobError>;
    fn run<B: Compute>(self, device: &B::Device) -> Self::Output {
        let pruned = match self.job.method {
            Method::GradProbe => super::gradprobe::prune_and_eval::<B>(
                self.job,
                self.opened,
                self.writer,
                self.run,
                device,
            ),
            _ => prune_and_eval::<B>(self.job, self.opened, self.writer, self.run, device),
        };
        // The kept layers and the evaluation's buffers are gone: their
        // memory goes back to the driver (`exec::cube`).
        crate::exec::release_free::<B>(device);
        pruned
    }
}

/// `--eval-dense` on the run's backend ([`dense_eval`]).
struct DenseEval<'a> {
    job: &'a PruneJob,
    ckpt: &'a Checkpoint,
    tok: &'a Tokenizer,
    seqlen: usize,
    run: &'a mut Run,
}

impl OnDevice for DenseEval<'_> {
    type Output = Result<(), JobError>;
    fn run<B: Compute>(self, device: &B::Device) -> Self::Output {
        dense_eval::<B>(self.job, self.ckpt, self.tok, self.seqlen, self.run, device)
    }
}

/// This rank's calibration windows (all of them in one process; the same
/// windows on every rank, drawn from the same seed, split by batches) and
/// the bytes of text tokenised for them; none for plain magnitude.
fn calibration_windows(
    job: &PruneJob,
    tok: &crate::model::tokenizer::Tokenizer,
    seqlen: usize,
) -> Result<(Vec<Vec<u32>>, u64), JobError> {
    let (calib, text_bytes) = match (&job.calib, job.method) {
        (Some(src), m) if m != Method::Magnitude || job.owl.is_some() || job.dsnot.is_some() => {
            text::calibration(tok, src, job.nsamples, seqlen, job.seed)?
        }
        _ => (Vec::new(), 0),
    };
    if calib.is_empty() {
        return Ok((calib, text_bytes));
    }
    let batch = job.batch_size();
    let batches = calib.len().div_ceil(batch);
    crate::exec::dist::check_share("calibration batches", batches, "--nsamples, --batch-size")?;
    Ok((crate::exec::dist::share_batches(&calib, batch), text_bytes))
}

/// OWL's outlier pass and the layer sparsities it gives, recorded in the
/// run's results (with a warning for layers clamped into (0, 1)).
#[allow(clippy::too_many_arguments)]
fn owl_sparsities<B: Compute>(
    job: &PruneJob,
    owl: crate::prune::owl::OwlConfig,
    ckpt: &Checkpoint,
    source: &Source<'_, B>,
    config: &PruneConfig,
    calib: &[Vec<u32>],
    run: &mut Run,
    device: &B::Device,
) -> Result<Vec<f64>, JobError> {
    let p = run.profiler.clone();
    let ratios = crate::prune::owl::outlier_pass(ckpt, source, config, calib, owl, device, &p)?;
    let (sparsities, clamped) =
        crate::prune::owl::layer_sparsities(&ratios, job.sparsity, owl.lambda);
    if !clamped.is_empty() {
        p.message(
            Level::Warn,
            format!(
                "OWL: the sparsity of layers {clamped:?} fell outside (0, 1) and was clamped to 0.01 or 0.99 (λ {} is large for sparsity {})",
                owl.lambda, job.sparsity
            ),
        );
    }
    run.result("owl_outlier_ratios", json!(ratios));
    run.result("owl_layer_sparsity", json!(sparsities));
    Ok(sparsities)
}

/// Magnitude, Wanda, SparseGPT, RIA (with OWL and DSnoT): the
/// layer-by-layer engine, then the evaluation streamed from what was written
/// (or from the resident model).
fn prune_and_eval<B: Compute>(
    job: &PruneJob,
    opened: &Opened,
    mut writer: Option<&mut PrunedWriter>,
    run: &mut Run,
    device: &B::Device,
) -> Result<Pruned, JobError> {
    let Opened { ckpt, tok, seqlen } = opened;
    let p = run.profiler.clone();
    let (calib, mut text_bytes) = calibration_windows(job, tok, *seqlen)?;
    // Only the windows are kept: the tokenised text is dropped here.
    let eval_wins = match &job.eval {
        Some(src) => {
            let (wins, bytes) = text::evaluation(tok, src, *seqlen, job.eval_windows)?;
            text_bytes = text_bytes.max(bytes);
            Some(wins)
        }
        None => None,
    };
    let (mut model, _model_held) =
        super::resident_model::<B>(ckpt, job.resident, job.dtype, device)?;
    p.stage(stages::MODEL_LOADED);
    let mut config = engine_config(job, *seqlen)?;
    if let Some(owl) = job.owl {
        let source = match model.as_mut() {
            Some(m) => Source::Resident(m),
            None => Source::Streamed,
        };
        let sparsities = owl_sparsities(job, owl, ckpt, &source, &config, &calib, run, device)?;
        config.layer_sparsity = Some(sparsities);
    }
    // Where the pruned layers wait for the evaluation (`jobs::waiting`).
    let streamed_eval = eval_wins.as_deref().filter(|_| model.is_none());
    let waiting =
        super::waiting::choose::<B>(job, opened, streamed_eval, writer.is_some(), run, device)?;
    let super::waiting::Waiting {
        mut kept,
        mut inline,
        mut scratch,
    } = waiting;
    let source = match model.as_mut() {
        Some(m) => Source::Resident(m),
        None => Source::Streamed,
    };
    let target = match (&mut writer, &mut scratch) {
        (Some(w), _) => Some(&mut **w),
        (None, Some((_, w))) => Some(w),
        _ => None,
    };
    let keep: Option<&mut dyn PrunedLayers<B>> = match (kept.as_mut(), inline.as_mut()) {
        (Some(k), _) => Some(k),
        (None, Some(e)) => Some(e),
        (None, None) => None,
    };
    let mut prune = engine::prune::<B>(ckpt, source, &config, &calib, target, keep, device, &p)?;
    // The evaluation's seconds inside the prune are the evaluation's.
    prune.seconds -= inline.as_ref().map_or(0.0, |e| e.seconds());
    layer_results(run, &prune);
    run.result("text_bytes", text_bytes);
    let seconds: Vec<f64> = prune.layers.iter().map(|l| l.seconds).collect();
    run.result("layer_seconds", seconds);
    if crate::exec::dist::world().1 > 1 {
        let layers = &prune.layers;
        let wait: Vec<f64> = layers.iter().map(|l| l.reduction_seconds).collect();
        let bytes: Vec<u64> = layers.iter().map(|l| l.reduced_bytes).collect();
        run.result("layer_reduction_seconds", wait);
        run.result("layer_reduced_bytes", bytes);
    }
    let Some(windows) = &eval_wins else {
        return Ok(Pruned {
            prune,
            perplexity: None,
        });
    };
    // Streaming: the pruned layers were evaluated or kept, or are on disk
    // (complete that folder).
    let in_memory = kept.is_some() || inline.is_some();
    let pruned = match (&model, in_memory, writer, &mut scratch) {
        (Some(_), _, _, _) | (None, true, _, _) => None,
        (None, false, Some(w), _) => Some(Checkpoint::open(&w.complete(ckpt)?)?),
        (None, false, None, Some((_, w))) => Some(Checkpoint::open(&w.complete(ckpt)?)?),
        (None, false, None, None) => {
            return Err(internal("pruned weights were not kept for evaluation"));
        }
    };
    let weights = match (&model, &kept, inline, &pruned) {
        (Some(m), _, _, _) => Weights::Resident(m, &ckpt.config),
        (None, Some(k), _, _) => Weights::Kept(ckpt, k),
        (None, None, Some(e), _) => Weights::Evaluated(e.finish()?),
        (None, None, None, Some(c)) => Weights::Streamed(c),
        (None, None, None, None) => return Err(internal("nothing to evaluate")),
    };
    let result = evaluate(job, weights, windows, run, device)?;
    Ok(Pruned {
        prune,
        perplexity: Some(result),
    })
}

/// A distributed run's per-rank figures, gathered on every rank and kept
/// in rank 0's results: peak RSS, bytes moved in reductions and seconds
/// spent in them (the slowest rank's lead is the others' wait).
fn rank_results(run: &mut Run) {
    let r = crate::exec::dist::reducer();
    if r.world().1 == 1 {
        return;
    }
    let mine = run.profiler.snapshot("ranks").rss_peak;
    let peaks = r.gather_f64(mine.map_or(-1.0, |b| b as f64));
    let (bytes, seconds) = r.traffic();
    let bytes = r.gather_f64(bytes as f64);
    let seconds = r.gather_f64(seconds);
    run.result("rank_rss_peaks", json!(peaks));
    run.result("rank_reduced_bytes", json!(bytes));
    run.result("rank_reduction_seconds", json!(seconds));
}

/// The engine's settings for `job`.
fn engine_config(job: &PruneJob, seqlen: usize) -> Result<PruneConfig, JobError> {
    Ok(PruneConfig {
        method: job.method.try_into()?,
        sparsity: job.sparsity,
        pattern: job.pattern,
        use_variant: job.use_variant,
        seqlen,
        batch_size: job.batch_size(),
        dtype: job.dtype,
        percdamp: job.percdamp,
        blocksize: job.blocksize,
        ria_a: job.ria_a,
        per_outneuron: job.per_outneuron,
        layer_sparsity: None,
        dsnot: job.dsnot,
        reallocation: job.reallocation.then_some(job.lsa),
        offload_activations: job.offload_activations,
    })
}

/// The pruned model's perplexity, between the eval stages.
fn evaluate<B: Compute>(
    job: &PruneJob,
    weights: Weights<'_, B>,
    windows: &[Vec<u32>],
    run: &mut Run,
    device: &B::Device,
) -> Result<Perplexity, JobError> {
    let p = run.profiler.clone();
    // What pruning freed goes back to the system before the evaluation.
    crate::exec::give_back::<B>(device);
    p.stage(stages::BEFORE_EVAL);
    let result = scoped_perplexity(job, weights, windows, &p, stages::EVAL_SCOPE, device)?;
    crate::exec::release_free::<B>(device);
    p.stage(stages::AFTER_EVAL);
    eval_results(run, &result);
    Ok(result)
}

/// Perplexity of `windows` with the job's batch size and dtype, inside the
/// profiler scope `scope`.
fn scoped_perplexity<B: Compute>(
    job: &PruneJob,
    weights: Weights<'_, B>,
    windows: &[Vec<u32>],
    p: &Profiler,
    scope: &str,
    device: &B::Device,
) -> Result<Perplexity, JobError> {
    let options = EvalOptions {
        batch_size: job.batch_size(),
        dtype: job.dtype,
    };
    let _scope = p.scope(scope);
    Ok(perplexity::perplexity::<B>(
        weights,
        windows,
        &options,
        device,
        Some(p),
    )?)
}

/// `--eval-dense`: the unpruned model's perplexity on the evaluation
/// windows, streamed from the checkpoint, before the run's first stage (its
/// windows are made again for the pruned model; only one set is held at a
/// time).
fn dense_eval<B: Compute>(
    job: &PruneJob,
    ckpt: &Checkpoint,
    tok: &Tokenizer,
    seqlen: usize,
    run: &mut Run,
    device: &B::Device,
) -> Result<(), JobError> {
    let (true, Some(src)) = (job.eval_dense, &job.eval) else {
        return Ok(());
    };
    let p = run.profiler.clone();
    p.stage(stages::BEFORE_DENSE_EVAL);
    let (windows, _) = text::evaluation(tok, src, seqlen, job.eval_windows)?;
    let weights = Weights::<B>::Streamed(ckpt);
    let result = scoped_perplexity(job, weights, &windows, &p, stages::DENSE_EVAL_SCOPE, device)?;
    drop(windows);
    // What the evaluation freed goes back to the system before pruning.
    crate::memory::alloc::trim();
    p.stage(stages::AFTER_DENSE_EVAL);
    p.message(
        Level::Info,
        format!(
            "dense perplexity {:.4} on {} windows",
            result.perplexity, result.windows
        ),
    );
    run.result("dense_perplexity", result.perplexity);
    run.result("dense_eval_seconds", result.seconds);
    Ok(())
}

fn internal(what: &str) -> JobError {
    crate::prune::PruneError::Invalid(format!("internal: {what}")).into()
}
