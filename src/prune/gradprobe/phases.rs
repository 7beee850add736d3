//! The four phases of one GradProbe gradient pass ([`run`]):
//! forward through the streamed layers keeping only the boundaries; the
//! head and loss by hand; the layers again, last to first, under autodiff;
//! the embedding gradient last. Each is a timing phase (`probe_forward`,
//! `probe_head`, `probe_backward`; a layer's load, `load_layer`).

use crate::exec::Compute;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use burn::backend::Autodiff;
use burn::module::{AutodiffModule, Param};
use burn::prelude::*;

use super::head::{WeightGrad, head_backward};
use super::on_device::{self, Maxima};
use super::pass::{
    Boundaries, Input, Norms, State, Which, fold_norms, load_layer_f32, max_across_ranks,
    strategy_norms,
};
use super::{EMBED, HEAD, select};
use crate::events::stages;
use crate::memory::held::Held;
use crate::memory::tag::{self, Category};
use crate::model::llama::{DecoderLayer, LAYER_LINEARS, LlamaRmsNorm};
use crate::model::{ComputeDtype, Rope};
use crate::prune::PruneError;
use crate::prune::engine::{set_weight, weight_out_in};
use crate::timing::{self, Phase};

type Ad<B> = Autodiff<B>;
/// A linear's candidates' indices on the device, where a pass uploaded them.
type Candidates<B> = Option<Tensor<B, 1, Int>>;
/// A layer as a pass sees it, its weights' guard, its linears' [`Candidates`].
type PreparedLayer<B> = (DecoderLayer<B>, Held, Vec<Candidates<B>>);
const DTYPE: ComputeDtype = ComputeDtype::F32;

/// One pass's fixed context.
pub(super) struct Pass<'a, B: Compute> {
    input: Input<'a, B>,
    which: Which,
    tag: &'static str,
    probed: BTreeSet<&'a str>,
    seqlen: usize,
}

/// What the head phase leaves for the later phases.
pub(super) struct HeadOut<B: Compute> {
    /// Gradient w.r.t. each batch's current boundary activations.
    pub grads: Vec<Tensor<B, 3>>,
    /// Their bytes, held as gradients (`memory::held`).
    grads_held: Held,
    /// Tied and probed: head gradients at candidates whose row the batch
    /// also looks up, added to the lookup gradient before `|·|`.
    deferred: Vec<HashMap<usize, f32>>,
    head_name: &'static str,
    head_positions: Vec<u32>,
    embed_positions: Vec<u32>,
    head_max: Vec<f32>,
    embed_max: Vec<f32>,
    tied_probed: bool,
    loss: f64,
}

impl<'a, B: Compute> Pass<'a, B> {
    pub fn new(input: Input<'a, B>, which: Which) -> Self {
        let probed = input.targets.iter().map(|t| t.name.as_str()).collect();
        let seqlen = input.batches.first().map_or(1, |b| b.inputs[0].len());
        let tag = match which {
            Which::Original => "original",
            Which::Modified => "modified",
        };
        Self {
            input,
            which,
            tag,
            probed,
            seqlen,
        }
    }

    fn progress(&self, index: usize, what: String) {
        let layers = self.input.ckpt.config.num_layers;
        let name = format!("{}: {what}", self.tag);
        let pass = format!("gradient pass ({})", self.tag);
        self.input
            .profiler
            .progress(&pass, index, 2 * layers + 2, &name);
    }

    /// What the last layer (or the head) freed goes back: the host's heap,
    /// and the device pool's free buffers, so that what a pass reserves is
    /// what it holds and one layer's pages (`estimate::prunemem_device`).
    fn trim(&self) {
        crate::exec::give_back::<B>(self.input.device);
    }

    /// `on_device::prepare` of `layer`'s linear `name`: a kept layer's
    /// linear that it reduced is a new weight beside the kept one, added
    /// to the layer's `held` weights; a streamed layer's is written over
    /// its own. Returns the candidates' indices it uploaded, if any.
    fn prepare_on_device(
        &self,
        state: &State,
        (full, name): (&str, &str),
        layer: &mut DecoderLayer<B>,
        held: &mut Held,
    ) -> Candidates<B> {
        let r = self.input.config.reduction_factor;
        let prepared = on_device::prepare(state, self.which, full, layer, name, r);
        if self.input.resident.is_some() {
            held.set(held.bytes() + prepared.bytes);
        }
        prepared.candidates
    }

