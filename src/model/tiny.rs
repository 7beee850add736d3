//! The demo's tiny model, for when no real model is at hand: text and a
//! small trained Llama, both made from a seed on the spot.
//!
//! A pruned random model would show nothing (its perplexity is the
//! vocabulary size before and after). So the demo generates sentences from a
//! small grammar, trains a 2-layer byte-level Llama on them for a few seconds
//! with Burn's autodiff and AdamW, and exports it in the Hugging Face layout;
//! then the ordinary pruning engine prunes it and the perplexity change means
//! something.

use std::path::Path;

use crate::exec::{Cpu, CpuAutodiff};
use burn::module::AutodiffModule;
use burn::optim::{AdamWConfig, GradientsParams, Optimizer};
use burn::prelude::*;

use super::perplexity::token_tensor;
use crate::model::llama::LAYER_LINEARS;
use crate::model::save::{OwnedTensor, write_safetensors};
use crate::model::synthetic::{Normal, SyntheticSpec, config_json};
use crate::model::{Checkpoint, ComputeDtype, Llama, ModelError, Rope};

/// Sentences from a small grammar, deterministic in `seed`.
pub fn corpus(sentences: usize, seed: u64) -> String {
    const SUBJECT: [&str; 8] = [
        "the model",
        "a pruned layer",
        "the calibration set",
        "our engine",
        "the GPU",
        "each row",
        "the profiler",
        "a sparse matrix",
    ];
    const VERB: [&str; 8] = [
        "keeps", "loses", "measures", "needs", "stores", "reads", "writes", "prunes",
    ];
    const OBJECT: [&str; 8] = [
        "half of its weights",
        "one layer at a time",
        "less memory",
        "the largest inputs",
        "every stage",
        "a few windows",
        "the peak",
        "its Hessian",
    ];
    const TAIL: [&str; 4] = [".", " again.", " today.", " on the CPU."];
    let mut rng = Normal::new(seed);
    let mut pick = |n: usize| (rng.uniform() * n as f64) as usize % n;
    let mut out = String::new();
    for i in 0..sentences {
        let s = format!(
            "{} {} {}{}",
            SUBJECT[pick(8)],
            VERB[pick(8)],
            OBJECT[pick(8)],
            TAIL[pick(4)]
        );
        out.push_str(&s);
        out.push(if i % 6 == 5 { '\n' } else { ' ' });
    }
    out
}

/// Mean next-token cross-entropy of logits `[n, vocab]` for `targets` `[n]`.
pub fn lm_loss<B: Backend>(logits: Tensor<B, 2>, targets: Tensor<B, 1, Int>) -> Tensor<B, 1> {
    let n = targets.dims()[0];
    // log_softmax with its reductions over the vocabulary in pieces
    // (`exec::reduce`: cubecl's stop short past 65 532).
    let max = crate::exec::reduce::max_dim(logits.clone(), 1).detach();
    let shifted = logits - max;
    let lse = crate::exec::reduce::sum_dim(shifted.clone().exp(), 1).log();
    let picked = (shifted - lse).gather(1, targets.reshape([n, 1]));
    picked.neg().mean()
}

/// Trains `spec`'s model on `tokens` for `steps` AdamW steps of `batch`
/// windows of `seq` tokens; returns the trained model and the last loss.
pub fn train(
    spec_dir: &Path,
    tokens: &[u32],
    steps: usize,
    batch: usize,
    seq: usize,
    seed: u64,
) -> Result<(Llama<Cpu>, f64), ModelError> {
    type AD = CpuAutodiff;
    let device = Default::default();
    let ckpt = Checkpoint::open(spec_dir)?;
    let mut model = ckpt.load_model::<AD>(ComputeDtype::F32, &device)?;
    let rope = Rope::<AD>::new(&ckpt.config, seq, ComputeDtype::F32.burn(), &device);
    let mut optim = AdamWConfig::new()
        .with_weight_decay(0.0)
        .init::<AD, Llama<AD>>();
    let mut rng = Normal::new(seed);
    let mut last = f64::NAN;
    for step in 0..steps {
        let windows: Vec<Vec<u32>> = (0..batch)
            .map(|_| {
                let i = (rng.uniform() * (tokens.len() - seq - 1) as f64) as usize;
                tokens[i..i + seq + 1].to_vec()
            })
            .collect();
        let inputs: Vec<Vec<u32>> = windows.iter().map(|w| w[..seq].to_vec()).collect();
        let targets: Vec<i64> = windows
            .iter()
            .flat_map(|w| w[1..].iter().map(|t| *t as i64))
            .collect();
        let logits = model.logits(token_tensor(&inputs, &device), &rope);
        let v = logits.dims()[2];
        let targets =
            Tensor::<AD, 1, Int>::from_data(TensorData::new(targets, [batch * seq]), &device);
        let loss = lm_loss(logits.reshape([batch * seq, v]), targets);
        last = loss.clone().into_scalar() as f64;
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        let lr = 3e-3 * (1.0 - step as f64 / steps as f64).max(0.1);
        model = optim.step(lr, model, grads);
    }
    Ok((model.valid(), last))
}

/// Writes a trained model as a Hugging Face folder (f32, PyTorch
/// orientation), with the synthetic spec's config and tokenizer.
pub fn export(model: &Llama<Cpu>, spec: &SyntheticSpec, dir: &Path) -> Result<(), ModelError> {
    std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    let json = |name: &str, v: &serde_json::Value| {
        let p = dir.join(name);
        std::fs::write(&p, serde_json::to_string_pretty(v).unwrap_or_default())
            .map_err(|e| ModelError::io(&p, e))
    };
    json("config.json", &config_json(spec))?;
    json(
        "tokenizer.json",
        &crate::model::tokenizer::byte_level_tokenizer_json(spec.vocab),
    )?;
    let f32s = |t: Tensor<Cpu, 2>| -> (Vec<usize>, Vec<f32>) {
        let d = t.dims().to_vec();
        (d, t.into_data().into_vec().unwrap_or_default())
    };
    let mut tensors = Vec::new();
    let mut push = |name: String, shape: Vec<usize>, values: Vec<f32>| {
        tensors.push(OwnedTensor {
            name,
            dtype: safetensors::Dtype::F32,
            shape,
            data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        })
    };
    let (shape, v) = f32s(model.model.embed_tokens.weight.val());
    push("model.embed_tokens.weight".into(), shape, v);
    for (i, layer) in model.model.layers.iter().enumerate() {
        for name in LAYER_LINEARS {
            if let Some(l) = layer.linear(name) {
                let (shape, v) = f32s(l.weight.val().transpose());
                push(format!("model.layers.{i}.{name}.weight"), shape, v);
            }
        }
        for (norm, w) in [
            ("input_layernorm", &layer.input_layernorm),
            ("post_attention_layernorm", &layer.post_attention_layernorm),
        ] {
            let v: Vec<f32> = w.weight.val().into_data().into_vec().unwrap_or_default();
            push(format!("model.layers.{i}.{norm}.weight"), vec![v.len()], v);
        }
    }
    let v: Vec<f32> = model
        .model
        .norm
        .weight
        .val()
        .into_data()
        .into_vec()
        .unwrap_or_default();
    push("model.norm.weight".into(), vec![v.len()], v);
    write_safetensors(&dir.join("model.safetensors"), tensors)
}
