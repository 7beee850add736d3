//! Training steps, measured: a Llama-family model from a checkpoint trained
//! on next-token loss with Burn autodiff, with a stage snapshot around every
//! forward, backward, optimizer step and zero-grad, a scope around every
//! step and epoch, and the engine's own accounting of what it holds
//! (parameters, gradients, optimizer state, checkpointed boundaries).
//!
//! Why: users profile training in two ways that disagree — one step's
//! component breakdown, and the peak over an epoch — and guess at the
//! difference. A run here records both on the same steps; [`analysis`]
//! explains the gap from the measured bytes.

pub mod analysis;
pub mod grads;
pub mod head;
pub mod micro;
pub mod optim;
pub mod step;

use std::collections::BTreeMap;

use burn::module::{AutodiffModule, Module};
use thiserror::Error;

use crate::events::{Level, stages};
use crate::exec::Compute;
use crate::memory::held::Held;
use crate::memory::tag::{self, Category};
use crate::model::{Checkpoint, ComputeDtype, ModelError};
use crate::profiler::Profiler;
pub use optim::{OptimizerConfig, OptimizerKind};
use step::{MicroBatch, Model, Ropes};

#[derive(Debug, Error)]
pub enum TrainError {
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// Which parameters stay fixed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Freeze {
    /// The token embeddings (and the head when it is tied to them).
    pub embeddings: bool,
    /// A separate output head.
    pub head: bool,
    /// The final norm.
    pub norm: bool,
    /// Decoder layers by index.
    pub layers: Vec<usize>,
}

impl std::str::FromStr for Freeze {
    type Err = String;
    /// `embeddings,head,norm,0-19,23`: parts, comma-separated; `layers` is
    /// every decoder layer (checked against the model later).
    fn from_str(s: &str) -> Result<Self, String> {
        let mut f = Freeze::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "embeddings" | "embed" => f.embeddings = true,
                "head" | "lm_head" => f.head = true,
                "norm" => f.norm = true,
                "layers" => f.layers.push(usize::MAX),
                _ => {
                    let bad = || {
                        format!(
                            "--freeze: '{part}' is not embeddings, head, norm, layers, N or A-B"
                        )
                    };
                    let (a, b) = match part.split_once('-') {
                        Some((a, b)) => (a, b),
                        None => (part, part),
                    };
                    let (a, b): (usize, usize) =
                        (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                    if a > b {
                        return Err(bad());
                    }
                    f.layers.extend(a..=b);
                }
            }
        }
        Ok(f)
    }
}

impl Freeze {
    /// The frozen layer indices for a model of `n` layers; an error names
    /// one out of range.
    pub fn resolve(&self, n: usize) -> Result<Vec<usize>, String> {
        if self.layers.contains(&usize::MAX) {
            return Ok((0..n).collect());
        }
        let mut v = self.layers.clone();
        v.sort_unstable();
        v.dedup();
        match v.iter().find(|i| **i >= n) {
            Some(i) => Err(format!(
                "--freeze: layer {i} does not exist (the model has {n} layers)"
            )),
            None => Ok(v),
        }
    }

    /// The lowest decoder layer the backward must reach for a model of
    /// `n` layers: 0 while the embeddings train, else the first layer not
    /// frozen (`n` when all are) — no layer below it saves activations.
    pub fn backward_floor(&self, n: usize) -> Result<usize, String> {
        if !self.embeddings {
            return Ok(0);
        }
        let layers = self.resolve(n)?;
        Ok((0..n).find(|i| !layers.contains(i)).unwrap_or(n))
    }
}

/// A training run's settings.
#[derive(Debug, Clone)]
pub struct TrainConfig {
    pub batch_size: usize,
    pub grad_accum: usize,
    pub seqlen: usize,
    /// Stop after this many optimizer steps (else after `epochs`).
    pub steps: Option<usize>,
    pub epochs: usize,
    pub optimizer: OptimizerConfig,
    pub lr: f64,
    pub dtype: ComputeDtype,
    pub checkpointing: bool,
    pub freeze: Freeze,
    /// Shuffles the windows each epoch.
    pub seed: u64,
}

