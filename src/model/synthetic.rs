//! Small Llama checkpoints made from a seed: `config.json`, safetensors
//! weights (one file or shards with an index) and a byte-level
//! `tokenizer.json`, in the Hugging Face layout.
//!
//! The demo, the tests and the estimator's validation runs all need models of
//! chosen shapes without downloading anything; these are bit-for-bit
//! reproducible from their [`SyntheticSpec`].

use std::path::Path;

use safetensors::Dtype;
use serde_json::json;

use super::ModelError;
use super::dtype::encode_f32;
use super::save::{OwnedTensor, write_safetensors};

/// Shape and seed of a synthetic model.
#[derive(Debug, Clone)]
pub struct SyntheticSpec {
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    /// 256 byte tokens plus specials; must be at least 259.
    pub vocab: usize,
    pub max_positions: usize,
    pub tied: bool,
    pub seed: u64,
    pub dtype: Dtype,
    /// Number of weight files (1 = `model.safetensors`).
    pub shards: usize,
}

impl Default for SyntheticSpec {
    fn default() -> Self {
        Self {
            hidden: 64,
            intermediate: 160,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            vocab: 259,
            max_positions: 256,
            tied: true,
            seed: 0,
            dtype: Dtype::F32,
            shards: 1,
        }
    }
}

/// Deterministic normal samples (splitmix64 + Box–Muller).
pub struct Normal {
    state: u64,
}

impl Normal {
    pub fn new(seed: u64) -> Self {
        Self {
            state: seed ^ 0x9e37_79b9_7f4a_7c15,
        }
    }
    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in (0, 1).
    pub fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }
    pub fn sample(&mut self) -> f32 {
        let (u, v) = (self.uniform(), self.uniform());
        ((-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()) as f32
    }
    pub fn vec(&mut self, n: usize, std: f32) -> Vec<f32> {
        (0..n).map(|_| self.sample() * std).collect()
    }
}

/// SparseGPT's test problem: `n` correlated calibration inputs of `cols`
/// features drawn from `rng` (each row leans on its first feature, so the
/// OBS update matters) and the Hessian `2/n · XᵀX` accumulated from them.
/// Returns `(h, x)`; shared by the host and device SparseGPT tests.
pub fn correlated_hessian(rng: &mut Normal, cols: usize, n: usize) -> (Vec<f32>, Vec<f32>) {
    let base = rng.vec(n * cols, 1.0);
    let x: Vec<f32> = (0..n * cols)
        .map(|t| base[t] + 0.8 * base[(t / cols) * cols])
        .collect();
    let mut h = vec![0f32; cols * cols];
    for s in 0..n {
        for i in 0..cols {
            for j in 0..cols {
                h[i * cols + j] += 2.0 / n as f32 * x[s * cols + i] * x[s * cols + j];
            }
        }
    }
    (h, x)
}

/// config.json for a spec.
pub fn config_json(s: &SyntheticSpec) -> serde_json::Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": s.hidden,
        "intermediate_size": s.intermediate,
        "num_hidden_layers": s.layers,
        "num_attention_heads": s.heads,
        "num_key_value_heads": s.kv_heads,
        "vocab_size": s.vocab,
        "max_position_embeddings": s.max_positions,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": s.tied,
        "hidden_act": "silu",
        "torch_dtype": match s.dtype { Dtype::F16 => "float16", Dtype::BF16 => "bfloat16", _ => "float32" },
        "bos_token_id": 256,
        "eos_token_id": 257,
    })
}

