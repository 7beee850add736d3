//! Memory prediction: how much a pruning (or inference, or training) run
//! needs, phase by phase and component by component, before anyone runs it.
//!
//! An [`Arch`] (from a preset, a config.json, or a parameter count) and a
//! [`Workload`] (method, sizes, dtype, device, engine) go in; an [`Estimate`]
//! comes out: phases with byte-level components, the peak and where it
//! happens. prunemem's own engine follows formulas calibrated on measured
//! runs (`prunemem`); the reference Python scripts follow their code's
//! allocations (`reference`); inference and training use the standard
//! accounting (`training`).

pub mod against;
pub mod bounds;
pub mod catalog;
mod component;
pub mod device_pool;
pub mod fit;
pub mod forecast;
mod inline;
pub mod presets;
pub mod projection;
pub mod prunemem;
pub mod prunemem_device;
pub mod prunemem_train;
pub mod ranks;
pub mod reference;
pub mod saved;
mod tokenizer;
pub mod training;

pub use component::{Component, category_of};

use crate::memory::tag::Category;
use serde::Serialize;
use thiserror::Error;

use crate::events::ModelInfo;
use crate::model::{ComputeDtype, LlamaConfig};

#[derive(Debug, Error)]
pub enum EstimateError {
    #[error("{0}")]
    Invalid(String),
    /// A workload whose bytes pass [`bounds::MAX_BYTES`]: refused before any sum
    /// could wrap (`--fit` reads it as "does not fit").
    #[error("{0}")]
    TooLarge(String),
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    #[error(transparent)]
    Units(#[from] crate::units::UnitError),
}

/// The shape of a model, as the estimator needs it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Arch {
    pub name: String,
    pub params: u64,
    pub layers: u64,
    pub hidden: u64,
    pub intermediate: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub vocab: u64,
    pub tied: bool,
    pub max_positions: u64,
}

impl Arch {
    pub fn from_config(name: &str, c: &LlamaConfig) -> Self {
        Self {
            name: name.to_string(),
            params: c.param_count(),
            layers: c.num_layers as u64,
            hidden: c.hidden_size as u64,
            intermediate: c.intermediate_size as u64,
            heads: c.num_heads as u64,
            kv_heads: c.num_kv_heads as u64,
            head_dim: c.head_dim as u64,
            vocab: c.vocab_size as u64,
            tied: c.tie_word_embeddings,
            max_positions: c.max_position_embeddings as u64,
        }
    }

    pub fn from_model_info(m: &ModelInfo) -> Self {
        Self {
            name: m.source.clone(),
            params: m.params,
            layers: m.layers as u64,
            hidden: m.hidden as u64,
            intermediate: m.intermediate as u64,
            heads: m.heads as u64,
            kv_heads: m.kv_heads as u64,
            head_dim: m.head_dim as u64,
            vocab: m.vocab as u64,
            tied: m.tied_embeddings,
            max_positions: m.max_positions as u64,
        }
    }

    /// Query/output width (heads × head_dim).
    pub fn q_dim(&self) -> u64 {
        self.heads * self.head_dim
    }
    pub fn kv_dim(&self) -> u64 {
        self.kv_heads * self.head_dim
    }
    /// Parameters of the seven linears of one decoder layer.
    pub fn layer_linear_params(&self) -> u64 {
        let h = self.hidden;
        2 * h * self.q_dim() + 2 * h * self.kv_dim() + 3 * h * self.intermediate
    }
    /// Parameters of one decoder layer (linears and norms).
    pub fn layer_params(&self) -> u64 {
        self.layer_linear_params() + 2 * self.hidden
    }
    pub fn embedding_params(&self) -> u64 {
        self.vocab * self.hidden
    }
    /// The largest linear (elements), which bounds per-linear transients.
    pub fn largest_linear(&self) -> u64 {
        let h = self.hidden;
        (h * self.intermediate).max(h * self.q_dim())
    }
}

