//! Models: configuration, the Burn Llama, checkpoints on disk (safetensors,
//! sharded, GGUF), tokenizers, writing models back out, perplexity (the
//! evaluation engine) and the demo's tiny trained model.

pub mod checkpoint;
pub mod compressed;
pub mod config;
pub mod convert;
pub mod cpu_attention;
pub mod cpu_ops;
pub mod dtype;
pub mod gguf;
pub mod host;
pub mod hub;
pub mod inline_eval;
pub mod kept;
pub mod llama;
pub mod lock;
pub mod matmul;
pub mod owned;
pub mod perplexity;
pub mod prefetch;
pub mod rms_norm;
pub mod save;
pub mod shard;
pub mod synthetic;
pub mod tiny;
pub mod tokenizer;
pub mod tokenizer_size;
pub mod vocab;

use std::path::Path;

use thiserror::Error;

pub use checkpoint::Checkpoint;
pub use config::LlamaConfig;
pub use dtype::ComputeDtype;
pub use llama::{DecoderLayer, Llama, Rope};

/// What can go wrong reading, converting or writing a model.
#[derive(Debug, Error)]
pub enum ModelError {
    #[error("{path}: {message}")]
    Io { path: String, message: String },
    #[error(transparent)]
    Input(#[from] crate::input::InputError),
    #[error("config.json: {0}")]
    Config(String),
    #[error("{path}: not a valid safetensors file ({reason})")]
    Safetensors { path: String, reason: String },
    #[error("{0}")]
    Checkpoint(String),
    #[error("tensor '{name}' is missing from the checkpoint in {dir}")]
    MissingTensor { name: String, dir: String },
    #[error("tensor '{name}' has shape {found:?}, expected {expected:?}")]
    Shape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error(
        "tensor '{name}' has dtype {dtype}, which prunemem cannot load (supported: F32, F16, BF16)"
    )]
    Dtype { name: String, dtype: String },
    #[error("{path}: GGUF: {reason}")]
    Gguf { path: String, reason: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A destination prunemem will not write into (`model::owned`).
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    DeviceOom(#[from] crate::memory::DeviceOom),
}

impl ModelError {
    pub fn io(path: &Path, e: impl std::fmt::Display) -> Self {
        ModelError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        }
    }
}
