//! The pruned layers kept for the evaluation that follows a device prune,
//! so that it never goes through disk: run through the evaluation as each
//! is pruned and kept nowhere (`model::inline_eval`), on the device when
//! they fit beside the run's own peak, else in host memory in the compute
//! dtype (uploaded again layer by layer), and only as the last resort
//! written to a scratch checkpoint that the evaluation streams back (the
//! job's choice, recorded as `pruned_layers_kept`). The engine hands each
//! pruned layer to a [`PrunedLayers`] and knows no more.
//!
//! On the CPU backend the host is the device: a layer kept would be the
//! whole model beside the run, so a CPU run evaluates inline or, where the
//! evaluation's hidden states do not fit, streams through the scratch
//! checkpoint ([`Place::choose_on_host`]); [`Kept`] is used by device runs
//! only.

use burn::prelude::*;
use burn_store::{ModuleSnapshot, TensorSnapshot};

use super::checkpoint::skeleton_layer;
use super::llama::DecoderLayer;
use super::{ComputeDtype, LlamaConfig, ModelError};
use crate::exec::Compute;
use crate::memory::held::Held;
use crate::memory::tag::Category;

/// Where the pruned layers wait for the evaluation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Place {
    /// Evaluated as it is pruned, then dropped (`model::inline_eval`).
    Inline,
    Device,
    Host,
    Disk,
}

/// Where the engine hands each pruned layer, in order: a store that keeps
/// it for the evaluation ([`Kept`]), or the evaluation itself
/// (`model::inline_eval`).
pub trait PrunedLayers<B: Compute> {
    /// Takes pruned layer `i`; `rope` holds the rotary tables the prune ran
    /// it with.
    fn take(
        &mut self,
        i: usize,
        layer: DecoderLayer<B>,
        rope: &super::Rope<B>,
    ) -> Result<(), ModelError>;
}

impl<B: Compute> PrunedLayers<B> for Kept<B> {
    fn take(
        &mut self,
        _: usize,
        layer: DecoderLayer<B>,
        _: &super::Rope<B>,
    ) -> Result<(), ModelError> {
        self.push(layer)
    }
}

impl std::str::FromStr for Place {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "inline" => Ok(Place::Inline),
            "device" => Ok(Place::Device),
            "host" => Ok(Place::Host),
            "disk" => Ok(Place::Disk),
            other => Err(format!(
                "unknown place '{other}' (expected auto, inline, device, host or disk)"
            )),
        }
    }
}

impl Place {
    pub fn name(self) -> &'static str {
        match self {
            Place::Inline => "inline",
            Place::Device => "device",
            Place::Host => "host",
            Place::Disk => "disk",
        }
    }

    /// Where `layers_bytes` of pruned layers go. Evaluated as they are
    /// pruned (`Inline`) when the evaluation's hidden states
    /// (`eval_bytes`, held through the prune instead of only through the
    /// evaluation) are no more than the layers and, where the device's
    /// budget is known, fit it beside the run's predicted device peak;
    /// else on the device when the peak plus them fits `device_budget`,
    /// else on the host when they fit `host_free` with a quarter to spare,
    /// else on disk. An unknown budget is not a yes for keeping every
    /// layer on the device; the inline evaluation asks no more of the
    /// device than keeping them would.
    pub fn choose(
        layers_bytes: u64,
        eval_bytes: Option<u64>,
        device_peak: u64,
        device_budget: Option<u64>,
        host_free: Option<u64>,
    ) -> Place {
        let fits = |need: Option<u64>, budget: Option<u64>| match (need, budget) {
            (Some(n), Some(b)) => n <= b,
            _ => false,
        };
        let inline = eval_bytes.is_some_and(|e| {
            e <= layers_bytes
                && (device_budget.is_none() || fits(device_peak.checked_add(e), device_budget))
        });
        if inline {
            Place::Inline
        } else if fits(device_peak.checked_add(layers_bytes), device_budget) {
            Place::Device
        } else if fits(layers_bytes.checked_add(layers_bytes / 4), host_free) {
            Place::Host
        } else {
            Place::Disk
        }
    }

    /// Where a CPU run's pruned layers go, where the host is the device:
    /// evaluated as they are pruned (`Inline`) when the evaluation's hidden
    /// states (`eval_bytes`, held in memory through the prune) are no more
    /// than the layers' `layers_bytes` and, where the memory available is
    /// known, fit it beside the run's predicted `peak`; else the scratch
    /// checkpoint (`Disk`), which costs disk and no memory. Never kept:
    /// every layer in memory is the whole model beside the run.
    pub fn choose_on_host(
        layers_bytes: u64,
        eval_bytes: u64,
        peak: u64,
        host_free: Option<u64>,
    ) -> Place {
        let fits =
            host_free.is_none_or(|free| peak.checked_add(eval_bytes).is_some_and(|n| n <= free));
        if eval_bytes <= layers_bytes && fits {
            Place::Inline
        } else {
            Place::Disk
        }
    }
}

