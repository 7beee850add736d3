//! The Llama decoder on Burn, computed the way transformers computes it.
//!
//! The struct tree mirrors the checkpoint's names (`model.layers.N.self_attn.
//! q_proj.weight` is `Llama.model.layers[N].self_attn.q_proj.weight`), so
//! weights load by path. A [`DecoderLayer`] runs on its own: the layer-by-
//! layer pruner loads, runs and drops one at a time, and
//! [`DecoderLayer::forward_traced`] shows it the input of every linear.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::timing::{self, Work};
use burn::nn::{Embedding, Linear};
use burn::prelude::*;
use burn::tensor::DType;
use burn::tensor::activation::silu;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;

use super::config::{LlamaConfig, RopeScaling};
use super::dtype::float_dtype;
use super::{cpu_attention, cpu_ops, host};
use crate::exec::Compute;
use crate::memory::held::{Held, tensor_bytes};
use crate::memory::tag::Category;

pub use super::rms_norm::LlamaRmsNorm;

/// Which linears a traced input feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinearInput {
    /// Input of q_proj, k_proj and v_proj.
    Qkv,
    /// Input of o_proj.
    O,
    /// Input of gate_proj and up_proj.
    GateUp,
    /// Input of down_proj.
    Down,
}

impl LinearInput {
    /// Every input, in the order of a layer's forward (and of pruning).
    pub const ALL: [LinearInput; 4] = [
        LinearInput::Qkv,
        LinearInput::O,
        LinearInput::GateUp,
        LinearInput::Down,
    ];

    /// The linears (by checkpoint name inside a layer) fed by this input.
    pub fn linears(self) -> &'static [&'static str] {
        match self {
            LinearInput::Qkv => &["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
            LinearInput::O => &["self_attn.o_proj"],
            LinearInput::GateUp => &["mlp.gate_proj", "mlp.up_proj"],
            LinearInput::Down => &["mlp.down_proj"],
        }
    }
}

/// The seven prunable linears of a decoder layer, in checkpoint order.
pub const LAYER_LINEARS: [&str; 7] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
];

/// Full-shape cos/sin for one `[batch, seq, heads]` layout.
type RopeTables<B> = (Tensor<B, 4>, Tensor<B, 4>);

/// Precomputed rotary tables: cos/sin `[seq, head_dim]`, the signed
/// permutation `rot` with `x @ rot == rotate_half(x)`, and the tables
/// expanded to each input shape seen (the CPU backend multiplies same-shape
/// tensors far faster than broadcast ones).
#[derive(Debug, Clone)]
pub struct Rope<B: Backend> {
    pub cos: Tensor<B, 2>,
    pub sin: Tensor<B, 2>,
    rot: Tensor<B, 2>,
    expanded: Arc<Mutex<HashMap<[usize; 3], RopeTables<B>>>>,
    /// The f32 cos/sin tables `[seq, head_dim]` for the fused host kernel.
    host: Arc<(Vec<f32>, Vec<f32>)>,
    /// The device bytes of every table, the cached ones included, for the
    /// device's composition (`memory::held`); shared by clones.
    held: Arc<Mutex<Held>>,
}

