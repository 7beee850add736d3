//! GradProbe (the `dcifrian/GradProbe` pruner): shrink the tentatively
//! pruned weights and keep only those whose loss gradient does not react —
//! at a fraction of the reference's memory.
//!
//! The reference keeps a full copy of the weights, two full sets of
//! gradients and full masks at once (≈8× the fp32 model). Here:
//! - the model is never resident: layers stream from the read-only
//!   checkpoint, which is also where the original values come from when a
//!   weight is restored (bit-identical, nothing copied);
//! - gradients are computed layer by layer ([`pass`]): one forward keeps the
//!   decoder-layer boundary activations, then each layer, last to first, is
//!   recomputed under autodiff, the upstream gradient pushed through it and
//!   its weight gradients folded into the running max at once;
//! - only candidates carry state: their positions, and the original
//!   gradient magnitudes in f16 ([`select::StoredGrads`]).
//!
//! Stage snapshots follow the reference's profiling stages (`04_…` to
//! `16_…`), with per-layer scopes.

mod embed;
mod head;
pub mod iterate;
mod on_device;
mod pass;
mod phases;
mod resident;
pub mod select;
mod write;

use crate::exec::Compute;
use std::collections::BTreeMap;

pub use head::block_rows;
use pass::{Batch, Norms, State, Which};
pub use select::{GradPrecision, Strategy};
pub use write::{Scratch, count_pruned, scratch_model, write_pruned};

use super::PruneError;
use crate::events::stages;
use crate::model::Checkpoint;
use crate::model::llama::LAYER_LINEARS;
use crate::profiler::Profiler;

/// Sorted flat positions per tensor name (PyTorch orientation).
pub type Masks = BTreeMap<String, Vec<u32>>;

/// How to probe.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GradProbeConfig {
    pub strategy: Strategy,
    pub sparsity: f64,
    /// Tentative weights are multiplied by this for the second pass.
    pub reduction_factor: f64,
    /// Prune iff `modified ≤ original × (1 + gradient_threshold)`.
    pub gradient_threshold: f64,
    /// Also probe the embeddings (and a separate LM head): the reference's
    /// global scope over every parameter of two or more dimensions.
    pub include_embeddings: bool,
    pub precision: GradPrecision,
}

/// One probed tensor.
#[derive(Debug, Clone)]
pub struct Target {
    pub name: String,
    pub rows: usize,
    pub cols: usize,
}

/// The tensors probed for `ckpt`: the seven linears of every decoder layer,
/// then (with `include_embeddings`) the embeddings and a separate head.
pub fn targets(ckpt: &Checkpoint, include_embeddings: bool) -> Vec<Target> {
    let c = &ckpt.config;
    let mut out = Vec::new();
    for i in 0..c.num_layers {
        for name in LAYER_LINEARS {
            let full = format!("model.layers.{i}.{name}.weight");
            if let Ok(e) = ckpt.entry(&full) {
                let rows = e.shape.first().copied().unwrap_or(0);
                let cols = e.shape.get(1).copied().unwrap_or(0);
                out.push(Target {
                    name: full,
                    rows,
                    cols,
                });
            }
        }
    }
    if include_embeddings {
        out.push(Target {
            name: EMBED.into(),
            rows: c.vocab_size,
            cols: c.hidden_size,
        });
        if !c.tie_word_embeddings {
            out.push(Target {
                name: HEAD.into(),
                rows: c.vocab_size,
                cols: c.hidden_size,
            });
        }
    }
    out
}

pub(crate) const EMBED: &str = "model.embed_tokens.weight";
pub(crate) const HEAD: &str = "lm_head.weight";

/// What one GradProbe step decided.
#[derive(Debug, Clone)]
pub struct StepOutcome {
    /// Weights newly pruned (zeroed) this step, per tensor.
    pub pruned: Masks,
    pub tentative: u64,
    pub restored: u64,
    /// Mean calibration loss with the original and with the reduced weights.
    pub loss_original: f64,
    pub loss_modified: f64,
    pub seconds: f64,
}

impl StepOutcome {
    pub fn pruned_count(&self) -> u64 {
        self.pruned.values().map(|v| v.len() as u64).sum()
    }
}

