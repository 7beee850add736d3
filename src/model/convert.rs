//! `prunemem convert --gguf FILE --out DIR`: a llama.cpp GGUF becomes a
//! Hugging Face folder (`config.json`, `model.safetensors`,
//! `tokenizer.json`, `tokenizer_config.json`).
//!
//! Tensors are renamed to transformers' names, dequantised one at a time
//! while the safetensors file is written, and q/k projections get back the
//! row order transformers expects (llama.cpp's converter interleaves the two
//! rotary halves of every head; this undoes `permute()` in its
//! `convert_hf_to_gguf.py`). The folder is written under a temporary name and
//! renamed when complete.

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, View};
use serde_json::{Value, json};

use super::ModelError;
use super::dtype::encode_f32;
use super::gguf::{GgmlType, GgufFile, GgufTensor};
use super::tokenizer::{tokenizer_config_json, tokenizer_json_from_gguf};

/// What a conversion produced.
#[derive(Debug, Clone)]
pub struct ConvertReport {
    pub out: PathBuf,
    pub tensors: usize,
    pub params: u64,
    pub architecture: String,
    /// Count of source tensors per GGML type name.
    pub source_types: Vec<(String, usize)>,
}

/// How a GGUF tensor becomes a transformers tensor.
struct Plan<'a> {
    src: &'a GgufTensor,
    name: String,
    /// Undo llama.cpp's rotary row interleave with this many heads.
    unpermute_heads: Option<usize>,
}

struct LazyTensor<'a> {
    gguf: &'a GgufFile,
    plan: &'a Plan<'a>,
    shape: Vec<usize>,
    dtype: Dtype,
}

impl View for LazyTensor<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        // Types and bounds were checked before writing began.
        let mut values = self.gguf.dequantize(self.plan.src).unwrap_or_default();
        if let Some(heads) = self.plan.unpermute_heads {
            values = unpermute_rows(
                &values,
                self.shape[0],
                self.shape.get(1).copied().unwrap_or(1),
                heads,
            );
        }
        Cow::Owned(encode_f32(&values, self.dtype))
    }
    fn data_len(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.bitsize() / 8
    }
}

