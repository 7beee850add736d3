//! Perplexity, as the Wanda/SparseGPT evaluation computes it: for each
//! window of `seqlen` tokens, the mean next-token cross-entropy over its
//! `seqlen - 1` predictions; perplexity is `exp` of the mean over windows.
//!
//! Two ways to hold the model, same numbers: [`Weights::Resident`] runs each
//! batch of windows through every layer; [`Weights::Streamed`] keeps the
//! hidden states of all windows and loads one decoder layer at a time from
//! the checkpoint, so only one layer is ever resident. Logits are computed in
//! row chunks so a large vocabulary never materialises `[batch, seq, vocab]`.

use crate::exec::Compute;
use std::time::Instant;

use crate::timing::{self, Work};
use burn::prelude::*;
use burn::tensor::{DType, FloatDType};

use crate::memory::held::{self, Held};
use crate::memory::tag::{self, Category};
use crate::model::llama::Head;
use crate::model::vocab::{Embed, LmHead};
use crate::model::{Checkpoint, ComputeDtype, Llama, LlamaConfig, ModelError, Rope};
use crate::profiler::Profiler;

/// Where the weights come from.
pub enum Weights<'a, B: Compute> {
    Resident(&'a Llama<B>, &'a LlamaConfig),
    Streamed(&'a Checkpoint),
}

/// How to evaluate.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    pub batch_size: usize,
    pub dtype: ComputeDtype,
}

/// A perplexity and how it was obtained.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Perplexity {
    pub perplexity: f64,
    pub mean_loss: f64,
    pub windows: usize,
    pub seqlen: usize,
    pub seconds: f64,
    pub tokens_per_second: f64,
}

/// Token ids `[batch, seq]` as a Burn int tensor.
pub fn token_tensor<B: Compute>(windows: &[Vec<u32>], device: &B::Device) -> Tensor<B, 2, Int> {
    let s = windows.first().map_or(0, Vec::len);
    let ids: Vec<i64> = windows.iter().flatten().map(|t| *t as i64).collect();
    Tensor::from_data(TensorData::new(ids, [windows.len(), s]), device)
}

/// Rows of logits per chunk: about 8 Mi f32 elements (32 MiB) at a time.
pub fn chunk_rows(vocab: usize) -> usize {
    ((1usize << 23) / vocab.max(1)).max(1)
}

/// Sum of next-token negative log-likelihoods per window, given final
/// normed hidden states `h` `[b, s, d]` and the windows' tokens.
pub fn window_nll<B: Compute>(
    h: Tensor<B, 3>,
    windows: &[Vec<u32>],
    head: &Head<'_, B>,
    vocab: usize,
) -> Vec<f64> {
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
            let mut values: Vec<f32> = logits.into_data().into_vec().unwrap_or_default();
            total += rows_nll(&mut values, vocab, &tokens[row + 1..end + 1]);
            row = end;
        }
        out.push(total);
    }
    out
}

/// Perplexity of `windows` (all of one length).
pub fn perplexity<B: Compute>(
    weights: Weights<'_, B>,
    windows: &[Vec<u32>],
    options: &EvalOptions,
    device: &B::Device,
    profiler: Option<&Profiler>,
) -> Result<Perplexity, ModelError> {
    let seqlen = windows.first().map_or(0, Vec::len);
    if windows.is_empty() || seqlen < 2 {
        return Err(ModelError::Checkpoint(
            "evaluation needs at least one window of 2 or more tokens".into(),
        ));
    }
    // In a distributed run each rank evaluates its share of the windows and
    // the losses are summed across ranks.
    crate::exec::dist::check_share("evaluation windows", windows.len(), "--eval-windows")
        .map_err(|e| ModelError::Checkpoint(e.to_string()))?;
    let shared;
    let windows = if crate::exec::dist::world().1 > 1 {
        shared = crate::exec::dist::share(windows);
        &shared[..]
    } else {
        windows
    };
    let t = Instant::now();
    let _phase = timing::phase(timing::Phase::Eval);
    let bs = options.batch_size.max(1);
    let batches: Vec<&[Vec<u32>]> = windows.chunks(bs).collect();
    let mut nll = Vec::with_capacity(windows.len());
    match weights {
        Weights::Resident(model, config) => {
            let rope = Rope::new(config, seqlen, options.dtype.burn(), device);
            for (k, batch) in batches.iter().enumerate() {
                let h = {
                    let _tag = tag::tag(Category::Activations);
                    model.hidden(token_tensor(batch, device), &rope)
                };
                nll.extend(window_nll(h, batch, &model.head(), config.vocab_size));
                if let Some(p) = profiler {
                    p.device_tick(|| format!("eval batch {}", k + 1))?;
                    p.progress(
                        "evaluation",
                        k,
                        batches.len(),
                        &format!("eval batch {}", k + 1),
                    );
                }
            }
        }
        Weights::Streamed(ckpt) => {
            nll = streamed_nll::<B>(ckpt, &batches, seqlen, options, device, profiler)?;
        }
    }
    let mut sums = [
        nll.iter().map(|n| n / (seqlen - 1) as f64).sum::<f64>(),
        nll.len() as f64,
    ];
    crate::exec::dist::reducer().sum_f64(&mut sums);
    let (mean_loss, evaluated) = (sums[0] / sums[1], sums[1] as usize);
    let seconds = t.elapsed().as_secs_f64();
    Ok(Perplexity {
        perplexity: mean_loss.exp(),
        mean_loss,
        windows: evaluated,
        seqlen,
        seconds,
        tokens_per_second: (evaluated * seqlen) as f64 / seconds.max(1e-9),
    })
}