impl TrainConfig {
    pub fn validate(&self) -> Result<(), TrainError> {
        let bad = |m: &str| Err(TrainError::Invalid(m.to_string()));
        if self.batch_size == 0 {
            return bad("--batch-size must be at least 1");
        }
        if self.grad_accum == 0 {
            return bad("--grad-accum must be at least 1");
        }
        if self
            .batch_size
            .checked_mul(self.grad_accum)
            .is_none_or(|b| b > 1 << 32)
        {
            return bad(
                "--batch-size × --grad-accum is past any run (at most 2^32 windows a step)",
            );
        }
        if self.seqlen == 0 {
            return bad("--seqlen must be at least 1");
        }
        if self.epochs == 0 || self.steps == Some(0) {
            return bad("--epochs and --steps must be at least 1");
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad("--lr must be a positive number");
        }
        if self.dtype != ComputeDtype::F32 {
            return bad(
                "training computes in f32 for now (--dtype f32); 16-bit training needs f32 master weights, not built yet",
            );
        }
        Ok(())
    }

    /// Windows per optimizer step.
    pub fn effective_batch(&self) -> usize {
        self.batch_size * self.grad_accum
    }
}

/// One optimizer step's record.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StepRecord {
    pub step: usize,
    pub epoch: usize,
    pub loss: f64,
    pub seconds: f64,
}

/// What a training run did.
#[derive(Debug)]
pub struct TrainOutcome<B: Compute = crate::exec::Cpu> {
    pub steps: Vec<StepRecord>,
    pub params: u64,
    pub trainable_params: u64,
    pub steps_per_epoch: usize,
    /// The trained model (plain backend), for saving.
    pub model: crate::model::llama::Llama<B>,
    /// Every stage snapshot the steps took, in order (for [`analysis`]).
    pub stages: Vec<crate::memory::MemorySnapshot>,
}

/// Parameters that require a gradient.
fn trainable_params<B: Compute>(model: &Model<B>) -> u64 {
    struct Count(u64);
    impl<B: Compute> burn::module::ModuleVisitor<step::Ad<B>> for Count {
        fn visit_float<const D: usize>(
            &mut self,
            p: &burn::module::Param<burn::prelude::Tensor<step::Ad<B>, D>>,
        ) {
            if p.val().is_require_grad() {
                self.0 += p.val().shape().num_elements() as u64;
            }
        }
    }
    let mut c = Count(0);
    model.visit(&mut c);
    c.0
}

/// Applies `freeze`; returns (the backward's floor, embeddings trainable).
fn apply_freeze<B: Compute>(
    mut model: Model<B>,
    freeze: &Freeze,
) -> Result<(Model<B>, (usize, bool)), TrainError> {
    let n = model.model.layers.len();
    let layers = freeze.resolve(n).map_err(TrainError::Invalid)?;
    let tied = model.lm_head.is_none();
    if freeze.head && tied && !freeze.embeddings {
        return Err(TrainError::Invalid(
            "--freeze head: the head is tied to the embeddings; freeze 'embeddings' to fix both"
                .into(),
        ));
    }
    for i in &layers {
        model.model.layers[*i] = model.model.layers[*i].clone().no_grad();
    }
    if freeze.embeddings {
        model.model.embed_tokens = model.model.embed_tokens.clone().no_grad();
    }
    if freeze.head {
        model.lm_head = model.lm_head.map(|h| h.no_grad());
    }
    if freeze.norm {
        model.model.norm = model.model.norm.clone().no_grad();
    }
    let floor = freeze.backward_floor(n).map_err(TrainError::Invalid)?;
    Ok((model, (floor, !freeze.embeddings)))
}

/// Windows of `seqlen + 1` tokens every `seqlen` tokens (each token is a
/// target once).
pub fn windows(tokens: &[u32], seqlen: usize) -> Vec<Vec<u32>> {
    if tokens.len() < seqlen + 1 {
        return Vec::new();
    }
    (0..(tokens.len() - 1) / seqlen)
        .map(|i| tokens[i * seqlen..i * seqlen + seqlen + 1].to_vec())
        .collect()
}

/// The order of `n` windows in epoch `epoch` (seeded Fisher–Yates).
fn order(n: usize, seed: u64, epoch: usize) -> Vec<usize> {
    let mut rng = crate::model::synthetic::Normal::new(
        seed ^ (epoch as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
    );
    let mut v: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = ((rng.uniform() * (i + 1) as f64) as usize).min(i);
        v.swap(i, j);
    }
    v
}

