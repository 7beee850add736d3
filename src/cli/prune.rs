//! `prunemem prune`: the flags of a prune, turned once into a
//! [`PruneJob`], and the printing of its outcome.

use std::path::PathBuf;

use clap::Args;

use super::CliResult;
use super::common::{RunFlags, job_error, logs_written};
use crate::data::LineRange;
use crate::jobs::{self, GradProbeSettings, PruneJob, TextSource};
use crate::model::ComputeDtype;
use crate::prune::gradprobe::{GradPrecision, Strategy};
use crate::prune::{Method, Pattern};

#[derive(Args, Debug)]
pub struct PruneArgs {
    #[command(flatten)]
    pub model: super::common::ModelFlags,
    /// Pruning method: magnitude, wanda, sparsegpt, gradprobe or ria
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
    /// Evaluate the dense model on the same windows first, inside the run
    /// (its memory and time in the same log; result dense_perplexity)
    #[arg(long)]
    pub eval_dense: bool,
    /// Wanda: the α-bisection variant (per-row cumulative-metric threshold)
    #[arg(long, alias = "use_variant")]
    pub use_variant: bool,
    /// Save the pruned model here (Hugging Face layout, same names and dtype)
    #[arg(long, alias = "save_model", value_name = "DIR")]
    pub save: Option<PathBuf>,
    /// How --save writes: dense (the input's layout, zeros stored) or compressed (compressed-tensors: sparse-24-bitmask for 2:4, sparse-bitmask otherwise)
    #[arg(long, default_value = "dense")]
    pub save_format: crate::jobs::config::SaveFormat,
    /// Let --save write into an existing folder prunemem did not write (only files of the same name are replaced; nothing else is deleted)
    #[arg(long)]
    pub overwrite: bool,
    /// Keep the whole model loaded instead of streaming one layer at a time
    #[arg(long)]
    pub resident: bool,
    /// Keep the calibration activations in host memory between layers, uploading one batch at a time (for models whose activations do not fit on the device)
    #[arg(long)]
    pub offload_activations: bool,
    /// Where the pruned layers wait for the evaluation: auto (inline when the evaluation's hidden states are no larger than the layers and fit beside the predicted peak; else, on a device, the device when the peak plus every layer fits, else host memory, else disk; on the CPU, disk), inline (each layer evaluated as it is pruned, none kept; the layer-by-layer methods, and GradProbe without --include-embeddings), device, host (a device run's: each layer uploaded again for the evaluation) or disk (a scratch checkpoint, or the --save folder)
    #[arg(long, default_value = "auto")]
    pub keep_pruned: KeepPruned,
    /// Compute dtype (default: f32 on the CPU, f16 on a GPU device, as the reference scripts)
    #[arg(long)]
    pub dtype: Option<ComputeDtype>,
    /// Windows per forward pass (default 8; gradprobe: windows per gradient batch, default 1)
    #[arg(long)]
    pub batch_size: Option<usize>,
    /// SparseGPT dampening, as a fraction of the mean Hessian diagonal
    #[arg(long, default_value_t = 0.01, allow_negative_numbers = true)]
    pub percdamp: f64,
    /// SparseGPT column block size
    #[arg(long, default_value_t = 128)]
    pub blocksize: usize,
    /// RIA: exponent of the activation norm in the metric
    #[arg(
        long = "ria-a",
        alias = "a",
        default_value_t = 0.5,
        allow_negative_numbers = true
    )]
    pub ria_a: f64,
    /// RIA, unstructured: compare within each output row (Wanda's group) instead of one threshold per matrix
    #[arg(long, alias = "per_outneuron")]
    pub per_outneuron: bool,
    /// RIA, N:M: the authors' heuristic channel reallocation (columns permuted before grouping)
    #[arg(long)]
    pub reallocation: bool,
    /// RIA, N:M, with --reallocation: the authors' linear-sum-assignment rounds after it
    #[arg(long)]
    pub lsa: bool,
    /// OWL: per-layer sparsities from each layer's share of outliers (a dense pass first)
    #[arg(long)]
    pub owl: bool,
    /// OWL: λ, how far a layer's sparsity may move from the target
    #[arg(
        long,
        alias = "Lamda",
        default_value_t = 0.08,
        allow_negative_numbers = true
    )]
    pub owl_lambda: f64,
    /// OWL: M, outliers are entries above M × the layer's mean Wanda metric
    #[arg(
        long,
        alias = "Hyper_m",
        default_value_t = 3.0,
        allow_negative_numbers = true
    )]
    pub owl_m: f64,
    /// DSnoT: refine the method's mask (per output row / N:M group) by swapping weights towards zero expected output change
    #[arg(long)]
    pub dsnot: bool,
    /// DSnoT: at most this many swaps per row
    #[arg(long, alias = "max_cycle_time", default_value_t = 50)]
    pub dsnot_max_cycles: usize,
    /// DSnoT: a row stops once its |reconstruction error| is at most this
    #[arg(
        long,
        alias = "update_threshold",
        default_value_t = 0.1,
        allow_negative_numbers = true
    )]
    pub dsnot_threshold: f64,
    /// DSnoT: the regrowing score is divided by the input variance to this power (0: off)
    #[arg(
        long,
        alias = "pow_of_var_regrowing",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub dsnot_pow_var: f64,
    /// DSnoT: linears left with their first mask: mlp, self_attn or none
    #[arg(long, alias = "skip_layer", default_value = "mlp")]
    pub dsnot_skip: crate::prune::dsnot::DsnotSkip,
    /// Print the result as one JSON line
    #[arg(long)]
    pub json: bool,
    /// Run even when the memory estimate exceeds the memory available
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub gradprobe: GradProbeArgs,
    #[command(flatten)]
    pub run: RunFlags,
}

