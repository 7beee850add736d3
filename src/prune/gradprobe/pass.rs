//! One gradient pass of GradProbe, layer by layer: its inputs, the state it
//! carries between passes and what it folds (the phases that run it are in
//! `phases.rs`, which depends on this file).
//!
//! Forward: embed every batch, run it through each streamed layer and keep
//! only the layer-boundary activations `x_0 … x_L`. Backward: the loss and
//! head by hand ([`super::head`]), the final norm under autodiff, then each
//! layer from last to first: reload it under autodiff, recompute it from its
//! boundary input, push the upstream gradient through it (backward of
//! `sum(y ⊙ g)`), fold its weight gradients into the running max at the
//! candidates, pass the input gradient down and drop the boundary. Embedding
//! gradients come last, from the layer-0 input gradient. At no time is more
//! than one layer's weights, activations or gradients alive.
//!
//! The original pass (steps 1–2) chooses the candidates as it reaches each
//! tensor and stores their gradient maxima; the modified pass (steps 3–5)
//! loads every tensor with its candidates × reduction factor and decides a
//! layer as soon as its maxima are final.

use crate::exec::Compute;
use crate::memory::held::{Held, tensor_bytes};
use crate::memory::tag::{self, Category};
use std::collections::{BTreeMap, HashMap};

use burn::prelude::*;

use super::select::{self, GradPrecision, StoredGrads};
use super::{GradProbeConfig, Masks, Target};
use crate::model::Checkpoint;
use crate::model::llama::LinearInput;
use crate::profiler::Profiler;

/// One calibration batch: inputs `[b][seqlen]` and the next tokens, flat.
pub struct Batch {
    pub(super) inputs: Vec<Vec<u32>>,
    pub(super) targets: Vec<u32>,
}

impl Batch {
    pub fn new(windows: &[Vec<u32>]) -> Self {
        let s = windows.iter().map(Vec::len).min().unwrap_or(1) - 1;
        Self {
            inputs: windows.iter().map(|w| w[..s].to_vec()).collect(),
            targets: windows.iter().flat_map(|w| w[1..=s].to_vec()).collect(),
        }
    }
}

/// Layer `i` read from the checkpoint and uploaded in f32 (the passes'
/// and step 6's dtype) as the prune's layer loop loads it
/// (`engine::counted_layer`: converted on every core, not through
/// burn-store's adapter, which took 1.9 s a layer of a 1B shape on an
/// H200), in the `load_layer` phase whichever phase asks, its upload
/// counted on a device.
pub(super) fn load_layer_f32<B: Compute>(
    ckpt: &Checkpoint,
    i: usize,
    device: &B::Device,
) -> Result<crate::model::llama::DecoderLayer<B>, crate::prune::PruneError> {
    let f32 = crate::model::ComputeDtype::F32;
    crate::prune::engine::counted_layer::<B>(ckpt, i, None, f32, device)
}

/// Every batch's layer-boundary activations `x_0 … x_L`, the only
/// activations a pass keeps; their device bytes are held as activations
/// (`memory::held`), and a popped boundary's go with it.
pub struct Boundaries<B: Compute> {
    xs: Vec<Vec<Tensor<B, 3>>>,
    held: Held,
}

fn bytes_of<B: Compute>(x: &[Tensor<B, 3>]) -> u64 {
    x.iter().map(tensor_bytes).sum()
}

impl<B: Compute> Default for Boundaries<B> {
    fn default() -> Self {
        Self {
            xs: Vec::new(),
            held: Held::none(Category::Activations),
        }
    }
}

impl<B: Compute> Boundaries<B> {
    /// The next boundary, one tensor per batch.
    pub fn push(&mut self, x: Vec<Tensor<B, 3>>) {
        self.held.set(self.held.bytes() + bytes_of(&x));
        self.xs.push(x);
    }

    /// The last boundary pushed.
    pub fn last(&self) -> &[Tensor<B, 3>] {
        self.xs.last().map_or(&[], Vec::as_slice)
    }

    /// The last boundary, its bytes held by the returned guard until the
    /// caller has used it.
    pub fn pop(&mut self) -> (Vec<Tensor<B, 3>>, Held) {
        let x = self.xs.pop().unwrap_or_default();
        let bytes = bytes_of(&x);
        self.held.set(self.held.bytes().saturating_sub(bytes));
        (x, Held::new(Category::Activations, bytes))
    }
}

/// Max over batches of each input column's L2 norm (the reference's
/// `WANDAPruning` statistic), per layer and linear input, and of the final
/// hidden state (input of a separate head).
#[derive(Debug, Clone, Default)]
pub struct Norms {
    pub(super) layers: Vec<HashMap<LinearInput, Vec<f32>>>,
    pub(super) head: Vec<f32>,
}

pub(super) fn fold_norms<B: Compute>(acc: &mut Vec<f32>, x: &Tensor<B, 3>) {
    let c = x.dims()[2];
    let squares = x.clone().square();
    let n = crate::exec::reduce::sum_dim(crate::exec::reduce::sum_dim(squares, 0), 1)
        .sqrt()
        .reshape([c])
        .into_data();
    if B::is_device() {
        crate::exec::transfer::read_back(n.bytes.len() as u64);
    }
    let n: Vec<f32> = n.into_vec().unwrap_or_default();
    if acc.is_empty() {
        *acc = n;
    } else {
        for (a, v) in acc.iter_mut().zip(n) {
            *a = a.max(v);
        }
    }
}

