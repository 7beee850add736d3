//! The calibration batches after the embedding, in f32 on the pass's
//! device: each batch's rows read from the checkpoint as they are stored,
//! or, where the pass changes the embedding (earlier steps pruned it, or
//! the modified pass reduces its candidates), gathered from the whole
//! table with those changes applied.

use burn::prelude::*;

use super::EMBED;
use super::pass::{Batch, Input, State, Which};
use crate::exec::Compute;
use crate::model::{ComputeDtype, vocab};
use crate::prune::PruneError;

const DTYPE: ComputeDtype = ComputeDtype::F32;

/// Every batch embedded, as the pass `which` sees the embedding.
pub(super) fn batches<B: Compute>(
    input: &Input<'_, B>,
    which: Which,
    state: &State,
) -> Result<Vec<Tensor<B, 3>>, PruneError> {
    match state.changes(which, EMBED) {
        true => from_table(input, which, state),
        false => from_rows(input, which),
    }
}

/// Each batch's rows of the embedding as stored, read and converted on
/// every core and uploaded as the prune embeds its windows
/// (`vocab::embed_windows`): the table is neither decoded nor held whole
/// (a 1B shape's is 1 GB in f32, decoded on one core twice a step for 256
/// tokens before). The original pass still refuses a damaged table, as
/// the whole read did.
fn from_rows<B: Compute>(
    input: &Input<'_, B>,
    which: Which,
) -> Result<Vec<Tensor<B, 3>>, PruneError> {
    let ckpt = input.ckpt;
    if which == Which::Original {
        vocab::check_finite(ckpt, EMBED)?;
    }
    let embed = |b: &Batch| vocab::embed_windows::<B>(ckpt, &b.inputs, DTYPE, input.device);
    Ok(input.batches.iter().map(embed).collect::<Result<_, _>>()?)
}

/// The whole table read in f32, the pass's changes applied
/// (`State::prepare`), then each batch's rows gathered from it.
fn from_table<B: Compute>(
    input: &Input<'_, B>,
    which: Which,
    state: &State,
) -> Result<Vec<Tensor<B, 3>>, PruneError> {
    let Input { ckpt, config, .. } = input;
    let mut embed_w = ckpt.read_f32(EMBED)?;
    state.prepare(which, EMBED, &mut embed_w, config.reduction_factor);
    let d = ckpt.config.hidden_size;
    let rows = |b: &Batch| -> Vec<f32> {
        b.inputs
            .iter()
            .flatten()
            .flat_map(|t| {
                embed_w[*t as usize * d..(*t as usize + 1) * d]
                    .iter()
                    .copied()
            })
            .collect()
    };
    Ok(input
        .batches
        .iter()
        .map(|b| {
            let (n, s) = (b.inputs.len(), b.inputs[0].len());
            if B::is_device() {
                crate::exec::transfer::uploaded((n * s * d * 4) as u64);
            }
            Tensor::from_data(TensorData::new(rows(b), [n, s, d]), input.device)
        })
        .collect())
}