/// How many steps the run takes, and per epoch.
pub fn plan_steps(config: &TrainConfig, windows: usize) -> Result<(usize, usize), TrainError> {
    let per_epoch = windows / config.effective_batch();
    if per_epoch == 0 {
        return Err(TrainError::Invalid(format!(
            "the text gives {windows} windows of {} tokens, fewer than one step needs (--batch-size {} × --grad-accum {})",
            config.seqlen + 1,
            config.batch_size,
            config.grad_accum
        )));
    }
    let total = match config.steps {
        Some(steps) => steps,
        None => per_epoch.checked_mul(config.epochs).ok_or_else(|| {
            TrainError::Invalid(format!(
                "--epochs {} of {per_epoch} steps is more steps than can be counted",
                config.epochs
            ))
        })?,
    };
    Ok((total, per_epoch))
}

/// Whether step `s` of `total` gets the full set of stages (the first
/// three and the last); the others get one stage at their end, so the
/// stage windows still tile the run and no peak escapes.
fn detailed(s: usize, total: usize) -> bool {
    s <= 3 || s == total
}

/// What every optimizer step of a run shares.
struct Steps<'a, B: Compute> {
    windows: &'a [Vec<u32>],
    config: &'a TrainConfig,
    p: &'a Profiler,
    ropes: Ropes<B>,
    /// The backward's floor and whether the embeddings train
    /// (`apply_freeze`).
    trainable: (usize, bool),
    /// 1 / grad_accum: each micro-batch's share of the step's loss.
    scale: f64,
    params: u64,
    trainable_count: u64,
    /// The checkpointed forward's layer inputs.
    boundary_bytes: u64,
    total: usize,
}

impl<B: Compute> Steps<'_, B> {
    /// The components a step's stage records: parameters, gradients (when
    /// held), the optimizer's state and checkpointed inputs.
    fn account(
        &self,
        grads: bool,
        opt: &optim::Optimizer<B>,
        boundaries: u64,
    ) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        m.insert("parameters".to_string(), self.params * 4);
        m.insert(
            "gradients".to_string(),
            if grads { self.trainable_count * 4 } else { 0 },
        );
        m.insert("optimizer state".to_string(), opt.state_bytes());
        if boundaries > 0 {
            m.insert("checkpointed layer inputs".to_string(), boundaries);
        }
        m
    }

    /// Step `s` on the windows of `chunk`: each micro-batch's forward and
    /// backward into one accumulator, the optimizer's update, zero-grad;
    /// the first steps and the last record a stage after each. Returns the
    /// updated model and the step's loss.
    fn step(
        &self,
        model: Model<B>,
        chunk: &[usize],
        s: usize,
        opt: &mut optim::Optimizer<B>,
        taken: &mut Vec<crate::memory::MemorySnapshot>,
    ) -> (Model<B>, f64) {
        let (config, p) = (self.config, self.p);
        let detail = detailed(s, self.total);
        let mut acc = step::Accumulator::<B>::new();
        // The accumulated gradients, from the first backward to the step.
        let mut grads_held = Held::none(Category::Gradients);
        let mut loss = 0.0;
        for (m, mb) in chunk.chunks(config.batch_size).enumerate() {
            let wins: Vec<Vec<u32>> = mb.iter().map(|i| self.windows[*i].clone()).collect();
            let mb = MicroBatch::from_windows(&wins);
            let fwd = step::forward(
                &model,
                &mb,
                &self.ropes,
                config.checkpointing,
                self.trainable,
                self.scale,
            );
            if detail {
                // What the pool holds beyond the parameters, gradients and
                // optimizer state here is the forward's graph.
                let _tag = crate::memory::tag::tag(Category::Activations);
                let label = stages::micro_batch(s, m + 1, "forward");
                let held = if config.checkpointing {
                    self.boundary_bytes
                } else {
                    0
                };
                p.components(&label, self.account(m > 0, opt, held));
                taken.push(p.stage(&label));
            }
            loss += step::backward(
                &model,
                &mb,
                fwd,
                &self.ropes,
                &mut acc,
                self.trainable,
                self.scale,
            );
            grads_held.set(self.trainable_count * 4);
            if detail {
                let label = stages::micro_batch(s, m + 1, "backward");
                p.components(&label, self.account(true, opt, 0));
                taken.push(p.stage(&label));
            }
        }
        let model = opt.step(config.lr, model, acc.grads());
        // The step consumed the gradients as it went.
        drop(grads_held);
        if detail {
            let label = stages::step_end(s, "optimizer_step");
            p.components(&label, self.account(false, opt, 0));
            taken.push(p.stage(&label));
        }
        // Gradients went as the step consumed them; what a zero_grad()
        // frees here is whatever the accumulator still held.
        drop(acc);
        // The step's freed buffers go back to the system, as the pruning
        // engines' do at every layer (`memory::mapping`).
        crate::memory::alloc::trim();
        let label = stages::step_end(s, "zero_grad");
        p.components(&label, self.account(false, opt, 0));
        taken.push(p.stage(&label));
        (model, loss)
    }
}

