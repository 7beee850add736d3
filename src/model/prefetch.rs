//! A decoder layer read, converted and laid out on the host, ready to go
//! up: what a device run's reader thread prepares for layer `i + 1` while
//! the device computes layer `i`, so that the checkpoint's read, the dtype
//! conversion and the linears' transposition overlap the device's work
//! instead of idling it. Only the upload itself stays on the computing
//! thread (cubecl's pools are per thread).
//!
//! The result is the same module [`Checkpoint::load_layer`] builds: the
//! same conversion, and the linears transposed from PyTorch's `[out, in]`
//! to Burn's `[in, out]` here, in the conversion's own pass
//! (`Checkpoint::read_transposed`), rather than by burn-store's adapter.

use std::borrow::Cow;
use std::cell::RefCell;
use std::rc::Rc;

use burn::prelude::*;
use burn_store::{ModuleSnapshot, TensorSnapshot};

use super::checkpoint::skeleton_layer;
use super::llama::DecoderLayer;
use super::{Checkpoint, ComputeDtype, ModelError};

/// One decoder layer on the host, in Burn's layout, or with its linears'
/// weights as stored ([`stored_layout`]).
pub struct HostLayer {
    index: usize,
    /// Module path (`input_layernorm.weight`) and values: all but the
    /// linears' weights.
    tensors: Vec<(String, TensorData)>,
    /// The linears' weights by linear (`self_attn.q_proj`): Burn's `[in,
    /// out]`, or as the checkpoint stores them (`[out, in]`) when
    /// [`stored_layout`] is on.
    linears: Vec<(String, TensorData)>,
}

impl HostLayer {
    pub fn index(&self) -> usize {
        self.index
    }

    /// Bytes of the layer's values.
    pub fn bytes(&self) -> u64 {
        let bytes = |t: &[(String, TensorData)]| -> u64 {
            t.iter().map(|(_, d)| d.bytes.len() as u64).sum()
        };
        bytes(&self.tensors) + bytes(&self.linears)
    }
}

/// Whether the reader leaves the linears' weights as the checkpoint stores
/// them (`[out, in]`) and the device takes each as the transposed view
/// Burn's `Linear` reads, instead of transposing them on the host (which
/// costs as much as the dtype conversion, `examples/reader_rate.rs`):
/// `PRUNEMEM_WEIGHT_LAYOUT=stored` or `burn`, else the device's measured
/// default (`exec::defaults`: stored on CUDA, where an H200 gave the same
/// perplexity to every digit and a host heap 1 GB smaller).
pub fn stored_layout() -> bool {
    static STORED: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    crate::exec::defaults::env_or(
        &STORED,
        "PRUNEMEM_WEIGHT_LAYOUT",
        &["burn", "stored"],
        crate::exec::defaults::cuda,
    )
}

/// Reads decoder layer `i` of `ckpt` in `dtype` (any thread).
pub fn read_layer(
    ckpt: &Checkpoint,
    i: usize,
    dtype: ComputeDtype,
) -> Result<HostLayer, ModelError> {
    let _io = crate::timing::work(crate::timing::Work::Io);
    let prefix = format!("model.layers.{i}.");
    let names: Vec<String> = ckpt
        .tensors
        .range(prefix.clone()..)
        .map(|(n, _)| n.clone())
        .take_while(|n| n.starts_with(&prefix))
        .collect();
    let mut tensors = Vec::with_capacity(names.len());
    let mut linears = Vec::new();
    for name in names {
        let local = name[prefix.len()..].to_string();
        let matrix = ckpt.entry(&name).is_ok_and(|e| e.shape.len() == 2);
        let Some(linear) = linear_of(&local).filter(|_| matrix).map(str::to_string) else {
            tensors.push((local, ckpt.read_converted(&name, dtype)?));
            continue;
        };
        let data = match stored_layout() {
            true => ckpt.read_converted(&name, dtype)?,
            false => ckpt.read_transposed(&name, dtype)?,
        };
        linears.push((linear, data));
    }
    Ok(HostLayer {
        index: i,
        tensors,
        linears,
    })
}

/// Runs `each(i, ready)` for every decoder layer of `ckpt` in order. With
/// `ahead`, a host thread reads layer `i + 1` ([`read_layer`]) while `each`
/// computes layer `i`, and `ready` is layer `i` read; without, `ready` is
/// `None` and `each` loads its layer itself. The prune's and the
/// evaluation's layer loops.
pub fn for_each_layer<E: From<ModelError>>(
    ckpt: &Checkpoint,
    dtype: ComputeDtype,
    ahead: bool,
    mut each: impl FnMut(usize, Option<HostLayer>) -> Result<(), E>,
) -> Result<(), E> {
    let layers = ckpt.config.num_layers;
    std::thread::scope(|scope| {
        let read = |i: usize| scope.spawn(move || read_layer(ckpt, i, dtype));
        let mut next = ahead.then(|| read(0));
        for i in 0..layers {
            let ready = match next.take() {
                Some(h) => {
                    // Time the device idles on the host (`seconds_by_work`).
                    let read = crate::timing::timed(crate::timing::Work::ReaderWait, || h.join());
                    Some(read.map_err(|_| {
                        ModelError::Checkpoint(format!("reading model.layers.{i} failed"))
                    })??)
                }
                None => None,
            };
            if ahead && i + 1 < layers {
                next = Some(read(i + 1));
            }
            each(i, ready)?;
        }
        Ok(())
    })
}

