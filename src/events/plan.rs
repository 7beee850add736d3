//! What a run set out to do and how it ended, as carried by the first and the
//! last event of every log.
//!
//! The plan is the resolved configuration (after defaults and caps), so a
//! log is self-describing: the estimator can re-estimate the same run, and a
//! report can say how two runs differ, from `events.jsonl` alone.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The model a run works on, as numbers the estimator can use.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    /// Where it came from: a folder, a file or a preset name.
    pub source: String,
    pub params: u64,
    pub layers: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub max_positions: usize,
    pub tied_embeddings: bool,
    /// Data type of the weights as stored (`f32`, `bf16`...).
    pub stored_dtype: String,
}

/// The resolved configuration of a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunPlan {
    /// `prunemem 0.1.0`, or the external program for `watch`.
    pub tool: String,
    /// Subcommand: `prune`, `eval`, `snapshot`, `watch`...
    pub command: String,
    /// The command line as typed.
    pub argv: Vec<String>,
    pub model: Option<ModelInfo>,
    pub method: Option<String>,
    /// Everything else that shapes memory: sparsity, nsamples, seqlen, dtype,
    /// batch size, streaming or resident...
    pub settings: BTreeMap<String, Value>,
    /// Device the run computes on (`cpu`, `cuda:0`).
    pub device: String,
    /// `prunemem` for this engine, `reference` for a watched Python run.
    pub engine: String,
    /// How memory was measured: stage snapshots, plus a sampler at `sampler_hz`
    /// (continuous peaks) when it is on.
    pub sampler_hz: Option<f64>,
    pub started_unix_ms: u64,
    pub host: HostInfo,
}

/// The machine a run ran on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HostInfo {
    pub cores: Option<usize>,
    pub memory_total: Option<u64>,
    pub os: String,
    /// Heap the CPU's matrix products keep once they have run: a packing
    /// block per pool thread, sized from this CPU's L2 cache (the jobs fill
    /// it; absent from older logs and from watched scripts' plans).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matmul_workspace: Option<u64>,
}

impl HostInfo {
    pub fn current() -> Self {
        let reading = crate::memory::process::ProcessProbe::for_pid(None).read();
        Self {
            cores: std::thread::available_parallelism().ok().map(|n| n.get()),
            memory_total: reading.system_total,
            os: format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH),
            matmul_workspace: None,
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Ok,
    Failed(String),
    Interrupted,
    /// Out of device memory (`--device-memory` or a failed device
    /// allocation): where, and how much was in use.
    Oom(String),
}

impl RunStatus {
    /// The status's name as the log spells it (`ok`, `failed`,
    /// `interrupted`, `oom`), without its message.
    pub fn name(&self) -> &'static str {
        match self {
            RunStatus::Ok => "ok",
            RunStatus::Failed(_) => "failed",
            RunStatus::Interrupted => "interrupted",
            RunStatus::Oom(_) => "oom",
        }
    }
}

/// The closing account of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    pub status: RunStatus,
    pub wall_s: f64,
    pub rss_peak: Option<u64>,
    pub heap_peak: Option<u64>,
    pub device_peak: Option<u64>,
    /// Results worth keeping: perplexity, sparsity, tokens/s...
    pub results: BTreeMap<String, Value>,
}
