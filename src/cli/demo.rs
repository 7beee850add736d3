//! `prunemem demo`: the main job, end to end, with nothing to download.
//!
//! With `models/smollm2-135m` present (scripts/fetch-smollm2.sh) it prunes
//! that with Wanda on WikiText-2 (when ../shared/data has it) or on generated
//! text. Otherwise it trains a tiny Llama on generated sentences for a few
//! seconds and prunes that. Either way it evaluates dense and pruned
//! perplexity and leaves logs and the pruned model under `reports/demo/`.

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::backend::Flex;
use clap::{Args, Parser};

use super::{Cli, CliResult, Command};
use crate::data::windows::eval_windows;
use crate::demo;
use crate::eval::{self, EvalOptions, Weights};
use crate::model::synthetic::{SyntheticSpec, write_checkpoint};
use crate::model::tokenizer::Tokenizer;
use crate::model::{Checkpoint, ComputeDtype};
use crate::units::format_count;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Output folder
    #[arg(long, default_value = "reports/demo")]
    out: PathBuf,
    /// Training steps for the tiny model (no SmolLM2)
    #[arg(long, default_value_t = 300)]
    steps: usize,
    /// Always train and prune the tiny model, even when SmolLM2 is present
    #[arg(long)]
    tiny: bool,
    /// Progress display passed to the prune step (tui, plain, none)
    #[arg(long)]
    ui: Option<String>,
}

const WIKI: &str = "../shared/data/wikitext-2-raw/wiki.test.raw";

/// What the demo prunes and how.
struct Setup {
    model: PathBuf,
    calib: PathBuf,
    calib_lines: &'static str,
    eval: PathBuf,
    eval_lines: &'static str,
    seqlen: usize,
    nsamples: usize,
    eval_windows: usize,
    batch: usize,
}

fn perplexity(
    model: &Path,
    text: &Path,
    lines: &str,
    seqlen: usize,
    windows: usize,
) -> CliResult<f64> {
    let ckpt = Checkpoint::open(model)?;
    let tok = Tokenizer::from_file(&model.join("tokenizer.json"))?;
    let tokens = super::common::tokenize_text(&tok, text, lines.parse()?)?;
    let wins = eval_windows(&tokens, seqlen, Some(windows))?;
    let options = EvalOptions {
        batch_size: 8,
        dtype: ComputeDtype::F32,
    };
    Ok(eval::perplexity::<Flex>(
        Weights::Streamed(&ckpt),
        &wins,
        &options,
        &Default::default(),
        None,
    )?
    .perplexity)
}

fn tiny_setup(out: &Path, steps: usize) -> CliResult<Setup> {
    let text = demo::corpus(6000, 1);
    let split = text.len() * 4 / 5;
    let split = text[..split].rfind('\n').map_or(split, |i| i + 1);
    let (train_text, eval_text) = text.split_at(split);
    std::fs::create_dir_all(out)?;
    let train_path = out.join("train.txt");
    let eval_path = out.join("eval.txt");
    std::fs::write(&train_path, train_text)?;
    std::fs::write(&eval_path, eval_text)?;
    let spec = SyntheticSpec {
        hidden: 96,
        intermediate: 256,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        max_positions: 256,
        seed: 3,
        ..Default::default()
    };
    let init = out.join("init");
    write_checkpoint(&init, &spec)?;
    let tok = Tokenizer::from_file(&init.join("tokenizer.json"))?;
    let tokens = tok.encode(train_text)?;
    let t = Instant::now();
    let (model, loss) = demo::train(&init, &tokens, steps, 16, 64, 7)?;
    let model_dir = out.join("model");
    demo::export(&model, &spec, &model_dir)?;
    std::fs::remove_dir_all(&init)?;
    let params = Checkpoint::open(&model_dir)?.config.param_count();
    println!(
        "trained a {}-layer byte-level Llama ({} parameters) on generated sentences: {steps} AdamW steps in {:.1}s, final loss {loss:.3}",
        spec.layers,
        format_count(params),
        t.elapsed().as_secs_f64()
    );
    Ok(Setup {
        model: model_dir,
        calib: train_path,
        calib_lines: "all",
        eval: eval_path,
        eval_lines: "all",
        seqlen: 64,
        nsamples: 64,
        eval_windows: 40,
        batch: 16,
    })
}

pub fn run(args: DemoArgs) -> CliResult<i32> {
    let smol = Path::new("models/smollm2-135m");
    let setup = if !args.tiny && smol.join("model.safetensors").is_file() {
        let (text, calib_lines, eval_lines) = if Path::new(WIKI).is_file() {
            println!(
                "using models/smollm2-135m on WikiText-2 ({WIKI}): calibration from the second half, evaluation on the first"
            );
            (PathBuf::from(WIKI), "second-half", "first-half")
        } else {
            let p = args.out.join("text.txt");
            std::fs::create_dir_all(&args.out)?;
            std::fs::write(&p, demo::corpus(8000, 2))?;
            println!("using models/smollm2-135m on generated text ({WIKI} is absent)");
            (p, "all", "all")
        };
        Setup {
            model: smol.to_path_buf(),
            calib: text.clone(),
            calib_lines,
            eval: text,
            eval_lines,
            seqlen: 512,
            nsamples: 32,
            eval_windows: 16,
            batch: 8,
        }
    } else {
        if args.tiny {
            println!("training a tiny model (--tiny)");
        } else {
            println!(
                "models/smollm2-135m is absent (scripts/fetch-smollm2.sh fetches it): training a tiny model instead"
            );
        }
        tiny_setup(&args.out, args.steps.max(1))?
    };
    let dense = perplexity(
        &setup.model,
        &setup.eval,
        setup.eval_lines,
        setup.seqlen,
        setup.eval_windows,
    )?;
    println!("dense perplexity {dense:.4}");
    let save = args.out.join("model-wanda-0.5");
    let logs = args.out.join("logs");
    let argv: Vec<String> = [
        "prunemem",
        "prune",
        "--model",
        &setup.model.display().to_string(),
        "--method",
        "wanda",
        "--sparsity",
        "0.5",
        "--nsamples",
        &setup.nsamples.to_string(),
        "--seqlen",
        &setup.seqlen.to_string(),
        "--calib-text",
        &setup.calib.display().to_string(),
        "--calib-lines",
        setup.calib_lines,
        "--eval-text",
        &setup.eval.display().to_string(),
        "--eval-lines",
        setup.eval_lines,
        "--eval-windows",
        &setup.eval_windows.to_string(),
        "--batch-size",
        &setup.batch.to_string(),
        "--save",
        &save.display().to_string(),
        "--log-memory",
        &logs.display().to_string(),
        "--ui",
        args.ui.as_deref().unwrap_or("plain"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let Command::Prune(prune_args) = Cli::try_parse_from(&argv)?.command else {
        return Err("internal: the demo built a non-prune command".into());
    };
    println!("running: {}", argv[1..].join(" "));
    let report = super::prune::execute(*prune_args, argv)?;
    let pruned = report
        .perplexity
        .map(|p| format!("{p:.4}"))
        .unwrap_or_else(|| "n/a".into());
    println!(
        "\ndemo finished: perplexity {dense:.4} dense → {pruned} after Wanda at sparsity {:.4}",
        report.sparsity
    );
    println!(
        "  logs:         {}/ (memory_log.csv, events.jsonl, summary.txt)",
        logs.display()
    );
    println!(
        "  pruned model: {}/ (Hugging Face layout; loads in transformers)",
        save.display()
    );
    Ok(0)
}
