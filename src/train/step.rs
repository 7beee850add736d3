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
    /// A tied head with trainable embeddings: the graph from the embedded
    /// inputs (a leaf) to the final norm's output; the lookup and the head
    /// are done by hand in the backward, so the embedding's gradient is one
    /// `[vocab, hidden]` buffer instead of the lookup's and the head's,
    /// each dense, and their sum.
    TiedHead {
        normed: Tensor<Ad<B>, 2>,
        start: Tensor<Ad<B>, 3>,
    },
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
    if !checkpointed && tied_and_trained(model) {
        let embed = model.model.embed_tokens.valid();
        let e = embed.forward(token_tensor::<B>(&mb.inputs, &device));
        drop(embed);
        let start = Tensor::<Ad<B>, 3>::from_inner(e).require_grad();
        let mut x = start.clone();
        for layer in &model.model.layers {
            x = layer.forward(x, &ropes.ad);
        }
        let [b, s, d] = x.dims();
        let normed = model.model.norm.forward(x).reshape([b * s, d]);
        return Forward::TiedHead { normed, start };
    }
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
        Forward::TiedHead { normed, start } => {
            return tied_head_backward(model, mb, normed, start, acc, scale);
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

/// The mean next-token loss of `mb` times `scale`, computed without a
/// graph (the model's plain copy): what a forward would report.
pub fn loss_value<B: Compute>(
    model: &Model<B>,
    mb: &MicroBatch,
    ropes: &Ropes<B>,
    scale: f64,
) -> f64 {
    let plain = model.valid();
    let device = device_of(model);
    let logits = plain.logits(token_tensor::<B>(&mb.inputs, &device), &ropes.plain);
    let [b, s, v] = logits.dims();
    let targets: Vec<i64> = mb.targets.iter().map(|t| *t as i64).collect();
    let targets = Tensor::<B, 1, Int>::from_data(TensorData::new(targets, [b * s]), &device);
    lm_loss(logits.reshape([b * s, v]), targets)
        .into_scalar()
        .to_f64()
        * scale
}

/// The head is the embedding's transpose and the embedding trains.
fn tied_and_trained<B: Compute>(model: &Model<B>) -> bool {
    model.lm_head.is_none() && model.model.embed_tokens.weight.val().is_require_grad()
}

/// The backward of a [`Forward::TiedHead`]: the loss and its gradient by
/// hand (mean cross-entropy: `(softmax − onehot) / N`, times `scale`), the
/// head's weight gradient `dlogitsᵀ·h` as the embedding's gradient buffer,
/// the graph's backward from the final norm to the embedded inputs, and
/// the inputs' gradient added into that buffer row by row (the lookup's
/// backward). Returns the micro-batch's scaled loss.
fn tied_head_backward<B: Compute>(
    model: &Model<B>,
    mb: &MicroBatch,
    normed: Tensor<Ad<B>, 2>,
    start: Tensor<Ad<B>, 3>,
    acc: &mut Accumulator<B>,
    scale: f64,
) -> f64 {
    use burn::tensor::IndexingUpdateOp;
    let device = device_of(model);
    let w = model.model.embed_tokens.weight.val().inner();
    let h = normed.clone().inner();
    let [n, d] = h.dims();
    let targets: Vec<i64> = mb.targets.iter().map(|t| *t as i64).collect();
    let targets = Tensor::<B, 2, Int>::from_data(TensorData::new(targets, [n, 1]), &device);
    let (value, dlogits) = {
        let _tag = tag::tag(Category::Logits);
        let logits = h.clone().matmul(w.clone().transpose());
        let logp = burn::tensor::activation::log_softmax(logits, 1);
        let picked = logp.clone().gather(1, targets.clone());
        let value = picked.neg().mean().into_scalar().to_f64() * scale;
        let ones = Tensor::<B, 2>::ones([n, 1], &device).neg();
        let dlogits = logp
            .exp()
            .scatter(1, targets, ones, IndexingUpdateOp::Add)
            .mul_scalar(scale / n as f64);
        (value, dlogits)
    };
    let dh = dlogits.clone().matmul(w);
    let mut dw = dlogits.transpose().matmul(h);
    let grads = (normed * Tensor::<Ad<B>, 2>::from_inner(dh))
        .sum()
        .backward();
    if let Some(g) = start.grad(&grads) {
        let ids: Vec<i64> = mb.inputs.iter().flatten().map(|t| *t as i64).collect();
        let ids = Tensor::<B, 1, Int>::from_data(TensorData::new(ids, [n]), &device);
        dw = dw.select_assign(0, ids, g.reshape([n, d]), IndexingUpdateOp::Add);
    }
    let mut params = GradientsParams::from_grads(grads, model);
    params.register::<B, 2>(model.model.embed_tokens.weight.id, dw);
    acc.accumulate(model, params);
    value
}
