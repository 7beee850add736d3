//! `prunemem prune --method gradprobe`: calibration windows cut the way the
//! reference cuts them, one GradProbe step (or `--iterative` steps with a
//! perplexity check after each), the pruned model written from the
//! checkpoint, evaluation streamed from what was written.

use serde_json::json;

use super::CliResult;
use super::common;
use super::prune::{Outcome, PruneArgs, batch_size};
use crate::data::windows::eval_windows;
use crate::data::{self, Corpus};
use crate::eval::{self, EvalOptions, Perplexity, Weights};
use crate::events::Level;
use crate::model::save::PrunedWriter;
use crate::model::tokenizer::Tokenizer;
use crate::model::{Checkpoint, ComputeDtype};
use crate::profiler::Profiler;
use crate::prune::engine::{self, LinearReport, PruneOutcome};
use crate::prune::gradprobe::{
    GradProbe, GradProbeConfig, Masks, select, sliding_windows, write_pruned,
};
use crate::run::Run;

/// Flags that make no sense with GradProbe, refused up front.
pub fn validate(args: &PruneArgs) -> CliResult<()> {
    let g = &args.gradprobe;
    if args.dtype != ComputeDtype::F32 {
        return Err("--method gradprobe computes gradients in f32: use --dtype f32".into());
    }
    if args.resident {
        return Err(
            "--method gradprobe always streams layers from the checkpoint; drop --resident".into(),
        );
    }
    if args.calib_text.is_none() {
        return Err("--calib-text is required for --method gradprobe".into());
    }
    if g.num_batches == 0 || g.stride == Some(0) {
        return Err("--num-batches and --stride must be at least 1".into());
    }
    if !(g.reduction_factor.is_finite() && g.gradient_threshold.is_finite()) {
        return Err("--reduction-factor and --gradient-threshold must be finite numbers".into());
    }
    if g.iterative {
        if args.eval_text.is_none() {
            return Err(
                "--iterative evaluates perplexity after each step: give --eval-text".into(),
            );
        }
        let ok = |v: f64| v > 0.0 && v < 1.0;
        if !ok(g.initial_sparsity) || !ok(g.sparsity_step) {
            return Err("--initial-sparsity and --sparsity-step must be in (0, 1)".into());
        }
        if g.max_ppl_increase.is_nan() || g.max_ppl_increase < 0.0 {
            return Err("--max-ppl-increase must be 0 or more".into());
        }
    }
    Ok(())
}

/// GradProbe's settings, recorded in the run's plan.
pub fn plan_settings(
    args: &PruneArgs,
    s: &mut std::collections::BTreeMap<String, serde_json::Value>,
) {
    let g = &args.gradprobe;
    s.insert("strategy".into(), json!(g.strategy.to_string()));
    s.insert("reduction_factor".into(), json!(g.reduction_factor));
    s.insert("gradient_threshold".into(), json!(g.gradient_threshold));
    s.insert("num_batches".into(), json!(g.num_batches));
    s.insert("include_embeddings".into(), json!(g.include_embeddings));
    s.insert("grad_precision".into(), json!(g.grad_precision));
    s.insert("iterative".into(), json!(g.iterative));
    if g.iterative {
        s.insert("initial_sparsity".into(), json!(g.initial_sparsity));
        s.insert("sparsity_step".into(), json!(g.sparsity_step));
        s.insert("max_ppl_increase".into(), json!(g.max_ppl_increase));
    }
}

fn calibration(args: &PruneArgs, tok: &Tokenizer, seqlen: usize) -> CliResult<Vec<Vec<u32>>> {
    let g = &args.gradprobe;
    let Some(path) = &args.calib_text else {
        return Err("--calib-text is required for --method gradprobe".into());
    };
    let text = match data::read_corpus(path, args.calib_lines)? {
        Corpus::Text(t) => t,
        Corpus::Documents(d) => d.join("\n\n"),
    };
    let tokens = tok.encode(&text)?;
    let count = g.num_batches * batch_size(args);
    let stride = g.stride.unwrap_or((seqlen / 2).max(1));
    Ok(sliding_windows(&tokens, seqlen, stride, count)?)
}

/// Streams `dir`'s checkpoint through the evaluation windows.
fn evaluate(
    dir: &std::path::Path,
    windows: &[Vec<u32>],
    args: &PruneArgs,
    p: &Profiler,
) -> CliResult<Perplexity> {
    let ckpt = Checkpoint::open(dir)?;
    let options = EvalOptions {
        batch_size: 8,
        dtype: args.dtype,
    };
    let _scope = p.scope("eval");
    Ok(eval::perplexity(
        Weights::Streamed::<burn::backend::Flex>(&ckpt),
        windows,
        &options,
        &Default::default(),
        Some(p),
    )?)
}