/// GradProbe's settings (defaults are the reference's).
#[derive(Args, Debug, Clone)]
pub struct GradProbeArgs {
    /// GradProbe: how tentative candidates are chosen (magnitude or wanda)
    #[arg(long, default_value = "magnitude", help_heading = "GradProbe")]
    pub strategy: Strategy,
    /// GradProbe: tentative weights are multiplied by this for the second pass
    #[arg(
        long,
        default_value_t = 0.1,
        help_heading = "GradProbe",
        allow_negative_numbers = true
    )]
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

impl PruneArgs {
    /// The job these flags ask for.
    pub fn job(&self, argv: Vec<String>) -> PruneJob {
        let text = |path: &Option<PathBuf>, lines| {
            path.as_ref().map(|p| TextSource {
                path: p.clone(),
                lines,
            })
        };
        let g = &self.gradprobe;
        PruneJob {
            model: self.model.model.clone(),
            revision: self.model.revision.clone(),
            method: self.method,
            sparsity: self.sparsity,
            pattern: self.sparsity_type,
            nsamples: self.nsamples,
            seqlen: self.seqlen,
            seed: self.seed,
            calib: text(&self.calib_text, self.calib_lines),
            eval: text(&self.eval_text, self.eval_lines),
            eval_windows: self.eval_windows,
            eval_dense: self.eval_dense,
            use_variant: self.use_variant,
            save: self.save.clone(),
            save_format: self.save_format,
            overwrite: self.overwrite,
            resident: self.resident,
            offload_activations: self.offload_activations,
            keep_pruned: self.keep_pruned.0,
            // GradProbe's gradients are f32 on every device.
            dtype: match self.method {
                Method::GradProbe => self.dtype.unwrap_or(ComputeDtype::F32),
                _ => self.run.device.dtype(self.dtype),
            },
            batch_size: self.batch_size,
            percdamp: self.percdamp,
            blocksize: self.blocksize,
            ria_a: self.ria_a,
            per_outneuron: self.per_outneuron,
            reallocation: self.reallocation,
            lsa: self.lsa,
            owl: self.owl.then_some(crate::prune::owl::OwlConfig {
                lambda: self.owl_lambda,
                m: self.owl_m,
            }),
            dsnot: self.dsnot.then_some(crate::prune::dsnot::DsnotOptions {
                max_cycles: self.dsnot_max_cycles,
                update_threshold: self.dsnot_threshold,
                pow_of_var: self.dsnot_pow_var,
                skip: self.dsnot_skip,
            }),
            gradprobe: GradProbeSettings {
                strategy: g.strategy,
                reduction_factor: g.reduction_factor,
                gradient_threshold: g.gradient_threshold,
                num_batches: g.num_batches,
                stride: g.stride,
                include_embeddings: g.include_embeddings,
                grad_precision: g.grad_precision,
                iterative: g.iterative,
                initial_sparsity: g.initial_sparsity,
                sparsity_step: g.sparsity_step,
                max_ppl_increase: g.max_ppl_increase,
            },
            force: self.force,
            argv,
        }
    }
}

pub fn run(args: PruneArgs, argv: Vec<String>) -> CliResult<i32> {
    let job = args.job(argv);
    // Refused before the live UI takes the terminal (the job checks again).
    job.validate().map_err(|e| job_error(e.into()))?;
    let outcome = jobs::prune::run(&job, args.run.run_options()?).map_err(job_error)?;
    if args.json {
        println!("{}", jobs::prune_output::json_line(&job, &outcome));
    } else {
        print_outcome(&outcome);
    }
    logs_written(&outcome.sink_errors)
}

/// The lines a finished prune prints (also the demo's).
pub fn print_outcome(o: &jobs::prune::Outcome) {
    print!("{}", jobs::prune_output::sparsity_lines(&o.prune));
    if let Some(ppl) = &o.perplexity {
        println!(
            "perplexity {:.4} ({} windows × {} tokens)",
            ppl.perplexity, ppl.windows, ppl.seqlen
        );
    }
    if let Some(dir) = &o.saved {
        let size = o
            .saved_bytes
            .map(crate::units::format_bytes)
            .unwrap_or_default();
        match &o.compressed {
            Some(c) => println!(
                "pruned model saved to {} ({}, {size} of weights; dense {})",
                dir.display(),
                c.format.name(),
                crate::units::format_bytes(c.bytes_in)
            ),
            None => println!(
                "pruned model saved to {} ({size} of weights)",
                dir.display()
            ),
        }
    }
    if let Some(l) = &o.logs {
        println!("memory logs in {}", l.display());
    }
}

/// `--keep-pruned`: `auto` (`None`) or a place.
#[derive(Debug, Clone, Copy)]
pub struct KeepPruned(Option<crate::model::kept::Place>);

impl std::str::FromStr for KeepPruned {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(KeepPruned(None)),
            other => other.parse().map(|p| KeepPruned(Some(p))),
        }
    }
}
