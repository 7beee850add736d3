//! The Llama decoder on Burn, computed the way transformers computes it.
//!
//! The struct tree mirrors the checkpoint's names (`model.layers.N.self_attn.
//! q_proj.weight` is `Llama.model.layers[N].self_attn.q_proj.weight`), so
//! weights load by path. A [`DecoderLayer`] runs on its own: the layer-by-
//! layer pruner loads, runs and drops one at a time, and
//! [`DecoderLayer::forward_traced`] shows it the input of every linear.

use burn::module::Param;
use burn::nn::{Embedding, Linear};
use burn::prelude::*;
use burn::tensor::activation::silu;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{DType, FloatDType};

use super::config::{LlamaConfig, RopeScaling};

/// RMS normalisation, computed in f32 whatever the model dtype (as
/// transformers' `LlamaRMSNorm` does).
#[derive(Module, Debug)]
pub struct LlamaRmsNorm<B: Backend> {
    pub weight: Param<Tensor<B, 1>>,
    pub eps: f64,
}

impl<B: Backend> LlamaRmsNorm<B> {
    pub fn new(weight: Tensor<B, 1>, eps: f64) -> Self {
        Self {
            weight: Param::from_tensor(weight),
            eps,
        }
    }

    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let dtype = x.dtype();
        let xf = to_f32(x);
        let variance = xf.clone().square().mean_dim(D - 1);
        let normed = xf * variance.add_scalar(self.eps).sqrt().recip();
        let normed = if dtype == DType::F32 {
            normed
        } else {
            normed.cast(float_dtype(dtype))
        };
        normed * self.weight.val().unsqueeze::<D>()
    }
}

fn to_f32<B: Backend, const D: usize>(x: Tensor<B, D>) -> Tensor<B, D> {
    if x.dtype() == DType::F32 {
        x
    } else {
        x.cast(FloatDType::F32)
    }
}

/// The float dtype of a runtime dtype (defaults to f32 for non-floats).
pub fn float_dtype(d: DType) -> FloatDType {
    match d {
        DType::F16 => FloatDType::F16,
        DType::BF16 => FloatDType::BF16,
        DType::F64 => FloatDType::F64,
        _ => FloatDType::F32,
    }
}

/// Which linears a traced input feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

/// Precomputed rotary cos/sin tables, `[seq, head_dim]`.
#[derive(Debug, Clone)]
pub struct Rope<B: Backend> {
    pub cos: Tensor<B, 2>,
    pub sin: Tensor<B, 2>,
}

impl<B: Backend> Rope<B> {
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
        let make = |v: Vec<f32>| {
            let t = Tensor::<B, 2>::from_data(TensorData::new(v, [seq, d]), device);
            if dtype == DType::F32 {
                t
            } else {
                t.cast(float_dtype(dtype))
            }
        };
        Self {
            cos: make(cos),
            sin: make(sin),
        }
    }

    /// Rotates `x` (`[batch, heads, seq, head_dim]`).
    pub fn apply(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let [_, _, s, d] = x.dims();
        let cos = self.cos.clone().slice([0..s, 0..d]).unsqueeze::<4>();
        let sin = self.sin.clone().slice([0..s, 0..d]).unsqueeze::<4>();
        let half = d / 2;
        let x1 = x.clone().narrow(3, 0, half);
        let x2 = x.clone().narrow(3, half, half);
        let rotated = Tensor::cat(vec![x2.neg(), x1], 3);
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
                let medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
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

impl<B: Backend> LlamaAttention<B> {
    fn heads(&self, x: Tensor<B, 3>, n: usize) -> Tensor<B, 4> {
        let [b, s, _] = x.dims();
        x.reshape([b, s, n, self.head_dim]).swap_dims(1, 2)
    }

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
        let q = rope.apply(self.heads(self.q_proj.forward(x.clone()), self.num_heads));
        let k = rope.apply(self.heads(self.k_proj.forward(x.clone()), self.num_kv_heads));
        let v = self.heads(self.v_proj.forward(x), self.num_kv_heads);
        let (k, v) = (self.repeat_kv(k), self.repeat_kv(v));
        let windowed = self.sliding_window > 0 && s > self.sliding_window;
        let mask = windowed.then(|| window_mask::<B>(s, self.sliding_window, &q.device()));
        let options = AttentionModuleOptions {
            scale: None,
            softcap: None,
            is_causal: !windowed,
        };
        let out = attention(q, k, v, mask, None, options);
        let out = out
            .swap_dims(1, 2)
            .reshape([b, s, self.num_heads * self.head_dim]);
        trace(LinearInput::O, &out);
        self.o_proj.forward(out)
    }
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

impl<B: Backend> LlamaMlp<B> {
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        trace: &mut dyn FnMut(LinearInput, &Tensor<B, 3>),
    ) -> Tensor<B, 3> {
        let h = silu(self.gate_proj.forward(x.clone())) * self.up_proj.forward(x);
        trace(LinearInput::Down, &h);
        self.down_proj.forward(h)
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

impl<B: Backend> DecoderLayer<B> {
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
    Tied(&'a Embedding<B>),
}

impl<B: Backend> Head<'_, B> {
    /// Logits for hidden states `[n, hidden]` → `[n, vocab]`.
    pub fn logits(&self, h: Tensor<B, 2>) -> Tensor<B, 2> {
        match self {
            Head::Linear(l) => l.forward(h),
            Head::Tied(e) => h.matmul(e.weight.val().transpose()),
        }
    }
}

impl<B: Backend> Llama<B> {
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
    /// chunked logits instead (see `crate::eval`).
    pub fn logits(&self, tokens: Tensor<B, 2, Int>, rope: &Rope<B>) -> Tensor<B, 3> {
        let h = self.hidden(tokens, rope);
        let [b, s, d] = h.dims();
        let logits = self.head().logits(h.reshape([b * s, d]));
        let v = logits.dims()[1];
        logits.reshape([b, s, v])
    }
}