impl<B: Compute> Rope<B> {
    /// Tables for positions `0..seq`, computed in f32 like transformers'
    /// `LlamaRotaryEmbedding`, then cast to `dtype`.
    pub fn new(config: &LlamaConfig, seq: usize, dtype: DType, device: &B::Device) -> Self {
        let inv = inv_freq(config);
        let d = config.head_dim;
        let mut cos = Vec::with_capacity(seq * d);
        let mut sin = Vec::with_capacity(seq * d);
        for p in 0..seq {
            let row: Vec<f32> = inv.iter().map(|f| p as f32 * f).collect();
            for _ in 0..2 {
                cos.extend(row.iter().map(|a| a.cos()));
                sin.extend(row.iter().map(|a| a.sin()));
            }
        }
        // rotate_half(x) = cat(-x[d/2..], x[..d/2]) as a matrix product.
        let half = d / 2;
        let mut rot = vec![0f32; d * d];
        for j in 0..half {
            rot[(j + half) * d + j] = -1.0;
            rot[j * d + j + half] = 1.0;
        }
        let host = Arc::new((cos.clone(), sin.clone()));
        let make = |v: Vec<f32>, rows: usize| {
            let t = Tensor::<B, 2>::from_data(TensorData::new(v, [rows, d]), device);
            if dtype == DType::F32 {
                t
            } else {
                t.cast(float_dtype(dtype))
            }
        };
        let (cos, sin, rot) = (make(cos, seq), make(sin, seq), make(rot, d));
        let bytes = [&cos, &sin, &rot].into_iter().map(tensor_bytes).sum();
        Self {
            cos,
            sin,
            rot,
            expanded: Arc::default(),
            host,
            held: Arc::new(Mutex::new(Held::new(Category::Activations, bytes))),
        }
    }

    fn tables(&self, b: usize, s: usize, n: usize, d: usize) -> RopeTables<B> {
        let key = [b, s, n];
        if let Ok(cache) = self.expanded.lock()
            && let Some(t) = cache.get(&key)
        {
            return t.clone();
        }
        let expand = |t: &Tensor<B, 2>| {
            let e = t
                .clone()
                .slice([0..s, 0..d])
                .reshape([1, s, 1, d])
                .expand([b, s, n, d]);
            // Materialise: a dense copy, not a zero-stride view.
            let dtype = e.dtype();
            Tensor::<B, 4>::from_data(e.into_data(), (&t.device(), dtype))
        };
        let tables = (expand(&self.cos), expand(&self.sin));
        if let Ok(mut cache) = self.expanded.lock() {
            let added = tensor_bytes(&tables.0) + tensor_bytes(&tables.1);
            if cache.insert(key, tables.clone()).is_none()
                && let Ok(mut held) = self.held.lock()
            {
                let bytes = held.bytes() + added;
                held.set(bytes);
            }
        }
        tables
    }

    /// Rotates `x` laid out `[batch, seq, heads, head_dim]` (the layout the
    /// projections produce, contiguous, so every op here is dense).
    pub fn apply(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let [b, s, n, d] = x.dims();
        if B::fused(&x) {
            let device = x.device();
            let mut v = host::values(x);
            cpu_ops::rope_in_place(&mut v, &self.host.0, &self.host.1, s, n, d);
            return host::tensor(v, [b, s, n, d], &device);
        }
        let (cos, sin) = self.tables(b, s, n, d);
        let rotated = x
            .clone()
            .reshape([b * s * n, d])
            .matmul(self.rot.clone())
            .reshape([b, s, n, d]);
        x * cos + rotated * sin
    }
}

/// Inverse frequencies in f32, with Llama-3 or linear scaling.
pub fn inv_freq(config: &LlamaConfig) -> Vec<f32> {
    let d = config.head_dim;
    let base = config.rope_theta as f32;
    let mut inv: Vec<f32> = (0..d)
        .step_by(2)
        .map(|i| 1.0f32 / base.powf(i as f32 / d as f32))
        .collect();
    match config.rope_scaling {
        None => {}
        Some(RopeScaling::Linear { factor }) => {
            for f in &mut inv {
                *f /= factor as f32;
            }
        }
        Some(RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        }) => {
            let old = original_max_position_embeddings as f64;
            let low_wavelen = old / low_freq_factor;
            let high_wavelen = old / high_freq_factor;
            for f in &mut inv {
                let freq = *f as f64;
                let wavelen = 2.0 * std::f64::consts::PI / freq;
                let scaled = if wavelen > low_wavelen {
                    freq / factor
                } else {
                    freq
                };
                let medium = (high_wavelen..=low_wavelen).contains(&wavelen);
                *f = if medium {
                    let smooth =
                        (old / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                    ((1.0 - smooth) * scaled / factor + smooth * scaled) as f32
                } else {
                    scaled as f32
                };
            }
        }
    }
    inv
}

