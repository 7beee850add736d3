//! `prunemem train`: the flags of a training run, turned once into a
//! [`TrainJob`], and the printing of its losses and of the two profiling
//! approaches side by side.

use clap::Args;
use serde_json::json;

use super::CliResult;
use super::common::{RunFlags, job_error, logs_written};
use crate::jobs;
use crate::jobs::train::{Outcome, TrainJob};
use crate::model::ComputeDtype;
use crate::train::{Freeze, OptimizerConfig, OptimizerKind, TrainConfig};

#[derive(Args, Debug)]
pub struct TrainArgs {
    #[command(flatten)]
    model: super::common::ModelFlags,
    #[command(flatten)]
    text: super::common::TextFlags,
    /// Windows per micro-batch
    #[arg(long, default_value_t = 4)]
    batch_size: usize,
    /// Micro-batches whose gradients add up before each optimizer step
    #[arg(long, default_value_t = 1)]
    grad_accum: usize,
    /// Tokens per window (default 256; capped at the model's max positions)
    #[arg(long, default_value_t = 256)]
    seqlen: usize,
    /// Optimizer steps to take (default: whole epochs)
    #[arg(long)]
    steps: Option<usize>,
    /// Passes over the text (when --steps is not given)
    #[arg(long, default_value_t = 1)]
    epochs: usize,
    /// adamw, adam or sgd (torch.optim's update rules and defaults)
    #[arg(long, default_value = "adamw")]
    optimizer: OptimizerKind,
    /// Learning rate
    #[arg(long, default_value_t = 1e-4)]
    lr: f64,
    /// Weight decay (default: AdamW 0.01, Adam and SGD 0)
    #[arg(long)]
    weight_decay: Option<f64>,
    /// SGD momentum (0: no momentum buffer)
    #[arg(long, default_value_t = 0.0)]
    momentum: f64,
    /// Compute dtype (f32 only for now)
    #[arg(long, default_value = "f32")]
    dtype: ComputeDtype,
    /// Recompute each decoder layer's activations in the backward
    #[arg(long)]
    checkpointing: bool,
    /// Parameters to keep fixed: embeddings, head, norm, layers, N or A-B, comma-separated
    #[arg(long, value_name = "PARTS")]
    freeze: Option<Freeze>,
    /// Seed of the window order
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print the result as one JSON line
    #[arg(long)]
    json: bool,
    /// Run even when the memory estimate exceeds the memory available
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    run: RunFlags,
}

impl TrainArgs {
    fn job(&self, argv: Vec<String>) -> CliResult<TrainJob> {
        let mut optimizer = OptimizerConfig::new(self.optimizer);
        if let Some(wd) = self.weight_decay {
            optimizer.weight_decay = wd;
        }
        optimizer.momentum = self.momentum;
        if self.optimizer != OptimizerKind::Sgd && self.momentum != 0.0 {
            return Err("--momentum applies to --optimizer sgd only".into());
        }
        Ok(TrainJob {
            model: self.model.model.clone(),
            revision: self.model.revision.clone(),
            text: self.text.source(),
            seqlen: Some(self.seqlen),
            config: TrainConfig {
                batch_size: self.batch_size,
                grad_accum: self.grad_accum,
                seqlen: self.seqlen,
                steps: self.steps,
                epochs: self.epochs,
                optimizer,
                lr: self.lr,
                dtype: self.dtype,
                checkpointing: self.checkpointing,
                freeze: self.freeze.clone().unwrap_or_default(),
                seed: self.seed,
            },
            force: self.force,
            argv,
        })
    }
}

pub fn run(args: TrainArgs, argv: Vec<String>) -> CliResult<i32> {
    let job = args.job(argv)?;
    // Refused before the live UI takes the terminal (the job checks again).
    job.config.validate().map_err(|e| job_error(e.into()))?;
    let o = jobs::train::run(&job, args.run.run_options()?).map_err(job_error)?;
    if args.json {
        println!("{}", json_line(&o));
    } else {
        print_outcome(&o);
    }
    logs_written(&o.sink_errors)
}

fn json_line(o: &Outcome) -> serde_json::Value {
    json!({
        "steps": o.steps, "params": o.params, "trainable_params": o.trainable_params,
        "seqlen": o.seqlen, "rss_peak": o.summary.rss_peak, "heap_peak": o.summary.heap_peak,
        "gap": o.gap,
    })
}

fn print_outcome(o: &Outcome) {
    let (first, last) = (o.steps.first(), o.steps.last());
    if let (Some(f), Some(l)) = (first, last) {
        let mean = o.steps.iter().map(|r| r.seconds).sum::<f64>() / o.steps.len() as f64;
        println!(
            "{} steps: loss {:.4} → {:.4}, {:.1} s/step; {} of {} parameters trained",
            o.steps.len(),
            f.loss,
            l.loss,
            mean,
            o.trainable_params,
            o.params
        );
    }
    if let Some(g) = &o.gap {
        print!("{}", crate::report::training::gap_text(g));
    }
    if let Some(l) = &o.logs {
        println!("memory logs in {}", l.display());
    }
}
