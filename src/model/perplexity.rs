//! Perplexity, as the Wanda/SparseGPT evaluation computes it: for each
//! window of `seqlen` tokens, the mean next-token cross-entropy over its
//! `seqlen - 1` predictions; perplexity is `exp` of the mean over windows.
//!
//! Two ways to hold the model, same numbers: [`Weights::Resident`] runs each
//! batch of windows through every layer; [`Weights::Streamed`] keeps the
//! hidden states of all windows and loads one decoder layer at a time from
//! the checkpoint, so only one layer is ever resident. Logits are computed in
//! row chunks so a large vocabulary never materialises `[batch, seq, vocab]`.

use crate::exec::{Compute, reduce};
use std::time::Instant;

use crate::timing::{self, Work};
use burn::prelude::*;
use burn::tensor::{DType, FloatDType};

use crate::memory::held::{self, Held};
use crate::memory::tag::{self, Category};
use crate::model::inline_eval::Evaluated;
use crate::model::kept::{Kept, LayerRef};
use crate::model::llama::Head;
use crate::model::prefetch;
use crate::model::vocab::{self, LmHead};
use crate::model::{Checkpoint, ComputeDtype, Llama, LlamaConfig, ModelError, Rope};
use crate::profiler::Profiler;

/// Where the weights come from.
pub enum Weights<'a, B: Compute> {
    Resident(&'a Llama<B>, &'a LlamaConfig),
    Streamed(&'a Checkpoint),
    /// The decoder layers a device prune kept (`model::kept`); the
    /// embedding, final norm and head from the checkpoint.
    Kept(&'a Checkpoint, &'a Kept<B>),
    /// Every batch already through the pruned layers, inside the prune
    /// (`model::inline_eval`): the final norm and the head are left.
    Evaluated(Evaluated<'a, B>),
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
    let shared = crate::exec::dist::share_cow(windows);
    let windows = &shared[..];
    let t = Instant::now();
    let mut before = 0.0;
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
            nll = streamed_nll::<B>(ckpt, None, &batches, seqlen, options, device, profiler)?;
        }
        Weights::Kept(ckpt, kept) => {
            let kept = Some(kept);
            nll = streamed_nll::<B>(ckpt, kept, &batches, seqlen, options, device, profiler)?;
        }
        Weights::Evaluated(e) => {
            let ran: Vec<&[Vec<u32>]> = e.batches.iter().map(Vec::as_slice).collect();
            if ran != batches {
                return Err(ModelError::Checkpoint(
                    "the evaluation inside the prune ran other windows".into(),
                ));
            }
            before = e.seconds;
            // The layers' freed buffers (the prune's last layer's, cached
            // by the allocator) go back before the head's table and
            // logits, as in `streamed_nll`.
            crate::memory::alloc::trim();
            crate::exec::release_free::<B>(device);
            let head = match e.table {
                Some(data) => LmHead::from_host(data, options.dtype, device)?,
                None => LmHead::load(e.ckpt, options.dtype, device)?,
            };
            let at_head = AtHead {
                ckpt: e.ckpt,
                dtype: options.dtype,
                device,
                profiler,
            };
            nll = at_head.nll(e.xs, e.held, head, &batches)?;
        }
    }
    // The head's freed logits chunks and table go back when the evaluation
    // ends: cached, they kept the process's resident set at the
    // evaluation's peak after it (SmolLM2 Wanda, 8 windows of 256: 220.6
    // MiB resident for 12.3 MiB live, to the end of the run).
    crate::memory::alloc::trim();
    crate::exec::release_free::<B>(device);
    // A perplexity of NaN is not an answer: finite weights can still
    // overflow the forward pass (f16's range ends at 65 504).
    if let Some(k) = nll.iter().position(|n| !n.is_finite()) {
        return Err(ModelError::Checkpoint(format!(
            "evaluation window {} gave a loss of {}: the forward pass overflowed in {} (try --dtype f32, or check the weights)",
            k + 1,
            nll[k],
            options.dtype
        )));
    }
    let mut sums = [
        nll.iter().map(|n| n / (seqlen - 1) as f64).sum::<f64>(),
        nll.len() as f64,
    ];
    crate::exec::dist::reducer().sum_f64(&mut sums);
    let (mean_loss, evaluated) = (sums[0] / sums[1], sums[1] as usize);
    let seconds = before + t.elapsed().as_secs_f64();
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
/// window's summed negative log-likelihood. The layers come from `kept`
/// when given (a device prune's), else from the checkpoint. On a device,
/// host threads read the next layer and the head's table while the device
/// runs this one (`model::prefetch`, `LmHead::read_ahead`).
fn streamed_nll<B: Compute>(
    ckpt: &Checkpoint,
    kept: Option<&Kept<B>>,
    batches: &[&[Vec<u32>]],
    seqlen: usize,
    options: &EvalOptions,
    device: &B::Device,
    profiler: Option<&Profiler>,
) -> Result<Vec<f64>, ModelError> {
    let c = &ckpt.config;
    let dtype = options.dtype;
    let rope = Rope::<B>::new(c, seqlen, dtype.burn(), device);
    // Each batch's rows gathered on the host: the embedding table never
    // goes up (`model::vocab`).
    let activations = tag::tag(Category::Activations);
    let xs = batches
        .iter()
        .map(|batch| vocab::embed_windows::<B>(ckpt, batch, dtype, device))
        .collect::<Result<Vec<_>, _>>()?;
    drop(activations);
    let xs_held = Held::new(
        Category::Activations,
        xs.iter().map(held::tensor_bytes).sum(),
    );
    let layers = Layers {
        ckpt,
        kept,
        rope: &rope,
        dtype,
        device,
        profiler,
    };
    let (xs, head) = std::thread::scope(|scope| -> Result<_, ModelError> {
        let ahead = LmHead::<B>::read_ahead(ckpt, dtype, device).map(|read| scope.spawn(read));
        let xs = layers.run(xs)?;
        // The layers' freed buffers (one forward's, reused from layer to
        // layer since the batches keep their shapes) go back before the
        // head's table and logits.
        crate::memory::alloc::trim();
        crate::exec::release_free::<B>(device);
        let head = match ahead {
            Some(read) => {
                let data = timing::timed(Work::ReaderWait, || read.join()).map_err(|_| {
                    ModelError::Checkpoint("reading the head's table failed".into())
                })??;
                LmHead::from_host(data, dtype, device)?
            }
            None => LmHead::load(ckpt, dtype, device)?,
        };
        Ok((xs, head))
    })?;
    let at_head = AtHead {
        ckpt,
        dtype,
        device,
        profiler,
    };
    at_head.nll(xs, xs_held, head, batches)
}