/// Inverse of llama.cpp's q/k permutation: within each head, GGUF row
/// `d * 2 + t` is transformers row `t * half + d`.
pub fn unpermute_rows(w: &[f32], rows: usize, cols: usize, heads: usize) -> Vec<f32> {
    let half = rows / heads / 2;
    let mut out = vec![0f32; w.len()];
    for h in 0..heads {
        for t in 0..2 {
            for d in 0..half {
                let src = h * 2 * half + d * 2 + t;
                let dst = h * 2 * half + t * half + d;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&w[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

fn hf_name(gguf_name: &str) -> Option<String> {
    let fixed = match gguf_name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(n) = fixed {
        return Some(n.to_string());
    }
    let rest = gguf_name.strip_prefix("blk.")?;
    let (layer, tail) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (part, kind) = tail.rsplit_once('.')?;
    let module = match part {
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{module}.{kind}"))
}

fn meta_u64(g: &GgufFile, key: &str) -> Result<u64, ModelError> {
    g.get(key)
        .and_then(|v| v.as_u64())
        .ok_or_else(|| ModelError::Gguf {
            path: g.path.display().to_string(),
            reason: format!("metadata key '{key}' is missing"),
        })
}

/// Builds config.json from GGUF metadata.
fn config_json(g: &GgufFile, arch: &str, tied: bool, dtype: Dtype) -> Result<Value, ModelError> {
    let k = |s: &str| format!("{arch}.{s}");
    let hidden = meta_u64(g, &k("embedding_length"))?;
    let heads = meta_u64(g, &k("attention.head_count"))?;
    let kv_heads = g
        .get(&k("attention.head_count_kv"))
        .and_then(|v| v.as_u64())
        .unwrap_or(heads);
    let vocab = g
        .get("tokenizer.ggml.tokens")
        .and_then(|v| v.as_array())
        .map(|a| a.len() as u64)
        .or_else(|| g.get(&k("vocab_size")).and_then(|v| v.as_u64()))
        .ok_or_else(|| ModelError::Gguf {
            path: g.path.display().to_string(),
            reason: "cannot tell the vocabulary size".into(),
        })?;
    let head_dim = g
        .get(&k("attention.key_length"))
        .or_else(|| g.get(&k("rope.dimension_count")))
        .and_then(|v| v.as_u64())
        .unwrap_or(hidden / heads.max(1));
    let (architecture, model_type) = match arch {
        "qwen2" => ("Qwen2ForCausalLM", "qwen2"),
        _ => ("LlamaForCausalLM", "llama"),
    };
    let mut c = json!({
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": meta_u64(g, &k("feed_forward_length"))?,
        "num_hidden_layers": meta_u64(g, &k("block_count"))?,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "rms_norm_eps": g.get(&k("attention.layer_norm_rms_epsilon")).and_then(|v| v.as_f64()).unwrap_or(1e-5),
        "rope_theta": g.get(&k("rope.freq_base")).and_then(|v| v.as_f64()).unwrap_or(10000.0),
        "max_position_embeddings": g.get(&k("context_length")).and_then(|v| v.as_u64()).unwrap_or(2048),
        "tie_word_embeddings": tied,
        "hidden_act": "silu",
        "attention_bias": false,
        "mlp_bias": false,
        "torch_dtype": match dtype { Dtype::F16 => "float16", Dtype::BF16 => "bfloat16", _ => "float32" },
        "use_cache": true,
    });
    for (key, field) in [
        ("tokenizer.ggml.bos_token_id", "bos_token_id"),
        ("tokenizer.ggml.eos_token_id", "eos_token_id"),
    ] {
        if let Some(id) = g.get(key).and_then(|v| v.as_u64()) {
            c[field] = json!(id);
        }
    }
    Ok(c)
}

/// Converts `gguf_path` into a Hugging Face folder at `out`, storing weights
/// as `dtype` (F32, F16 or BF16).
pub fn convert_gguf(
    gguf_path: &Path,
    out: &Path,
    dtype: Dtype,
    overwrite: bool,
) -> Result<ConvertReport, ModelError> {
    // Refused before any work: a file in the way, a folder prunemem did not
    // write (unless `overwrite`), another run writing the same folder.
    super::owned::check_destination(out, overwrite)?;
    let _lock = super::lock::DestLock::acquire(out)?;
    let g = GgufFile::open(gguf_path)?;
    let path_str = gguf_path.display().to_string();
    let err = |reason: String| ModelError::Gguf {
        path: path_str.clone(),
        reason,
    };
    let arch = g
        .get("general.architecture")
        .and_then(|v| v.as_str())
        .unwrap_or("")
        .to_string();
    if !matches!(arch.as_str(), "llama" | "qwen2") {
        return Err(err(format!(
            "architecture '{arch}' is not supported (supported: llama, qwen2)"
        )));
    }
    let (plans, source_types) = plan_tensors(&g, &arch, &err)?;
    let tied = !plans.iter().any(|p| p.name == "lm_head.weight");
    let config = config_json(&g, &arch, tied, dtype)?;
    let (tokenizer, facts) = tokenizer_json_from_gguf(&g)?;
    let max_len = config["max_position_embeddings"].as_u64().unwrap_or(2048) as usize;

    let tmp = tmp_sibling(out);
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| ModelError::io(&tmp, e))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| ModelError::io(&tmp, e))?;
    // Removed on every exit path until it is renamed into place.
    let tmp_guard = crate::scratch::Guard::new(tmp.clone());
    let write_json = |name: &str, v: &Value| -> Result<(), ModelError> {
        let p = tmp.join(name);
        let text = serde_json::to_string_pretty(v).unwrap_or_default();
        std::fs::write(&p, text).map_err(|e| ModelError::io(&p, e))
    };
    write_json("config.json", &config)?;
    write_json("tokenizer.json", &tokenizer)?;
    write_json(
        "tokenizer_config.json",
        &tokenizer_config_json(&facts, max_len),
    )?;

    let views: Vec<(String, LazyTensor)> = plans
        .iter()
        .map(|p| {
            (
                p.name.clone(),
                LazyTensor {
                    gguf: &g,
                    plan: p,
                    shape: p.src.torch_shape(),
                    dtype,
                },
            )
        })
        .collect();
    let params = plans.iter().map(|p| p.src.elements()).sum();
    let st = tmp.join("model.safetensors");
    let mut meta = HashMap::new();
    meta.insert("format".to_string(), "pt".to_string());
    meta.insert(
        "source".to_string(),
        format!("prunemem convert from {}", file_name(gguf_path)),
    );
    safetensors::serialize_to_file(views, Some(meta), &st)
        .map_err(|e| ModelError::io(&st, format!("{e:?}")))?;

    super::owned::install(&tmp, out, overwrite)?;
    tmp_guard.keep();
    let mut source_types: Vec<(String, usize)> = source_types.into_iter().collect();
    source_types.sort();
    Ok(ConvertReport {
        out: out.to_path_buf(),
        tensors: plans.len(),
        params,
        architecture: arch,
        source_types,
    })
}

/// Each GGUF tensor's Hugging Face name and whether its rows need
/// llama.cpp's rotary interleave undone; with a count of the source
/// quantisation types. Refuses what cannot be imported, naming it.
fn plan_tensors<'g>(
    g: &'g GgufFile,
    arch: &str,
    err: &dyn Fn(String) -> ModelError,
) -> Result<(Vec<Plan<'g>>, HashMap<String, usize>), ModelError> {
    let heads = meta_u64(g, &format!("{arch}.attention.head_count"))? as usize;
    let kv_heads = g
        .get(&format!("{arch}.attention.head_count_kv"))
        .and_then(|v| v.as_u64())
        .map(|v| v as usize)
        .unwrap_or(heads);
    let mut plans = Vec::new();
    let mut source_types: HashMap<String, usize> = HashMap::new();
    for t in &g.tensors {
        if t.name == "rope_freqs.weight" {
            return Err(err(
                "tensor 'rope_freqs.weight' (precomputed Llama-3.1 rope factors) is not supported; convert from the Hugging Face checkpoint instead".into(),
            ));
        }
        let ty = GgmlType::from_id(t.type_id).map_err(|ty| {
            err(format!(
                "tensor '{}' uses quantisation type {ty}, which prunemem cannot import (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1)",
                t.name
            ))
        })?;
        *source_types.entry(ty.name().to_string()).or_default() += 1;
        let name = hf_name(&t.name).ok_or_else(|| err(format!("unknown tensor '{}'", t.name)))?;
        let unpermute_heads = (arch == "llama").then_some(()).and_then(|_| {
            if name.ends_with("self_attn.q_proj.weight") || name.ends_with("self_attn.q_proj.bias")
            {
                Some(heads)
            } else if name.ends_with("self_attn.k_proj.weight")
                || name.ends_with("self_attn.k_proj.bias")
            {
                Some(kv_heads)
            } else {
                None
            }
        });
        plans.push(Plan {
            src: t,
            name,
            unpermute_heads,
        });
    }
    Ok((plans, source_types))
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// `DIR.partial` beside `DIR`: written fully, then renamed into place.
pub fn tmp_sibling(out: &Path) -> PathBuf {
    let mut name = out
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(".partial");
    out.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_transformers() {
        assert_eq!(
            hf_name("blk.3.attn_q.weight").unwrap(),
            "model.layers.3.self_attn.q_proj.weight"
        );
        assert_eq!(
            hf_name("blk.12.ffn_down.weight").unwrap(),
            "model.layers.12.mlp.down_proj.weight"
        );
        assert_eq!(hf_name("output_norm.weight").unwrap(), "model.norm.weight");
        assert_eq!(
            hf_name("blk.0.attn_q.bias").unwrap(),
            "model.layers.0.self_attn.q_proj.bias"
        );
        assert!(hf_name("blk.0.ssm_a").is_none());
    }

    /// llama.cpp's permute followed by ours is the identity.
    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        let (heads, half, cols) = (3, 4, 5);
        let rows = heads * 2 * half;
        let hf: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
        // permute: reshape(heads, 2, half, cols).swapaxes(1, 2)
        let mut gguf = vec![0f32; hf.len()];
        for h in 0..heads {
            for t in 0..2 {
                for d in 0..half {
                    let src = h * 2 * half + t * half + d;
                    let dst = h * 2 * half + d * 2 + t;
                    gguf[dst * cols..(dst + 1) * cols]
                        .copy_from_slice(&hf[src * cols..(src + 1) * cols]);
                }
            }
        }
        assert_ne!(gguf, hf);
        assert_eq!(unpermute_rows(&gguf, rows, cols, heads), hf);
    }
}