/// A scratch checkpoint holding `masks` applied.
fn scratch_model(
    ckpt: &Checkpoint,
    probe: &GradProbe<'_>,
    masks: &Masks,
) -> CliResult<(
    tempfile::TempDir,
    std::path::PathBuf,
    Vec<LinearReport>,
    PruneOutcome,
)> {
    let dir = tempfile::Builder::new()
        .prefix("prunemem-gradprobe-")
        .tempdir()?;
    let mut w = PrunedWriter::create(ckpt, &dir.path().join("model"))?;
    let (layers, others) = write_pruned(ckpt, probe.targets(), masks, &mut w)?;
    let path = w.complete(ckpt)?;
    let seconds = layers.iter().map(|l| l.seconds).sum();
    Ok((dir, path, others, PruneOutcome { layers, seconds }))
}

/// Zeros over every probed tensor: decoder linears and `others`.
fn sparsity_of(outcome: &PruneOutcome, others: &[LinearReport]) -> f64 {
    engine::sparsity_of(outcome.layers.iter().flat_map(|l| &l.linears).chain(others))
}

pub(super) fn prune_and_eval(
    args: &PruneArgs,
    seqlen: usize,
    ckpt: &Checkpoint,
    tok: &Tokenizer,
    writer: Option<&mut PrunedWriter>,
    p: &Profiler,
    run: &mut Run,
) -> CliResult<Outcome> {
    let g = &args.gradprobe;
    p.checkpoint("01_model_loaded");
    let calib = calibration(args, tok, seqlen)?;
    let eval_wins = match &args.eval_text {
        Some(path) => {
            let (tokens, _) = common::tokenize_counting(tok, path, args.eval_lines)?;
            Some(eval_windows(&tokens, seqlen, args.eval_windows)?)
        }
        None => None,
    };
    p.checkpoint("02_data_prepared");
    let config = GradProbeConfig {
        strategy: g.strategy,
        sparsity: if g.iterative {
            g.initial_sparsity
        } else {
            args.sparsity
        },
        reduction_factor: g.reduction_factor,
        gradient_threshold: g.gradient_threshold,
        include_embeddings: g.include_embeddings,
        precision: g.grad_precision,
    };
    let mut probe = GradProbe::new(ckpt, config, &calib, batch_size(args), p)?;
    drop(calib);
    let started = std::time::Instant::now();

    let (masks, perplexity) = if g.iterative {
        let windows = eval_wins.as_deref().unwrap_or_default();
        iterate(args, ckpt, &mut probe, windows, p, run)?
    } else {
        let step = probe.step(&Masks::new())?;
        report_step(run, p, &step, args.sparsity);
        (step.pruned, None)
    };

    // Step 6: the pruned model, from the checkpoint with the masks zeroed.
    let needs_eval = eval_wins.is_some() && perplexity.is_none();
    let _scratch;
    let (layers, others, path) = match writer {
        Some(w) => {
            let (layers, others) = write_pruned(ckpt, probe.targets(), &masks, w)?;
            let path = if needs_eval {
                Some(w.complete(ckpt)?)
            } else {
                None
            };
            (layers, others, path)
        }
        None => {
            let (dir, path, others, outcome) = scratch_model(ckpt, &probe, &masks)?;
            _scratch = dir;
            (outcome.layers, others, Some(path))
        }
    };
    let outcome = PruneOutcome {
        layers,
        seconds: started.elapsed().as_secs_f64(),
    };
    let mut components = std::collections::BTreeMap::new();
    components.insert(
        "pruned positions (u32)".to_string(),
        masks.values().map(|m| m.len() as u64 * 4).sum(),
    );
    p.components("16_final_pruning_applied", components);
    p.checkpoint("16_final_pruning_applied");
    let perplexity = match (&eval_wins, path, perplexity) {
        (Some(wins), Some(path), None) => {
            p.checkpoint("17_before_eval");
            let r = evaluate(&path, wins, args, p)?;
            p.checkpoint("18_after_eval");
            Some(r)
        }
        (_, _, known) => known,
    };
    run.result("sparsity", outcome.sparsity());
    run.result("sparsity_all_probed", sparsity_of(&outcome, &others));
    run.result("prune_seconds", outcome.seconds);
    run.result(
        "layer_sparsity",
        outcome
            .layers
            .iter()
            .map(|l| l.sparsity())
            .collect::<Vec<_>>(),
    );
    for o in &others {
        run.result(
            &format!("sparsity_{}", o.name),
            o.zeros as f64 / o.params.max(1) as f64,
        );
    }
    if let Some(r) = &perplexity {
        run.result("perplexity", r.perplexity);
        run.result("eval_windows", r.windows);
        run.result("eval_seconds", r.seconds);
    }
    Ok(Outcome {
        prune: outcome,
        perplexity,
    })
}