    /// Layer `i` on the device, in f32 (its upload counted), or the one
    /// kept there; a loaded layer's bytes are held as weights by the guard
    /// (a kept one's by `Resident`).
    fn load(&self, i: usize) -> Result<(DecoderLayer<B>, Held), PruneError> {
        let ckpt = self.input.ckpt;
        let bytes = ckpt.config.layer_param_count() * DTYPE.size();
        let read = || load_layer_f32::<B>(ckpt, i, self.input.device);
        Ok(match self.input.resident {
            Some(resident) => (
                resident.get_or_load(i, bytes, read)?,
                Held::none(Category::Weights),
            ),
            None => (read()?, Held::new(Category::Weights, bytes)),
        })
    }

    /// Embedding and every layer forward; returns the boundaries `x_0 … x_L`
    /// (and, for the Wanda strategy's first pass, the activation norms).
    pub fn forward(&self, state: &mut State) -> Result<Boundaries<B>, PruneError> {
        let _phase = timing::phase(Phase::ProbeForward);
        let Input { ckpt, config, .. } = self.input;
        let c = &ckpt.config;
        let rope = Rope::<B>::new(c, self.seqlen, DTYPE.burn(), self.input.device);
        let collect_norms = self.which == Which::Original
            && config.strategy == select::Strategy::Wanda
            && state.norms.is_none();
        let mut norms = Norms::default();
        let _tag = tag::tag(Category::Activations);
        let mut xs = Boundaries::default();
        xs.push(super::embed::batches(&self.input, self.which, state)?);
        for i in 0..c.num_layers {
            self.trim();
            let (layer, _held, _) = self.prepared_layer(state, i, false)?;
            let mut layer_norms = HashMap::new();
            let next: Vec<Tensor<B, 3>> = xs
                .last()
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
            self.progress(i, format!("forward layer {i}"));
        }
        if collect_norms {
            let final_norm = ckpt.load_norm::<B>(DTYPE, self.input.device)?;
            for x in xs.last() {
                fold_norms(&mut norms.head, &final_norm.forward(x.clone()));
            }
            max_across_ranks(&mut norms);
            state.norms = Some(norms);
        }
        Ok(xs)
    }

    /// The head weight as the pass sees it; in the original pass, the
    /// head's (and a separate probed embedding's) candidates are chosen.
    fn head_weight(
        &self,
        state: &mut State,
        head_name: &'static str,
    ) -> Result<Vec<f32>, PruneError> {
        let Input { ckpt, config, .. } = self.input;
        let c = &ckpt.config;
        let mut head_w = ckpt.read_f32(head_name)?;
        // The original pass only zeroes earlier steps' pruning, so the
        // prepared head is the current model's.
        state.prepare(self.which, head_name, &mut head_w, config.reduction_factor);
        if self.which == Which::Original && self.probed.contains(head_name) {
            let n = (head_name == HEAD)
                .then(|| state.norms.as_ref().map(|n| n.head.as_slice()))
                .flatten()
                .filter(|_| config.strategy == select::Strategy::Wanda);
            let t = select::tentative(&head_w, c.hidden_size, n, config.sparsity);
            state.tentative.insert(head_name.to_string(), t);
        }
        if self.which == Which::Original && self.probed.contains(EMBED) && head_name != EMBED {
            let mut w = ckpt.read_f32(EMBED)?;
            state.prepare(self.which, EMBED, &mut w, 0.0);
            let t = select::tentative(&w, c.hidden_size, None, config.sparsity);
            state.tentative.insert(EMBED.to_string(), t);
        }
        Ok(head_w)
    }

    /// The head's table in f32 on the device (its upload counted), as the
    /// pass sees it (`head_weight`).
    fn head_table(
        &self,
        state: &mut State,
        head_name: &'static str,
    ) -> Result<Tensor<B, 2>, PruneError> {
        let c = &self.input.ckpt.config;
        let head_w = self.head_weight(state, head_name)?;
        if B::is_device() {
            crate::exec::transfer::uploaded(head_w.len() as u64 * 4);
        }
        Ok(Tensor::<B, 2>::from_data(
            TensorData::new(head_w, [c.vocab_size, c.hidden_size]),
            self.input.device,
        ))
    }