/// Trains `ckpt` on `windows` (each `seqlen + 1` tokens) on Burn's CPU
/// backend.
pub fn train(
    ckpt: &Checkpoint,
    windows: &[Vec<u32>],
    config: &TrainConfig,
    p: &Profiler,
) -> Result<TrainOutcome, TrainError> {
    train_on::<crate::exec::Cpu>(ckpt, windows, config, p, &Default::default())
}

/// Trains `ckpt` on `windows` (each `seqlen + 1` tokens) on `device`.
pub fn train_on<B: Compute>(
    ckpt: &Checkpoint,
    windows: &[Vec<u32>],
    config: &TrainConfig,
    p: &Profiler,
    device: &B::Device,
) -> Result<TrainOutcome<B>, TrainError> {
    config.validate()?;
    let (total, per_epoch) = plan_steps(config, windows.len())?;
    let model = tag::tagged(Category::Weights, || {
        ckpt.load_model::<step::Ad<B>>(config.dtype, device)
    })?;
    let (mut model, trainable) = apply_freeze(model, &config.freeze)?;
    let (params, trainable_count) = (model.num_params() as u64, trainable_params(&model));
    // The parameters on the device, for its composition (`memory::held`).
    let _weights_held = Held::new(Category::Weights, params * config.dtype.size());
    if trainable_count == 0 {
        return Err(TrainError::Invalid(
            "--freeze leaves nothing to train".into(),
        ));
    }
    let mut taken = vec![p.stage(stages::TRAIN_MODEL_LOADED)];
    let c = &ckpt.config;
    let steps = Steps {
        windows,
        config,
        p,
        ropes: Ropes::<B>::on(&ckpt.config, config.seqlen, device),
        trainable,
        scale: 1.0 / config.grad_accum as f64,
        params,
        trainable_count,
        boundary_bytes: ((c.num_layers + 1) * config.batch_size * config.seqlen * c.hidden_size * 4)
            as u64,
        total,
    };
    let mut opt = optim::Optimizer::<B>::new(config.optimizer);
    let mut records = Vec::new();
    let mut s = 0;
    'epochs: for epoch in 1.. {
        let start = stages::epoch_start(epoch);
        taken.push(p.stage(&start));
        let _epoch_scope = p.scope(&stages::epoch(epoch));
        let order = order(windows.len(), config.seed, epoch);
        for chunk in order.chunks_exact(config.effective_batch()).take(per_epoch) {
            if s == total {
                break 'epochs;
            }
            s += 1;
            let started = std::time::Instant::now();
            let _step_scope = p.scope(&stages::step(s));
            let (next, loss) = steps.step(model, chunk, s, &mut opt, &mut taken);
            model = next;
            let seconds = started.elapsed().as_secs_f64();
            records.push(StepRecord {
                step: s,
                epoch,
                loss,
                seconds,
            });
            let text = format!("epoch {epoch} step {s}/{total} loss {loss:.4} ({seconds:.1} s)");
            p.progress("training", s - 1, total, &text);
            p.message(Level::Info, text);
        }
        if s == total {
            break;
        }
    }
    Ok(TrainOutcome {
        steps: records,
        params,
        trainable_params: trainable_count,
        steps_per_epoch: per_epoch,
        model: model.valid(),
        stages: taken,
    })
}