/// Decoder layer `i` of `ckpt` on `device`: `ready`, read ahead by
/// [`for_each_layer`]'s reader thread, or else read here, on this thread
/// (a layer loop without a reader: the CPU backend's prune and
/// evaluation). Either way the same conversion, not burn-store's adapter
/// ([`Checkpoint::load_layer`]), which transposes on one core (1.9 s a
/// layer of a 1B shape on an H200's host, against 0.05 s here).
pub fn load_layer<B: crate::exec::Compute>(
    ckpt: &Checkpoint,
    i: usize,
    ready: Option<HostLayer>,
    dtype: ComputeDtype,
    device: &B::Device,
) -> Result<DecoderLayer<B>, ModelError> {
    let host = match ready {
        Some(host) => host,
        None => read_layer(ckpt, i, dtype)?,
    };
    upload_layer::<B>(ckpt, host, device)
}

/// Uploads `layer` to `device` (the computing thread).
pub fn upload_layer<B: crate::exec::Compute>(
    ckpt: &Checkpoint,
    layer: HostLayer,
    device: &B::Device,
) -> Result<DecoderLayer<B>, ModelError> {
    let mut module = skeleton_layer::<B>(&ckpt.config, device);
    let i = layer.index;
    let snapshots: Vec<TensorSnapshot> = layer
        .tensors
        .into_iter()
        .map(|(path, data)| {
            let (dtype, shape) = (data.dtype, data.shape.clone());
            // Handed over once, not cloned: the closure gives its data up.
            let cell = RefCell::new(Some(data));
            let data_fn = Rc::new(move || {
                cell.borrow_mut()
                    .take()
                    .ok_or_else(|| burn_store::TensorSnapshotError::DataError("read twice".into()))
            });
            TensorSnapshot::from_closure(
                data_fn,
                dtype,
                shape,
                path.split('.').map(str::to_string).collect(),
                Vec::new(),
                burn::module::ParamId::new(),
            )
        })
        .collect();
    let _tag = crate::memory::tag::tag(crate::memory::tag::Category::Weights);
    // On the CPU backend the host is the device: nothing is uploaded.
    let _upload = B::is_device().then(|| crate::timing::work(crate::timing::Work::Upload));
    let result = module.apply(snapshots, None, None, false);
    if let Some(e) = result.errors.first() {
        return Err(ModelError::Checkpoint(format!(
            "{}: loading model.layers.{i}.: {e}",
            ckpt.dir.display()
        )));
    }
    // The linears' weights go up below, through `exec::copies`.
    let later = |m: &str| {
        layer
            .linears
            .iter()
            .any(|(l, _)| m == format!("{l}.weight"))
    };
    if let Some((missing, _)) = result.missing.iter().find(|(m, _)| !later(m)) {
        return Err(ModelError::MissingTensor {
            name: format!("model.layers.{i}.{missing}"),
            dir: ckpt.dir.display().to_string(),
        });
    }
    for (linear, data) in layer.linears {
        let weight = crate::exec::copies::to_device::<B, 2>(Cow::Owned(data), device);
        set_linear(&mut module, &linear, weight)
            .map_err(|e| ModelError::Checkpoint(format!("model.layers.{i}.{e}")))?;
    }
    Ok(module)
}

/// A linear's weight between Burn's `[in, out]` view and the way the host
/// holds it: as the checkpoint stores it (`[out, in]`, contiguous) when
/// [`stored_layout`] is on, else as it is. Each direction is the other's
/// inverse (a transposition or nothing).
pub fn host_oriented<B: Backend>(weight: Tensor<B, 2>) -> Tensor<B, 2> {
    match stored_layout() {
        true => weight.transpose(),
        false => weight,
    }
}

/// Sets the weight of `layer`'s linear `name` (`self_attn.q_proj`) to
/// `weight`, oriented as the host holds it ([`host_oriented`]); `Err`
/// names a linear a decoder layer does not have.
pub fn set_linear<B: crate::exec::Compute>(
    layer: &mut DecoderLayer<B>,
    name: &str,
    weight: Tensor<B, 2>,
) -> Result<(), String> {
    match layer.linear_mut(name) {
        Some(l) => {
            l.weight = burn::module::Param::from_tensor(host_oriented(weight));
            Ok(())
        }
        None => Err(format!("{name}: not a linear of a decoder layer")),
    }
}

/// The linear (`self_attn.q_proj`) whose weight a module path names
/// (`self_attn.q_proj.weight`): the seven projections, which Burn stores
/// transposed.
pub fn linear_of(local: &str) -> Option<&str> {
    local
        .strip_suffix(".weight")
        .filter(|l| l.ends_with("_proj"))
}
