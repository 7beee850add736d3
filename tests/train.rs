//! Training: the loss goes down, gradients are right (a finite difference
//! along the gradient, and the checkpointed backward against the full
//! graph), accumulation over k micro-batches equals one batch k times
//! larger, the two profiling approaches come out of a real run's log with
//! accumulation measured, and bad flags are one-line errors.

mod support;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::backend::Flex;
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::prelude::*;
use prunemem::events::{Emitter, Event};
use prunemem::model::synthetic::{SyntheticSpec, write_checkpoint};
use prunemem::model::tokenizer::Tokenizer;
use prunemem::model::{Checkpoint, ComputeDtype};
use prunemem::profiler::{Profiler, ProfilerConfig};
use prunemem::train::step::{self, Accumulator, Ad, MicroBatch, Model, Ropes};
use prunemem::train::{self, Freeze, OptimizerConfig, OptimizerKind, TrainConfig};
use support::{json_line, run_prunemem as run, s};

struct Fixture {
    _dir: tempfile::TempDir,
    model: PathBuf,
    text: PathBuf,
}

fn fixture(words: usize) -> Fixture {
    fixture_of(words, SyntheticSpec::default())
}

/// Every linear at least 64 KiB, so each lands in its own category
/// (`memory::tag` tracks blocks from 64 KiB).
fn wide() -> SyntheticSpec {
    SyntheticSpec {
        hidden: 256,
        intermediate: 512,
        ..SyntheticSpec::default()
    }
}

fn fixture_of(words: usize, spec: SyntheticSpec) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    write_checkpoint(&model, &spec).unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(&text, support::sample_text(words)).unwrap();
    Fixture {
        model,
        text,
        _dir: dir,
    }
}

fn windows(f: &Fixture, seqlen: usize) -> Vec<Vec<u32>> {
    let tok = Tokenizer::from_file(&f.model.join("tokenizer.json")).unwrap();
    let ids = tok
        .encode(&std::fs::read_to_string(&f.text).unwrap())
        .unwrap();
    train::windows(&ids, seqlen)
}

fn config(kind: OptimizerKind) -> TrainConfig {
    TrainConfig {
        batch_size: 2,
        grad_accum: 1,
        seqlen: 32,
        steps: Some(1),
        epochs: 1,
        optimizer: OptimizerConfig::new(kind),
        lr: 1e-3,
        dtype: ComputeDtype::F32,
        checkpointing: false,
        freeze: Freeze::default(),
        seed: 0,
    }
}

fn quiet_profiler() -> Profiler {
    let config = ProfilerConfig {
        sampler_hz: None,
        gpu_index: None,
        ..Default::default()
    };
    Profiler::new(Arc::new(Emitter::new()), config)
}

/// Every parameter's values, in visiting order.
fn params(model: &impl Module<Flex>) -> Vec<f32> {
    struct Collect(Vec<f32>);
    impl ModuleVisitor<Flex> for Collect {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<Flex, D>>) {
            self.0
                .extend(p.val().into_data().into_vec::<f32>().unwrap());
        }
    }
    let mut c = Collect(Vec::new());
    model.visit(&mut c);
    c.0
}

/// Every parameter's gradient in `grads` (zeros where none), in order.
fn grads_of(model: &Model, grads: &GradientsParams) -> Vec<f32> {
    struct Collect<'a>(&'a GradientsParams, Vec<f32>);
    impl ModuleVisitor<Ad> for Collect<'_> {
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<Ad, D>>) {
            match self.0.get::<Flex, D>(p.id) {
                Some(g) => self.1.extend(g.into_data().into_vec::<f32>().unwrap()),
                None => self
                    .1
                    .extend(std::iter::repeat_n(0.0, p.shape().num_elements())),
            }
        }
    }
    let mut c = Collect(grads, Vec::new());
    model.visit(&mut c);
    c.1
}

fn load(f: &Fixture) -> (Checkpoint, Model) {
    let ckpt = Checkpoint::open(&f.model).unwrap();
    let model = ckpt
        .load_model::<Ad>(ComputeDtype::F32, &Default::default())
        .unwrap();
    (ckpt, model)
}

/// Accumulated gradients over `mbs` (each scaled by `scale`), and the
/// summed scaled loss.
fn gradients(
    model: &Model,
    ropes: &Ropes,
    mbs: &[MicroBatch],
    checkpointed: bool,
    scale: f64,
) -> (Vec<f32>, f64) {
    let mut acc = Accumulator::new();
    let mut loss = 0.0;
    for mb in mbs {
        let fwd = step::forward(model, mb, ropes, checkpointed, (0, true), scale);
        loss += step::backward(model, mb, fwd, ropes, &mut acc, (0, true), scale);
    }
    let grads = acc.grads();
    (grads_of(model, &grads), loss)
}