/// One layer's tensors on the host, as its module paths name them.
struct HostLayer {
    tensors: Vec<(Vec<String>, Vec<String>, TensorData)>,
}

enum Layer<B: Compute> {
    Device(Box<DecoderLayer<B>>),
    Host(HostLayer),
}

/// The pruned decoder layers, in order.
pub struct Kept<B: Compute> {
    place: Place,
    layers: Vec<Layer<B>>,
    /// Device bytes of the layers kept there (the pool's composition).
    held: Held,
    host_bytes: u64,
}

/// A kept layer ready to run: borrowed where it lives on the device,
/// rebuilt (uploaded) where it waits on the host.
pub enum LayerRef<'a, B: Compute> {
    Borrowed(&'a DecoderLayer<B>),
    Owned(Box<DecoderLayer<B>>),
}

impl<B: Compute> std::ops::Deref for LayerRef<'_, B> {
    type Target = DecoderLayer<B>;
    fn deref(&self) -> &DecoderLayer<B> {
        match self {
            LayerRef::Borrowed(l) => l,
            LayerRef::Owned(l) => l,
        }
    }
}

impl<B: Compute> Kept<B> {
    /// Keeps layers at `place` (`Device` or `Host`; `Disk` is the job's
    /// scratch checkpoint and `Inline` the evaluation's, not kept here).
    pub fn new(place: Place) -> Self {
        Self {
            place,
            layers: Vec::new(),
            held: Held::none(Category::Weights),
            host_bytes: 0,
        }
    }

    pub fn place(&self) -> Place {
        self.place
    }

    pub fn len(&self) -> usize {
        self.layers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// Bytes of the kept layers in host memory.
    pub fn host_bytes(&self) -> u64 {
        self.host_bytes
    }

    /// Takes a pruned layer (the next in order).
    pub fn push(&mut self, layer: DecoderLayer<B>) -> Result<(), ModelError> {
        match self.place {
            Place::Device => {
                let bytes = layer_bytes(&layer);
                self.held.set(self.held.bytes() + bytes);
                self.layers.push(Layer::Device(Box::new(layer)));
            }
            _ => {
                let _tag = crate::memory::tag::tag(Category::Weights);
                let mut tensors = Vec::new();
                for s in layer.collect(None, None, false) {
                    let path = s.path_stack.clone().unwrap_or_default();
                    // The linears' weights (the bulk) through
                    // `exec::copies`; kept as stored where the layer
                    // holds them so (a contiguous `[out, in]`).
                    let weight = super::prefetch::linear_of(&path.join("."))
                        .and_then(|l| layer.linear(l))
                        .map(|l| l.weight.val());
                    let data = match weight {
                        Some(w) => crate::exec::copies::to_host(super::prefetch::host_oriented(w)),
                        None => s.to_data().map_err(|e| {
                            ModelError::Checkpoint(format!("keeping a layer: {e:?}"))
                        })?,
                    };
                    crate::exec::transfer::read_back(data.bytes.len() as u64);
                    self.host_bytes += data.bytes.len() as u64;
                    let containers = s.container_stack.clone().unwrap_or_default();
                    tensors.push((path, containers, data));
                }
                self.layers.push(Layer::Host(HostLayer { tensors }));
            }
        }
        Ok(())
    }

    /// Layer `i`, ready to run on `device`.
    pub fn layer(
        &self,
        i: usize,
        config: &LlamaConfig,
        device: &B::Device,
    ) -> Result<LayerRef<'_, B>, ModelError> {
        match self.layers.get(i) {
            Some(Layer::Device(l)) => Ok(LayerRef::Borrowed(l)),
            Some(Layer::Host(h)) => {
                let _upload = crate::timing::work(crate::timing::Work::Upload);
                let mut layer = skeleton_layer::<B>(config, device);
                let mut snapshots = Vec::new();
                for (path, containers, data) in &h.tensors {
                    crate::exec::transfer::uploaded(data.bytes.len() as u64);
                    // The linears' weights (the bulk) through
                    // `exec::copies`, read where they are kept.
                    if let Some(linear) = super::prefetch::linear_of(&path.join(".")) {
                        let weight = crate::exec::copies::to_device::<B, 2>(
                            std::borrow::Cow::Borrowed(data),
                            device,
                        );
                        super::prefetch::set_linear(&mut layer, linear, weight)
                            .map_err(|e| ModelError::Checkpoint(format!("model.layers.{i}.{e}")))?;
                        continue;
                    }
                    snapshots.push(TensorSnapshot::from_data(
                        data.clone(),
                        path.clone(),
                        containers.clone(),
                        burn::module::ParamId::new(),
                    ));
                }
                let result = layer.apply(snapshots, None, None, false);
                if let Some(e) = result.errors.first() {
                    return Err(ModelError::Checkpoint(format!(
                        "model.layers.{i}: restoring a kept layer: {e}"
                    )));
                }
                Ok(LayerRef::Owned(Box::new(layer)))
            }
            None => Err(ModelError::Checkpoint(format!(
                "model.layers.{i} was not kept"
            ))),
        }
    }
}

