//! Shared helpers for integration tests: synthetic checkpoints and GGUF
//! files built from them, and the estimator's validation grid.

#![allow(dead_code)]

pub mod gguf;
pub mod grid;
pub mod train_grid;

use std::path::{Path, PathBuf};

use gguf::{GgufTensorIn, Meta};
use prunemem::model::synthetic::{self, SyntheticSpec};
use prunemem::model::tokenizer::bytes_to_unicode;

/// Merges of the test tokenizer; each adds one token after the 259 base ones.
pub const MERGES: [&str; 5] = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a"];

pub fn gguf_spec() -> SyntheticSpec {
    SyntheticSpec {
        hidden: 64,
        intermediate: 128,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        vocab: 259 + MERGES.len(),
        max_positions: 128,
        tied: true,
        seed: 7,
        ..Default::default()
    }
}

/// Tokens of the test vocabulary: 256 byte symbols, three control tokens,
/// then the merge results.
pub fn vocab_tokens() -> Vec<String> {
    let mut t: Vec<String> = bytes_to_unicode().into_iter().map(String::from).collect();
    t.extend(["<|endoftext|>", "<|im_start|>", "<|im_end|>"].map(String::from));
    t.extend(MERGES.iter().map(|m| m.replace(' ', "")));
    t
}

fn gguf_name(hf: &str) -> String {
    match hf {
        "model.embed_tokens.weight" => return "token_embd.weight".into(),
        "model.norm.weight" => return "output_norm.weight".into(),
        "lm_head.weight" => return "output.weight".into(),
        _ => {}
    }
    let rest = hf.strip_prefix("model.layers.").unwrap();
    let (layer, tail) = rest.split_once('.').unwrap();
    let part = match tail {
        "input_layernorm.weight" => "attn_norm.weight",
        "post_attention_layernorm.weight" => "ffn_norm.weight",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "mlp.gate_proj.weight" => "ffn_gate.weight",
        "mlp.up_proj.weight" => "ffn_up.weight",
        "mlp.down_proj.weight" => "ffn_down.weight",
        other => panic!("{other}"),
    };
    format!("blk.{layer}.{part}")
}

/// Writes a llama GGUF of [`gguf_spec`] with linears stored as `linear_type`
/// (GGML id), embeddings as Q8_0 and norms as F32, q/k permuted as
/// llama.cpp does. Returns the path and the HF tensors it encodes.
/// (name, PyTorch shape, values) of every tensor.
pub type NamedTensors = Vec<(String, Vec<usize>, Vec<f32>)>;

pub fn write_gguf(dir: &Path, linear_type: u32) -> (PathBuf, NamedTensors) {
    let spec = gguf_spec();
    let hf = synthetic::tensors(&spec);
    let hd = spec.hidden / spec.heads;
    let tensors: Vec<GgufTensorIn> = hf
        .iter()
        .map(|(name, shape, values)| {
            let mut values = values.clone();
            if name.ends_with("q_proj.weight") {
                values = gguf::permute_rows(&values, shape[0], shape[1], spec.heads);
            } else if name.ends_with("k_proj.weight") {
                values = gguf::permute_rows(&values, shape[0], shape[1], spec.kv_heads);
            }
            let ty = if shape.len() == 1 {
                0
            } else if name.contains("embed") {
                8
            } else {
                linear_type
            };
            GgufTensorIn {
                name: gguf_name(name),
                shape: shape.clone(),
                ty,
                values,
            }
        })
        .collect();
    let mut types = vec![1i32; 256];
    types.extend([3, 3, 3]);
    types.extend([1; MERGES.len()]);
    let meta = vec![
        ("general.architecture", Meta::Str("llama".into())),
        ("llama.block_count", Meta::U32(spec.layers as u32)),
        ("llama.context_length", Meta::U32(spec.max_positions as u32)),
        ("llama.embedding_length", Meta::U32(spec.hidden as u32)),
        (
            "llama.feed_forward_length",
            Meta::U32(spec.intermediate as u32),
        ),
        ("llama.attention.head_count", Meta::U32(spec.heads as u32)),
        (
            "llama.attention.head_count_kv",
            Meta::U32(spec.kv_heads as u32),
        ),
        ("llama.rope.freq_base", Meta::F32(10000.0)),
        ("llama.rope.dimension_count", Meta::U32(hd as u32)),
        ("llama.attention.layer_norm_rms_epsilon", Meta::F32(1e-5)),
        ("tokenizer.ggml.model", Meta::Str("gpt2".into())),
        ("tokenizer.ggml.pre", Meta::Str("smollm".into())),
        ("tokenizer.ggml.tokens", Meta::Strs(vocab_tokens())),
        ("tokenizer.ggml.token_type", Meta::I32s(types)),
        (
            "tokenizer.ggml.merges",
            Meta::Strs(MERGES.iter().map(|s| s.to_string()).collect()),
        ),
        ("tokenizer.ggml.bos_token_id", Meta::U32(256)),
        ("tokenizer.ggml.eos_token_id", Meta::U32(256)),
        ("tokenizer.ggml.add_bos_token", Meta::Bool(false)),
    ];
    let path = dir.join("tiny.gguf");
    std::fs::write(&path, gguf::write(&meta, &tensors)).unwrap();
    (path, hf)
}

