//! The accumulated gradients of a step, kept at about one gradient per
//! trained parameter. Burn's autodiff returns a whole backward's gradients
//! at once, its embedding backward builds a zero table and then a copy of
//! it, and one product as large as the vocabulary table costs a second
//! table inside the matrix multiply; for a tied 49 152-row table that made
//! four tables of gradient memory in the backward. Here the backward adds
//! each segment's gradients as soon as they exist (Burn's tensor add reuses
//! a uniquely held, contiguous left operand), and the two gradients as
//! large as the vocabulary — the head's weight and the embedding table —
//! are added into the held gradient in pieces: the head's product a block
//! of vocabulary rows at a time, the one-hot part of its loss gradient and
//! the lookup's gradient row by row. The held table
//! is read as host data for that (zero-copy on the CPU backend, a download
//! and an upload on a device) — as PyTorch's `AccumulateGrad` adds into
//! `.grad`.

use burn::module::ParamId;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::prelude::*;

use crate::exec::{Compute, Cpu};

use super::micro::{Ad, Model};

/// Elements of one block of the head's weight gradient (8 MiB of f32).
const BLOCK_ELEMENTS: usize = 1 << 21;

/// A step's gradients, accumulated across micro-batches.
pub struct Accumulator<B: Compute = Cpu> {
    inner: GradientsAccumulator<Model<B>>,
}

impl<B: Compute> Default for Accumulator<B> {
    fn default() -> Self {
        Self::new()
    }
}

impl<B: Compute> Accumulator<B> {
    pub fn new() -> Self {
        Self {
            inner: GradientsAccumulator::new(),
        }
    }

    /// Adds one backward's gradients of `model`'s parameters.
    pub fn accumulate(&mut self, model: &Model<B>, grads: GradientsParams) {
        self.inner.accumulate(model, grads);
    }

    /// Runs `update` on the table parameter `id`'s gradient (`shape`,
    /// row-major) as host data, zeros when none is held yet.
    fn update_table(
        &mut self,
        model: &Model<B>,
        (id, shape): (ParamId, [usize; 2]),
        device: &B::Device,
        update: impl FnOnce(&mut [f32]),
    ) {
        let mut all = self.inner.grads();
        let mut data = match all.remove::<B, 2>(id) {
            Some(t) => t.into_data(),
            None => TensorData::zeros::<f32, _>(shape),
        };
        update(
            data.as_mut_slice::<f32>()
                .expect("training keeps f32 gradients"),
        );
        all.register::<B, 2>(id, Tensor::from_data(data, device));
        // The accumulator is empty after `grads()`: this moves them back.
        self.inner.accumulate(model, all);
    }

    /// Adds the head's weight gradient for hidden states `h` (`[n,
    /// hidden]`) and the loss's gradient at the logits, `probs − coef ·
    /// one-hot(targets)` (`probs`: `[n, vocab]`): `dlogitsᵀ·h` into a tied
    /// table (`[vocab, hidden]`), `hᵀ·dlogits` into a head's (`[hidden,
    /// vocab]`, Burn's layout). The product goes a block of vocabulary
    /// entries at a time; the one-hot part row by row.
    pub fn add_head(
        &mut self,
        model: &Model<B>,
        (id, tied): (ParamId, bool),
        (h, probs): (Tensor<B, 2>, Tensor<B, 2>),
        (targets, coef): (&[u32], f64),
    ) {
        let ([n, width], vocab) = (h.dims(), probs.dims()[1]);
        let shape = if tied { [vocab, width] } else { [width, vocab] };
        let device = h.device();
        let rows = (BLOCK_ELEMENTS / width.max(1)).max(1);
        let hidden = h.clone().into_data();
        let hidden = hidden.as_slice::<f32>().expect("f32").to_vec();
        let coef = coef as f32;
        self.update_table(model, (id, shape), &device, |table| {
            for v0 in (0..vocab).step_by(rows) {
                let v1 = (v0 + rows).min(vocab);
                let part = probs.clone().slice([0..n, v0..v1]);
                if tied {
                    let block = part.transpose().matmul(h.clone()).into_data();
                    let block = block.as_slice::<f32>().expect("f32");
                    add_into(&mut table[v0 * width..v1 * width], block);
                } else {
                    let block = h.clone().transpose().matmul(part).into_data();
                    let block = block.as_slice::<f32>().expect("f32");
                    for (r, src) in block.chunks(v1 - v0).enumerate() {
                        add_into(&mut table[r * vocab + v0..r * vocab + v1], src);
                    }
                }
            }
            for (t, row) in targets.iter().zip(hidden.chunks(width)) {
                let t = *t as usize;
                for (r, x) in row.iter().enumerate() {
                    let at = if tied { t * width + r } else { r * vocab + t };
                    table[at] -= coef * x;
                }
            }
        });
    }

    /// Adds `rows` (`[n, width]`) into the rows `tokens` of the table
    /// parameter `id` (`[vocab, width]`): the embedding lookup's gradient.
    pub fn add_rows(
        &mut self,
        model: &Model<B>,
        (id, shape): (ParamId, [usize; 2]),
        tokens: &[u32],
        rows: Tensor<B, 2>,
    ) {
        let device = rows.device();
        let width = shape[1];
        let rows = rows.into_data();
        let rows = rows.as_slice::<f32>().expect("f32").to_vec();
        self.update_table(model, (id, shape), &device, |table| {
            for (t, src) in tokens.iter().zip(rows.chunks(width)) {
                let t = *t as usize;
                add_into(&mut table[t * width..(t + 1) * width], src);
            }
        });
    }

    /// The accumulated gradients, for the optimizer.
    pub fn grads(&mut self) -> GradientsParams {
        self.inner.grads()
    }
}

/// `dst += src`, element by element.
fn add_into(dst: &mut [f32], src: &[f32]) {
    dst.iter_mut().zip(src).for_each(|(d, s)| *d += s);
}

/// The gradient of `output` pushed back to its input, the parameters'
/// gradients added into `acc`.
pub fn push_back<B: Compute, const D: usize>(
    model: &Model<B>,
    output: Tensor<Ad<B>, D>,
    input: &Tensor<Ad<B>, 3>,
    dy: Tensor<B, D>,
    acc: &mut Accumulator<B>,
) -> Option<Tensor<B, 3>> {
    let grads = (output * Tensor::<Ad<B>, D>::from_inner(dy))
        .sum()
        .backward();
    let dx = input.grad(&grads);
    acc.accumulate(model, GradientsParams::from_grads(grads, model));
    dx
}