/// Self-attention with grouped-query heads.
#[derive(Module, Debug)]
pub struct LlamaAttention<B: Backend> {
    pub q_proj: Linear<B>,
    pub k_proj: Linear<B>,
    pub v_proj: Linear<B>,
    pub o_proj: Linear<B>,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// Mistral's local window; 0 when attention is plain causal.
    pub sliding_window: usize,
}

impl<B: Compute> LlamaAttention<B> {
    fn repeat_kv(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let rep = self.num_heads / self.num_kv_heads;
        if rep == 1 {
            return x;
        }
        let [b, n, s, d] = x.dims();
        x.unsqueeze_dim::<5>(2)
            .expand([b, n, rep, s, d])
            .reshape([b, n * rep, s, d])
    }

    /// `x`: normalised hidden states `[batch, seq, hidden]`. `trace` sees the
    /// input of o_proj.
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        rope: &Rope<B>,
        trace: &mut dyn FnMut(LinearInput, &Tensor<B, 3>),
    ) -> Tensor<B, 3> {
        let [b, s, _] = x.dims();
        let (nh, nkv, hd) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let q = rope.apply(gemm(&self.q_proj, x.clone()).reshape([b, s, nh, hd]));
        let k = rope.apply(gemm(&self.k_proj, x.clone()).reshape([b, s, nkv, hd]));
        let v = gemm(&self.v_proj, x).reshape([b, s, nkv, hd]);
        let attention_span = timing::work(Work::Attention);
        let window =
            (self.sliding_window > 0 && s > self.sliding_window).then_some(self.sliding_window);
        let out = if B::host_attention() {
            let shape = cpu_attention::AttentionShape {
                batch: b,
                seq: s,
                heads: nh,
                kv_heads: nkv,
                head_dim: hd,
                window,
            };
            host::attention(q, k, v, shape)
        } else {
            let q = q.swap_dims(1, 2);
            let k = self.repeat_kv(k.swap_dims(1, 2));
            let v = self.repeat_kv(v.swap_dims(1, 2));
            let out = match window {
                // Plain causal attention: the backend's fused kernel where
                // it has one (the scores never stored), else Burn's op.
                None => match B::fused_attention(q, k, v) {
                    Ok(out) => out,
                    Err((q, k, v)) => parallel_attention(q, k, v, None, true),
                },
                Some(w) => {
                    let mask = window_mask::<B>(s, w, &q.device());
                    parallel_attention(q, k, v, Some(mask), false)
                }
            };
            out.swap_dims(1, 2).reshape([b, s, nh * hd])
        };
        drop(attention_span);
        trace(LinearInput::O, &out);
        gemm(&self.o_proj, out)
    }
}

/// A linear layer's forward, timed as a matrix product (the backend's:
/// one GEMM over all rows on the CPU backend in f32).
fn gemm<B: Compute>(linear: &Linear<B>, x: Tensor<B, 3>) -> Tensor<B, 3> {
    let _span = timing::work(Work::Gemm);
    <B as Compute>::linear(linear, x)
}