/// The evaluation's last part: the final norm and the head over every
/// batch's hidden states.
struct AtHead<'a, B: Compute> {
    ckpt: &'a Checkpoint,
    dtype: ComputeDtype,
    device: &'a B::Device,
    profiler: Option<&'a Profiler>,
}

impl<B: Compute> AtHead<'_, B> {
    /// Each window's summed negative log-likelihood from `xs` (one tensor
    /// per batch, `xs_held` their bytes) through `head`.
    fn nll(
        &self,
        xs: Vec<Tensor<B, 3>>,
        mut xs_held: Held,
        head: LmHead<B>,
        batches: &[&[Vec<u32>]],
    ) -> Result<Vec<f64>, ModelError> {
        let (c, dtype, device) = (&self.ckpt.config, self.dtype, self.device);
        let sizes: Vec<u64> = xs.iter().map(held::tensor_bytes).collect();
        let _head_held = Held::new(Category::Weights, c.vocab_table_params() * dtype.size());
        let norm = self.ckpt.load_norm::<B>(dtype, device)?;
        let head = Head::of(&head);
        // The head over every batch is its own sequence: on a large
        // vocabulary it takes as long as the layers.
        let mut nll = Vec::new();
        let mut shapes = crate::exec::BatchShapes::default();
        for (k, (x, batch)) in xs.into_iter().zip(batches).enumerate() {
            shapes.next::<B>(&x.dims(), device);
            // The batches still waiting stay held; this one is the head's.
            xs_held.set(sizes[k + 1..].iter().sum());
            nll.extend(window_nll(norm.forward(x), batch, &head, c.vocab_size));
            if let Some(p) = self.profiler {
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
}

/// The decoder layers of a streamed evaluation.
struct Layers<'a, B: Compute> {
    ckpt: &'a Checkpoint,
    kept: Option<&'a Kept<B>>,
    rope: &'a Rope<B>,
    dtype: ComputeDtype,
    device: &'a B::Device,
    profiler: Option<&'a Profiler>,
}

impl<B: Compute> Layers<'_, B> {
    /// Every batch through every layer, one watch over all of them (a
    /// layer's first batch follows the last layer's last). Read from the
    /// checkpoint on a device, the next layer is read and converted on a
    /// host thread while the device runs this one.
    fn run(&self, mut xs: Vec<Tensor<B, 3>>) -> Result<Vec<Tensor<B, 3>>, ModelError> {
        let c = &self.ckpt.config;
        let ahead = self.kept.is_none() && B::is_device();
        let mut shapes = crate::exec::BatchShapes::default();
        prefetch::for_each_layer(self.ckpt, self.dtype, ahead, |i, ready| {
            crate::memory::alloc::trim();
            let (layer, _held) = self.layer(i, ready)?;
            let _tag = tag::tag(Category::Activations);
            xs = std::mem::take(&mut xs)
                .into_iter()
                .map(|x| {
                    shapes.next::<B>(&x.dims(), self.device);
                    layer.forward(x, self.rope)
                })
                .collect();
            if let Some(p) = self.profiler {
                p.device_tick(|| format!("eval model.layers.{i}"))?;
                p.progress(
                    "evaluation",
                    i,
                    c.num_layers,
                    &format!("eval model.layers.{i}"),
                );
            }
            Ok::<_, ModelError>(())
        })?;
        Ok(xs)
    }

    /// Layer `i` and what holds its bytes: kept on the device, already in
    /// the store's ledger; brought up from the host or the checkpoint,
    /// this pass's.
    fn layer(
        &self,
        i: usize,
        ready: Option<prefetch::HostLayer>,
    ) -> Result<(LayerRef<'_, B>, Held), ModelError> {
        let c = &self.ckpt.config;
        let bytes = c.layer_param_count() * self.dtype.size();
        let layer = match (self.kept, ready) {
            (Some(k), _) => k.layer(i, c, self.device)?,
            (None, ready) => LayerRef::Owned(Box::new(prefetch::load_layer::<B>(
                self.ckpt,
                i,
                ready,
                self.dtype,
                self.device,
            )?)),
        };
        if self.kept.is_none() && B::is_device() {
            crate::exec::transfer::uploaded(bytes);
        }
        let held = match &layer {
            LayerRef::Borrowed(_) => Held::none(Category::Weights),
            LayerRef::Owned(_) => Held::new(Category::Weights, bytes),
        };
        Ok((layer, held))
    }
}
