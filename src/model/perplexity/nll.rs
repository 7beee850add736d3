//! Logits to losses: each window's summed next-token negative
//! log-likelihood from its final normed hidden states, the head's logits in
//! row chunks (so a large vocabulary never materialises
//! `[batch, seq, vocab]`), on the host in parallel f64 sums, on a device one
//! kernel launch per chunk with one f32 per window coming back.

use burn::prelude::*;
use burn::tensor::{DType, FloatDType};

use crate::exec::{Compute, reduce};
use crate::memory::tag::{self, Category};
use crate::model::llama::Head;
use crate::timing::{self, Work};

/// Rows of logits per chunk: about 8 Mi f32 elements (32 MiB) at a time.
pub fn chunk_rows(vocab: usize) -> usize {
    ((1usize << 23) / vocab.max(1)).max(1)
}

/// Rows of logits per chunk on a device: 32 Mi f32 elements (128 MiB, the
/// smallest largest-buffer among the devices prunemem meets: lavapipe's).
/// Four times the host's chunk: on an H100 a 1B-shape window's 511 rows
/// over 128 256 tokens went through the head in 8 chunks of 65 rows; in 2
/// of 261 the products are wider and the launches fewer.
pub fn device_chunk_rows(vocab: usize) -> usize {
    ((1usize << 25) / vocab.max(1)).max(1)
}

/// Sum of next-token negative log-likelihoods per window, given final
/// normed hidden states `h` `[b, s, d]` and the windows' tokens.
pub fn window_nll<B: Compute>(
    h: Tensor<B, 3>,
    windows: &[Vec<u32>],
    head: &Head<'_, B>,
    vocab: usize,
) -> Vec<f64> {
    if B::is_device() {
        return device_window_nll(h, windows, head, vocab);
    }
    let [b, s, d] = h.dims();
    let chunk = chunk_rows(vocab);
    let mut out = Vec::with_capacity(b);
    for (j, tokens) in windows.iter().enumerate().take(b) {
        let hj = h.clone().slice([j..j + 1, 0..s, 0..d]).reshape([s, d]);
        let mut total = 0f64;
        let mut row = 0;
        while row < s - 1 {
            let end = (row + chunk).min(s - 1);
            let _tag = tag::tag(Category::Logits);
            let logits = head.logits(hj.clone().slice([row..end, 0..d]));
            let logits = if logits.dtype() == DType::F32 {
                logits
            } else {
                let f32s = logits.clone().cast(FloatDType::F32);
                // The chunk in both dtypes: the evaluation's high-water mark.
                crate::exec::watch::after_op();
                f32s
            };
            let _span = timing::work(Work::Logits);
            let data = logits.into_data();
            if B::is_device() {
                crate::exec::transfer::read_back(data.bytes.len() as u64);
            }
            let mut values: Vec<f32> = data.into_vec().unwrap_or_default();
            total += rows_nll(&mut values, vocab, &tokens[row + 1..end + 1]);
            row = end;
        }
        out.push(total);
    }
    out
}