/// Burn's attention op run on chunks of the (batch x head) dimension on
/// scoped threads where the backend allows it ([`Compute::split_across_threads`]):
/// the CPU backend's attention kernel is single-threaded. On a device it is
/// one op on the computing thread.
fn parallel_attention<B: Compute>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: Option<Tensor<B, 4, Bool>>,
    is_causal: bool,
) -> Tensor<B, 4> {
    let options = AttentionModuleOptions {
        scale: None,
        softcap: None,
        is_causal,
    };
    let [b, h, s, d] = q.dims();
    let threads = match B::split_across_threads() {
        true => std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(b * h),
        false => 1,
    };
    if threads <= 1 {
        return attention(q, k, v, mask, None, options);
    }
    let flat = |t: Tensor<B, 4>| t.reshape([1, b * h, s, d]).chunk(threads, 1);
    let parts: Vec<_> = flat(q).into_iter().zip(flat(k)).zip(flat(v)).collect();
    let outs: Vec<Tensor<B, 4>> = std::thread::scope(|scope| {
        let handles: Vec<_> = parts
            .into_iter()
            .map(|((q, k), v)| {
                let mask = mask.clone();
                scope.spawn(move || attention(q, k, v, mask, None, options))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("attention worker panicked"))
            .collect()
    });
    Tensor::cat(outs, 1).reshape([b, h, s, d])
}

/// Causal mask that also hides keys `window` or more positions back.
fn window_mask<B: Backend>(s: usize, window: usize, device: &B::Device) -> Tensor<B, 4, Bool> {
    let mut m = Vec::with_capacity(s * s);
    for i in 0..s {
        for j in 0..s {
            m.push(j > i || i - j >= window);
        }
    }
    Tensor::<B, 2, Bool>::from_data(TensorData::new(m, [s, s]), device).unsqueeze::<4>()
}

/// The SiLU-gated MLP.
#[derive(Module, Debug)]
pub struct LlamaMlp<B: Backend> {
    pub gate_proj: Linear<B>,
    pub up_proj: Linear<B>,
    pub down_proj: Linear<B>,
}

impl<B: Compute> LlamaMlp<B> {
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        trace: &mut dyn FnMut(LinearInput, &Tensor<B, 3>),
    ) -> Tensor<B, 3> {
        let (gate, up) = (gemm(&self.gate_proj, x.clone()), gemm(&self.up_proj, x));
        let h = if B::fused(&gate) {
            let (dims, device) = (gate.dims(), gate.device());
            let mut g = host::values(gate);
            cpu_ops::swiglu_in_place(&mut g, &host::values(up));
            host::tensor(g, dims, &device)
        } else {
            // A device's kernel (no f32 copy of the gate), else Burn's ops.
            match B::swiglu(gate, up) {
                Ok(h) => h,
                Err((gate, up)) => silu(gate) * up,
            }
        };
        trace(LinearInput::Down, &h);
        gemm(&self.down_proj, h)
    }
}

/// One decoder layer.
#[derive(Module, Debug)]
pub struct DecoderLayer<B: Backend> {
    pub self_attn: LlamaAttention<B>,
    pub mlp: LlamaMlp<B>,
    pub input_layernorm: LlamaRmsNorm<B>,
    pub post_attention_layernorm: LlamaRmsNorm<B>,
}

impl<B: Compute> DecoderLayer<B> {
    pub fn forward(&self, x: Tensor<B, 3>, rope: &Rope<B>) -> Tensor<B, 3> {
        self.forward_traced(x, rope, &mut |_, _| {})
    }

    /// Forward pass that shows `trace` the input of every linear.
    pub fn forward_traced(
        &self,
        x: Tensor<B, 3>,
        rope: &Rope<B>,
        trace: &mut dyn FnMut(LinearInput, &Tensor<B, 3>),
    ) -> Tensor<B, 3> {
        // Norms, rope, SwiGLU and residuals: what the inner spans leave.
        let _span = timing::work(Work::Elementwise);
        let h = self.input_layernorm.forward(x.clone());
        trace(LinearInput::Qkv, &h);
        let x = x + self.self_attn.forward(h, rope, trace);
        let h = self.post_attention_layernorm.forward(x.clone());
        trace(LinearInput::GateUp, &h);
        x + self.mlp.forward(h, trace)
    }

    /// The linear named as in the checkpoint (`self_attn.q_proj`...).
    pub fn linear(&self, name: &str) -> Option<&Linear<B>> {
        Some(match name {
            "self_attn.q_proj" => &self.self_attn.q_proj,
            "self_attn.k_proj" => &self.self_attn.k_proj,
            "self_attn.v_proj" => &self.self_attn.v_proj,
            "self_attn.o_proj" => &self.self_attn.o_proj,
            "mlp.gate_proj" => &self.mlp.gate_proj,
            "mlp.up_proj" => &self.mlp.up_proj,
            "mlp.down_proj" => &self.mlp.down_proj,
            _ => return None,
        })
    }

