//! `prunemem prune`: prune a model layer by layer, optionally evaluate it and
//! save it in the Hugging Face layout, with stage snapshots throughout.

use std::path::PathBuf;

use burn::backend::Flex;
use clap::Args;
use serde_json::json;

use super::CliResult;
use super::common::{self, ReportArgs};
use crate::data::windows::{calibration_from_documents, calibration_windows, eval_windows};
use crate::data::{self, Corpus, LineRange};
use crate::eval::{self, EvalOptions, Weights};
use crate::events::{Level, RunStatus};
use crate::model::save::PrunedWriter;
use crate::model::tokenizer::Tokenizer;
use crate::model::{Checkpoint, ComputeDtype, hub};
use crate::profiler::Profiler;
use crate::prune::engine::{self, PruneConfig, PruneOutcome, Source};
use crate::prune::gradprobe::{GradPrecision, Strategy};
use crate::prune::{Method, Pattern, validate};
use crate::run::Run;

#[derive(Args, Debug)]
pub struct PruneArgs {
    /// Model folder or Hugging Face Hub id
    #[arg(long, value_name = "DIR|ORG/NAME")]
    pub model: String,
    /// Hub revision when --model is a Hub id
    #[arg(long, default_value = "main")]
    pub revision: String,
    /// Pruning method: magnitude, wanda, sparsegpt or gradprobe
    #[arg(long, alias = "prune_method", default_value = "wanda")]
    pub method: Method,
    /// Fraction of each decoder linear's weights to remove, in [0, 1)
    #[arg(
        long,
        alias = "sparsity_ratio",
        default_value_t = 0.5,
        allow_negative_numbers = true
    )]
    pub sparsity: f64,
    /// unstructured, 2:4, 4:8 (any N:M)
    #[arg(long, alias = "sparsity_type", default_value = "unstructured")]
    pub sparsity_type: Pattern,
    /// Calibration windows
    #[arg(long, default_value_t = 128)]
    pub nsamples: usize,
    /// Window length in tokens (default 2048, 128 for gradprobe; capped at the model's max positions)
    #[arg(long)]
    pub seqlen: Option<usize>,
    /// Seed of the calibration sampling (Python random.seed semantics)
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Calibration text (plain text, or .jsonl with a "text" field sampled like C4)
    #[arg(long, value_name = "FILE")]
    pub calib_text: Option<PathBuf>,
    /// Lines of --calib-text to use: all, first-half, second-half or START:END
    #[arg(long, default_value = "all", value_name = "RANGE")]
    pub calib_lines: LineRange,
    /// Evaluate perplexity after pruning on this text
    #[arg(long, value_name = "FILE")]
    pub eval_text: Option<PathBuf>,
    /// Lines of --eval-text to use
    #[arg(long, default_value = "all", value_name = "RANGE")]
    pub eval_lines: LineRange,
    /// Evaluate only the first K windows
    #[arg(long, value_name = "K")]
    pub eval_windows: Option<usize>,
    /// Wanda: the α-bisection variant (per-row cumulative-metric threshold)
    #[arg(long, alias = "use_variant")]
    pub use_variant: bool,
    /// Save the pruned model here (Hugging Face layout, same names and dtype)
    #[arg(long, alias = "save_model", value_name = "DIR")]
    pub save: Option<PathBuf>,
    /// Keep the whole model loaded instead of streaming one layer at a time
    #[arg(long)]
    pub resident: bool,
    /// Compute dtype
    #[arg(long, default_value = "f32")]
    pub dtype: ComputeDtype,
    /// Windows per forward pass (default 8; gradprobe: windows per gradient batch, default 1)
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// SparseGPT dampening, as a fraction of the mean Hessian diagonal
    #[arg(long, default_value_t = 0.01)]
    pub percdamp: f64,
    /// SparseGPT column block size
    #[arg(long, default_value_t = 128)]
    pub blocksize: usize,
    /// Print the result as one JSON line
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub gradprobe: GradProbeArgs,
    #[command(flatten)]
    pub report: ReportArgs,
}