fn max_rel_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = a.iter().fold(0f32, |m, v| m.max(v.abs()));
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
        / scale
}

#[test]
fn checkpointed_backward_gives_the_full_graphs_gradients() {
    let f = fixture(3000);
    let (ckpt, model) = load(&f);
    let ropes = Ropes::new(&ckpt.config, 32);
    let mb = MicroBatch::from_windows(&windows(&f, 32)[..2]);
    let (full, l1) = gradients(&model, &ropes, std::slice::from_ref(&mb), false, 1.0);
    let (ckpt_g, l2) = gradients(&model, &ropes, &[mb], true, 1.0);
    assert!(full.iter().any(|g| *g != 0.0));
    assert!((l1 - l2).abs() < 1e-5, "loss {l1} vs {l2}");
    let d = max_rel_diff(&full, &ckpt_g);
    assert!(
        d < 1e-4,
        "checkpointed gradients differ by {d} (relative to the largest)"
    );
}

#[test]
fn gradient_matches_a_finite_difference_along_itself() {
    // Moving the parameters by ±ε·g changes the loss by ±ε·|g|² to first
    // order: (L(θ+εg) − L(θ−εg)) / 2ε ≈ |g|².
    let f = fixture(3000);
    let (ckpt, model) = load(&f);
    let ropes = Ropes::new(&ckpt.config, 32);
    let mb = MicroBatch::from_windows(&windows(&f, 32)[..2]);
    let (g, _) = gradients(&model, &ropes, std::slice::from_ref(&mb), false, 1.0);
    let norm2: f64 = g.iter().map(|g| (*g as f64).powi(2)).sum();
    let eps = 1e-2 / norm2;
    let moved = |lr: f64| -> f64 {
        let mut acc = Accumulator::new();
        let fwd = step::forward(&model, &mb, &ropes, false, (0, true), 1.0);
        step::backward(&model, &mb, fwd, &ropes, &mut acc, (0, true), 1.0);
        let g = acc.grads();
        let mut sgd =
            train::optim::Optimizer::<Flex>::new(OptimizerConfig::new(OptimizerKind::Sgd));
        let m = sgd.step(lr, model.clone(), g);
        let fwd = step::forward(&m, &mb, &ropes, false, (0, true), 1.0);
        fwd.loss().expect("the full graph's loss")
    };
    // SGD with lr = ε moves by −εg; with lr = −ε by +εg.
    let numeric = (moved(-eps) - moved(eps)) / (2.0 * eps);
    let rel = (numeric - norm2).abs() / norm2;
    assert!(
        rel < 2e-2,
        "finite difference {numeric} vs |g|² {norm2} (rel {rel})"
    );
}

#[test]
fn accumulating_k_micro_batches_equals_one_batch_k_times_larger() {
    let f = fixture(3000);
    let (ckpt, model) = load(&f);
    let ropes = Ropes::new(&ckpt.config, 32);
    let w = windows(&f, 32);
    let big = MicroBatch::from_windows(&w[..4]);
    let small = [
        MicroBatch::from_windows(&w[..2]),
        MicroBatch::from_windows(&w[2..4]),
    ];
    let (g1, l1) = gradients(&model, &ropes, &[big], false, 1.0);
    let (g2, l2) = gradients(&model, &ropes, &small, false, 0.5);
    assert!((l1 - l2).abs() < 1e-5, "loss {l1} vs {l2}");
    let d = max_rel_diff(&g1, &g2);
    assert!(d < 1e-5, "accumulated gradients differ by {d}");
    // And through the whole trainer: the same update (SGD shows it plainly).
    let p = quiet_profiler();
    let mut a = config(OptimizerKind::Sgd);
    a.batch_size = 4;
    let mut b = a.clone();
    (b.batch_size, b.grad_accum) = (2, 2);
    let one = train::train(&ckpt, &w, &a, &p).unwrap();
    let two = train::train(&ckpt, &w, &b, &p).unwrap();
    let (pa, pb) = (params(&one.model), params(&two.model));
    let before = params(
        &ckpt
            .load_model::<Flex>(ComputeDtype::F32, &Default::default())
            .unwrap(),
    );
    assert!(
        pa.iter().zip(&before).any(|(x, y)| x != y),
        "the step changed nothing"
    );
    let d = max_rel_diff(&pa, &pb);
    assert!(d < 1e-6, "updates differ by {d}");
    assert!((one.steps[0].loss - two.steps[0].loss).abs() < 1e-5);
}

