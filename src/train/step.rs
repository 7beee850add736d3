//! One micro-batch's forward and backward on Burn autodiff, in two ways:
//! the whole graph kept from the embedding to the loss (what a PyTorch
//! training loop does), or checkpointed — the forward keeps only each
//! layer's input, and the backward recomputes one layer at a time under
//! autodiff and pushes the gradient through it (activation checkpointing
//! per decoder layer: the memory-for-time trade of
//! `torch.utils.checkpoint` around each layer).
//!
//! Either way the backward runs in segments — the head, then each decoder
//! layer from the top, then the embedding lookup — and each segment's
//! gradients are added into the [`Accumulator`] as soon as they exist, so
//! the backward holds one segment's new gradients beside the accumulated
//! ones, not a second copy of the model's. The full graph keeps every
//! layer's graph from the forward, each from its own input; the
//! checkpointed backward rebuilds it. What is as large as the vocabulary
//! stays out of Burn's graph: the head and its loss are written out
//! (`train::head`: one logits-sized tensor from the forward to the end of
//! the head's backward), and the head's and the embedding's weight
//! gradients are added into the held gradient in pieces (`train::grads`).
//! Frozen parameters are not tracked:
//! Burn keeps no graph for a frozen prefix, and the backward stops at the
//! lowest trainable layer.

use crate::exec::{Compute, Cpu};
use burn::module::AutodiffModule;
use burn::prelude::*;

use crate::memory::tag::{self, Category};
use crate::model::perplexity::token_tensor;
use crate::model::{ComputeDtype, Rope};

pub use super::grads::Accumulator;
use super::grads::push_back;
use super::head;
pub use super::micro::{Ad, MicroBatch, Model};

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

/// Which parameters the backward must reach: the lowest decoder layer
/// (`Freeze::backward_floor`) and whether the embedding table trains.
pub type Trainable = (usize, bool);

/// One decoder layer's graph, from its own input.
pub struct Segment<B: Compute = Cpu> {
    input: Tensor<Ad<B>, 3>,
    output: Tensor<Ad<B>, 3>,
}

/// What the forward leaves for the backward.
pub enum Forward<B: Compute = Cpu> {
    /// Every layer's graph and the head's.
    Full {
        layers: Vec<Segment<B>>,
        head: head::HeadPass<B>,
    },
    /// The inputs of every layer and of the final norm, no graph.
    Checkpointed { boundaries: Vec<Tensor<B, 3>> },
}

impl<B: Compute> Forward<B> {
    /// The full graph's scaled loss (a checkpointed forward has none yet).
    pub fn loss(&self) -> Option<f64> {
        match self {
            Forward::Full { head, .. } => Some(head.loss),
            Forward::Checkpointed { .. } => None,
        }
    }
}

/// The device the model's parameters live on.
fn device_of<B: Compute>(model: &Model<B>) -> B::Device {
    model.model.embed_tokens.weight.val().device()
}

/// The embedding lookup, outside the graph.
fn embed<B: Compute>(model: &Model<B>, mb: &MicroBatch) -> Tensor<B, 3> {
    let device = device_of(model);
    model
        .model
        .embed_tokens
        .valid()
        .forward(token_tensor::<B>(&mb.inputs, &device))
}

/// A leaf on `x`'s values; tracked when the backward needs its gradient.
fn leaf<B: Compute>(x: Tensor<B, 3>, tracked: bool) -> Tensor<Ad<B>, 3> {
    let x = Tensor::<Ad<B>, 3>::from_inner(x);
    if tracked { x.require_grad() } else { x }
}

/// Whether the backward needs the gradient of layer `i`'s input (`i` = the
/// number of layers: the head's).
fn needs_input_grad(i: usize, (floor, embeddings): Trainable) -> bool {
    i > floor || (i == 0 && embeddings)
}

/// The forward of one micro-batch.
pub fn forward<B: Compute>(
    model: &Model<B>,
    mb: &MicroBatch,
    ropes: &Ropes<B>,
    checkpointed: bool,
    trainable: Trainable,
    scale: f64,
) -> Forward<B> {
    let _tag = tag::tag(Category::Activations);
    let mut x = embed(model, mb);
    if checkpointed {
        let mut boundaries = vec![x];
        for layer in &model.model.layers {
            let plain = layer.valid();
            let next = plain.forward(boundaries[boundaries.len() - 1].clone(), &ropes.plain);
            boundaries.push(next);
        }
        return Forward::Checkpointed { boundaries };
    }
    let mut layers = Vec::with_capacity(model.model.layers.len());
    for (i, layer) in model.model.layers.iter().enumerate() {
        let input = leaf(x, needs_input_grad(i, trainable));
        let output = layer.forward(input.clone(), &ropes.ad);
        x = output.clone().inner();
        layers.push(Segment { input, output });
    }
    let input = leaf(x, needs_input_grad(layers.len(), trainable));
    Forward::Full {
        layers,
        head: head::forward(model, input, mb, scale),
    }
}

/// The backward of one micro-batch; gradients are added into `acc`.
/// Returns the micro-batch's scaled loss.
pub fn backward<B: Compute>(
    model: &Model<B>,
    mb: &MicroBatch,
    fwd: Forward<B>,
    ropes: &Ropes<B>,
    acc: &mut Accumulator<B>,
    trainable: Trainable,
    scale: f64,
) -> f64 {
    let _tag = tag::tag(Category::Gradients);
    let (floor, embeddings_trainable) = trainable;
    let layers = model.model.layers.len();
    // The head's pass (rebuilt here when checkpointed), then the layers'
    // graphs from the top: kept from the forward, or rebuilt one at a time.
    let (head, mut kept, mut boundaries) = match fwd {
        Forward::Full { layers, head } => (head, layers, Vec::new()),
        Forward::Checkpointed { mut boundaries } => {
            let last = boundaries.pop().expect("the final norm's input");
            let input = leaf(last, needs_input_grad(layers, trainable));
            let head = tag::tagged(Category::Activations, || {
                head::forward(model, input, mb, scale)
            });
            (head, Vec::new(), boundaries)
        }
    };
    let value = head.loss;
    let mut g = head::backward(model, head, acc);
    for i in (floor..layers).rev() {
        let Some(dy) = g.take() else { break };
        let seg = match kept.pop() {
            Some(seg) => seg,
            None => {
                let Some(x) = boundaries.pop() else { break };
                let input = leaf(x, needs_input_grad(i, trainable));
                let output = tag::tagged(Category::Activations, || {
                    model.model.layers[i].forward(input.clone(), &ropes.ad)
                });
                Segment { input, output }
            }
        };
        g = push_back(model, seg.output, &seg.input, dy, acc);
    }
    if floor == 0
        && embeddings_trainable
        && let Some(de) = g.take()
    {
        let [b, s, d] = de.dims();
        let table = &model.model.embed_tokens.weight;
        let tokens: Vec<u32> = mb.inputs.iter().flatten().copied().collect();
        let shape = [table.val().dims()[0], d];
        acc.add_rows(model, (table.id, shape), &tokens, de.reshape([b * s, d]));
    }
    value
}