/// GradProbe's settings (defaults are the reference's).
#[derive(Args, Debug, Clone)]
pub struct GradProbeArgs {
    /// GradProbe: how tentative candidates are chosen (magnitude or wanda)
    #[arg(long, default_value = "magnitude", help_heading = "GradProbe")]
    pub strategy: Strategy,
    /// GradProbe: tentative weights are multiplied by this for the second pass
    #[arg(long, default_value_t = 0.1, help_heading = "GradProbe")]
    pub reduction_factor: f64,
    /// GradProbe: prune iff modified |grad| <= original |grad| x (1 + this)
    #[arg(
        long,
        default_value_t = 0.0,
        help_heading = "GradProbe",
        allow_negative_numbers = true
    )]
    pub gradient_threshold: f64,
    /// GradProbe: calibration batches per gradient pass (max |grad| over them)
    #[arg(long, default_value_t = 1, help_heading = "GradProbe")]
    pub num_batches: usize,
    /// GradProbe: tokens between the starts of calibration windows (default seqlen/2)
    #[arg(long, help_heading = "GradProbe")]
    pub stride: Option<usize>,
    /// GradProbe: also probe the embeddings and a separate LM head (every >=2-D parameter)
    #[arg(long, help_heading = "GradProbe")]
    pub include_embeddings: bool,
    /// GradProbe: storage of the original gradient maxima (f16 or f32)
    #[arg(long, default_value = "f16", help_heading = "GradProbe")]
    pub grad_precision: GradPrecision,
    /// GradProbe: raise sparsity step by step while perplexity holds
    #[arg(long, help_heading = "GradProbe")]
    pub iterative: bool,
    /// GradProbe --iterative: first target sparsity
    #[arg(long, default_value_t = 0.1, help_heading = "GradProbe")]
    pub initial_sparsity: f64,
    /// GradProbe --iterative: sparsity added per step
    #[arg(long, default_value_t = 0.1, help_heading = "GradProbe")]
    pub sparsity_step: f64,
    /// GradProbe --iterative: stop when perplexity exceeds the dense one by more than this (absolute)
    #[arg(long, default_value_t = 3.0, help_heading = "GradProbe")]
    pub max_ppl_increase: f64,
}

/// Calibration windows for `args`, from the calibration text.
/// Calibration windows for `args`, and the bytes of text tokenised.
fn calibration(
    args: &PruneArgs,
    tok: &Tokenizer,
    seqlen: usize,
) -> CliResult<(Vec<Vec<u32>>, u64)> {
    if args.method == Method::Magnitude {
        return Ok((Vec::new(), 0));
    }
    let Some(path) = &args.calib_text else {
        return Err(format!("--calib-text is required for --method {}", args.method).into());
    };
    Ok(match data::read_corpus(path, args.calib_lines)? {
        Corpus::Text(text) => (
            calibration_windows(&tok.encode(&text)?, args.nsamples, seqlen, args.seed)?,
            text.len() as u64,
        ),
        Corpus::Documents(docs) => {
            let encode = |s: &str| tok.encode(s).map_err(|e| e.to_string());
            let bytes = docs.iter().map(|d| d.len() as u64).max().unwrap_or(0);
            (
                calibration_from_documents(&docs, &encode, args.nsamples, seqlen, args.seed)?,
                bytes,
            )
        }
    })
}

/// Prints what `check_sparsity` prints, and returns the overall sparsity.
pub fn sparsity_lines(outcome: &PruneOutcome) -> String {
    let mut s = String::new();
    for l in &outcome.layers {
        s += &format!("layer {} sparsity {:.6}\n", l.index, l.sparsity());
    }
    s += &format!("sparsity sanity check {:.4}\n", outcome.sparsity());
    s
}

/// What a finished `prune` reports back to callers such as `demo`.
pub struct PruneReport {
    pub sparsity: f64,
    pub perplexity: Option<f64>,
}

pub fn run(args: PruneArgs, argv: Vec<String>) -> CliResult<i32> {
    execute(args, argv).map(|_| 0)
}

