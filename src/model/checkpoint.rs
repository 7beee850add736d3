//! A Hugging Face checkpoint folder: `config.json` plus `model.safetensors`,
//! or shards listed in `model.safetensors.index.json`.
//!
//! Every shard is memory-mapped once and its header validated (sizes,
//! offsets, dtypes) when the checkpoint is opened; no tensor bytes are read
//! then. Loading a module builds lazy burn-store [`TensorSnapshot`]s for just
//! its tensors and applies them with [`PyTorchToBurnAdapter`] (Linear weights
//! transposed from [out, in] to [in, out]) after converting to the compute
//! dtype — so loading decoder layer k reads layer k's bytes and nothing else.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use burn::module::Module;
use burn::nn::{Embedding, EmbeddingConfig, Linear, LinearConfig};
use burn::prelude::*;
use burn_store::{ModuleSnapshot, PyTorchToBurnAdapter, TensorSnapshot, TensorSnapshotError};
use safetensors::Dtype;

use super::ModelError;
use super::config::LlamaConfig;
use super::dtype::{self, ComputeDtype};
use super::llama::{DecoderLayer, Llama, LlamaAttention, LlamaMlp, LlamaModel, LlamaRmsNorm};
use super::shard::read_index;
use super::shard::{READ_CHUNK, for_each_chunk_releasing};
pub use super::shard::{Shard, TensorEntry, copy_releasing, map_shard, release_range};

/// An opened checkpoint.
pub struct Checkpoint {
    pub dir: PathBuf,
    pub config: LlamaConfig,
    pub shards: Vec<Shard>,
    pub tensors: BTreeMap<String, TensorEntry>,
    /// Whether the weights came from an index file (sharded).
    pub sharded: bool,
    /// Tensor bytes read so far (for tests and accounting).
    bytes_read: Arc<AtomicU64>,
    /// A compressed folder's dense copy, removed with the checkpoint.
    _decompressed: Option<Arc<crate::scratch::Guard>>,
}

pub use super::shard::{INDEX_FILE, SINGLE_FILE};