/// Bytes of a layer's parameters in their dtypes.
pub fn layer_bytes<B: Compute>(layer: &DecoderLayer<B>) -> u64 {
    layer
        .collect(None, None, false)
        .iter()
        .map(|s| (s.shape.num_elements() * s.dtype.size()) as u64)
        .sum()
}

/// The compute dtype's bytes of every decoder layer of `config`.
pub fn all_layers_bytes(config: &LlamaConfig, dtype: ComputeDtype) -> u64 {
    config.num_layers as u64 * config.layer_param_count() * dtype.size()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_place_is_the_device_only_when_a_budget_says_so() {
        let gib = 1u64 << 30;
        assert_eq!(
            Place::choose(gib, None, gib, Some(4 * gib), None),
            Place::Device
        );
        assert_eq!(
            Place::choose(gib, None, 3 * gib + 1, Some(4 * gib), Some(2 * gib)),
            Place::Host
        );
        // An unknown device size is no room on the device.
        assert_eq!(
            Place::choose(gib, None, 0, None, Some(2 * gib)),
            Place::Host
        );
        assert_eq!(Place::choose(gib, None, 0, None, Some(gib)), Place::Disk);
        assert_eq!(Place::choose(gib, None, 0, None, None), Place::Disk);
        // Sizes near u64::MAX never wrap into a fit.
        assert_eq!(
            Place::choose(u64::MAX, None, 1, Some(u64::MAX), Some(u64::MAX)),
            Place::Disk
        );
    }

    #[test]
    fn the_evaluation_runs_inline_when_its_states_are_no_more_than_the_layers() {
        let gib = 1u64 << 30;
        let small = Some(gib / 8);
        // Known budget: inline when the peak plus the states fit, even
        // where keeping every layer would not.
        assert_eq!(
            Place::choose(gib, small, gib, Some(gib + gib / 8), None),
            Place::Inline
        );
        assert_eq!(
            Place::choose(gib, small, gib, Some(gib), Some(4 * gib)),
            Place::Host
        );
        // Unknown budget: inline asks no more than keeping would.
        assert_eq!(Place::choose(gib, small, 0, None, None), Place::Inline);
        // States larger than the layers: keep the layers instead.
        assert_eq!(
            Place::choose(gib, Some(2 * gib), 0, Some(8 * gib), None),
            Place::Device
        );
        assert_eq!(
            Place::choose(gib, Some(2 * gib), 0, None, Some(4 * gib)),
            Place::Host
        );
        assert_eq!(
            Place::choose(gib, Some(u64::MAX), u64::MAX, Some(u64::MAX), None),
            Place::Disk
        );
    }

    #[test]
    fn a_cpu_run_evaluates_inline_or_streams_from_disk() {
        let gib = 1u64 << 30;
        // Unknown memory, or the states fit beside the peak: inline.
        assert_eq!(
            Place::choose_on_host(gib, gib / 8, gib, None),
            Place::Inline
        );
        assert_eq!(
            Place::choose_on_host(gib, gib / 8, gib, Some(gib + gib / 8)),
            Place::Inline
        );
        // They do not fit, or they are more than the layers: disk, never
        // the layers kept.
        assert_eq!(
            Place::choose_on_host(gib, gib / 8, gib, Some(gib)),
            Place::Disk
        );
        assert_eq!(Place::choose_on_host(gib, 2 * gib, 0, None), Place::Disk);
        assert_eq!(
            Place::choose_on_host(u64::MAX, u64::MAX, 1, Some(u64::MAX)),
            Place::Disk
        );
    }

    #[test]
    fn host_kept_layers_come_back_with_the_same_values() {
        use crate::exec::Cpu;
        let config = LlamaConfig::from_json(
            r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 16,
                "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                "num_key_value_heads": 1, "vocab_size": 64, "rms_norm_eps": 1e-5}"#,
        )
        .unwrap();
        let device = Default::default();
        let layer = crate::model::checkpoint::skeleton_layer::<Cpu>(&config, &device);
        let values = |l: &crate::model::llama::DecoderLayer<Cpu>| -> Vec<f32> {
            let w = l.linear("mlp.down_proj").unwrap().weight.val();
            w.into_data().iter::<f32>().collect()
        };
        let before = values(&layer);
        let bytes = layer_bytes(&layer);
        let mut kept = Kept::<Cpu>::new(Place::Host);
        kept.push(layer).unwrap();
        assert_eq!(kept.host_bytes(), bytes);
        let back = kept.layer(0, &config, &device).unwrap();
        assert_eq!(before, values(&back));
        assert!(kept.layer(1, &config, &device).is_err());
    }
}