/// What the run does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Task {
    Magnitude,
    Wanda,
    SparseGpt,
    GradProbe,
    /// RIA: Wanda's statistics, its own metric.
    Ria,
    Inference,
    Train,
}

impl std::str::FromStr for Task {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "magnitude" => Task::Magnitude,
            "wanda" => Task::Wanda,
            "ria" => Task::Ria,
            "sparsegpt" => Task::SparseGpt,
            "gradprobe" => Task::GradProbe,
            "inference" => Task::Inference,
            "train" | "training" => Task::Train,
            other => {
                return Err(format!(
                    "unknown method '{other}' (expected magnitude, wanda, sparsegpt, gradprobe, ria, inference or train)"
                ));
            }
        })
    }
}

/// Whose code runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    /// prunemem's layer-streamed engine.
    Prunemem,
    /// The Python reference scripts (Wanda's lib/prune.py, SparseGPT,
    /// GradProbe's pruner.py): whole model resident.
    Reference,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    Cpu,
    Cuda,
    /// prunemem's engine on Burn's wgpu backend (Vulkan, Metal, DX12).
    Wgpu,
}

impl Device {
    /// A GPU: memory is cubecl's pool on the device, not the host's.
    pub fn is_gpu(self) -> bool {
        self != Device::Cpu
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Optimizer {
    AdamW,
    Sgd,
}

/// The run to estimate.
#[derive(Debug, Clone, Serialize)]
pub struct Workload {
    pub task: Task,
    pub engine: Engine,
    pub device: Device,
    pub dtype: ComputeDtype,
    /// Bytes per element of the weights as stored (read into `dtype`).
    pub stored_bytes: u64,
    pub nsamples: u64,
    pub seqlen: u64,
    pub batch_size: u64,
    pub grad_accum: u64,
    pub optimizer: Optimizer,
    /// prunemem: keep the whole model loaded (`--resident`).
    pub resident: bool,
    /// Evaluation windows after pruning (0: no evaluation).
    pub eval_windows: u64,
    /// The dense model evaluated first, on the same windows (`--eval-dense`).
    pub eval_dense: bool,
    /// GradProbe: fraction tentatively pruned; batches; embeddings included.
    pub sparsity: f64,
    /// Pruning with an N:M pattern (`--sparsity-type 2:4`).
    pub nm: bool,
    pub num_batches: u64,
    pub include_embeddings: bool,
    /// Bytes of the largest text tokenised (calibration or evaluation).
    pub text_bytes: u64,
    /// The model's tokenizer, counted from its `tokenizer.json` (`None`:
    /// unknown, taken as a BPE of the architecture's vocabulary).
    pub tokenizer: Option<crate::model::tokenizer_size::TokenizerSize>,
    /// Training: recompute each layer's activations in the backward.
    pub checkpointing: bool,
    /// Training: parameters that get gradients (`None`: all).
    pub trainable_params: Option<u64>,
    /// Training: the lowest trained layer (frozen ones save no activations).
    pub first_trainable_layer: u64,
    /// Pruning: OWL's outlier pass first (`--owl`).
    pub owl: bool,
    /// Pruning: DSnoT's refinement (`--dsnot`).
    pub dsnot: bool,
    /// DSnoT: the linears left with their first mask (`--dsnot-skip`).
    pub dsnot_skip: crate::prune::dsnot::DsnotSkip,
    /// On a device: calibration activations on the host (`--offload-activations`).
    pub offload_activations: bool,
    /// Pruning on a device: the pruned layers wait on the device for the
    /// evaluation (`pruned_layers_kept: device`) instead of streaming.
    pub kept_on_device: bool,
    /// Pruning: the evaluation runs each pruned layer as it is pruned
    /// (`pruned_layers_kept: inline`), its hidden states held through the
    /// prune, and only the head is left after it.
    pub eval_inline: bool,
    /// GradProbe on a device: its decoder layers (and an unchanged head's
    /// table) kept on the device between the passes (`gradprobe_layers:
    /// device`) instead of streamed four times a step.
    pub probe_layers_on_device: bool,
    /// On a device: attention in one fused (flash) kernel, its scores never
    /// stored (`exec::attention`; f16 only); else Burn's separate kernels.
    pub fused_attention: bool,
    /// On a device: the MLP's `silu(gate) · up` in one kernel
    /// (`exec::kernels`), with no f32 copy of the gate.
    pub swiglu_kernel: bool,
    /// The SwiGLU writes over the gate (two `T × i` pages at the MLP, not 3).
    pub swiglu_in_place: bool,
    /// On a device: Wanda's column norms summed straight from the
    /// activations (`Compute::column_square_sums`), with no f32 copy of the
    /// input and no squares stored.
    pub norms_kernel: bool,
    /// On a device: the RMS norm in one kernel (`Compute::rms_norm`).
    pub rms_norm_kernel: bool,
    /// On a device: DSnoT's cycles in one launch (`Compute::dsnot_swaps`;
    /// plan: `dsnot: kernel`), not stepped with Burn's ops.
    pub dsnot_kernel: bool,
    /// Streamed, only the windows' rows are embedded, on the host, and the
    /// head's table arrives after the layers (plan: `embedding: rows`).
    pub embedding_rows: bool,
    /// SparseGPT's `Hinv` factored on the device (plan: `factor: device`).
    pub factor_on_device: bool,
    /// DSnoT from SparseGPT's saliency on the device: `diag(Hinv)` there,
    /// the loop where the weights are (plan: `dsnot_saliency: device`).
    pub saliency_on_device: bool,
    /// RIA, N:M: the inputs permuted before grouping (`--reallocation`),
    /// with the assignment rounds (`--lsa`); Wanda's α-variant
    /// (`--use-variant`). On a device all where the metric is.
    pub reallocation: bool,
    pub lsa: bool,
    pub use_variant: bool,
    /// N:M's group size `m` (4 unless told).
    pub group: u64,
    /// The CPU products' packing blocks (`model::matmul::workspace_bytes`).
    pub matmul_workspace: u64,
    /// The saved (pruning) or loaded (inference) checkpoint's sparse
    /// layout; `sparsity` is its decoder linears' sparsity.
    pub compressed: Option<crate::model::compressed::SparseFormat>,
    /// GradProbe `--iterative`: the probed linears' sparsity the earlier
    /// steps reached, whose positions (u32) the step estimated holds
    /// throughout (0 for one step; `estimate --against` reads it from the
    /// run's `iterations`).
    pub earlier_sparsity: f64,
    /// GradProbe `--iterative`: each step evaluates its model inside its
    /// step 6, the head's evaluation included (no separate eval phase).
    pub iterative: bool,
}

impl Workload {
    /// A pruning workload with prunemem's defaults.
    pub fn new(task: Task) -> Self {
        Self {
            task,
            engine: Engine::Prunemem,
            device: Device::Cpu,
            dtype: ComputeDtype::F32,
            stored_bytes: 4,
            nsamples: 128,
            seqlen: 2048,
            batch_size: 8,
            grad_accum: 1,
            optimizer: Optimizer::AdamW,
            resident: false,
            eval_windows: 0,
            eval_dense: false,
            sparsity: 0.5,
            nm: false,
            num_batches: 1,
            include_embeddings: false,
            text_bytes: 0,
            tokenizer: None,
            checkpointing: false,
            trainable_params: None,
            first_trainable_layer: 0,
            owl: false,
            dsnot: false,
            dsnot_skip: crate::prune::dsnot::DsnotSkip::Mlp,
            offload_activations: false,
            kept_on_device: false,
            eval_inline: false,
            probe_layers_on_device: false,
            fused_attention: false,
            swiglu_kernel: false,
            swiglu_in_place: false,
            norms_kernel: false,
            rms_norm_kernel: false,
            dsnot_kernel: false,
            embedding_rows: true,
            factor_on_device: true,
            saliency_on_device: true,
            reallocation: false,
            lsa: false,
            use_variant: false,
            group: 4,
            matmul_workspace: crate::model::matmul::workspace_bytes(),
            compressed: None,
            earlier_sparsity: 0.0,
            iterative: false,
        }
    }
}

/// The memory held during one phase of a run, at its own peak.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Phase {
    pub name: String,
    /// The stage snapshots (`layer_NN_stats`...) this phase spans, for
    /// comparisons with measured runs.
    pub stages: Vec<String>,
    pub components: Vec<Component>,
    /// What a device pool reserves in this phase, where it keeps more than
    /// the bytes in use (`device_pool`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserved: Option<u64>,
}

impl Phase {
    pub fn new(name: &str, stages: &[&str]) -> Self {
        Self {
            name: name.to_string(),
            stages: stages.iter().map(|s| s.to_string()).collect(),
            components: Vec::new(),
            reserved: None,
        }
    }

