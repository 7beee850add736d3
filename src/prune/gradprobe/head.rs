//! The loss and the output head's backward, by hand and in vocabulary
//! blocks: `[tokens, vocab]` logits and the `[vocab, hidden]` head gradient
//! never exist whole. Two sweeps over the vocabulary: the first finds each
//! row's log-sum-exp (online) and the target logit; the second forms
//! `dlogits = (softmax − onehot) / T` one block at a time, accumulates
//! `dh = dlogits · W` and hands the head-weight gradient of the block to the
//! caller at the candidate positions only.

use crate::exec::Compute;
use burn::prelude::*;

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
    // Blocks of at most 4 Mi logits and 2 Mi head weights (16 and 8 MiB f32):
    // a block's slice and its transposed copy stay small beside the head.
    let block = ((1usize << 22) / t.max(1))
        .min((1usize << 21) / d.max(1))
        .clamp(1, v.max(1));
    let host = |x: Tensor<B, 2>| -> Vec<f32> {
        let data = x.into_data();
        if B::is_device() {
            crate::exec::transfer::read_back(data.bytes.len() as u64);
        }
        data.into_vec().unwrap_or_default()
    };
    let logits = |v0: usize, v1: usize| {
        let wb = w.clone().slice([v0..v1, 0..d]);
        (host(h.clone().matmul(wb.clone().transpose())), wb)
    };

    let mut max = vec![f32::NEG_INFINITY; t];
    let mut sum = vec![0f32; t];
    let mut target_logit = vec![0f32; t];
    for v0 in (0..v).step_by(block) {
        let v1 = (v0 + block).min(v);
        let (l, _) = logits(v0, v1);
        let nb = v1 - v0;
        for r in 0..t {
            let row = &l[r * nb..(r + 1) * nb];
            let m = row.iter().fold(max[r], |a, b| a.max(*b));
            sum[r] = sum[r] * (max[r] - m).exp() + row.iter().map(|x| (x - m).exp()).sum::<f32>();
            max[r] = m;
            let tg = targets[r] as usize;
            if (v0..v1).contains(&tg) {
                target_logit[r] = row[tg - v0];
            }
        }
    }
    let lse: Vec<f32> = max.iter().zip(&sum).map(|(m, s)| m + s.ln()).collect();
    let loss = lse
        .iter()
        .zip(&target_logit)
        .map(|(l, g)| (l - g) as f64)
        .sum::<f64>()
        / t.max(1) as f64;

    let device = h.device();
    let scale = 1.0 / t.max(1) as f32;
    let mut dh = Tensor::<B, 2>::zeros([t, d], &device);
    let mut cursor = 0usize;
    for v0 in (0..v).step_by(block) {
        let v1 = (v0 + block).min(v);
        let nb = v1 - v0;
        let (mut l, wb) = logits(v0, v1);
        for r in 0..t {
            let row = &mut l[r * nb..(r + 1) * nb];
            for x in row.iter_mut() {
                *x = (*x - lse[r]).exp() * scale;
            }
            let tg = targets[r] as usize;
            if (v0..v1).contains(&tg) {
                row[tg - v0] -= scale;
            }
        }
        if B::is_device() {
            crate::exec::transfer::uploaded(l.len() as u64 * 4);
        }
        let dlogits = Tensor::<B, 2>::from_data(TensorData::new(l, [t, nb]), &device);
        dh = dh + dlogits.clone().matmul(wb);
        if let Some((positions, sink)) = weight_grad.as_mut() {
            let end = (v1 * d) as u32;
            if positions.get(cursor).is_some_and(|p| *p < end) {
                let dw = host(dlogits.transpose().matmul(h.clone()));
                let base = v0 * d;
                while let Some(p) = positions.get(cursor).filter(|p| **p < end) {
                    sink(cursor, dw[*p as usize - base]);
                    cursor += 1;
                }
            }
        }
    }
    (dh, loss)
}