impl Checkpoint {
    /// Opens `dir`: reads config.json, maps every shard, validates headers.
    pub fn open(dir: &Path) -> Result<Self, ModelError> {
        if dir.is_file() {
            let hint = if dir.extension().is_some_and(|e| e == "gguf") {
                format!(
                    "; convert it first: prunemem convert --gguf {} --out DIR",
                    dir.display()
                )
            } else {
                String::new()
            };
            return Err(ModelError::Checkpoint(format!(
                "{} is a file; --model expects a folder with config.json and safetensors weights{hint}",
                dir.display()
            )));
        }
        if !dir.is_dir() {
            return Err(ModelError::io(dir, "no such folder"));
        }
        if super::compressed::declared_format(dir).is_some() {
            return Self::open_compressed(dir);
        }
        let config = LlamaConfig::from_file(&dir.join("config.json"))?;
        let index = dir.join(INDEX_FILE);
        let (files, weight_map, sharded) = if index.is_file() {
            let (files, map) = read_index(&index)?;
            (files, Some(map), true)
        } else if dir.join(SINGLE_FILE).is_file() {
            (vec![SINGLE_FILE.to_string()], None, false)
        } else {
            return Err(ModelError::Checkpoint(format!(
                "{}: no {SINGLE_FILE} or {INDEX_FILE}",
                dir.display()
            )));
        };
        let mut shards = Vec::new();
        let mut tensors = BTreeMap::new();
        for (i, file) in files.iter().enumerate() {
            // An index's shard names stay in the model's folder.
            let inside = std::path::Path::new(file)
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)));
            if !inside {
                return Err(ModelError::Checkpoint(format!(
                    "{}: the shard index names '{}', outside the model's folder",
                    crate::input::shown(&index),
                    crate::input::escape(file)
                )));
            }
            let path = dir.join(file);
            if !path.is_file() {
                return Err(ModelError::Checkpoint(format!(
                    "{}: the shard index names {file}, which does not exist",
                    index.display()
                )));
            }
            let (shard, entries) = map_shard(&path, i)?;
            for (name, entry) in entries {
                if let Some(map) = &weight_map
                    && map.get(&name).is_some_and(|f| f != file)
                {
                    continue;
                }
                tensors.insert(name, entry);
            }
            shards.push(shard);
        }
        if let Some(map) = &weight_map {
            for (name, file) in map {
                if !tensors.contains_key(name) {
                    return Err(ModelError::Checkpoint(format!(
                        "{}: the shard index places '{name}' in {file}, which does not contain it",
                        index.display()
                    )));
                }
            }
        }
        let ckpt = Self {
            dir: dir.to_path_buf(),
            config,
            shards,
            tensors,
            sharded,
            bytes_read: Arc::default(),
            _decompressed: None,
        };
        ckpt.check_required()?;
        Ok(ckpt)
    }

    /// A compressed-tensors sparse folder: decompressed into a scratch
    /// folder (one weight at a time; disk, not memory, holds the dense
    /// copy), which is opened and removed when the checkpoint drops.
    fn open_compressed(dir: &Path) -> Result<Self, ModelError> {
        let scratch = crate::scratch::dir("decompressed").map_err(|e| ModelError::io(dir, e))?;
        super::compressed::decompress(dir, scratch.path())?;
        super::compressed::copy_side_files(dir, scratch.path())?;
        let mut ckpt = Self::open(scratch.path())?;
        ckpt._decompressed = Some(Arc::new(scratch));
        Ok(ckpt)
    }

    /// Every tensor the config implies must exist with the right shape and a
    /// loadable dtype; checked up front so a run fails before it starts.
    fn check_required(&self) -> Result<(), ModelError> {
        let c = &self.config;
        let (h, q, kv, i) = (
            c.hidden_size,
            c.num_heads * c.head_dim,
            c.num_kv_heads * c.head_dim,
            c.intermediate_size,
        );
        let mut want: Vec<(String, Vec<usize>)> = vec![
            ("model.embed_tokens.weight".into(), vec![c.vocab_size, h]),
            ("model.norm.weight".into(), vec![h]),
        ];
        if !c.tie_word_embeddings {
            want.push(("lm_head.weight".into(), vec![c.vocab_size, h]));
        }
        for l in 0..c.num_layers {
            let p = format!("model.layers.{l}.");
            for (name, shape) in [
                ("self_attn.q_proj.weight", vec![q, h]),
                ("self_attn.k_proj.weight", vec![kv, h]),
                ("self_attn.v_proj.weight", vec![kv, h]),
                ("self_attn.o_proj.weight", vec![h, q]),
                ("mlp.gate_proj.weight", vec![i, h]),
                ("mlp.up_proj.weight", vec![i, h]),
                ("mlp.down_proj.weight", vec![h, i]),
                ("input_layernorm.weight", vec![h]),
                ("post_attention_layernorm.weight", vec![h]),
            ] {
                want.push((format!("{p}{name}"), shape));
            }
            if c.qkv_bias {
                want.push((format!("{p}self_attn.q_proj.bias"), vec![q]));
                want.push((format!("{p}self_attn.k_proj.bias"), vec![kv]));
                want.push((format!("{p}self_attn.v_proj.bias"), vec![kv]));
            }
            if c.o_bias {
                want.push((format!("{p}self_attn.o_proj.bias"), vec![h]));
            }
        }
        for (name, shape) in want {
            let entry = self.entry(&name)?;
            if entry.shape != shape {
                return Err(ModelError::Shape {
                    name,
                    expected: shape,
                    found: entry.shape.clone(),
                });
            }
            if !dtype::is_loadable(entry.dtype) {
                return Err(ModelError::Dtype {
                    name,
                    dtype: format!("{:?}", entry.dtype),
                });
            }
        }
        Ok(())
    }

    pub fn entry(&self, name: &str) -> Result<&TensorEntry, ModelError> {
        self.tensors
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_string(),
                dir: self.dir.display().to_string(),
            })
    }

    /// Raw stored bytes of a tensor (a view into the mapping).
    pub fn bytes(&self, name: &str) -> Result<&[u8], ModelError> {
        let e = self.entry(name)?;
        Ok(&self.shards[e.shard].mmap[e.start..e.end])
    }

    /// A tensor decoded to f32, in its stored (PyTorch) orientation.
    pub fn read_f32(&self, name: &str) -> Result<Vec<f32>, ModelError> {
        // Decoded 8 MiB at a time straight from the mapping, each piece on
        // every core and released once decoded: only the f32 result is ever
        // held whole. (One core decoding a 1B shape's bf16 table took about
        // 0.8 s of each GradProbe pass on an H200's host.)
        let e = self.entry(name)?;
        let mmap = &self.shards[e.shard].mmap;
        let width = (e.dtype.bitsize() / 8).max(1);
        let _tag = crate::memory::tag::tag(crate::memory::tag::Category::Weights);
        let _io = crate::timing::work(crate::timing::Work::Io);
        let mut out = bytemuck::allocation::zeroed_vec::<f32>((e.end - e.start) / width);
        let chunk = READ_CHUNK / width * width;
        for_each_chunk_releasing(mmap, e.start, e.end, chunk, |a, piece| {
            let at = (a - e.start) / width;
            let dst = &mut out[at..at + piece.len() / width];
            dtype::decode_f32_parallel(piece, e.dtype, dst)
                .map_err(|i| ModelError::Checkpoint(dtype::non_finite(name, at + i)))
        })?;
        self.bytes_read
            .fetch_add((e.end - e.start) as u64, Ordering::Relaxed);
        Ok(out)
    }

    /// Drops a tensor's pages from the resident set (see [`release_range`]).
    pub fn release(&self, name: &str) {
        if let Some(e) = self.tensors.get(name) {
            release_range(&self.shards[e.shard].mmap, e.start, e.end);
        }
    }

    /// Counts `bytes` read from the mapping by a reader outside this file
    /// (`model::vocab`'s row gather).
    pub(crate) fn count_read(&self, bytes: u64) {
        self.bytes_read.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Tensor bytes read through this checkpoint so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Ordering::Relaxed)
    }

    /// The dtype most weights are stored in (`f32`, `bf16`...).
    pub fn stored_dtype(&self) -> Dtype {
        self.entry("model.embed_tokens.weight")
            .map(|e| e.dtype)
            .unwrap_or(Dtype::F32)
    }

    /// Bytes of all tensors as stored.
    pub fn stored_bytes(&self) -> u64 {
        self.tensors
            .values()
            .map(|e| (e.end - e.start) as u64)
            .sum()
    }

    /// Bytes of decoder layer `i` as stored.
    pub fn layer_bytes(&self, i: usize) -> u64 {
        let p = format!("model.layers.{i}.");
        self.tensors
            .range(p.clone()..)
            .take_while(|(n, _)| n.starts_with(&p))
            .map(|(_, e)| (e.end - e.start) as u64)
            .sum()
    }

    /// A lazy snapshot of `name`, exposed at module path `local`.
    fn snapshot(
        &self,
        name: &str,
        local: &str,
        target: ComputeDtype,
    ) -> Result<TensorSnapshot, ModelError> {
        let e = self.entry(name)?.clone();
        let mmap = self.shards[e.shard].mmap.clone();
        let counter = self.bytes_read.clone();
        let shape = e.shape.clone();
        let tensor = name.to_string();
        let data_fn = Rc::new(move || -> Result<TensorData, TensorSnapshotError> {
            convert(&mmap, &e, target, &tensor, &counter).map_err(TensorSnapshotError::DataError)
        });
        Ok(TensorSnapshot::from_closure(
            data_fn,
            target.burn(),
            shape.into(),
            local.split('.').map(str::to_string).collect(),
            Vec::new(),
            burn::module::ParamId::new(),
        ))
    }

    /// Applies every checkpoint tensor under `prefix` to `module` (paths
    /// relative to the prefix). Errors on missing or malformed tensors.
    fn apply<B: Backend, M: Module<B> + ModuleSnapshot<B>>(
        &self,
        module: &mut M,
        prefix: &str,
        target: ComputeDtype,
    ) -> Result<(), ModelError> {
        let mut snapshots = Vec::new();
        for name in self
            .tensors
            .range(prefix.to_string()..)
            .map(|(n, _)| n)
            .take_while(|n| n.starts_with(prefix))
        {
            snapshots.push(self.snapshot(name, &name[prefix.len()..], target)?);
        }
        let _tag = crate::memory::tag::tag(crate::memory::tag::Category::Weights);
        let _io = crate::timing::work(crate::timing::Work::Io);
        let result = module.apply(snapshots, None, Some(Box::new(PyTorchToBurnAdapter)), false);
        if let Some(err) = result.errors.first() {
            let why = match err {
                // Our own reason (a damaged tensor), without burn's wrapping.
                burn_store::ApplyError::LoadError { message, .. } => message
                    .find("tensor '")
                    .map(|i| message[i..].trim_end_matches([')', '"']).to_string())
                    .unwrap_or_else(|| message.clone()),
                other => other.to_string(),
            };
            return Err(ModelError::Checkpoint(format!(
                "{}: loading {prefix}: {why}",
                self.dir.display()
            )));
        }
        if let Some((missing, _)) = result.missing.first() {
            return Err(ModelError::MissingTensor {
                name: format!("{prefix}{missing}"),
                dir: self.dir.display().to_string(),
            });
        }
        Ok(())
    }

    /// Loads decoder layer `i` (only its bytes are read).
    pub fn load_layer<B: Backend>(
        &self,
        i: usize,
        dtype: ComputeDtype,
        device: &B::Device,
    ) -> Result<DecoderLayer<B>, ModelError> {
        let mut layer = skeleton_layer::<B>(&self.config, device);
        self.apply(&mut layer, &format!("model.layers.{i}."), dtype)?;
        Ok(layer)
    }

    /// Loads the token embeddings.
    pub fn load_embedding<B: Backend>(
        &self,
        dtype: ComputeDtype,
        device: &B::Device,
    ) -> Result<Embedding<B>, ModelError> {
        let c = &self.config;
        let mut e = EmbeddingConfig::new(c.vocab_size, c.hidden_size).init(device);
        self.apply(&mut e, "model.embed_tokens.", dtype)?;
        Ok(e)
    }

    /// Loads the final norm.
    pub fn load_norm<B: Backend>(
        &self,
        dtype: ComputeDtype,
        device: &B::Device,
    ) -> Result<LlamaRmsNorm<B>, ModelError> {
        let mut n = skeleton_norm::<B>(&self.config, device);
        self.apply(&mut n, "model.norm.", dtype)?;
        Ok(n)
    }

    /// Loads the separate output head; `None` when tied to the embeddings.
    pub fn load_lm_head<B: Backend>(
        &self,
        dtype: ComputeDtype,
        device: &B::Device,
    ) -> Result<Option<Linear<B>>, ModelError> {
        let c = &self.config;
        if c.tie_word_embeddings {
            return Ok(None);
        }
        let mut head = LinearConfig::new(c.hidden_size, c.vocab_size)
            .with_bias(false)
            .init(device);
        self.apply(&mut head, "lm_head.", dtype)?;
        Ok(Some(head))
    }

    /// Loads the whole model.
    pub fn load_model<B: Backend>(
        &self,
        dtype: ComputeDtype,
        device: &B::Device,
    ) -> Result<Llama<B>, ModelError> {
        let layers = (0..self.config.num_layers)
            .map(|i| self.load_layer(i, dtype, device))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Llama {
            model: LlamaModel {
                embed_tokens: self.load_embedding(dtype, device)?,
                layers,
                norm: self.load_norm(dtype, device)?,
            },
            lm_head: self.load_lm_head(dtype, device)?,
        })
    }
}