/// [`window_nll`] on a device: log-softmax, the target's logit and the
/// sum stay on the device, chunk by chunk of the same rows as the host
/// path; one f32 per window comes back, once per batch. Each chunk's
/// losses are one kernel launch over the logits in their own dtype
/// (`Compute::row_nll`), so a chunk's high-water mark is the chunk alone;
/// a backend without the kernel takes Burn's ops ([`ops_nll`]: the chunk
/// beside its f32 copy).
fn device_window_nll<B: Compute>(
    h: Tensor<B, 3>,
    windows: &[Vec<u32>],
    head: &Head<'_, B>,
    vocab: usize,
) -> Vec<f64> {
    let [b, s, d] = h.dims();
    let device = h.device();
    // Every chunk has the same rows: the last one starts early and skips
    // the rows already counted, so cubecl's pool, which reuses a freed
    // buffer only for a tensor of its exact size, reuses one chunk's
    // buffers for all of them instead of keeping a second set.
    let chunk = device_chunk_rows(vocab).min(s - 1);
    let mut totals = Vec::with_capacity(b);
    for (j, tokens) in windows.iter().enumerate().take(b) {
        let hj = h.clone().slice([j..j + 1, 0..s, 0..d]).reshape([s, d]);
        let targets: Vec<i64> = tokens[1..s].iter().map(|t| *t as i64).collect();
        crate::exec::transfer::uploaded(targets.len() as u64 * 4);
        let targets = Tensor::<B, 1, Int>::from_data(TensorData::new(targets, [s - 1]), &device);
        let in_vocab = fits_vocab(&tokens[1..s], vocab);
        let mut total: Option<Tensor<B, 1>> = None;
        let mut counted = 0;
        while counted < s - 1 {
            let row = counted.min(s - 1 - chunk);
            let end = row + chunk;
            let skip = counted - row;
            let _tag = tag::tag(Category::Logits);
            let logits = head.logits(hj.clone().slice([row..end, 0..d]));
            let chunk_targets = targets.clone().slice(row..end);
            let nll = match in_vocab {
                // One launch over the chunk in its own dtype
                // (`exec::kernels`): no f32 copy, no reductions in pieces.
                true => match B::row_nll(logits, chunk_targets, skip) {
                    Ok(rows) => {
                        crate::exec::watch::after_op();
                        Ok(reduce::sum_all(rows).reshape([1]))
                    }
                    Err(back) => Err(back),
                },
                false => Err((logits, chunk_targets)),
            };
            let nll = match nll {
                Ok(nll) => nll,
                Err((logits, chunk_targets)) => ops_nll(logits, chunk_targets, skip),
            };
            total = Some(match total {
                Some(t) => t + nll,
                None => nll,
            });
            counted = end;
        }
        totals.extend(total);
    }
    if totals.is_empty() {
        return Vec::new();
    }
    let data = Tensor::cat(totals, 0).into_data();
    crate::exec::transfer::read_back(data.bytes.len() as u64);
    data.iter::<f32>().map(f64::from).collect()
}

/// Whether every token of `tokens` is a row of the vocabulary (a kernel
/// reads the target's logit without a bounds check).
fn fits_vocab(tokens: &[u32], vocab: usize) -> bool {
    tokens.iter().all(|t| (*t as usize) < vocab)
}

/// The summed loss of the rows `skip..` of `logits` (`[rows, vocab]`) with
/// Burn's ops, where the backend has no `row_nll` kernel: the chunk cast
/// to f32, log-softmax over the vocabulary in pieces (cubecl's reductions
/// stop short on axes past 65 532, `exec::reduce`), the targets gathered.
fn ops_nll<B: Compute>(
    logits: Tensor<B, 2>,
    targets: Tensor<B, 1, Int>,
    skip: usize,
) -> Tensor<B, 1> {
    let [rows, _] = logits.dims();
    let logits = if logits.dtype() == DType::F32 {
        logits
    } else {
        let f32s = logits.cast(FloatDType::F32);
        // The chunk in both dtypes: this path's high-water mark.
        crate::exec::watch::after_op();
        f32s
    };
    let _span = timing::work(Work::Logits);
    let picked = logits.clone().gather(1, targets.reshape([rows, 1]));
    let max = reduce::max_dim(logits.clone(), 1);
    let lse = reduce::sum_dim((logits - max.clone()).exp(), 1).log() + max;
    let rows = (lse - picked).slice([skip..rows, 0..1]);
    reduce::sum_all(rows).reshape([1])
}

/// Sum over rows of `logsumexp(row) - row[target]`, rows of `vocab`
/// logits, in parallel, in f64 sums. Destroys `logits`. The rows are
/// computed in parallel but added in order, so the same windows give the
/// same perplexity to the last bit whatever the threads' timing (rayon's
/// parallel `sum` groups its additions by work stealing).
fn rows_nll(logits: &mut [f32], vocab: usize, targets: &[u32]) -> f64 {
    use rayon::prelude::*;
    logits
        .par_chunks_mut(vocab)
        .zip(targets.par_iter())
        .map(|(row, t)| {
            let picked = row[*t as usize] as f64;
            let max = row.iter().fold(f32::NEG_INFINITY, |a, b| a.max(*b));
            for v in row.iter_mut() {
                *v -= max;
            }
            crate::model::cpu_attention::exp_in_place(row);
            let sum: f64 = row.iter().map(|v| *v as f64).sum();
            max as f64 + sum.ln() - picked
        })
        .collect::<Vec<f64>>()
        .into_iter()
        .sum()
}