/// Runs `prune` and returns what it found.
pub fn execute(args: PruneArgs, argv: Vec<String>) -> CliResult<PruneReport> {
    validate(
        args.method,
        args.sparsity,
        args.sparsity_type,
        args.nsamples,
    )?;
    let gradprobe = args.method == Method::GradProbe;
    if gradprobe {
        super::gradprobe::validate(&args)?;
    }
    if args.batch_size == Some(0) || args.blocksize == 0 {
        return Err("--batch-size and --blocksize must be at least 1".into());
    }
    if args.eval_windows == Some(0) {
        return Err("--eval-windows must be at least 1".into());
    }
    if args.use_variant
        && (args.method != Method::Wanda || args.sparsity_type != Pattern::Unstructured)
    {
        return Err("--use-variant applies to --method wanda with unstructured sparsity".into());
    }
    for (flag, path) in [
        ("--calib-text", &args.calib_text),
        ("--eval-text", &args.eval_text),
    ] {
        if let Some(p) = path
            && !p.is_file()
        {
            return Err(format!("{flag} {}: no such file", p.display()).into());
        }
    }
    let model_dir = hub::resolve(&args.model, &args.revision)?;
    let ckpt = Checkpoint::open(&model_dir)?;
    let tok = common::load_tokenizer(&model_dir)?;
    let mut writer = match &args.save {
        Some(dir) => Some(PrunedWriter::create(&ckpt, dir)?),
        None => None,
    };
    // Logs default to SAVE/logs (written inside the partial folder, which is
    // renamed into place at the end).
    let log_dir = args
        .report
        .log_memory
        .clone()
        .or_else(|| writer.as_ref().map(|w| w.partial_dir().join("logs")));

    let mut plan = common::base_plan("prune", argv);
    plan.model = Some(ckpt.config.model_info(
        &args.model,
        &crate::model::dtype::stored_name(ckpt.stored_dtype()),
    ));
    plan.method = Some(args.method.to_string());
    let s = &mut plan.settings;
    s.insert("sparsity".into(), json!(args.sparsity));
    s.insert(
        "sparsity_type".into(),
        json!(args.sparsity_type.to_string()),
    );
    s.insert("nsamples".into(), json!(args.nsamples));
    s.insert("seed".into(), json!(args.seed));
    s.insert("dtype".into(), json!(args.dtype.name()));
    s.insert("batch_size".into(), json!(batch_size(&args)));
    s.insert("resident".into(), json!(args.resident));
    s.insert("use_variant".into(), json!(args.use_variant));
    s.insert(
        "save".into(),
        json!(args.save.as_ref().map(|p| p.display().to_string())),
    );
    s.insert("eval_windows".into(), json!(args.eval_windows));
    if args.method == Method::SparseGpt {
        s.insert("percdamp".into(), json!(args.percdamp));
        s.insert("blocksize".into(), json!(args.blocksize));
    }
    if gradprobe {
        super::gradprobe::plan_settings(&args, s);
    }
    let requested = args.seqlen.or(gradprobe.then_some(128));
    let (seqlen, capped) = common::resolve_seqlen(requested, ckpt.config.max_position_embeddings)?;
    plan.settings.insert("seqlen".into(), json!(seqlen));
    let mut run = Run::start(plan, args.report.run_options(log_dir.clone())?)?;
    let p = run.profiler.clone();
    common::warn_seqlen(capped, &p);
    let late = if gradprobe {
        p.checkpoint("00_initial");
        ["19_before_save_model", "20_after_save_model", "21_end"]
    } else {
        p.checkpoint("01_start");
        ["07_before_save_model", "08_after_save_model", "09_end"]
    };
    let outcome = if gradprobe {
        super::gradprobe::prune_and_eval(&args, seqlen, &ckpt, &tok, writer.as_mut(), &p, &mut run)
    } else {
        prune_and_eval(&args, seqlen, &ckpt, &tok, writer.as_mut(), &p, &mut run)
    };
    let outcome = match outcome {
        Ok(o) => o,
        Err(e) => {
            p.message(Level::Error, e.to_string());
            run.finish(RunStatus::Failed(e.to_string()));
            return Err(e);
        }
    };
    let saved = match writer {
        Some(w) => {
            p.checkpoint(late[0]);
            let dir = w.finish(&ckpt)?;
            p.checkpoint(late[1]);
            Some(dir)
        }
        None => None,
    };
    p.checkpoint(late[2]);
    let (summary, errors) = run.finish(RunStatus::Ok);
    let final_logs = match (&args.report.log_memory, &saved) {
        (Some(l), _) => Some(l.clone()),
        (None, Some(dir)) => Some(dir.join("logs")),
        _ => None,
    };
    if args.json {
        let fp32_bytes = ckpt.config.param_count() * 4;
        let layer_sparsity: Vec<f64> = outcome.prune.layers.iter().map(|l| l.sparsity()).collect();
        println!(
            "{}",
            json!({
                "method": args.method.to_string(), "type": args.sparsity_type.to_string(),
                "sparsity_target": args.sparsity, "sparsity": outcome.prune.sparsity(),
                "prune_seconds": outcome.prune.seconds, "wall_seconds": summary.wall_s,
                "rss_peak": summary.rss_peak, "heap_peak": summary.heap_peak,
                "perplexity": outcome.perplexity.as_ref().map(|p| p.perplexity),
                "eval_windows": outcome.perplexity.as_ref().map(|p| p.windows),
                "nsamples": args.nsamples, "resident": args.resident, "layer_sparsity": layer_sparsity,
                "fp32_model_bytes": fp32_bytes,
                "peak_over_fp32_model": summary.rss_peak.map(|p| p as f64 / fp32_bytes.max(1) as f64),
            })
        );
    } else {
        print!("{}", sparsity_lines(&outcome.prune));
        if let Some(ppl) = &outcome.perplexity {
            println!(
                "perplexity {:.4} ({} windows × {} tokens)",
                ppl.perplexity, ppl.windows, ppl.seqlen
            );
        }
        if let Some(dir) = &saved {
            println!("pruned model saved to {}", dir.display());
        }
        if let Some(l) = &final_logs {
            println!("memory logs in {}", l.display());
        }
    }
    for e in errors {
        eprintln!("warning: {e}");
    }
    Ok(PruneReport {
        sparsity: outcome.prune.sparsity(),
        perplexity: outcome.perplexity.as_ref().map(|p| p.perplexity),
    })
}