/// A tensor of the mapping converted to `target`, 8 MiB at a time, each
/// piece checked and released: the tensor is held once, typed.
fn convert(
    mmap: &memmap2::Mmap,
    e: &TensorEntry,
    target: ComputeDtype,
    tensor: &str,
    counter: &AtomicU64,
) -> Result<TensorData, String> {
    const CHUNK: usize = 8 << 20;
    let width = (e.dtype.bitsize() / 8).max(1);
    let mut out = dtype::Converted::with_capacity(target, (e.end - e.start) / width);
    let mut a = e.start;
    while a < e.end {
        let b = (a + CHUNK / width * width).min(e.end);
        if let Some(i) = dtype::first_non_finite(&mmap[a..b], e.dtype) {
            let at = (a - e.start) / width + i;
            return Err(dtype::non_finite(tensor, at));
        }
        out.extend(&mmap[a..b], e.dtype);
        release_range(mmap, a, b);
        a = b;
    }
    counter.fetch_add((e.end - e.start) as u64, Ordering::Relaxed);
    Ok(out.into_data(e.shape.clone()))
}

impl Checkpoint {
    /// 2-D tensor `name` converted to `target` and transposed (a linear's
    /// PyTorch `[out, in]` as Burn's `[in, out]`) in one pass on every core
    /// (`dtype::convert_transposed`); any thread may read.
    pub fn read_transposed(
        &self,
        name: &str,
        target: ComputeDtype,
    ) -> Result<TensorData, ModelError> {
        self.read_with(name, |bytes, e| {
            let [rows, cols] = e.shape[..] else {
                return Err(ModelError::Checkpoint(format!(
                    "tensor '{name}' has shape {:?}, not a matrix",
                    e.shape
                )));
            };
            dtype::convert_transposed(bytes, e.dtype, target, [rows, cols])
                .map_err(|at| ModelError::Checkpoint(dtype::non_finite(name, at)))
        })
    }