/// A GradProbe run over one checkpoint and one set of calibration batches,
/// on one backend's device.
pub struct GradProbe<'a, B: Compute> {
    device: B::Device,
    ckpt: &'a Checkpoint,
    config: GradProbeConfig,
    batches: Vec<Batch>,
    targets: Vec<Target>,
    /// Activation norms (Wanda strategy), from the first original pass on
    /// the dense model, reused by later steps as the reference caches them.
    norms: Option<Norms>,
    profiler: &'a Profiler,
    /// The layers kept on the device between passes, where they fit.
    resident: Option<resident::Resident<B>>,
}

impl<'a, B: Compute> GradProbe<'a, B> {
    /// `windows` hold `seqlen + 1` tokens each (inputs and shifted targets),
    /// grouped `batch_size` to a batch.
    pub fn new(
        ckpt: &'a Checkpoint,
        config: GradProbeConfig,
        windows: &[Vec<u32>],
        batch_size: usize,
        profiler: &'a Profiler,
        device: B::Device,
    ) -> Result<Self, PruneError> {
        if windows.is_empty() || windows.iter().any(|w| w.len() < 2) {
            return Err(PruneError::Invalid(
                "GradProbe needs at least one calibration window of 2 or more tokens".into(),
            ));
        }
        if !(config.reduction_factor.is_finite() && config.gradient_threshold.is_finite()) {
            return Err(PruneError::Invalid(
                "the reduction factor and the gradient threshold must be finite".into(),
            ));
        }
        // Across MPI ranks each rank probes its share of the batches; every
        // figure the decisions use is a maximum over batches, reduced
        // across ranks (`phases`), so the shares change no bit.
        let total = windows.len().div_ceil(batch_size.max(1));
        crate::exec::dist::check_share("calibration batches", total, "--num-batches")
            .map_err(|e| PruneError::Invalid(e.to_string()))?;
        let mine = crate::exec::dist::share_batches(windows, batch_size);
        let batches = mine.chunks(batch_size.max(1)).map(Batch::new).collect();
        let targets = targets(ckpt, config.include_embeddings);
        Ok(Self {
            device,
            ckpt,
            config,
            batches,
            targets,
            norms: None,
            profiler,
            resident: None,
        })
    }

    /// Keeps every decoder layer on the device, in f32, from its first
    /// read to the end of the probe, instead of reading it from the
    /// checkpoint and uploading it four times a step. For a caller that
    /// knows the device has room for them (`all_layers_bytes` in f32).
    pub fn keep_layers_resident(&mut self) {
        self.resident = Some(resident::Resident::new(self.ckpt.config.num_layers));
    }

    /// Whether the layers stay on the device between passes.
    pub fn layers_resident(&self) -> bool {
        self.resident.is_some()
    }

    /// Step 6 without a save (`write::keep_pruned`): the decoder layers
    /// with `masks` zeroed, handed to `to` — the evaluation of windows of
    /// `seqlen` tokens, run on each at once, or a store that keeps them for
    /// it; the layers this probe kept on the device are handed over (a
    /// later step would read them from the checkpoint again).
    pub fn keep_pruned(
        &self,
        masks: &Masks,
        to: &mut dyn crate::model::kept::PrunedLayers<B>,
        seqlen: usize,
    ) -> Result<Vec<crate::prune::engine::LayerReport>, PruneError> {
        self.hand_pruned(masks, to, seqlen, true)
    }

    /// [`Self::keep_pruned`] for a step that another follows
    /// (`iterate`): the layers kept on the device stay kept.
    pub(super) fn lend_pruned(
        &self,
        masks: &Masks,
        to: &mut dyn crate::model::kept::PrunedLayers<B>,
        seqlen: usize,
    ) -> Result<Vec<crate::prune::engine::LayerReport>, PruneError> {
        self.hand_pruned(masks, to, seqlen, false)
    }

    fn hand_pruned(
        &self,
        masks: &Masks,
        to: &mut dyn crate::model::kept::PrunedLayers<B>,
        seqlen: usize,
        hand_over: bool,
    ) -> Result<Vec<crate::prune::engine::LayerReport>, PruneError> {
        let c = &self.ckpt.config;
        let dtype = crate::model::ComputeDtype::F32.burn();
        let rope = crate::model::Rope::<B>::new(c, seqlen, dtype, &self.device);
        let resident = self.resident.as_ref().map(|r| (r, hand_over));
        let (ckpt, targets) = (self.ckpt, &self.targets);
        write::keep_pruned(ckpt, targets, masks, to, &rope, &self.device, resident)
    }

    /// The device the probe computes on.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// The target sparsity of the next step (`--iterative` raises it).
    pub fn set_sparsity(&mut self, sparsity: f64) {
        self.config.sparsity = sparsity;
    }