fn report_step(
    run: &mut Run,
    p: &Profiler,
    step: &crate::prune::gradprobe::StepOutcome,
    target: f64,
) {
    p.message(
        Level::Info,
        format!(
            "gradprobe at {:.3}: {} candidates, {} pruned, {} restored (gradient rose); loss {:.4} → {:.4} with candidates × reduction",
            target,
            step.tentative,
            step.pruned_count(),
            step.restored,
            step.loss_original,
            step.loss_modified
        ),
    );
    run.result("tentative", step.tentative);
    run.result("pruned", step.pruned_count());
    run.result("restored", step.restored);
    run.result("calibration_loss", step.loss_original);
    run.result("calibration_loss_reduced", step.loss_modified);
}

/// `--iterative`: the reference's `iterative_prune` with perplexity as the
/// metric. Each step probes the model with the masks so far applied, adds
/// what it prunes, writes the model to a scratch folder and evaluates it.
/// Stops when sparsity has not risen for two steps or perplexity exceeds
/// the dense one by more than `--max-ppl-increase`; returns the best valid
/// masks and their perplexity.
fn iterate(
    args: &PruneArgs,
    ckpt: &Checkpoint,
    probe: &mut GradProbe<'_>,
    windows: &[Vec<u32>],
    p: &Profiler,
    run: &mut Run,
) -> CliResult<(Masks, Option<Perplexity>)> {
    let g = &args.gradprobe;
    let dense = evaluate(&ckpt.dir, windows, args, p)?;
    p.message(
        Level::Info,
        format!("dense perplexity {:.4}", dense.perplexity),
    );
    run.result("dense_perplexity", dense.perplexity);
    let mut masks = Masks::new();
    let mut best: Option<(Masks, Perplexity)> = None;
    let (mut previous, mut flat_steps) = (0.0, 0);
    let mut history = Vec::new();
    let mut target = g.initial_sparsity;
    while target <= 1.0 {
        probe.set_sparsity(target);
        let step = probe.step(&masks)?;
        for (name, new) in &step.pruned {
            let merged = select::union(masks.get(name).map_or(&[][..], |v| v), new);
            masks.insert(name.clone(), merged);
        }
        let (_dir, path, others, outcome) = scratch_model(ckpt, probe, &masks)?;
        let sparsity = sparsity_of(&outcome, &others);
        let ppl = evaluate(&path, windows, args, p)?;
        p.message(
            Level::Info,
            format!(
                "step at {target:.3}: sparsity {sparsity:.4}, perplexity {:.4} (dense {:.4}), {} pruned, {} restored",
                ppl.perplexity,
                dense.perplexity,
                step.pruned_count(),
                step.restored
            ),
        );
        history.push(json!({
            "target": target, "sparsity": sparsity, "perplexity": ppl.perplexity,
            "tentative": step.tentative, "pruned": step.pruned_count(), "restored": step.restored,
            "seconds": step.seconds,
        }));
        if sparsity - previous <= 0.0 {
            flat_steps += 1;
        } else {
            flat_steps = 0;
        }
        if flat_steps >= 2 {
            p.message(
                Level::Info,
                "sparsity stopped rising for two steps: stopping",
            );
            break;
        }
        if ppl.perplexity - dense.perplexity > g.max_ppl_increase {
            p.message(
                Level::Info,
                format!(
                    "perplexity rose {:.4} > {}: keeping the previous step",
                    ppl.perplexity - dense.perplexity,
                    g.max_ppl_increase
                ),
            );
            break;
        }
        best = Some((masks.clone(), ppl));
        previous = sparsity;
        target += g.sparsity_step;
    }
    run.result("iterations", history);
    match best {
        Some((m, ppl)) => Ok((m, Some(ppl))),
        None => {
            p.message(
                Level::Warn,
                "no step kept perplexity within --max-ppl-increase: the model is left dense",
            );
            Ok((Masks::new(), Some(dense)))
        }
    }
}
