//! The loss and the output head's backward, by hand and in vocabulary
//! blocks: `[tokens, vocab]` logits and the `[vocab, hidden]` head gradient
//! never exist whole. Two sweeps over the vocabulary: the first finds each
//! row's log-sum-exp (online); the second forms `dlogits = (softmax −
//! onehot) / T` one block at a time, accumulates `dh = dlogits · W` and
//! hands the head-weight gradient of the block to the caller at the
//! candidate positions only.
//!
//! All of it is tensor ops where the head is, so on a device no logits
//! cross the bus: one f32 per token comes back (the loss), and, with the
//! head probed, one f32 per candidate (its gradient), their positions
//! going up. The CPU runs the same ops on its backend.

use crate::exec::Compute;
use crate::exec::copies::{f32s_to_host, ints_to_device};
use crate::exec::reduce;
use burn::prelude::*;
use burn::tensor::IndexingUpdateOp;

/// Where the head-weight gradient goes: the sorted candidate positions and
/// a sink called with `(candidate index, dL/dW there)`.
pub type WeightGrad<'a> = Option<(&'a [u32], &'a mut dyn FnMut(usize, f32))>;

/// Mean cross-entropy of `h` `[T, d]` against `targets` through head `w`
/// `[V, d]`; returns `dL/dh` and the loss. `weight_grad`, when given, is
/// called with `(candidate index, dL/dW at that position)` for each sorted
/// flat position of `W`.
pub fn head_backward<B: Compute>(
    h: Tensor<B, 2>,
    w: &Tensor<B, 2>,
    targets: &[u32],
    mut weight_grad: WeightGrad<'_>,
) -> (Tensor<B, 2>, f64) {
    let [t, d] = h.dims();
    let [v, _] = w.dims();
    let block = block_rows(t, d, v);
    let device = h.device();
    let targets = ints_to_device::<B>(targets.iter().map(|x| *x as i64).collect(), &device);
    let logits = |v0: usize, v1: usize| {
        let wb = w.clone().slice([v0..v1, 0..d]);
        (h.clone().matmul(wb.clone().transpose()), wb)
    };

    let (mut max, mut sum): (Option<Tensor<B, 2>>, Option<Tensor<B, 2>>) = (None, None);
    for v0 in (0..v).step_by(block) {
        let (l, _) = logits(v0, (v0 + block).min(v));
        let m = reduce::max_dim(l.clone(), 1);
        let m = match &max {
            Some(old) => old.clone().max_pair(m),
            None => m,
        };
        let e = (l - m.clone()).exp();
        crate::exec::watch::after_op();
        let s = reduce::sum_dim(e, 1);
        sum = Some(match (sum, max) {
            (Some(old), Some(old_max)) => old * (old_max - m.clone()).exp() + s,
            _ => s,
        });
        max = Some(m);
    }
    let (Some(max), Some(sum)) = (max, sum) else {
        return (h.zeros_like(), 0.0);
    };
    let lse = max + sum.log();
    let target_logit = reduce::sum_dim(h.clone() * w.clone().select(0, targets.clone()), 1);
    let loss = f32s_to_host(lse.clone() - target_logit)
        .iter()
        .map(|x| *x as f64)
        .sum::<f64>()
        / t.max(1) as f64;

    let scale = 1.0 / t.max(1) as f32;
    let mut dh = Tensor::<B, 2>::zeros([t, d], &device);
    let mut cursor = 0usize;
    // Every full block's candidates gathered at one length (the most any
    // full block has, padded with position 0), so the pool reuses one page
    // for them instead of keeping a page per block's count (the shorter
    // last block has pages of its own anyway). The padding is read back
    // too: a prefix read made a page per count again.
    let widest = weight_grad
        .as_ref()
        .map_or(0, |(positions, _)| widest_block(positions, block, d, v));
    for v0 in (0..v).step_by(block) {
        let v1 = (v0 + block).min(v);
        let (l, wb) = logits(v0, v1);
        let dlogits = minus_onehot((l - lse.clone()).exp() * scale, &targets, v0, scale);
        let product = dlogits.clone().matmul(wb);
        crate::exec::watch::after_op();
        dh = dh + product;
        if let Some((positions, sink)) = weight_grad.as_mut() {
            let (base, end) = ((v0 * d) as u32, (v1 * d) as u32);
            let upto = cursor + positions[cursor..].partition_point(|p| *p < end);
            if upto > cursor {
                let mut at: Vec<i64> = positions[cursor..upto]
                    .iter()
                    .map(|p| (p - base) as i64)
                    .collect();
                if v1 - v0 == block {
                    at.resize(widest, 0);
                }
                let at = ints_to_device::<B>(at, &device);
                let dw = dlogits.transpose().matmul(h.clone());
                crate::exec::watch::after_op();
                let dw = f32s_to_host(dw.reshape([(v1 - v0) * d]).select(0, at));
                for g in &dw[..upto - cursor] {
                    sink(cursor, *g);
                    cursor += 1;
                }
            }
        }
    }
    (dh, loss)
}

/// The most of the sorted flat `positions` (of a `[v, d]` head) that one
/// full block of `block` rows holds.
fn widest_block(positions: &[u32], block: usize, d: usize, v: usize) -> usize {
    let at = |row: usize| positions.partition_point(|p| (*p as usize) < row * d);
    (block.max(1)..=v)
        .step_by(block.max(1))
        .map(|end| at(end) - at(end - block))
        .max()
        .unwrap_or(0)
}

/// Vocabulary rows a block takes for `tokens` rows of `hidden` against a
/// `vocab`-row head: at most 4 Mi logits and 2 Mi head weights (16 and 8
/// MiB f32), so a block's slice and its transposed copy stay small beside
/// the head. The estimator sizes its blocks by it too.
pub fn block_rows(tokens: usize, hidden: usize, vocab: usize) -> usize {
    ((1usize << 22) / tokens.max(1))
        .min((1usize << 21) / hidden.max(1))
        .clamp(1, vocab.max(1))
}

/// `p` `[T, nb]`, a block of the vocabulary from `v0`, with `scale` taken
/// from each row's target logit where the target falls in the block: a
/// scatter of `[T]` values, computed where the targets are.
fn minus_onehot<B: Compute>(
    p: Tensor<B, 2>,
    targets: &Tensor<B, 1, Int>,
    v0: usize,
    scale: f32,
) -> Tensor<B, 2> {
    let [t, nb] = p.dims();
    let column = targets.clone().sub_scalar(v0 as i64);
    let inside = column
        .clone()
        .greater_equal_elem(0)
        .bool_and(column.clone().lower_elem(nb as i64));
    let values = inside.float().mul_scalar(-scale).cast(p.dtype());
    let at = column.clamp(0, nb as i64 - 1).reshape([t, 1]);
    p.scatter(1, at, values.reshape([t, 1]), IndexingUpdateOp::Add)
}