    pub fn targets(&self) -> &[Target] {
        &self.targets
    }

    /// Steps 1–2 alone: the candidates of every target and the max |grad|
    /// over the batches at them, in f32 (for tests and diagnostics).
    pub fn original_magnitudes(
        &mut self,
        pruned: &Masks,
    ) -> Result<(Masks, BTreeMap<String, Vec<f32>>), PruneError> {
        let mut state = self.state(pruned, GradPrecision::F32);
        phases::run(self.input(), &mut state, Which::Original)?;
        self.norms = state.norms.take().or(self.norms.take());
        let grads = state
            .original
            .iter()
            .map(|(k, v)| (k.clone(), (0..v.len()).map(|i| v.get(i)).collect()))
            .collect();
        Ok((state.tentative, grads))
    }

    /// One GradProbe step (steps 1–5) on the model with `pruned` already
    /// zeroed: returns the weights it prunes.
    pub fn step(&mut self, pruned: &Masks) -> Result<StepOutcome, PruneError> {
        let start = std::time::Instant::now();
        let p = self.profiler;
        let mut components = BTreeMap::new();
        components.insert("saved_values".to_string(), 0);
        p.components(stages::GP_SAVED_TENTATIVE, components);
        p.stage(stages::GP_SAVED_TENTATIVE);
        let mut state = self.state(pruned, self.config.precision);
        let loss_original = phases::run(self.input(), &mut state, Which::Original)?;
        p.components(stages::GP_ORIGINAL_GRADIENTS, state.components());
        p.stage(stages::GP_ORIGINAL_GRADIENTS);
        let tentative: u64 = state.tentative.values().map(|v| v.len() as u64).sum();
        p.stage(stages::GP_TENTATIVE_MASKS);
        p.stage(stages::GP_WEIGHTS_REDUCED);
        let loss_modified = phases::run(self.input(), &mut state, Which::Modified)?;
        p.components(stages::GP_MODIFIED_GRADIENTS, state.components());
        p.stage(stages::GP_MODIFIED_GRADIENTS);
        self.norms = state.norms.take().or(self.norms.take());
        let decided = std::mem::take(&mut state.decided);
        let count: u64 = decided.values().map(|v| v.len() as u64).sum();
        // The final masks are all that is left of the step: the candidates,
        // their gradient maxima and the passes' freed buffers go back to
        // the system here, so that step 6's peak is its own (SmolLM2 at
        // 30%, 2 batches of 128: 284 MiB of RSS through step 6 for 105 MiB
        // of live heap, before).
        drop(state);
        crate::memory::alloc::trim();
        p.stage(stages::GP_FINAL_MASKS);
        Ok(StepOutcome {
            pruned: decided,
            tentative,
            restored: tentative - count,
            loss_original,
            loss_modified,
            seconds: start.elapsed().as_secs_f64(),
        })
    }

    fn state<'m>(&mut self, pruned: &'m Masks, precision: GradPrecision) -> State<'m> {
        State::new(pruned, self.norms.take(), precision)
    }

    fn input(&self) -> pass::Input<'_, B> {
        pass::Input {
            device: &self.device,
            ckpt: self.ckpt,
            config: &self.config,
            batches: &self.batches,
            targets: &self.targets,
            profiler: self.profiler,
            resident: self.resident.as_ref(),
        }
    }
}

/// Calibration windows the way the reference's `prepare_calibration_data`
/// cuts them: `seqlen + 1` consecutive tokens every `stride` tokens from the
/// start of the text, the first `count` of them.
pub fn sliding_windows(
    tokens: &[u32],
    seqlen: usize,
    stride: usize,
    count: usize,
) -> Result<Vec<Vec<u32>>, PruneError> {
    if seqlen < 1 || stride < 1 {
        return Err(PruneError::Invalid(
            "seqlen and stride must be at least 1".into(),
        ));
    }
    let windows: Vec<Vec<u32>> = (0..)
        .map(|k| k * stride)
        .take_while(|start| start + seqlen < tokens.len())
        .take(count)
        .map(|start| tokens[start..start + seqlen + 1].to_vec())
        .collect();
    if windows.len() < count {
        return Err(PruneError::Invalid(format!(
            "the calibration text gives {} windows of {} tokens every {stride} tokens; {count} are needed",
            windows.len(),
            seqlen + 1
        )));
    }
    Ok(windows)
}
