//! One micro-batch's forward and backward on Burn autodiff, in two ways:
//! the whole graph kept from the embedding to the loss (what a PyTorch
//! training loop does), or checkpointed — the forward keeps only each
//! layer's input, and the backward recomputes one layer at a time under
//! autodiff and pushes the gradient through it (activation checkpointing
//! per decoder layer: the memory-for-time trade of
//! `torch.utils.checkpoint` around each layer).
//!
//! Gradients land in a [`GradientsAccumulator`], so k micro-batches add into
//! the same buffers. Frozen parameters are not tracked: Burn keeps no graph
//! for a frozen prefix, and the checkpointed backward stops at the lowest
//! trainable layer.

use crate::exec::{Compute, Cpu};
use burn::backend::Autodiff;
use burn::module::AutodiffModule;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::prelude::*;

use crate::memory::tag::{self, Category};
use crate::model::llama::Llama;
use crate::model::perplexity::token_tensor;
use crate::model::tiny::lm_loss;
use crate::model::{ComputeDtype, Rope};

/// The autodiff backend over `B` (Burn's CPU backend unless named).
pub type Ad<B = Cpu> = Autodiff<B>;
/// The model under training on `B`.
pub type Model<B = Cpu> = Llama<Ad<B>>;
pub type Accumulator<B = Cpu> = GradientsAccumulator<Model<B>>;

/// `b` windows of `seqlen` inputs and their next tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct MicroBatch {
    pub inputs: Vec<Vec<u32>>,
    pub targets: Vec<u32>,
}

impl MicroBatch {
    /// From windows of `seqlen + 1` tokens.
    pub fn from_windows(windows: &[Vec<u32>]) -> Self {
        Self {
            inputs: windows.iter().map(|w| w[..w.len() - 1].to_vec()).collect(),
            targets: windows
                .iter()
                .flat_map(|w| w[1..].iter().copied())
                .collect(),
        }
    }
    pub fn tokens(&self) -> usize {
        self.targets.len()
    }
}

/// Rotary tables for both backends at one length.
pub struct Ropes<B: Compute = Cpu> {
    pub ad: Rope<Ad<B>>,
    pub plain: Rope<B>,
}

impl Ropes<Cpu> {
    /// On Burn's CPU backend.
    pub fn new(config: &crate::model::LlamaConfig, seqlen: usize) -> Self {
        Self::on(config, seqlen, &Default::default())
    }
}

impl<B: Compute> Ropes<B> {
    /// On `device`.
    pub fn on(config: &crate::model::LlamaConfig, seqlen: usize, device: &B::Device) -> Self {
        let dtype = ComputeDtype::F32.burn();
        Self {
            ad: Rope::new(config, seqlen, dtype, device),
            plain: Rope::new(config, seqlen, dtype, device),
        }
    }
}

/// What the forward leaves for the backward.
pub enum Forward<B: Compute = Cpu> {
    /// The loss, with the whole graph behind it.
    Full { loss: Tensor<Ad<B>, 1> },
    /// The inputs of every layer and of the final norm, no graph.
    Checkpointed { boundaries: Vec<Tensor<B, 3>> },
}

/// Mean next-token cross-entropy of `x` (the last layer's output, before
/// the final norm) times `scale`.
fn loss_of<B: Compute>(
    model: &Model<B>,
    x: Tensor<Ad<B>, 3>,
    mb: &MicroBatch,
    scale: f64,
) -> Tensor<Ad<B>, 1> {
    let [b, s, d] = x.dims();
    let h = model.model.norm.forward(x);
    let _tag = tag::tag(Category::Logits);
    let logits = model.head().logits(h.reshape([b * s, d]));
    let targets: Vec<i64> = mb.targets.iter().map(|t| *t as i64).collect();
    let targets =
        Tensor::<Ad<B>, 1, Int>::from_data(TensorData::new(targets, [b * s]), &device_of(model));
    lm_loss(logits, targets).mul_scalar(scale)
}

/// The device the model's parameters live on.
fn device_of<B: Compute>(model: &Model<B>) -> B::Device {
    model.model.embed_tokens.weight.val().device()
}

/// The forward of one micro-batch.
pub fn forward<B: Compute>(
    model: &Model<B>,
    mb: &MicroBatch,
    ropes: &Ropes<B>,
    checkpointed: bool,
    scale: f64,
) -> Forward<B> {
    let _tag = tag::tag(Category::Activations);
    let device = device_of(model);
    if !checkpointed {
        let mut x = model
            .model
            .embed_tokens
            .forward(token_tensor::<Ad<B>>(&mb.inputs, &device));
        for layer in &model.model.layers {
            x = layer.forward(x, &ropes.ad);
        }
        return Forward::Full {
            loss: loss_of(model, x, mb, scale),
        };
    }
    let embed = model.model.embed_tokens.valid();
    let mut boundaries = vec![embed.forward(token_tensor::<B>(&mb.inputs, &device))];
    drop(embed);
    for layer in &model.model.layers {
        let plain = layer.valid();
        let next = plain.forward(boundaries[boundaries.len() - 1].clone(), &ropes.plain);
        boundaries.push(next);
    }
    Forward::Checkpointed { boundaries }
}

/// The backward of one micro-batch; gradients are added into `acc`.
/// `floor` is the lowest decoder layer the backward must reach
/// (`Freeze::backward_floor`), `embeddings_trainable` whether the lookup's
/// gradient is needed. Returns the micro-batch's scaled loss.
pub fn backward<B: Compute>(
    model: &Model<B>,
    mb: &MicroBatch,
    fwd: Forward<B>,
    ropes: &Ropes<B>,
    acc: &mut Accumulator<B>,
    (floor, embeddings_trainable): (usize, bool),
    scale: f64,
) -> f64 {
    let _tag = tag::tag(Category::Gradients);
    let mut boundaries = match fwd {
        Forward::Full { loss } => {
            let value = loss.clone().into_scalar().to_f64();
            let grads = loss.backward();
            acc.accumulate(model, GradientsParams::from_grads(grads, model));
            return value;
        }
        Forward::Checkpointed { boundaries } => boundaries,
    };
    let layers = model.model.layers.len();
    let last = boundaries.pop().expect("the final norm's input");
    let x = Tensor::<Ad<B>, 3>::from_inner(last).require_grad();
    let loss = tag::tagged(Category::Activations, || {
        loss_of(model, x.clone(), mb, scale)
    });
    let value = loss.clone().into_scalar().to_f64();
    let grads = loss.backward();
    let mut g = x.grad(&grads);
    acc.accumulate(model, GradientsParams::from_grads(grads, model));
    for i in (floor..layers).rev() {
        let (Some(dy), Some(input)) = (g.take(), boundaries.pop()) else {
            break;
        };
        let x = Tensor::<Ad<B>, 3>::from_inner(input).require_grad();
        let y = tag::tagged(Category::Activations, || {
            model.model.layers[i].forward(x.clone(), &ropes.ad)
        });
        let grads = (y * Tensor::<Ad<B>, 3>::from_inner(dy)).sum().backward();
        g = x.grad(&grads);
        acc.accumulate(model, GradientsParams::from_grads(grads, model));
    }
    drop(boundaries);
    if embeddings_trainable && let Some(dy) = g {
        let device = device_of(model);
        let e = model
            .model
            .embed_tokens
            .forward(token_tensor::<Ad<B>>(&mb.inputs, &device));
        let grads = (e * Tensor::<Ad<B>, 3>::from_inner(dy)).sum().backward();
        acc.accumulate(model, GradientsParams::from_grads(grads, model));
    }
    value
}