    /// The pool's reserved bytes in this phase.
    pub fn reserving(mut self, bytes: u64) -> Self {
        self.reserved = Some(bytes);
        self
    }
    pub fn add(mut self, name: &str, bytes: u64) -> Self {
        if bytes > 0 {
            self.components.push(Component {
                name: name.to_string(),
                category: category_of(name),
                bytes,
            });
        }
        self
    }
    pub fn total(&self) -> u64 {
        self.components.iter().map(|c| c.bytes).sum()
    }

    /// Bytes of the components with this name.
    pub fn named(&self, name: &str) -> u64 {
        self.components
            .iter()
            .filter(|c| c.name == name)
            .map(|c| c.bytes)
            .sum()
    }

    /// The bytes inside the allocator: the total less the process or CUDA
    /// context and the allocator's reserve (`reference::outside_allocator`).
    pub fn allocated(&self) -> u64 {
        self.components
            .iter()
            .filter(|c| !reference::outside_allocator(&c.name))
            .map(|c| c.bytes)
            .sum()
    }

    /// Bytes per category, in the categories' display order.
    pub fn by_category(&self) -> Vec<(Category, u64)> {
        let mut out: Vec<(Category, u64)> = Vec::new();
        for c in &self.components {
            match out.iter_mut().find(|(k, _)| *k == c.category) {
                Some((_, b)) => *b += c.bytes,
                None => out.push((c.category, c.bytes)),
            }
        }
        out.sort_by_key(|(k, _)| crate::memory::tag::order(k.name()));
        out
    }
}

/// A full estimate.
#[derive(Debug, Clone, Serialize)]
pub struct Estimate {
    pub arch: Arch,
    pub workload: Workload,
    pub phases: Vec<Phase>,
    /// Pruning, or inference of a compressed checkpoint: the weights on disk.
    pub saved_weights: Option<saved::SavedWeights>,
    /// What the estimate assumed that the user should know.
    pub notes: Vec<String>,
    /// prunemem on a device: what cubecl's pool reserves at its highest and
    /// what nvidia-smi would show (`device_pool::pool`).
    pub device_pool: Option<device_pool::DevicePool>,
}

impl Estimate {
    /// Index of the phase with the highest total.
    pub fn peak_phase(&self) -> usize {
        self.phases
            .iter()
            .enumerate()
            .max_by_key(|(_, p)| p.total())
            .map(|(i, _)| i)
            .unwrap_or(0)
    }
    pub fn peak(&self) -> u64 {
        self.phases.get(self.peak_phase()).map_or(0, Phase::total)
    }

