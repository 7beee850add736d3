//! `prunemem demo`: the main job end to end on a fresh clone (SmolLM2-135M
//! fetched when missing, WikiText-2 shipped). The flags become a
//! [`DemoJob`]; the job says what it does through a callback that prints
//! here.

use std::path::PathBuf;

use clap::Args;

use super::CliResult;
use super::common::{Role, UiMode, for_ui, job_error, logs_written};
use crate::jobs::demo::DemoJob;
use crate::jobs::{self, RunOptions};

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
    /// Do not fetch SmolLM2-135M when it is missing (the tiny model instead)
    #[arg(long)]
    no_fetch: bool,
    /// The SmolLM2-135M folder (fetched there by scripts/fetch-smollm2.sh)
    #[arg(long, default_value = "models/smollm2-135m")]
    smollm2: PathBuf,
    /// Progress display of the prune step (tui, plain, none)
    #[arg(long, value_enum, default_value = "plain")]
    ui: UiMode,
    /// Memory the run should fit in (24GiB, 80GB), for the live forecast
    #[arg(long, value_name = "SIZE", value_parser = super::common::parse_budget)]
    budget: Option<u64>,
    #[command(flatten)]
    device: super::common::DeviceFlags,
}

pub fn run(args: DemoArgs) -> CliResult<i32> {
    let job = DemoJob {
        out: args.out,
        steps: args.steps,
        tiny: args.tiny,
        fetch: !args.no_fetch,
        smollm2: args.smollm2,
        dtype: args.device.dtype(None),
        device: args.device.device,
        ..DemoJob::default()
    };
    let options = RunOptions {
        sinks: for_ui(args.ui, Role::Run)?.sinks,
        budget: args.budget,
        device: args.device.device,
        device_memory: args.device.device_memory,
        ..RunOptions::default()
    };
    // Under the live view, what the demo says waits until the view closes:
    // printed while it owns the terminal, it would scribble over the screen.
    let live = matches!(args.ui, UiMode::Tui);
    let mut held: Vec<String> = Vec::new();
    let mut say = |line: &str| match live {
        true => held.push(line.to_string()),
        false => println!("{line}"),
    };
    let o = jobs::demo::run(&job, options, args.ui.name(), &mut say);
    for line in &held {
        println!("{line}");
    }
    let o = o.map_err(job_error)?;
    super::prune::print_outcome(&o.prune);
    let pruned = o
        .prune
        .perplexity
        .map(|p| format!("{:.4}", p.perplexity))
        .unwrap_or_else(|| "n/a".into());
    println!(
        "\ndemo finished: perplexity {:.4} dense → {pruned} after Wanda at sparsity {:.4}",
        o.dense_perplexity,
        o.prune.prune.sparsity()
    );
    let logs = job.out.join("logs");
    println!(
        "  logs:         {}/ (memory_log.csv, events.jsonl, summary.txt)",
        logs.display()
    );
    println!(
        "  pruned model: {}/ (Hugging Face layout; loads in transformers)",
        job.out.join("model-wanda-0.5").display()
    );
    logs_written(&o.prune.sink_errors)
}