/// The tokenizer.json Hugging Face ships for a SmolLM-style byte-level BPE
/// with this vocabulary (Digits then ByteLevel pre-tokenisation, control
/// tokens as special added tokens).
pub fn reference_tokenizer_json() -> String {
    let vocab: serde_json::Map<String, serde_json::Value> = vocab_tokens()
        .into_iter()
        .enumerate()
        .map(|(i, t)| (t, serde_json::json!(i)))
        .collect();
    let added: Vec<serde_json::Value> = (256..259)
        .map(|id| {
            serde_json::json!({"id": id, "content": vocab_tokens()[id], "single_word": false, "lstrip": false,
                               "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added, "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": MERGES.iter().map(|m| m.split(' ').collect::<Vec<_>>()).collect::<Vec<_>>()}
    })
    .to_string()
}

/// Text for tests: deterministic English-like sentences.
pub fn sample_text(words: usize) -> String {
    const WORDS: [&str; 24] = [
        "the", "model", "prunes", "weights", "in", "a", "layer", "and", "memory", "stays", "low",
        "while", "Wanda", "compares", "each", "row", "of", "2024", "numbers", "at", "512",
        "tokens", "per", "window",
    ];
    let mut rng = synthetic::Normal::new(3);
    let mut out = String::new();
    for i in 0..words {
        let w = WORDS[(rng.uniform() * WORDS.len() as f64) as usize % WORDS.len()];
        out.push_str(w);
        out.push(if i % 13 == 12 { '\n' } else { ' ' });
    }
    out
}

/// `prunemem estimate --against LOGS --json`, parsed; the run must succeed.
pub fn against_json(logs: &str) -> serde_json::Value {
    let (code, stdout, stderr) = run_prunemem(&["estimate", "--against", logs, "--json"]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    serde_json::from_str(&stdout).expect("estimate --against --json prints JSON")
}

/// The phase named `name` of an `estimate --against --json` comparison.
pub fn phase_of<'a>(cmp: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    cmp["phases"]
        .as_array()
        .expect("a comparison's phases")
        .iter()
        .find(|p| p["phase"] == name)
        .unwrap_or_else(|| panic!("no {name} phase: {cmp}"))
}

/// Runs the `prunemem` binary: (exit code, stdout, stderr).
pub fn run_prunemem(args: &[&str]) -> (Option<i32>, String, String) {
    run_prunemem_with(args, &[])
}

/// [`run_prunemem`] with the environment variables `env` set.
pub fn run_prunemem_with(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_prunemem"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("the prunemem binary runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A path as the `&str` a command line takes.
/// Every path under `dir`, recursively (links are listed, not followed), to
/// check that a run left nothing behind.
pub fn listing(dir: &Path) -> std::collections::BTreeSet<PathBuf> {
    let mut out = std::collections::BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.symlink_metadata().is_ok_and(|m| m.is_dir()) {
                stack.push(p.clone());
            }
            out.insert(p);
        }
    }
    out
}

pub fn s(p: &Path) -> &str {
    p.to_str().expect("test paths are UTF-8")
}

/// The JSON object on the last line of a `--json` run's stdout.
pub fn json_line(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout.lines().last().expect("a JSON line")).expect("valid JSON")
}

/// The stage labels of a run's events, in order.
pub fn stage_labels(events: &[prunemem::events::Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            prunemem::events::Event::Stage { snapshot } => Some(snapshot.label.clone()),
            _ => None,
        })
        .collect()
}

/// A profiler that reports nowhere and samples nothing.
pub fn quiet_profiler() -> prunemem::profiler::Profiler {
    prunemem::profiler::Profiler::new(
        std::sync::Arc::new(prunemem::events::Emitter::new()),
        prunemem::profiler::ProfilerConfig {
            sampler_hz: None,
            gpu_index: None,
            ..Default::default()
        },
    )
}