    /// Tensor `name` converted to `target`, in its stored (PyTorch)
    /// orientation; any thread may read (a device run's layer reader).
    /// Converted on every core (`dtype::convert_parallel`).
    pub fn read_converted(
        &self,
        name: &str,
        target: ComputeDtype,
    ) -> Result<TensorData, ModelError> {
        self.read_with(name, |bytes, e| {
            dtype::convert_parallel(bytes, e.dtype, target, e.shape.clone())
                .map_err(|at| ModelError::Checkpoint(dtype::non_finite(name, at)))
        })
    }

    /// Tensor `name`'s stored bytes through `convert`, then its pages
    /// handed back and its bytes counted.
    fn read_with(
        &self,
        name: &str,
        convert: impl FnOnce(&[u8], &TensorEntry) -> Result<TensorData, ModelError>,
    ) -> Result<TensorData, ModelError> {
        let e = self.entry(name)?;
        let mmap = &self.shards[e.shard].mmap;
        let data = convert(&mmap[e.start..e.end], e)?;
        release_range(mmap, e.start, e.end);
        self.bytes_read
            .fetch_add((e.end - e.start) as u64, Ordering::Relaxed);
        Ok(data)
    }
}

/// A layer with lazily-initialised parameters of the right shapes; loading
/// replaces them without ever running the initialisers.
pub fn skeleton_layer<B: Backend>(c: &LlamaConfig, device: &B::Device) -> DecoderLayer<B> {
    let (h, q, kv, i) = (
        c.hidden_size,
        c.num_heads * c.head_dim,
        c.num_kv_heads * c.head_dim,
        c.intermediate_size,
    );
    let lin = |inp: usize, out: usize, bias: bool| {
        LinearConfig::new(inp, out).with_bias(bias).init(device)
    };
    DecoderLayer {
        self_attn: LlamaAttention {
            q_proj: lin(h, q, c.qkv_bias),
            k_proj: lin(h, kv, c.qkv_bias),
            v_proj: lin(h, kv, c.qkv_bias),
            o_proj: lin(q, h, c.o_bias),
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            sliding_window: c.sliding_window.unwrap_or(0),
        },
        mlp: LlamaMlp {
            gate_proj: lin(h, i, c.mlp_bias),
            up_proj: lin(h, i, c.mlp_bias),
            down_proj: lin(i, h, c.mlp_bias),
        },
        input_layernorm: skeleton_norm(c, device),
        post_attention_layernorm: skeleton_norm(c, device),
    }
}

fn skeleton_norm<B: Backend>(c: &LlamaConfig, device: &B::Device) -> LlamaRmsNorm<B> {
    LlamaRmsNorm::new(Tensor::ones([c.hidden_size], device), c.rms_norm_eps)
}

impl super::compressed::Dense for Checkpoint {
    fn folder(&self) -> &Path {
        &self.dir
    }
    fn shards(&self) -> &[Shard] {
        &self.shards
    }
    fn tensors(&self) -> &BTreeMap<String, TensorEntry> {
        &self.tensors
    }
    fn bytes(&self, name: &str) -> Result<&[u8], ModelError> {
        Checkpoint::bytes(self, name)
    }
    fn release(&self, name: &str) {
        Checkpoint::release(self, name)
    }
    fn stored_bytes(&self) -> u64 {
        Checkpoint::stored_bytes(self)
    }
}