    /// Loss and head backward, by hand in vocabulary blocks, then the final
    /// norm under autodiff: the gradient w.r.t. the last boundary.
    pub fn head(
        &self,
        state: &mut State,
        (last, mut last_held): (Vec<Tensor<B, 3>>, Held),
    ) -> Result<HeadOut<B>, PruneError> {
        let _phase = timing::phase(Phase::ProbeHead);
        // The last layer's freed buffers go back first, as each layer's do.
        self.trim();
        let Input {
            ckpt,
            batches,
            profiler,
            ..
        } = self.input;
        let c = &ckpt.config;
        let head_name = if c.tie_word_embeddings { EMBED } else { HEAD };
        // A table no pass changes stays on the device with the layers.
        let unchanged = !self.probed.contains(head_name)
            && !self.probed.contains(EMBED)
            && !state.pruned.contains_key(head_name);
        let bytes = c.vocab_table_params() * 4;
        let (head, _head_held) = match self.input.resident {
            Some(resident) if unchanged => (
                resident.head_or_load(bytes, || self.head_table(state, head_name))?,
                Held::none(Category::Weights),
            ),
            _ => (
                self.head_table(state, head_name)?,
                Held::new(Category::Weights, bytes),
            ),
        };
        let mut held = state.components();
        held.insert("head weight (f32)".into(), bytes);
        let tokens: usize = batches.iter().map(|b| b.targets.len()).sum();
        held.insert(
            "boundary activations".into(),
            ((c.num_layers + 1) * tokens * c.hidden_size * 4) as u64,
        );
        profiler.components(&format!("{} pass, head", self.tag), held);
        let norm_ad =
            LlamaRmsNorm::<Ad<B>>::from_inner(ckpt.load_norm::<B>(DTYPE, self.input.device)?);
        let _tag = tag::tag(Category::Logits);
        let head_probed = self.probed.contains(head_name);
        let head_positions = state.tentative.get(head_name).cloned().unwrap_or_default();
        let mut out = HeadOut {
            grads: Vec::with_capacity(batches.len()),
            grads_held: Held::none(Category::Gradients),
            deferred: Vec::with_capacity(batches.len()),
            head_name,
            head_max: vec![0f32; head_positions.len()],
            embed_positions: state.tentative.get(EMBED).cloned().unwrap_or_default(),
            embed_max: Vec::new(),
            head_positions,
            tied_probed: head_probed && head_name == EMBED,
            loss: 0.0,
        };
        out.embed_max = vec![0f32; out.embed_positions.len()];
        for (b, x) in batches.iter().zip(last) {
            let [n, s, d] = x.dims();
            let x_bytes = crate::memory::held::tensor_bytes(&x);
            let x_ad = Tensor::<Ad<B>, 3>::from_inner(x).require_grad();
            let h = norm_ad.forward(x_ad.clone());
            let rows: BTreeSet<u32> = b.inputs.iter().flatten().copied().collect();
            let mut held = HashMap::new();
            let (positions, maxima, tied) =
                (&out.head_positions, &mut out.head_max, out.tied_probed);
            let mut sink = |k: usize, g: f32| {
                let row = positions[k] as usize / d;
                if tied && rows.contains(&(row as u32)) {
                    held.insert(k, g);
                } else if g.abs() > maxima[k] {
                    maxima[k] = g.abs();
                }
            };
            let wg: WeightGrad<'_> = head_probed.then_some((positions.as_slice(), &mut sink));
            let (dh, l) =
                head_backward(h.clone().inner().reshape([n * s, d]), &head, &b.targets, wg);
            out.loss += l;
            out.deferred.push(held);
            let g = Tensor::<Ad<B>, 3>::from_inner(dh.reshape([n, s, d]));
            let backward = (h * g).sum().backward();
            crate::exec::watch::after_op();
            out.grads.push(
                x_ad.grad(&backward)
                    .unwrap_or_else(|| Tensor::zeros([n, s, d], self.input.device)),
            );
            // The batch's boundary is spent; its gradient is kept.
            drop(x_ad);
            last_held.set(last_held.bytes().saturating_sub(x_bytes));
            out.grads_held.set(out.grads_held.bytes() + x_bytes);
        }
        drop(head);
        drop(norm_ad);
        self.progress(c.num_layers, "head".into());
        Ok(out)
    }

    /// Every layer, last to first: recomputed from its boundary under
    /// autodiff, the upstream gradient pushed through, weight gradients
    /// folded into the maxima at the candidates.
    pub fn backward(
        &self,
        state: &mut State,
        mut boundaries: Boundaries<B>,
        grads: &mut [Tensor<B, 3>],
    ) -> Result<(), PruneError> {
        let _phase = timing::phase(Phase::ProbeBackward);
        let c = &self.input.ckpt.config;
        let rope = Rope::<Ad<B>>::new(c, self.seqlen, DTYPE.burn(), self.input.device);
        for i in (0..c.num_layers).rev() {
            self.trim();
            let _scope = self.input.profiler.scope(&stages::layer_pass(i, self.tag));
            let (inputs, _held) = boundaries.pop();
            self.backward_layer(state, i, inputs, grads, &rope)?;
            self.progress(2 * c.num_layers - i, format!("backward layer {i}"));
        }
        Ok(())
    }