    /// The highest phase's bytes inside the allocator: on CUDA with the
    /// reference engine, what `torch.cuda.max_memory_allocated` would say.
    pub fn peak_allocated(&self) -> u64 {
        self.phases.iter().map(Phase::allocated).max().unwrap_or(0)
    }

    /// What the run needs of a GPU's usable memory: the peak less any CUDA
    /// context in it, since the GPU table subtracts each card's own; on
    /// prunemem's device pool, what the pool reserves if that is more (the
    /// driver grants reserved bytes, not bytes in use).
    pub fn device_need(&self) -> u64 {
        let Some(p) = self.phases.get(self.peak_phase()) else {
            return 0;
        };
        let reserved = self.device_pool.as_ref().map_or(0, |pool| pool.reserved);
        (p.total() - p.named(reference::CUDA_CONTEXT_NAME)).max(reserved)
    }
}

/// The calibration phase, empty: from the model loaded (or OWL's ratios)
/// to the first layer's pass.
pub(crate) fn calibration_phase(w: &Workload) -> Phase {
    let first = if w.owl {
        crate::events::stages::OWL_RATIOS
    } else {
        crate::events::stages::MODEL_LOADED
    };
    Phase::new(
        "calibration",
        &[first, crate::events::stages::BEFORE_PRUNING],
    )
}

/// Validates a workload against an architecture.
pub fn validate(arch: &Arch, w: &Workload) -> Result<(), EstimateError> {
    let bad = |m: String| Err(EstimateError::Invalid(m));
    bounds::check(arch, w)?;
    if w.seqlen == 0 {
        return bad("--seqlen must be at least 1".into());
    }
    if w.batch_size == 0 || w.grad_accum == 0 {
        return bad("--batch-size and --grad-accum must be at least 1".into());
    }
    if matches!(
        w.task,
        Task::Wanda | Task::Ria | Task::SparseGpt | Task::GradProbe
    ) && w.nsamples == 0
    {
        return bad("--nsamples must be at least 1".into());
    }
    if arch.params == 0 || arch.layers == 0 || arch.hidden == 0 {
        return bad("the architecture has no parameters".into());
    }
    if w.device == Device::Wgpu && (w.engine == Engine::Reference || w.task == Task::Train) {
        return bad(
            "--device wgpu is prunemem's engine only, training excepted: the reference scripts and training are estimated on cuda or cpu"
                .into(),
        );
    }
    Ok(())
}

/// Estimates `w` on `arch`.
pub fn estimate(arch: &Arch, w: &Workload) -> Result<Estimate, EstimateError> {
    validate(arch, w)?;
    let mut notes = Vec::new();
    let phases = match (w.task, w.engine) {
        (Task::Train, Engine::Prunemem) if w.device == Device::Cpu => {
            prunemem_train::phases(arch, w, &mut notes)
        }
        (Task::Train, Engine::Prunemem) => {
            notes.push(
                "prunemem trains on the CPU only for now: this is PyTorch's accounting of a CUDA training step".into(),
            );
            training::phases(arch, w)
        }
        (Task::Inference, Engine::Prunemem) if w.device == Device::Cpu => {
            prunemem::inference_phases(arch, w, &mut notes)
        }
        (Task::Inference, Engine::Prunemem) => {
            prunemem_device::inference_phases(arch, w, &mut notes)
        }
        (Task::Inference | Task::Train, _) => training::phases(arch, w),
        // On a GPU: cubecl's pool, from the engine's device buffers.
        (Task::GradProbe, Engine::Prunemem) if w.device.is_gpu() => {
            prunemem_device::gradprobe_phases(arch, w, &mut notes)
        }
        (_, Engine::Prunemem) if w.device.is_gpu() => match prunemem::method(w) {
            Some(m) => prunemem_device::phases(arch, w, m, &mut notes),
            None => prunemem::phases(arch, w, &mut notes),
        },
        (_, Engine::Prunemem) => prunemem::phases(arch, w, &mut notes),
        (_, Engine::Reference) => reference::phases(arch, w, &mut notes),
    };
    let saved_weights = saved::saved_weights(arch, w, &mut notes);
    let device_pool = match (w.engine, w.task) {
        (Engine::Prunemem, Task::Train) => None,
        (Engine::Prunemem, _) if w.device.is_gpu() => Some(device_pool::pool(w, &phases)),
        _ => None,
    };
    Ok(Estimate {
        arch: arch.clone(),
        workload: w.clone(),
        phases,
        saved_weights,
        notes,
        device_pool,
    })
}

#[cfg(test)]
mod tests;