#[test]
fn loss_decreases_and_frozen_layers_stay_put() {
    let f = fixture(2000);
    let w = windows(&f, 32);
    let ckpt = Checkpoint::open(&f.model).unwrap();
    let mut c = config(OptimizerKind::AdamW);
    (c.steps, c.lr, c.batch_size) = (Some(12), 3e-3, 4);
    c.freeze = "embeddings,0".parse().unwrap();
    c.checkpointing = true;
    let out = train::train(&ckpt, &w, &c, &quiet_profiler()).unwrap();
    let losses: Vec<f64> = out.steps.iter().map(|r| r.loss).collect();
    let head = losses[..3].iter().sum::<f64>() / 3.0;
    let tail = losses[losses.len() - 3..].iter().sum::<f64>() / 3.0;
    assert!(tail < head * 0.9, "loss did not decrease: {losses:?}");
    let before = ckpt
        .load_model::<Flex>(ComputeDtype::F32, &Default::default())
        .unwrap();
    assert_eq!(
        params(&before.model.layers[0]),
        params(&out.model.model.layers[0])
    );
    assert_eq!(
        params(&before.model.embed_tokens),
        params(&out.model.model.embed_tokens)
    );
    assert_ne!(
        params(&before.model.layers[1]),
        params(&out.model.model.layers[1])
    );
    assert!(out.trainable_params < out.params);
}

fn train_args<'a>(f: &'a Fixture, logs: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "train",
        "--model",
        s(&f.model),
        "--text",
        s(&f.text),
        "--seqlen",
        "32",
        "--batch-size",
        "2",
        "--ui",
        "none",
        "--json",
        "--log-memory",
        s(logs),
    ];
    v.extend_from_slice(extra);
    v
}

#[test]
fn a_run_logs_both_approaches_and_measures_accumulation() {
    let f = fixture_of(3000, wide());
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    let (code, out, err) = run(&train_args(
        &f,
        &logs,
        &["--grad-accum", "3", "--steps", "3"],
    ));
    assert_eq!(code, Some(0), "{err}");
    let j = json_line(&out);
    assert_eq!(j["steps"].as_array().unwrap().len(), 3);
    let gap = &j["gap"];
    let factor = |name: &str| {
        gap["factors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == name)
            .and_then(|f| f["bytes"].as_i64())
            .unwrap()
    };
    // Adam's moments: 2 × 4 bytes per parameter, created at the first step.
    let params = j["params"].as_i64().unwrap();
    let opt = factor("optimizer state");
    assert!(
        (opt - 8 * params).abs() < params / 10,
        "optimizer factor {opt} vs 8 × {params}"
    );
    assert!(gap["single_step"]["optimizer_state"].as_i64().unwrap() >= 7 * params);
    let growth = gap["accumulation_growth"].as_i64().unwrap();
    assert!(
        growth.abs() < params / 10,
        "accumulation grew gradients by {growth}"
    );
    let epoch_peak = gap["epochs"][0][1]["heap"].as_u64().unwrap();
    let single = gap["single_step"]["peak"]["heap"].as_u64().unwrap();
    assert!(
        epoch_peak > single,
        "epoch peak {epoch_peak} <= single step {single}"
    );
    // The log has every stage the analysis needs, and the scopes.
    let text = std::fs::read_to_string(logs.join("events.jsonl")).unwrap();
    let events = prunemem::events::parse_log(&text).unwrap().events;
    let labels = support::stage_labels(&events);
    for l in [
        "epoch_1_start",
        "step_0001_mb1_forward",
        "step_0001_mb3_backward",
        "step_0003_zero_grad",
    ] {
        assert!(labels.iter().any(|x| x == l), "no stage {l} in {labels:?}");
    }
    let scopes = events
        .iter()
        .filter(|e| matches!(e, Event::ScopeEnd { report } if report.label == "epoch_1"))
        .count();
    assert_eq!(scopes, 1);
}

#[test]
fn bad_training_flags_are_one_line_errors() {
    let f = fixture(300);
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--batch-size", "0"], "--batch-size"),
        (vec!["--grad-accum", "0"], "--grad-accum"),
        (vec!["--optimizer", "lion"], "lion"),
        (vec!["--freeze", "7"], "layer 7"),
        (vec!["--freeze", "embeddings,norm,0-1"], "nothing to train"),
        (vec!["--device", "cuda"], "--device"),
        (vec!["--dtype", "bf16"], "f32"),
        (vec!["--text", s(&empty)], "text"),
    ];
    for (extra, needle) in cases {
        let (code, out, err) = run(&train_args(&f, &logs, &extra));
        assert_eq!(code, Some(2), "{extra:?}: {out} {err}");
        assert_eq!(err.trim().lines().count(), 1, "{extra:?}: {err}");
        assert!(err.contains(needle), "{extra:?}: {err}");
    }
    // A seqlen beyond the model's positions is capped with a warning.
    let (code, out, err) = run(&train_args(
        &f,
        &logs,
        &["--seqlen", "4096", "--steps", "1", "--batch-size", "1"],
    ));
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(json_line(&out)["seqlen"], 256);
}