/// Perplexity of the model folder `dir`, streamed one layer at a time,
/// inside an `eval` scope.
pub fn of_folder<B: Compute>(
    dir: &std::path::Path,
    windows: &[Vec<u32>],
    options: &EvalOptions,
    device: &B::Device,
    profiler: &Profiler,
) -> Result<Perplexity, ModelError> {
    let ckpt = Checkpoint::open(dir)?;
    let _scope = profiler.scope(crate::events::stages::EVAL_SCOPE);
    perplexity::<B>(
        Weights::Streamed(&ckpt),
        windows,
        options,
        device,
        Some(profiler),
    )
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

/// The streamed evaluation: every batch embedded, each layer read once and
/// run over every batch, then the head batch by batch. Returns each
/// window's summed negative log-likelihood.
fn streamed_nll<B: Compute>(
    ckpt: &Checkpoint,
    batches: &[&[Vec<u32>]],
    seqlen: usize,
    options: &EvalOptions,
    device: &B::Device,
    profiler: Option<&Profiler>,
) -> Result<Vec<f64>, ModelError> {
    let mut nll = Vec::new();
    let c = &ckpt.config;
    let dtype = options.dtype;
    let rope = Rope::<B>::new(c, seqlen, dtype.burn(), device);
    // Sharded when a table passes the device's largest buffer.
    let embed = Embed::<B>::load(ckpt, dtype, device)?;
    let embed_bytes = c.vocab_table_params() * dtype.size();
    let _embed_held = Held::new(Category::Weights, embed_bytes);
    let activations = tag::tag(Category::Activations);
    let mut xs: Vec<Tensor<B, 3>> = timing::timed(Work::Elementwise, || {
        batches
            .iter()
            .map(|batch| embed.forward(token_tensor(batch, device)))
            .collect()
    });
    drop(activations);
    let sizes: Vec<u64> = xs.iter().map(held::tensor_bytes).collect();
    let mut xs_held = Held::new(Category::Activations, sizes.iter().sum());
    let head_linear = LmHead::<B>::load(ckpt, dtype, device)?;
    let _head_held = Held::new(
        Category::Weights,
        head_linear.as_ref().map_or(0, |_| embed_bytes),
    );
    for i in 0..c.num_layers {
        crate::memory::alloc::trim();
        let layer = ckpt.load_layer::<B>(i, dtype, device)?;
        let _layer_held = Held::new(Category::Weights, c.layer_param_count() * dtype.size());
        let _tag = tag::tag(Category::Activations);
        xs = xs.into_iter().map(|x| layer.forward(x, &rope)).collect();
        if let Some(p) = profiler {
            p.device_tick(|| format!("eval model.layers.{i}"))?;
            p.progress(
                "evaluation",
                i,
                c.num_layers,
                &format!("eval model.layers.{i}"),
            );
        }
    }
    // The last layer's freed buffers go back before the head's
    // logits, as every layer's do before the next.
    crate::memory::alloc::trim();
    let norm = ckpt.load_norm::<B>(dtype, device)?;
    let head = Head::of(head_linear.as_ref(), &embed);
    // The head over every batch is its own sequence: on a large
    // vocabulary it takes as long as the layers.
    for (k, (x, batch)) in xs.into_iter().zip(batches).enumerate() {
        // The batches still waiting stay held; this one is the head's.
        xs_held.set(sizes[k + 1..].iter().sum());
        nll.extend(window_nll(norm.forward(x), batch, &head, c.vocab_size));
        if let Some(p) = profiler {
            p.device_tick(|| format!("eval logits batch {}", k + 1))?;
            p.progress(
                "evaluation logits",
                k,
                batches.len(),
                &format!("eval logits batch {}", k + 1),
            );
        }
    }
    Ok(nll)
}
