//! `prunemem eval`: perplexity of a model on a text, with stage snapshots.

use std::path::PathBuf;

use burn::backend::Flex;
use clap::Args;
use serde_json::json;

use super::CliResult;
use super::common::{self, ReportArgs};
use crate::data::LineRange;
use crate::data::windows::eval_windows;
use crate::eval::{self, EvalOptions, Weights};
use crate::events::RunStatus;
use crate::model::{Checkpoint, ComputeDtype};
use crate::run::Run;

#[derive(Args, Debug)]
pub struct EvalArgs {
    /// Model folder (config.json + safetensors + tokenizer.json) or Hugging Face Hub id
    #[arg(long, value_name = "DIR|ORG/NAME")]
    model: String,
    /// Hub revision (branch, tag or commit) when --model is a Hub id
    #[arg(long, default_value = "main")]
    revision: String,
    /// Text to evaluate on (plain text, or .jsonl with a "text" field)
    #[arg(long, value_name = "FILE")]
    text: PathBuf,
    /// Lines of --text to use: all, first-half, second-half or START:END
    #[arg(long, default_value = "all", value_name = "RANGE")]
    lines: LineRange,
    /// Window length in tokens (default 2048, capped at the model's max positions)
    #[arg(long)]
    seqlen: Option<usize>,
    /// Evaluate only the first K windows
    #[arg(long, value_name = "K")]
    windows: Option<usize>,
    /// Windows per forward pass
    #[arg(long, default_value_t = 4)]
    batch_size: usize,
    /// Compute dtype
    #[arg(long, default_value = "f32")]
    dtype: ComputeDtype,
    /// Keep the whole model loaded instead of streaming one layer at a time
    #[arg(long)]
    resident: bool,
    /// Print the result as JSON
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    report: ReportArgs,
}

pub fn run(args: EvalArgs, argv: Vec<String>) -> CliResult<i32> {
    if args.batch_size == 0 {
        return Err("--batch-size must be at least 1".into());
    }
    if args.windows == Some(0) {
        return Err("--windows must be at least 1".into());
    }
    let mut plan = common::base_plan("eval", argv);
    let model_dir = crate::model::hub::resolve(&args.model, &args.revision)?;
    let ckpt = Checkpoint::open(&model_dir)?;
    let tok = common::load_tokenizer(&model_dir)?;
    plan.model = Some(ckpt.config.model_info(
        &args.model,
        &crate::model::dtype::stored_name(ckpt.stored_dtype()),
    ));
    plan.settings
        .insert("dtype".into(), json!(args.dtype.name()));
    plan.settings
        .insert("batch_size".into(), json!(args.batch_size));
    plan.settings
        .insert("resident".into(), json!(args.resident));
    plan.settings
        .insert("eval_text".into(), json!(args.text.display().to_string()));
    let (seqlen, capped) =
        common::resolve_seqlen(args.seqlen, ckpt.config.max_position_embeddings)?;
    plan.settings.insert("seqlen".into(), json!(seqlen));
    let mut run = Run::start(plan, args.report.run_options(None)?)?;
    let p = run.profiler.clone();
    common::warn_seqlen(capped, &p);
    p.checkpoint("01_start");
    let tokens = common::tokenize_text(&tok, &args.text, args.lines)?;
    let windows = eval_windows(&tokens, seqlen, args.windows)?;
    drop(tokens);
    let device = Default::default();
    let model = if args.resident {
        Some(ckpt.load_model::<Flex>(args.dtype, &device)?)
    } else {
        None
    };
    p.checkpoint("02_model_loaded");
    let options = EvalOptions {
        batch_size: args.batch_size,
        dtype: args.dtype,
    };
    p.checkpoint("05_before_eval");
    let weights = match &model {
        Some(m) => Weights::Resident(m, &ckpt.config),
        None => Weights::Streamed(&ckpt),
    };
    let result = {
        let _scope = p.scope("eval");
        eval::perplexity::<Flex>(weights, &windows, &options, &device, Some(&p))?
    };
    p.checkpoint("06_after_eval");
    drop(model);
    p.checkpoint("09_end");
    run.result("perplexity", result.perplexity);
    run.result("eval_windows", result.windows);
    run.result("seqlen", result.seqlen);
    run.result("eval_seconds", result.seconds);
    run.result("tokens_per_second", result.tokens_per_second);
    let (summary, errors) = run.finish(RunStatus::Ok);
    if args.json {
        println!(
            "{}",
            json!({"perplexity": result.perplexity, "windows": result.windows, "seqlen": seqlen,
                   "tokens": result.windows * seqlen, "seconds": result.seconds,
                   "tokens_per_second": result.tokens_per_second, "rss_peak": summary.rss_peak})
        );
    } else {
        println!(
            "perplexity {:.4} over {} windows × {} tokens ({} tokens) in {:.1}s, {:.0} tokens/s",
            result.perplexity,
            result.windows,
            seqlen,
            result.windows * seqlen,
            result.seconds,
            result.tokens_per_second
        );
    }
    for e in errors {
        eprintln!("warning: {e}");
    }
    Ok(0)
}