/// The tensors of a spec, by name, in PyTorch orientation.
pub fn tensors(s: &SyntheticSpec) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let mut rng = Normal::new(s.seed);
    let (h, i) = (s.hidden, s.intermediate);
    let hd = h / s.heads;
    let (q, kv) = (s.heads * hd, s.kv_heads * hd);
    let mut out = vec![(
        "model.embed_tokens.weight".to_string(),
        vec![s.vocab, h],
        rng.vec(s.vocab * h, 0.5),
    )];
    for l in 0..s.layers {
        let p = format!("model.layers.{l}.");
        let lin = |rng: &mut Normal, o: usize, n: usize| rng.vec(o * n, 1.0 / (n as f32).sqrt());
        let norm = |rng: &mut Normal| {
            (0..h)
                .map(|_| 1.0 + 0.1 * rng.sample())
                .collect::<Vec<f32>>()
        };
        out.push((
            format!("{p}input_layernorm.weight"),
            vec![h],
            norm(&mut rng),
        ));
        out.push((
            format!("{p}self_attn.q_proj.weight"),
            vec![q, h],
            lin(&mut rng, q, h),
        ));
        out.push((
            format!("{p}self_attn.k_proj.weight"),
            vec![kv, h],
            lin(&mut rng, kv, h),
        ));
        out.push((
            format!("{p}self_attn.v_proj.weight"),
            vec![kv, h],
            lin(&mut rng, kv, h),
        ));
        out.push((
            format!("{p}self_attn.o_proj.weight"),
            vec![h, q],
            lin(&mut rng, h, q),
        ));
        out.push((
            format!("{p}post_attention_layernorm.weight"),
            vec![h],
            norm(&mut rng),
        ));
        out.push((
            format!("{p}mlp.gate_proj.weight"),
            vec![i, h],
            lin(&mut rng, i, h),
        ));
        out.push((
            format!("{p}mlp.up_proj.weight"),
            vec![i, h],
            lin(&mut rng, i, h),
        ));
        out.push((
            format!("{p}mlp.down_proj.weight"),
            vec![h, i],
            lin(&mut rng, h, i),
        ));
    }
    out.push(("model.norm.weight".to_string(), vec![h], vec![1.0; h]));
    if !s.tied {
        out.push((
            "lm_head.weight".to_string(),
            vec![s.vocab, h],
            rng.vec(s.vocab * h, 0.5),
        ));
    }
    out
}

/// Writes a complete checkpoint folder for `spec` at `dir`.
pub fn write_checkpoint(dir: &Path, spec: &SyntheticSpec) -> Result<(), ModelError> {
    if spec.vocab < 259 {
        return Err(ModelError::Config(
            "a synthetic model needs a vocabulary of at least 259".into(),
        ));
    }
    std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    let write = |name: &str, v: &serde_json::Value| {
        let p = dir.join(name);
        std::fs::write(&p, serde_json::to_string_pretty(v).unwrap_or_default())
            .map_err(|e| ModelError::io(&p, e))
    };
    write("config.json", &config_json(spec))?;
    write(
        "tokenizer.json",
        &super::tokenizer::byte_level_tokenizer_json(spec.vocab),
    )?;
    let all: Vec<OwnedTensor> = tensors(spec)
        .into_iter()
        .map(|(name, shape, values)| OwnedTensor {
            name,
            dtype: spec.dtype,
            shape,
            data: encode_f32(&values, spec.dtype),
        })
        .collect();
    if spec.shards <= 1 {
        return write_safetensors(&dir.join("model.safetensors"), all);
    }
    let per = all.len().div_ceil(spec.shards);
    let mut weight_map = serde_json::Map::new();
    let n = all.len().div_ceil(per);
    let mut total = 0usize;
    let mut iter = all.into_iter().peekable();
    let mut k = 0;
    while iter.peek().is_some() {
        k += 1;
        let file = format!("model-{k:05}-of-{n:05}.safetensors");
        let part: Vec<OwnedTensor> = iter.by_ref().take(per).collect();
        for t in &part {
            weight_map.insert(t.name.clone(), json!(file));
            total += t.data.len();
        }
        write_safetensors(&dir.join(&file), part)?;
    }
    write(
        "model.safetensors.index.json",
        &json!({"metadata": {"total_size": total}, "weight_map": weight_map}),
    )
}
