//! One gradient pass of GradProbe, layer by layer.
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

use std::collections::{BTreeMap, BTreeSet, HashMap};

use burn::backend::{Autodiff, Flex};
use burn::module::{AutodiffModule, Param};
use burn::prelude::*;

use super::head::{WeightGrad, head_backward};
use super::select::{self, GradPrecision, StoredGrads};
use super::{EMBED, GradProbeConfig, HEAD, Masks, Target};
use crate::model::llama::{DecoderLayer, LAYER_LINEARS, LinearInput, LlamaRmsNorm};
use crate::model::{Checkpoint, ComputeDtype, Rope};
use crate::profiler::Profiler;
use crate::prune::PruneError;
use crate::prune::engine::{set_weight, weight_out_in};

type Ad = Autodiff<Flex>;

/// One calibration batch: inputs `[b][seqlen]` and the next tokens, flat.
pub struct Batch {
    inputs: Vec<Vec<u32>>,
    targets: Vec<u32>,
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

/// Max over batches of each input column's L2 norm (the reference's
/// `WANDAPruning` statistic), per layer and linear input, and of the final
/// hidden state (input of a separate head).
#[derive(Debug, Clone, Default)]
pub struct Norms {
    layers: Vec<HashMap<LinearInput, Vec<f32>>>,
    head: Vec<f32>,
}

fn fold_norms(acc: &mut Vec<f32>, x: &Tensor<Flex, 3>) {
    let c = x.dims()[2];
    let n: Vec<f32> = x
        .clone()
        .square()
        .sum_dim(0)
        .sum_dim(1)
        .sqrt()
        .reshape([c])
        .into_data()
        .into_vec()
        .unwrap_or_default();
    if acc.is_empty() {
        *acc = n;
    } else {
        for (a, v) in acc.iter_mut().zip(n) {
            *a = a.max(v);
        }
    }
}

fn input_of(linear: &str) -> LinearInput {
    [
        LinearInput::Qkv,
        LinearInput::O,
        LinearInput::GateUp,
        LinearInput::Down,
    ]
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
pub struct Input<'a> {
    pub ckpt: &'a Checkpoint,
    pub config: &'a GradProbeConfig,
    pub batches: &'a [Batch],
    pub targets: &'a [Target],
    pub profiler: &'a Profiler,
}

/// What the passes carry between them.
pub struct State {
    /// Already zero (earlier iterative steps): applied on every load.
    pub pruned: Masks,
    pub tentative: Masks,
    pub original: BTreeMap<String, StoredGrads>,
    pub decided: Masks,
    pub norms: Option<Norms>,
    precision: GradPrecision,
}

impl State {
    pub fn new(pruned: Masks, norms: Option<Norms>, precision: GradPrecision) -> Self {
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
            positions(&self.pruned),
        );
        c
    }

