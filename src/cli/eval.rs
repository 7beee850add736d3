//! `prunemem eval`: the flags of an evaluation, turned once into an
//! [`EvalJob`], and the printing of its perplexity.

use clap::Args;

use super::CliResult;
use super::common::{RunFlags, job_error, logs_written};
use crate::jobs::{self, EvalJob};
use crate::model::ComputeDtype;

#[derive(Args, Debug)]
pub struct EvalArgs {
    #[command(flatten)]
    model: super::common::ModelFlags,
    #[command(flatten)]
    text: super::common::TextFlags,
    /// Window length in tokens (default 2048, capped at the model's max positions)
    #[arg(long)]
    seqlen: Option<usize>,
    /// Evaluate only the first K windows
    #[arg(long, value_name = "K")]
    windows: Option<usize>,
    /// Windows per forward pass
    #[arg(long, default_value_t = 4)]
    batch_size: usize,
    /// Compute dtype (default: f32 on the CPU, f16 on a GPU device)
    #[arg(long)]
    dtype: Option<ComputeDtype>,
    /// Keep the whole model loaded instead of streaming one layer at a time
    #[arg(long)]
    resident: bool,
    /// Print the result as JSON
    #[arg(long)]
    json: bool,
    /// Run even when the memory estimate exceeds the memory available
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    run: RunFlags,
}

pub fn run(args: EvalArgs, argv: Vec<String>) -> CliResult<i32> {
    let job = EvalJob {
        model: args.model.model,
        revision: args.model.revision,
        text: args.text.source(),
        seqlen: args.seqlen,
        windows: args.windows,
        batch_size: args.batch_size,
        dtype: args.run.device.dtype(args.dtype),
        resident: args.resident,
        force: args.force,
        argv,
    };
    job.validate().map_err(|e| job_error(e.into()))?;
    let o = jobs::eval::run(&job, args.run.run_options()?).map_err(job_error)?;
    let r = &o.perplexity;
    if args.json {
        println!("{}", jobs::eval::json_line(&o));
    } else {
        println!(
            "perplexity {:.4} over {} windows × {} tokens ({} tokens) in {:.1}s, {:.0} tokens/s",
            r.perplexity,
            r.windows,
            o.seqlen,
            r.windows * o.seqlen,
            r.seconds,
            r.tokens_per_second
        );
    }
    logs_written(&o.sink_errors)
}
