//! The output head and its cross-entropy, written out instead of left to
//! Burn's autodiff: the logits are the one activation as large as the
//! vocabulary, and autodiff keeps the logits' log-softmax for the backward
//! and then makes two more tensors of that size for its gradient (three
//! in all at the backward's start). Here the forward keeps the logits and
//! each row's log-sum-exp (computed a block of rows at a time), and the
//! backward turns the logits into their
//! gradient in place — `scale/n · (softmax − one-hot)`, the one-hot part
//! applied row by row and never built — so the head holds one tensor of
//! the logits' size from the forward to the end of its backward (the
//! memory trade of fused cross-entropy kernels). The weight's gradient goes
//! into the held gradient a block of rows at a time (`train::grads`); the
//! final norm stays in autodiff.

use burn::module::{AutodiffModule, ParamId};
use burn::prelude::*;

use crate::exec::Compute;
use crate::memory::tag::{self, Category};
use crate::model::llama::Head;

use super::grads::{Accumulator, push_back};
use super::micro::{Ad, MicroBatch, Model};

/// The head's forward, kept for its backward.
pub struct HeadPass<B: Compute> {
    /// The last decoder layer's output (a leaf) and the final norm's graph.
    input: Tensor<Ad<B>, 3>,
    normed: Tensor<Ad<B>, 2>,
    /// `[n, vocab]`, outside the graph.
    logits: Tensor<B, 2>,
    /// Each row's log-sum-exp, `[n, 1]`.
    lse: Tensor<B, 2>,
    targets: Vec<u32>,
    scale: f64,
    /// The scaled mean cross-entropy.
    pub loss: f64,
}

/// The head's weight: the embedding table `[vocab, hidden]` when tied,
/// else the head's `[hidden, vocab]`; its id; tied; whether it trains.
fn weight<B: Compute>(model: &Model<B>) -> (Tensor<B, 2>, ParamId, bool, bool) {
    let (param, tied) = match &model.lm_head {
        Some(l) => (&l.weight, false),
        None => (&model.model.embed_tokens.weight, true),
    };
    let value = param.val();
    let trains = value.is_require_grad();
    (value.inner(), param.id, tied, trains)
}

fn index_tensor<B: Compute>(ids: &[u32], device: &B::Device) -> Tensor<B, 1, Int> {
    let ids: Vec<i64> = ids.iter().map(|t| *t as i64).collect();
    let n = ids.len();
    Tensor::from_data(TensorData::new(ids, [n]), device)
}

/// Elements of one block of the log-sum-exp's shifted exponentials (1 MiB
/// of f32).
const LSE_BLOCK: usize = 1 << 18;

/// Each row's log-sum-exp (`[n, 1]`), a block of rows at a time so the
/// shifted exponentials never take a second logits-sized buffer.
fn log_sum_exp<B: Compute>(logits: &Tensor<B, 2>) -> Tensor<B, 2> {
    let [n, vocab] = logits.dims();
    let rows = (LSE_BLOCK / vocab.max(1)).max(1);
    let blocks: Vec<Tensor<B, 2>> = (0..n)
        .step_by(rows)
        .map(|r0| {
            let block = logits.clone().slice([r0..(r0 + rows).min(n), 0..vocab]);
            // Over the vocabulary in pieces (`exec::reduce`).
            let max = crate::exec::reduce::max_dim(block.clone(), 1);
            crate::exec::reduce::sum_dim((block - max.clone()).exp(), 1).log() + max
        })
        .collect();
    Tensor::cat(blocks, 0)
}

/// The final norm of `x` (the last layer's output), the logits and the
/// loss times `scale`.
pub fn forward<B: Compute>(
    model: &Model<B>,
    x: Tensor<Ad<B>, 3>,
    mb: &MicroBatch,
    scale: f64,
) -> HeadPass<B> {
    let [b, s, d] = x.dims();
    let n = b * s;
    let normed = model.model.norm.forward(x.clone()).reshape([n, d]);
    let _tag = tag::tag(Category::Logits);
    let h = normed.clone().inner();
    // The model's own head on the parameters' values (outside the graph).
    let logits = match &model.lm_head {
        Some(l) => Head::Linear(&l.valid()).logits(h),
        None => Head::Tied(&model.model.embed_tokens.valid()).logits(h),
    };
    let lse = log_sum_exp(&logits);
    let device = logits.device();
    let picked = logits
        .clone()
        .gather(1, index_tensor::<B>(&mb.targets, &device).reshape([n, 1]));
    let mean = (lse.clone() - picked).mean().into_scalar().to_f64();
    HeadPass {
        input: x,
        normed,
        logits,
        lse,
        targets: mb.targets.clone(),
        scale,
        loss: mean * scale,
    }
}

/// The head's backward: the logits become their gradient in place, the
/// weight's gradient is added into `acc` (when it trains), and the
/// gradient at the hidden states goes back through the final norm.
/// Returns the gradient at the head's input.
pub fn backward<B: Compute>(
    model: &Model<B>,
    head: HeadPass<B>,
    acc: &mut Accumulator<B>,
) -> Option<Tensor<B, 3>> {
    let n = head.targets.len();
    let coef = head.scale / n as f64;
    let probs = (head.logits - head.lse).exp().mul_scalar(coef);
    let (w, id, tied, trains) = weight(model);
    let h = head.normed.clone().inner();
    if trains {
        acc.add_head(model, (id, tied), (h, probs.clone()), (&head.targets, coef));
    }
    let device = probs.device();
    let targets = index_tensor::<B>(&head.targets, &device);
    // dh = dlogits · Wᵀ with dlogits = probs − coef · one-hot.
    let dh = if tied {
        probs.matmul(w.clone()) - w.select(0, targets).mul_scalar(coef)
    } else {
        probs.matmul(w.clone().transpose()) - w.select(1, targets).transpose().mul_scalar(coef)
    };
    push_back(model, head.normed, &head.input, dh, acc)
}
