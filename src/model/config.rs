//! `config.json` for the Llama family, read the way transformers reads it.
//!
//! [`HfConfig`] mirrors the file (every key optional, unknown keys ignored);
//! [`LlamaConfig::from_hf`] resolves it into a complete configuration with
//! transformers' defaults, or says which key is missing or unsupported. Both
//! the transformers v4 spelling (`rope_theta`, `rope_scaling`,
//! `torch_dtype`) and the v5 one (`rope_parameters`, `dtype`) are accepted.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::ModelError;
use crate::events::ModelInfo;

/// The file as written, keys optional.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct HfConfig {
    pub architectures: Option<Vec<String>>,
    pub model_type: Option<String>,
    pub hidden_size: Option<usize>,
    pub intermediate_size: Option<usize>,
    pub num_hidden_layers: Option<usize>,
    pub num_attention_heads: Option<usize>,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub vocab_size: Option<usize>,
    pub rms_norm_eps: Option<f64>,
    pub rope_theta: Option<f64>,
    pub rope_scaling: Option<Value>,
    pub rope_parameters: Option<Value>,
    pub attention_bias: Option<bool>,
    pub mlp_bias: Option<bool>,
    pub tie_word_embeddings: Option<bool>,
    pub max_position_embeddings: Option<usize>,
    pub sliding_window: Option<Value>,
    pub use_sliding_window: Option<bool>,
    pub torch_dtype: Option<String>,
    pub dtype: Option<String>,
    pub bos_token_id: Option<Value>,
    pub eos_token_id: Option<Value>,
    pub hidden_act: Option<String>,
}

/// Rotary embedding frequency scaling.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum RopeScaling {
    /// Llama 3.1+: long wavelengths divided by `factor`, short ones kept,
    /// smooth interpolation between.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
    /// Positions divided by `factor`.
    Linear { factor: f64 },
}

/// Which Hugging Face family a checkpoint belongs to; decides defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Family {
    Llama,
    Mistral,
    Qwen2,
}

/// A complete, resolved model configuration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LlamaConfig {
    pub family: Family,
    pub architecture: String,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<RopeScaling>,
    /// Bias on q, k and v projections.
    pub qkv_bias: bool,
    /// Bias on the attention output projection.
    pub o_bias: bool,
    pub mlp_bias: bool,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: usize,
    /// Mistral's local attention window, when it applies.
    pub sliding_window: Option<usize>,
    /// Data type named by the config (`float32`, `bfloat16`...), if any.
    pub dtype: Option<String>,
}

const SUPPORTED: &str = "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM";