    /// Zeroes already-pruned weights of `name`, and in the modified pass
    /// multiplies its candidates by the reduction factor.
    fn prepare(&self, which: Which, name: &str, values: &mut [f32], reduction: f64) {
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
    fn finish(&mut self, which: Which, name: &str, maxima: Vec<f32>, threshold: f64) {
        match which {
            Which::Original => {
                let stored = StoredGrads::store(maxima, self.precision);
                self.original.insert(name.to_string(), stored);
            }
            Which::Modified => {
                let positions = self.tentative.get(name).map_or(&[][..], |v| v);
                let decided = match self.original.remove(name) {
                    Some(o) => select::decide(positions, &o, &maxima, threshold),
                    None => Vec::new(),
                };
                self.decided.insert(name.to_string(), decided);
            }
        }
    }
}

/// Runs one pass; returns the mean calibration loss.
pub fn run(input: Input<'_>, state: &mut State, which: Which) -> Result<f64, PruneError> {
    let Input {
        ckpt,
        config,
        batches,
        targets,
        profiler,
    } = input;
    let c = &ckpt.config;
    let device = Default::default();
    let dtype = ComputeDtype::F32;
    let probed: BTreeSet<&str> = targets.iter().map(|t| t.name.as_str()).collect();
    let seqlen = batches.first().map_or(1, |b| b.inputs[0].len());
    let rope = Rope::<Flex>::new(c, seqlen, dtype.burn(), &device);
    let tag = match which {
        Which::Original => "original",
        Which::Modified => "modified",
    };
    let collect_norms = which == Which::Original
        && config.strategy == select::Strategy::Wanda
        && state.norms.is_none();
    let mut norms = Norms::default();

    // Embedding (tentative candidates of a probed embedding were chosen in
    // the original pass, so the modified pass can reduce them here).
    let mut embed_w = ckpt.read_f32(EMBED)?;
    state.prepare(which, EMBED, &mut embed_w, config.reduction_factor);
    let d = c.hidden_size;
    let mut xs: Vec<Vec<Tensor<Flex, 3>>> = vec![
        batches
            .iter()
            .map(|b| {
                let rows: Vec<f32> = b
                    .inputs
                    .iter()
                    .flatten()
                    .flat_map(|t| {
                        embed_w[*t as usize * d..(*t as usize + 1) * d]
                            .iter()
                            .copied()
                    })
                    .collect();
                let (n, s) = (b.inputs.len(), b.inputs[0].len());
                Tensor::from_data(TensorData::new(rows, [n, s, d]), &device)
            })
            .collect(),
    ];
    drop(embed_w);

    // Forward, keeping the boundaries.
    for i in 0..c.num_layers {
        crate::memory::alloc::trim();
        let mut layer = ckpt.load_layer::<Flex>(i, dtype, &device)?;
        for name in LAYER_LINEARS {
            let full = format!("model.layers.{i}.{name}.weight");
            if state.pruned.contains_key(&full) || which == Which::Modified {
                let (mut w, out, inp) = weight_out_in(&layer, name);
                state.prepare(which, &full, &mut w, config.reduction_factor);
                set_weight(&mut layer, name, w, out, inp, dtype, &device);
            }
        }
        let mut layer_norms: HashMap<LinearInput, Vec<f32>> = HashMap::new();
        let next: Vec<Tensor<Flex, 3>> = xs[i]
            .iter()
            .map(|x| {
                if collect_norms {
                    layer.forward_traced(x.clone(), &rope, &mut |k, t| {
                        fold_norms(layer_norms.entry(k).or_default(), t)
                    })
                } else {
                    layer.forward(x.clone(), &rope)
                }
            })
            .collect();
        norms.layers.push(layer_norms);
        xs.push(next);
        profiler.progress(
            i,
            2 * c.num_layers + 2,
            &format!("{tag}: forward layer {i}"),
        );
    }
    let final_norm = ckpt.load_norm::<Flex>(dtype, &device)?;
    if collect_norms {
        for x in &xs[c.num_layers] {
            fold_norms(&mut norms.head, &final_norm.forward(x.clone()));
        }
    }
    drop(final_norm);
    if collect_norms {
        state.norms = Some(norms);
    }

    // Head and loss.
    let head_name = if c.tie_word_embeddings { EMBED } else { HEAD };
    let mut head_w = ckpt.read_f32(head_name)?;
    let head_probed = probed.contains(head_name);
    if which == Which::Original && head_probed {
        let n = (head_name == HEAD)
            .then(|| state.norms.as_ref().map(|n| n.head.as_slice()))
            .flatten()
            .filter(|_| config.strategy == select::Strategy::Wanda);
        // The original pass only zeroes earlier steps' pruning, so the
        // prepared head is the current model's.
        state.prepare(which, head_name, &mut head_w, config.reduction_factor);
        let t = select::tentative(&head_w, c.hidden_size, n, config.sparsity);
        state.tentative.insert(head_name.to_string(), t);
    } else {
        state.prepare(which, head_name, &mut head_w, config.reduction_factor);
    }
    if which == Which::Original && probed.contains(EMBED) && head_name != EMBED {
        let mut w = ckpt.read_f32(EMBED)?;
        state.prepare(which, EMBED, &mut w, 0.0);
        let t = select::tentative(&w, c.hidden_size, None, config.sparsity);
        state.tentative.insert(EMBED.to_string(), t);
    }
    let head = Tensor::<Flex, 2>::from_data(
        TensorData::new(head_w, [c.vocab_size, c.hidden_size]),
        &device,
    );
    let mut held = state.components();
    held.insert(
        "head weight (f32)".into(),
        (c.vocab_size * c.hidden_size * 4) as u64,
    );
    let tokens: usize = batches.iter().map(|b| b.targets.len()).sum();
    held.insert(
        "boundary activations".into(),
        ((c.num_layers + 1) * tokens * c.hidden_size * 4) as u64,
    );
    profiler.components(&format!("{tag} pass, head"), held);
    let norm_ad = LlamaRmsNorm::<Ad>::from_inner(ckpt.load_norm::<Flex>(dtype, &device)?);
    let head_positions = state.tentative.get(head_name).cloned().unwrap_or_default();
    let embed_positions = state.tentative.get(EMBED).cloned().unwrap_or_default();
    let mut head_max = vec![0f32; head_positions.len()];
    let mut embed_max = vec![0f32; embed_positions.len()];
    let tied_probed = head_probed && head_name == EMBED;
    // Tied and probed: a candidate in a row the batch also looks up gets the
    // lookup gradient added before |·| is taken; the rest fold now.
    let mut deferred: Vec<HashMap<usize, f32>> = Vec::with_capacity(batches.len());
    let mut grads: Vec<Tensor<Flex, 3>> = Vec::with_capacity(batches.len());
    let mut loss = 0.0;
    for (b, x) in batches.iter().zip(xs.pop().unwrap_or_default()) {
        let [n, s, d] = x.dims();
        let x_ad = Tensor::<Ad, 3>::from_inner(x).require_grad();
        let h = norm_ad.forward(x_ad.clone());
        let rows: BTreeSet<u32> = b.inputs.iter().flatten().copied().collect();
        let mut held = HashMap::new();
        let mut sink = |k: usize, g: f32| {
            let row = head_positions[k] as usize / d;
            if tied_probed && rows.contains(&(row as u32)) {
                held.insert(k, g);
            } else if g.abs() > head_max[k] {
                head_max[k] = g.abs();
            }
        };
        let wg: WeightGrad<'_> = head_probed.then_some((head_positions.as_slice(), &mut sink));
        let (dh, l) = head_backward(h.clone().inner().reshape([n * s, d]), &head, &b.targets, wg);
        loss += l;
        deferred.push(held);
        let g = Tensor::<Ad, 3>::from_inner(dh.reshape([n, s, d]));
        let backward = (h * g).sum().backward();
        grads.push(
            x_ad.grad(&backward)
                .unwrap_or_else(|| Tensor::zeros([n, s, d], &device)),
        );
    }
    drop(head);
    drop(norm_ad);
    profiler.progress(c.num_layers, 2 * c.num_layers + 2, &format!("{tag}: head"));

    // Layers, last to first.
    let rope_ad = Rope::<Ad>::new(c, seqlen, dtype.burn(), &device);
    for i in (0..c.num_layers).rev() {
        crate::memory::alloc::trim();
        let _scope = profiler.scope(&format!("layer_{i:02}_{tag}"));
        // Prepared on the plain backend, then wrapped: reading a tracked
        // parameter would leave an unconsumed node in the autodiff graph.
        let mut plain = ckpt.load_layer::<Flex>(i, dtype, &device)?;
        let mut names = Vec::new();
        for name in LAYER_LINEARS {
            let full = format!("model.layers.{i}.{name}.weight");
            let (mut w, out, inp) = weight_out_in(&plain, name);
            state.prepare(which, &full, &mut w, config.reduction_factor);
            if which == Which::Original && probed.contains(full.as_str()) {
                let n = state
                    .norms
                    .as_ref()
                    .filter(|_| config.strategy == select::Strategy::Wanda)
                    .and_then(|n| n.layers.get(i))
                    .and_then(|m| m.get(&input_of(name)))
                    .map(Vec::as_slice);
                let t = select::tentative(&w, inp, n, config.sparsity);
                state.tentative.insert(full.clone(), t);
            }
            set_weight(&mut plain, name, w, out, inp, dtype, &device);
            names.push((name, full));
        }
        let mut layer = DecoderLayer::<Ad>::from_inner(plain);
        for name in LAYER_LINEARS {
            if let Some(l) = layer.linear_mut(name) {
                l.weight = Param::from_tensor(l.weight.val());
            }
        }
        let inputs = xs.pop().unwrap_or_default();
        let mut maxima: Vec<Vec<f32>> = names
            .iter()
            .map(|(_, f)| vec![0f32; state.tentative.get(f).map_or(0, Vec::len)])
            .collect();
        for (x, g) in inputs.into_iter().zip(grads.iter_mut()) {
            let x_ad = Tensor::<Ad, 3>::from_inner(x).require_grad();
            let y = layer.forward(x_ad.clone(), &rope_ad);
            let backward = (y * Tensor::<Ad, 3>::from_inner(g.clone()))
                .sum()
                .backward();
            for ((name, full), acc) in names.iter().zip(maxima.iter_mut()) {
                let Some(positions) = state.tentative.get(full) else {
                    continue;
                };
                let Some(grad) = layer
                    .linear(name)
                    .and_then(|l| l.weight.val().grad(&backward))
                else {
                    continue;
                };
                let host: Vec<f32> = grad.transpose().into_data().into_vec().unwrap_or_default();
                select::fold_max(acc, &host, positions);
            }
            if let Some(dx) = x_ad.grad(&backward) {
                *g = dx;
            }
        }
        for ((_, full), acc) in names.iter().zip(maxima) {
            if probed.contains(full.as_str()) {
                state.finish(which, full, acc, config.gradient_threshold);
            }
        }
        profiler.progress(
            2 * c.num_layers - i,
            2 * c.num_layers + 2,
            &format!("{tag}: backward layer {i}"),
        );
    }

    // Embedding: lookup gradient (plus the held head part when tied).
    if probed.contains(EMBED) {
        let d = c.hidden_size;
        let acc = if tied_probed {
            &mut head_max
        } else {
            &mut embed_max
        };
        let positions = if tied_probed {
            &head_positions
        } else {
            &embed_positions
        };
        for ((b, g), held) in batches.iter().zip(&grads).zip(&deferred) {
            let g0: Vec<f32> = g.clone().into_data().into_vec().unwrap_or_default();
            let mut lookup: BTreeMap<u32, Vec<f32>> = BTreeMap::new();
            for (t, tok) in b.inputs.iter().flatten().enumerate() {
                let row = lookup.entry(*tok).or_insert_with(|| vec![0f32; d]);
                for (r, v) in row.iter_mut().zip(&g0[t * d..(t + 1) * d]) {
                    *r += v;
                }
            }
            for (tok, row) in &lookup {
                let lo = positions.partition_point(|p| (*p as usize) < *tok as usize * d);
                let hi = positions.partition_point(|p| (*p as usize) < (*tok as usize + 1) * d);
                for k in lo..hi {
                    let v = held.get(&k).copied().unwrap_or(0.0)
                        + row[positions[k] as usize - *tok as usize * d];
                    if v.abs() > acc[k] {
                        acc[k] = v.abs();
                    }
                }
            }
        }
        let maxima = std::mem::take(acc);
        state.finish(which, EMBED, maxima, config.gradient_threshold);
    }
    if probed.contains(HEAD) && head_name == HEAD {
        state.finish(which, HEAD, head_max, config.gradient_threshold);
    }
    profiler.progress(
        2 * c.num_layers + 1,
        2 * c.num_layers + 2,
        &format!("{tag}: embeddings"),
    );
    Ok(loss / batches.len().max(1) as f64)
}