/// Windows per forward pass: `--batch-size`, or the method's default.
pub fn batch_size(args: &PruneArgs) -> usize {
    args.batch_size
        .unwrap_or(if args.method == Method::GradProbe {
            1
        } else {
            8
        })
}

pub(super) struct Outcome {
    pub prune: PruneOutcome,
    pub perplexity: Option<eval::Perplexity>,
}

fn prune_and_eval(
    args: &PruneArgs,
    seqlen: usize,
    ckpt: &Checkpoint,
    tok: &Tokenizer,
    mut writer: Option<&mut PrunedWriter>,
    p: &Profiler,
    run: &mut Run,
) -> CliResult<Outcome> {
    let device = Default::default();
    let (calib, calib_bytes) = calibration(args, tok, seqlen)?;
    let mut text_bytes = calib_bytes;
    // Only the windows are kept: the tokenised text is dropped here.
    let eval_wins = match &args.eval_text {
        Some(path) => {
            let (tokens, bytes) = common::tokenize_counting(tok, path, args.eval_lines)?;
            text_bytes = text_bytes.max(bytes);
            Some(eval_windows(&tokens, seqlen, args.eval_windows)?)
        }
        None => None,
    };
    let mut model = if args.resident {
        Some(ckpt.load_model::<Flex>(args.dtype, &device)?)
    } else {
        None
    };
    p.checkpoint("02_model_loaded");
    let config = PruneConfig {
        method: args.method,
        sparsity: args.sparsity,
        pattern: args.sparsity_type,
        use_variant: args.use_variant,
        seqlen,
        batch_size: batch_size(args),
        dtype: args.dtype,
        percdamp: args.percdamp,
        blocksize: args.blocksize,
    };
    // Streaming evaluation reads the pruned weights back from disk: from the
    // save folder, or from a scratch copy when nothing is saved.
    let mut scratch: Option<(tempfile::TempDir, PrunedWriter)> = None;
    if eval_wins.is_some() && model.is_none() && writer.is_none() {
        let dir = tempfile::Builder::new()
            .prefix("prunemem-pruned-")
            .tempdir()?;
        let w = PrunedWriter::create(ckpt, &dir.path().join("model"))?;
        p.message(
            Level::Info,
            format!(
                "evaluation streams the pruned layers from {}",
                dir.path().display()
            ),
        );
        scratch = Some((dir, w));
    }
    let source = match model.as_mut() {
        Some(m) => Source::Resident(m),
        None => Source::Streamed,
    };
    let target = match (&mut writer, &mut scratch) {
        (Some(w), _) => Some(&mut **w),
        (None, Some((_, w))) => Some(w),
        _ => None,
    };
    let prune = engine::prune::<Flex>(ckpt, source, &config, &calib, target, &device, p)?;
    run.result("sparsity", prune.sparsity());
    run.result("text_bytes", text_bytes);
    run.result("prune_seconds", prune.seconds);
    run.result(
        "layer_seconds",
        prune.layers.iter().map(|l| l.seconds).collect::<Vec<_>>(),
    );
    run.result(
        "layer_sparsity",
        prune
            .layers
            .iter()
            .map(|l| l.sparsity())
            .collect::<Vec<_>>(),
    );
    let mut perplexity = None;
    if let Some(windows) = &eval_wins {
        let options = EvalOptions {
            batch_size: batch_size(args),
            dtype: args.dtype,
        };
        // Streaming: the pruned layers are on disk; complete that folder.
        let pruned = match (&model, &mut writer, &mut scratch) {
            (Some(_), _, _) => None,
            (None, Some(w), _) => Some(Checkpoint::open(&w.complete(ckpt)?)?),
            (None, None, Some((_, w))) => Some(Checkpoint::open(&w.complete(ckpt)?)?),
            (None, None, None) => {
                return Err("internal: pruned weights were not kept for evaluation".into());
            }
        };
        p.checkpoint("05_before_eval");
        let result = {
            let _scope = p.scope("eval");
            let weights = match (&model, &pruned) {
                (Some(m), _) => Weights::Resident(m, &ckpt.config),
                (None, Some(c)) => Weights::Streamed(c),
                (None, None) => return Err("internal: nothing to evaluate".into()),
            };
            eval::perplexity::<Flex>(weights, windows, &options, &device, Some(p))?
        };
        p.checkpoint("06_after_eval");
        run.result("perplexity", result.perplexity);
        run.result("eval_windows", result.windows);
        run.result("eval_seconds", result.seconds);
        perplexity = Some(result);
    }
    drop(model);
    drop(scratch);
    Ok(Outcome { prune, perplexity })
}