    /// Mutable access to the linear named as in the checkpoint.
    pub fn linear_mut(&mut self, name: &str) -> Option<&mut Linear<B>> {
        Some(match name {
            "self_attn.q_proj" => &mut self.self_attn.q_proj,
            "self_attn.k_proj" => &mut self.self_attn.k_proj,
            "self_attn.v_proj" => &mut self.self_attn.v_proj,
            "self_attn.o_proj" => &mut self.self_attn.o_proj,
            "mlp.gate_proj" => &mut self.mlp.gate_proj,
            "mlp.up_proj" => &mut self.mlp.up_proj,
            "mlp.down_proj" => &mut self.mlp.down_proj,
            _ => return None,
        })
    }
}

/// Embeddings, decoder layers and final norm (`model.*` in checkpoints).
#[derive(Module, Debug)]
pub struct LlamaModel<B: Backend> {
    pub embed_tokens: Embedding<B>,
    pub layers: Vec<DecoderLayer<B>>,
    pub norm: LlamaRmsNorm<B>,
}

/// The whole causal LM; `lm_head` is `None` when tied to the embeddings.
#[derive(Module, Debug)]
pub struct Llama<B: Backend> {
    pub model: LlamaModel<B>,
    pub lm_head: Option<Linear<B>>,
}

/// The output projection: a separate head, or the embeddings transposed.
pub enum Head<'a, B: Backend> {
    Linear(&'a Linear<B>),
    /// A `[vocab, hidden]` table multiplied transposed: the tied
    /// embedding, or an untied head kept in its stored layout.
    Tied(&'a Embedding<B>),
    /// A table past the device's largest buffer, in row shards
    /// (`model::vocab`).
    Sharded(&'a super::vocab::Shards<B>),
}

impl<'a, B: Compute> Head<'a, B> {
    /// The head of a streamed evaluation (`model::vocab`).
    pub fn of(lm_head: &'a super::vocab::LmHead<B>) -> Self {
        use super::vocab::LmHead;
        match lm_head {
            LmHead::Whole(l) => Head::Linear(l),
            LmHead::Rows(e) => Head::Tied(e),
            LmHead::Sharded(s) => Head::Sharded(s),
        }
    }

    /// Logits for hidden states `[n, hidden]` → `[n, vocab]`.
    pub fn logits(&self, h: Tensor<B, 2>) -> Tensor<B, 2> {
        let _span = timing::work(Work::Gemm);
        let logits = match self {
            Head::Linear(l) => l.forward(h.clone()),
            Head::Tied(e) => crate::exec::matmul::times_rows(h.clone(), e.weight.val()),
            Head::Sharded(s) => s.logits(h.clone()),
        };
        crate::exec::watch::after_op();
        logits
    }
}

impl<B: Compute> Llama<B> {
    pub fn head(&self) -> Head<'_, B> {
        match &self.lm_head {
            Some(l) => Head::Linear(l),
            None => Head::Tied(&self.model.embed_tokens),
        }
    }

    /// Final hidden states (after the last norm) for `tokens` `[batch, seq]`.
    pub fn hidden(&self, tokens: Tensor<B, 2, Int>, rope: &Rope<B>) -> Tensor<B, 3> {
        let mut x = self.model.embed_tokens.forward(tokens);
        for layer in &self.model.layers {
            x = layer.forward(x, rope);
        }
        self.model.norm.forward(x)
    }

    /// Logits `[batch, seq, vocab]`. Fine for short inputs; perplexity uses
    /// chunked logits instead (the evaluation engine, `perplexity`).
    pub fn logits(&self, tokens: Tensor<B, 2, Int>, rope: &Rope<B>) -> Tensor<B, 3> {
        let h = self.hidden(tokens, rope);
        let [b, s, d] = h.dims();
        let logits = self.head().logits(h.reshape([b * s, d]));
        let v = logits.dims()[1];
        logits.reshape([b, s, v])
    }
}