    /// Layer `i` as this pass sees it: earlier zeros, and the modified
    /// pass's reduction, applied; with `choose` (the original pass's
    /// backward) its candidates are chosen. On a device all of it happens
    /// where the weights are: the candidates come back as one bit per
    /// weight (`on_device::tentative`). The forward and the backward both
    /// take their layer here; the modified pass's maxima gather at its
    /// [`Candidates`] (`LAYER_LINEARS` order).
    fn prepared_layer(
        &self,
        state: &mut State,
        i: usize,
        choose: bool,
    ) -> Result<PreparedLayer<B>, PruneError> {
        let config = self.input.config;
        let (mut plain, mut held) = self.load(i)?;
        let mut candidates = Vec::with_capacity(LAYER_LINEARS.len());
        for name in LAYER_LINEARS {
            let full = format!("model.layers.{i}.{name}.weight");
            let choosing =
                choose && self.which == Which::Original && self.probed.contains(full.as_str());
            let norms = strategy_norms(config, state.norms.as_ref(), i, name);
            if B::is_device() {
                candidates.push(self.prepare_on_device(
                    state,
                    (&full, name),
                    &mut plain,
                    &mut held,
                ));
                if choosing {
                    let t = tag::tagged(Category::Masks, || {
                        on_device::tentative(&plain, name, norms, config.sparsity)
                    });
                    state.tentative.insert(full, t);
                }
                continue;
            }
            candidates.push(None);
            let changed = state.pruned.contains_key(&full) || self.which == Which::Modified;
            if !choosing && !changed {
                continue;
            }
            let (mut w, out, inp) = weight_out_in(&plain, name);
            state.prepare(self.which, &full, &mut w, config.reduction_factor);
            if choosing {
                let t = tag::tagged(Category::Masks, || {
                    select::tentative(&w, inp, norms, config.sparsity)
                });
                state.tentative.insert(full, t);
            }
            set_weight(&mut plain, name, w, out, inp, DTYPE, self.input.device);
        }
        // The selections' buffers go back before the backward takes its own.
        if B::is_device() && choose && self.which == Which::Original {
            crate::exec::release_free::<B>(self.input.device);
        }
        Ok((plain, held, candidates))
    }

    fn backward_layer(
        &self,
        state: &mut State,
        i: usize,
        inputs: Vec<Tensor<B, 3>>,
        grads: &mut [Tensor<B, 3>],
        rope: &Rope<Ad<B>>,
    ) -> Result<(), PruneError> {
        let config = self.input.config;
        // Prepared on the plain backend, then wrapped: reading a tracked
        // parameter would leave an unconsumed node in the autodiff graph.
        let (plain, _held, candidates) = self.prepared_layer(state, i, true)?;
        let names: Vec<(&str, String)> = LAYER_LINEARS
            .iter()
            .map(|name| (*name, format!("model.layers.{i}.{name}.weight")))
            .collect();
        let _tag = tag::tag(Category::Gradients);
        let mut layer = DecoderLayer::<Ad<B>>::from_inner(plain);
        for name in LAYER_LINEARS {
            if let Some(l) = layer.linear_mut(name) {
                l.weight = Param::from_tensor(l.weight.val());
            }
        }
        let mut maxima: Vec<Vec<f32>> = names
            .iter()
            .map(|(_, f)| vec![0f32; state.tentative.get(f).map_or(0, Vec::len)])
            .collect();
        // On a device the maxima stay there until the last batch.
        // The modified pass gathers at the indices it scaled (one upload).
        let mut on_device: Vec<Option<Maxima<B>>> = names
            .iter()
            .zip(candidates)
            .map(|((name, full), at)| {
                let positions = state.tentative.get(full)?;
                let [inp, out] = layer.linear(name)?.weight.dims();
                B::is_device()
                    .then(|| Maxima::new(positions, (out, inp), at, self.input.device))
                    .flatten()
            })
            .collect();
        for (x, g) in inputs.into_iter().zip(grads.iter_mut()) {
            let x_ad = Tensor::<Ad<B>, 3>::from_inner(x).require_grad();
            let y = layer.forward(x_ad.clone(), rope);
            let backward = (y * Tensor::<Ad<B>, 3>::from_inner(g.clone()))
                .sum()
                .backward();
            // The layer's gradients, all alive: the pass's largest moment.
            crate::exec::watch::after_op();
            for (((name, full), acc), device_acc) in names
                .iter()
                .zip(maxima.iter_mut())
                .zip(on_device.iter_mut())
            {
                let Some(positions) = state.tentative.get(full).filter(|p| !p.is_empty()) else {
                    continue;
                };
                let Some(grad) = layer
                    .linear(name)
                    .and_then(|l| l.weight.val().grad(&backward))
                else {
                    continue;
                };
                match device_acc {
                    Some(m) => m.fold(grad),
                    None => {
                        let host: Vec<f32> =
                            grad.transpose().into_data().into_vec().unwrap_or_default();
                        select::fold_max(acc, &host, positions);
                    }
                }
            }
            if let Some(dx) = x_ad.grad(&backward) {
                *g = dx;
            }
        }
        for (acc, device_acc) in maxima.iter_mut().zip(on_device) {
            if let Some(m) = device_acc {
                *acc = m.finish();
            }
        }
        for ((_, full), mut acc) in names.iter().zip(maxima) {
            if self.probed.contains(full.as_str()) {
                crate::exec::dist::reducer().max_f32(&mut acc);
                state.finish(self.which, full, acc, config.gradient_threshold);
            }
        }
        Ok(())
    }