impl LlamaConfig {
    /// Reads and resolves `config.json`.
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let text = crate::input::read_string(path, crate::input::JSON_LIMIT, "a config.json")?;
        Self::from_json(&text).map_err(|e| match e {
            ModelError::Config(msg) => ModelError::Config(format!("{}: {msg}", path.display())),
            other => other,
        })
    }

    /// Parses and resolves config.json text.
    pub fn from_json(text: &str) -> Result<Self, ModelError> {
        let hf: HfConfig = serde_json::from_str(text)
            .map_err(|e| ModelError::Config(format!("not a valid config.json: {e}")))?;
        Self::from_hf(&hf)
    }

    pub fn from_hf(hf: &HfConfig) -> Result<Self, ModelError> {
        let architecture = hf
            .architectures
            .as_ref()
            .and_then(|a| a.first().cloned())
            .or_else(|| {
                hf.model_type.as_deref().map(|t| match t {
                    "mistral" => "MistralForCausalLM".to_string(),
                    "qwen2" => "Qwen2ForCausalLM".to_string(),
                    _ => "LlamaForCausalLM".to_string(),
                })
            })
            .ok_or_else(|| missing("architectures"))?;
        let family = match architecture.as_str() {
            "LlamaForCausalLM" => Family::Llama,
            "MistralForCausalLM" => Family::Mistral,
            "Qwen2ForCausalLM" => Family::Qwen2,
            other => {
                return Err(ModelError::Config(format!(
                    "unsupported architecture '{other}' in field 'architectures' (supported: {SUPPORTED})"
                )));
            }
        };
        if let Some(act) = &hf.hidden_act
            && act != "silu"
        {
            return Err(ModelError::Config(format!(
                "unsupported activation '{act}' in field 'hidden_act' (supported: silu)"
            )));
        }
        let hidden_size = hf.hidden_size.ok_or_else(|| missing("hidden_size"))?;
        let num_heads = hf
            .num_attention_heads
            .ok_or_else(|| missing("num_attention_heads"))?;
        let num_kv_heads = hf.num_key_value_heads.unwrap_or(num_heads);
        let head_dim = hf.head_dim.unwrap_or(hidden_size / num_heads.max(1));
        let (rope_theta, rope_scaling) = resolve_rope(hf)?;
        let attention_bias = hf.attention_bias.unwrap_or(false);
        let (qkv_bias, o_bias) = match family {
            Family::Qwen2 => (true, false),
            _ => (attention_bias, attention_bias),
        };
        let sliding_window = match family {
            Family::Mistral => hf.sliding_window.as_ref().and_then(Value::as_u64),
            Family::Qwen2 if hf.use_sliding_window == Some(true) => {
                hf.sliding_window.as_ref().and_then(Value::as_u64)
            }
            _ => None,
        }
        .map(|w| w as usize);
        let config = Self {
            family,
            architecture,
            hidden_size,
            intermediate_size: hf
                .intermediate_size
                .ok_or_else(|| missing("intermediate_size"))?,
            num_layers: hf
                .num_hidden_layers
                .ok_or_else(|| missing("num_hidden_layers"))?,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size: hf.vocab_size.ok_or_else(|| missing("vocab_size"))?,
            rms_norm_eps: hf.rms_norm_eps.unwrap_or(1e-6),
            rope_theta,
            rope_scaling,
            qkv_bias,
            o_bias,
            mlp_bias: hf.mlp_bias.unwrap_or(false),
            tie_word_embeddings: hf.tie_word_embeddings.unwrap_or(false),
            max_position_embeddings: hf.max_position_embeddings.unwrap_or(2048),
            sliding_window,
            dtype: hf.dtype.clone().or_else(|| hf.torch_dtype.clone()),
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ModelError> {
        let bad = |m: String| Err(ModelError::Config(m));
        if self.hidden_size == 0 || self.num_layers == 0 || self.vocab_size == 0 {
            return bad("hidden_size, num_hidden_layers and vocab_size must be positive".into());
        }
        // Beyond any model that exists by orders of magnitude: a typo or a
        // hostile file, refused before anything is sized from it.
        let limits = [
            ("num_hidden_layers", self.num_layers, 4096),
            ("hidden_size", self.hidden_size, 1 << 17),
            ("intermediate_size", self.intermediate_size, 1 << 20),
            ("num_attention_heads", self.num_heads, 4096),
            ("head_dim", self.head_dim, 4096),
            ("vocab_size", self.vocab_size, 1 << 24),
            (
                "max_position_embeddings",
                self.max_position_embeddings,
                1 << 24,
            ),
        ];
        for (name, value, max) in limits {
            if value > max {
                return bad(format!(
                    "{name} {value} is beyond any real model (at most {max})"
                ));
            }
        }
        if self.intermediate_size == 0 || self.max_position_embeddings == 0 {
            return bad("intermediate_size and max_position_embeddings must be positive".into());
        }
        if !(self.rms_norm_eps > 0.0 && self.rms_norm_eps < 1.0) {
            return bad(format!(
                "rms_norm_eps must be in (0, 1), got {}",
                self.rms_norm_eps
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return bad(format!(
                "rope_theta must be a positive number, got {}",
                self.rope_theta
            ));
        }
        if self.num_heads == 0
            || self.num_kv_heads == 0
            || !self.num_heads.is_multiple_of(self.num_kv_heads)
        {
            return bad(format!(
                "num_attention_heads ({}) must be a positive multiple of num_key_value_heads ({})",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad(format!(
                "head_dim ({}) must be even and positive",
                self.head_dim
            ));
        }
        Ok(())
    }

    /// Parameters of the vocabulary table: the embedding (an untied head
    /// has as many).
    pub fn vocab_table_params(&self) -> u64 {
        self.vocab_size as u64 * self.hidden_size as u64
    }

    /// Parameters of the whole model (embeddings counted once when tied).
    pub fn param_count(&self) -> u64 {
        let h = self.hidden_size as u64;
        let embed = self.vocab_table_params();
        let lm_head = if self.tie_word_embeddings { 0 } else { embed };
        embed + lm_head + self.num_layers as u64 * self.layer_param_count() + h
    }

    /// Parameters of one decoder layer.
    pub fn layer_param_count(&self) -> u64 {
        let h = self.hidden_size as u64;
        let q = (self.num_heads * self.head_dim) as u64;
        let kv = (self.num_kv_heads * self.head_dim) as u64;
        let i = self.intermediate_size as u64;
        let mut n = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h;
        if self.qkv_bias {
            n += q + 2 * kv;
        }
        if self.o_bias {
            n += h;
        }
        if self.mlp_bias {
            n += 2 * i + h;
        }
        n
    }

    /// The numbers the estimator and the event log need.
    pub fn model_info(&self, source: &str, stored_dtype: &str) -> ModelInfo {
        ModelInfo {
            source: source.to_string(),
            params: self.param_count(),
            layers: self.num_layers,
            hidden: self.hidden_size,
            intermediate: self.intermediate_size,
            heads: self.num_heads,
            kv_heads: self.num_kv_heads,
            head_dim: self.head_dim,
            vocab: self.vocab_size,
            max_positions: self.max_position_embeddings,
            tied_embeddings: self.tie_word_embeddings,
            stored_dtype: stored_dtype.to_string(),
        }
    }
}

fn missing(key: &str) -> ModelError {
    ModelError::Config(format!("missing required key '{key}'"))
}

fn get_f64(v: &Value, key: &str) -> Option<f64> {
    v.get(key).and_then(Value::as_f64)
}

/// Rope theta and scaling from either spelling.
fn resolve_rope(hf: &HfConfig) -> Result<(f64, Option<RopeScaling>), ModelError> {
    // v5 keeps everything in rope_parameters; v4 splits it.
    let params = hf.rope_parameters.as_ref().or(hf.rope_scaling.as_ref());
    let theta = hf
        .rope_parameters
        .as_ref()
        .and_then(|p| get_f64(p, "rope_theta"))
        .or(hf.rope_theta)
        .unwrap_or(10_000.0);
    let Some(p) = params.filter(|p| !p.is_null()) else {
        return Ok((theta, None));
    };
    let kind = p
        .get("rope_type")
        .or_else(|| p.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let need = |key: &str| {
        get_f64(p, key)
            .ok_or_else(|| ModelError::Config(format!("rope scaling '{kind}' is missing '{key}'")))
    };
    let scaling = match kind {
        "default" => None,
        "linear" => Some(RopeScaling::Linear {
            factor: need("factor")?,
        }),
        "llama3" => Some(RopeScaling::Llama3 {
            factor: need("factor")?,
            low_freq_factor: need("low_freq_factor")?,
            high_freq_factor: need("high_freq_factor")?,
            original_max_position_embeddings: need("original_max_position_embeddings")? as usize,
        }),
        other => {
            return Err(ModelError::Config(format!(
                "unsupported rope_type '{other}' (supported: default, linear, llama3)"
            )));
        }
    };
    Ok((theta, scaling))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOL: &str = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":576,
      "intermediate_size":1536,"num_hidden_layers":30,"num_attention_heads":9,
      "num_key_value_heads":3,"vocab_size":49152,"rms_norm_eps":1e-5,"rope_theta":100000,
      "tie_word_embeddings":true,"max_position_embeddings":8192,"torch_dtype":"bfloat16"}"#;

    #[test]
    fn smollm2_resolves_with_defaults() {
        let c = LlamaConfig::from_json(SMOL).unwrap();
        assert_eq!(c.head_dim, 64);
        assert_eq!(c.num_kv_heads, 3);
        assert_eq!(c.rope_theta, 100_000.0);
        assert!(c.tie_word_embeddings);
        assert_eq!(c.dtype.as_deref(), Some("bfloat16"));
        assert_eq!(c.param_count(), 134_515_008);
    }

    #[test]
    fn kv_heads_default_to_heads() {
        let c = LlamaConfig::from_json(&SMOL.replace(r#""num_key_value_heads":3,"#, "")).unwrap();
        assert_eq!(c.num_kv_heads, 9);
    }

    #[test]
    fn llama3_scaling_in_both_spellings() {
        let v4 = r#"{"model_type":"llama","hidden_size":64,"intermediate_size":128,"num_hidden_layers":1,
          "num_attention_heads":4,"vocab_size":10,"rope_theta":500000.0,
          "rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,
          "high_freq_factor":4.0,"original_max_position_embeddings":8192}}"#;
        let v5 = r#"{"model_type":"llama","hidden_size":64,"intermediate_size":128,"num_hidden_layers":1,
          "num_attention_heads":4,"vocab_size":10,
          "rope_parameters":{"rope_type":"llama3","rope_theta":500000.0,"factor":8.0,
          "low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192}}"#;
        let a = LlamaConfig::from_json(v4).unwrap();
        let b = LlamaConfig::from_json(v5).unwrap();
        assert_eq!(a.rope_theta, 500_000.0);
        assert_eq!(a.rope_scaling, b.rope_scaling);
        assert!(matches!(a.rope_scaling, Some(RopeScaling::Llama3 { .. })));
    }

    #[test]
    fn errors_name_the_field() {
        let e = LlamaConfig::from_json(&SMOL.replace(r#""hidden_size":576,"#, "")).unwrap_err();
        assert!(e.to_string().contains("'hidden_size'"), "{e}");
        let e = LlamaConfig::from_json(&SMOL.replace("LlamaForCausalLM", "GPTNeoXForCausalLM"))
            .unwrap_err();
        assert!(e.to_string().contains("architectures"), "{e}");
        assert!(e.to_string().contains("GPTNeoXForCausalLM"), "{e}");
        let e = LlamaConfig::from_json(&SMOL.replace(
            r#""rope_theta":100000"#,
            r#""rope_theta":1,"rope_scaling":{"rope_type":"yarn","factor":2}"#,
        ))
        .unwrap_err();
        assert!(e.to_string().contains("yarn"), "{e}");
    }

    #[test]
    fn qwen2_has_qkv_bias_only() {
        let c =
            LlamaConfig::from_json(&SMOL.replace("LlamaForCausalLM", "Qwen2ForCausalLM")).unwrap();
        assert!(c.qkv_bias && !c.o_bias);
    }
}