pub(super) fn input_of(linear: &str) -> LinearInput {
    LinearInput::ALL
        .into_iter()
        .find(|i| i.linears().contains(&linear))
        .unwrap_or(LinearInput::Qkv)
}

/// Which pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    Original,
    Modified,
}

/// What a pass reads.
pub struct Input<'a, B: Compute> {
    /// The device the pass computes on.
    pub device: &'a B::Device,
    pub ckpt: &'a Checkpoint,
    pub config: &'a GradProbeConfig,
    pub batches: &'a [Batch],
    pub targets: &'a [Target],
    pub profiler: &'a Profiler,
    /// Layers kept on the device between passes (`None`: streamed).
    pub(super) resident: Option<&'a super::resident::Resident<B>>,
}

/// What the passes carry between them.
pub struct State<'a> {
    /// Already zero (earlier iterative steps): applied on every load,
    /// borrowed from the iteration, which holds them anyway.
    pub pruned: &'a Masks,
    pub tentative: Masks,
    pub original: BTreeMap<String, StoredGrads>,
    pub decided: Masks,
    pub norms: Option<Norms>,
    precision: GradPrecision,
}

impl<'a> State<'a> {
    pub fn new(pruned: &'a Masks, norms: Option<Norms>, precision: GradPrecision) -> Self {
        Self {
            pruned,
            tentative: Masks::new(),
            original: BTreeMap::new(),
            decided: Masks::new(),
            norms,
            precision,
        }
    }

    /// Bytes of candidate state, for stage snapshots.
    pub fn components(&self) -> BTreeMap<String, u64> {
        let positions = |m: &Masks| m.values().map(|v| v.len() as u64 * 4).sum::<u64>();
        let maxima = match self.precision {
            GradPrecision::F16 => "original maxima (f16)",
            GradPrecision::F32 => "original maxima (f32)",
        };
        let mut c = BTreeMap::new();
        c.insert(
            "candidate positions (u32)".into(),
            positions(&self.tentative),
        );
        c.insert(
            maxima.into(),
            self.original.values().map(StoredGrads::bytes).sum(),
        );
        c.insert("pruned positions (u32)".into(), positions(&self.decided));
        c.insert(
            "earlier steps' pruning (u32)".into(),
            positions(self.pruned),
        );
        c
    }

    /// Whether [`State::prepare`] changes `name` in this pass (earlier
    /// steps pruned it, or the modified pass reduces its candidates).
    pub(super) fn changes(&self, which: Which, name: &str) -> bool {
        let some = |m: &Masks| m.get(name).is_some_and(|p| !p.is_empty());
        some(self.pruned) || (which == Which::Modified && some(&self.tentative))
    }

    /// Zeroes already-pruned weights of `name`, and in the modified pass
    /// multiplies its candidates by the reduction factor.
    pub(super) fn prepare(&self, which: Which, name: &str, values: &mut [f32], reduction: f64) {
        if let Some(p) = self.pruned.get(name) {
            select::scale_at(values, p, 0.0);
        }
        if which == Which::Modified
            && let Some(t) = self.tentative.get(name)
        {
            select::scale_at(values, t, reduction as f32);
        }
    }

    /// Records a finished tensor's gradient maxima.
    pub(super) fn finish(&mut self, which: Which, name: &str, maxima: Vec<f32>, threshold: f64) {
        match which {
            Which::Original => {
                let stored = StoredGrads::store(maxima, self.precision);
                self.original.insert(name.to_string(), stored);
            }
            Which::Modified => {
                let positions = self.tentative.get(name).map_or(&[][..], |v| v);
                let decided = match self.original.remove(name) {
                    Some(o) => tag::tagged(Category::Masks, || {
                        select::decide(positions, &o, &maxima, threshold)
                    }),
                    None => Vec::new(),
                };
                self.decided.insert(name.to_string(), decided);
            }
        }
    }
}

/// The activation norms (each a maximum over batches) as maxima over every
/// rank's batches, reduced in a fixed order (layer by layer, the inputs in
/// `LinearInput::ALL` order, then the head's).
pub(super) fn max_across_ranks(norms: &mut Norms) {
    let reducer = crate::exec::dist::reducer();
    if reducer.world().1 == 1 {
        return;
    }
    for layer in norms.layers.iter_mut() {
        for input in crate::model::llama::LinearInput::ALL {
            if let Some(v) = layer.get_mut(&input) {
                reducer.max_f32(v);
            }
        }
    }
    reducer.max_f32(&mut norms.head);
}

/// The norms the Wanda strategy weighs layer `i`'s linear `name` by (its
/// input's), or `None` (magnitude).
pub(super) fn strategy_norms<'a>(
    config: &GradProbeConfig,
    norms: Option<&'a Norms>,
    i: usize,
    name: &str,
) -> Option<&'a [f32]> {
    norms
        .filter(|_| config.strategy == select::Strategy::Wanda)
        .and_then(|n| n.layers.get(i))
        .and_then(|m| m.get(&input_of(name)))
        .map(Vec::as_slice)
}