    /// Embedding: the lookup gradient (plus the held head part when tied);
    /// a separate probed head is finished too. Returns the mean loss.
    pub fn embeddings(&self, state: &mut State, mut head: HeadOut<B>) -> f64 {
        let _phase = timing::phase(Phase::ProbeBackward);
        self.trim();
        let Input {
            ckpt,
            config,
            batches,
            ..
        } = self.input;
        let c = &ckpt.config;
        if self.probed.contains(EMBED) {
            let d = c.hidden_size;
            let (acc, positions) = if head.tied_probed {
                (&mut head.head_max, &head.head_positions)
            } else {
                (&mut head.embed_max, &head.embed_positions)
            };
            for ((b, g), held) in batches.iter().zip(&head.grads).zip(&head.deferred) {
                let g0 = g.clone().into_data();
                if B::is_device() {
                    crate::exec::transfer::read_back(g0.bytes.len() as u64);
                }
                let g0: Vec<f32> = g0.into_vec().unwrap_or_default();
                let mut lookup: BTreeMap<u32, Vec<f32>> = BTreeMap::new();
                for (t, tok) in b.inputs.iter().flatten().enumerate() {
                    let row = lookup.entry(*tok).or_insert_with(|| vec![0f32; d]);
                    for (r, v) in row.iter_mut().zip(&g0[t * d..(t + 1) * d]) {
                        *r += v;
                    }
                }
                for (tok, row) in &lookup {
                    let base = *tok as usize * d;
                    let lo = positions.partition_point(|p| (*p as usize) < base);
                    let hi = positions.partition_point(|p| (*p as usize) < base + d);
                    for k in lo..hi {
                        let v = held.get(&k).copied().unwrap_or(0.0)
                            + row[positions[k] as usize - base];
                        if v.abs() > acc[k] {
                            acc[k] = v.abs();
                        }
                    }
                }
            }
            let mut maxima = std::mem::take(acc);
            crate::exec::dist::reducer().max_f32(&mut maxima);
            state.finish(self.which, EMBED, maxima, config.gradient_threshold);
        }
        if self.probed.contains(HEAD) && head.head_name == HEAD {
            crate::exec::dist::reducer().max_f32(&mut head.head_max);
            state.finish(self.which, HEAD, head.head_max, config.gradient_threshold);
        }
        self.progress(2 * c.num_layers + 1, "embeddings".into());
        // The mean over every rank's batches.
        let mut loss = [head.loss, batches.len() as f64];
        crate::exec::dist::reducer().sum_f64(&mut loss);
        loss[0] / loss[1].max(1.0)
    }
}

/// Runs one pass; returns the mean calibration loss.
pub fn run<B: Compute>(
    input: Input<'_, B>,
    state: &mut State,
    which: Which,
) -> Result<f64, PruneError> {
    let pass = Pass::new(input, which);
    let mut boundaries = pass.forward(state)?;
    let last = boundaries.pop();
    let mut head = pass.head(state, last)?;
    pass.backward(state, boundaries, &mut head.grads)?;
    Ok(pass.embeddings(state, head))
}
