//! SmolLM2-135M as imported by scripts/fetch-smollm2.sh, against what
//! transformers computes reading the original GGUF
//! (tests/fixtures/smollm2-expected.json, made by
//! tests/fixtures/make_smollm2_expected.py).
//!
//! Without models/smollm2-135m these tests say so and return, unless
//! PRUNEMEM_REQUIRE_SMOLLM2=1 (set by CI after fetching the model), which
//! turns the absence into a failure.

use std::path::{Path, PathBuf};

use burn::backend::Flex;
use prunemem::data::windows::eval_windows;
use prunemem::model::perplexity::{self as eval, EvalOptions, Weights};
use prunemem::model::tokenizer::Tokenizer;
use prunemem::model::{Checkpoint, ComputeDtype, Rope};

type B = Flex;

fn model_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/smollm2-135m");
    if dir.join("model.safetensors").is_file() {
        return Some(dir);
    }
    if std::env::var("PRUNEMEM_REQUIRE_SMOLLM2").as_deref() == Ok("1") {
        panic!(
            "models/smollm2-135m is missing and PRUNEMEM_REQUIRE_SMOLLM2=1: run scripts/fetch-smollm2.sh"
        );
    }
    eprintln!(
        "SKIPPED: models/smollm2-135m is absent; run scripts/fetch-smollm2.sh to enable this test"
    );
    None
}

fn expected() -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/smollm2-expected.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn tokenizer_matches_transformers_on_the_gguf() {
    let Some(dir) = model_dir() else { return };
    let tok = Tokenizer::from_file(&dir.join("tokenizer.json")).unwrap();
    let exp = expected();
    for case in exp["tokens"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        assert_eq!(tok.encode(text).unwrap(), ids(&case["ids"]), "{text:?}");
    }
    assert_eq!(
        tok.encode(exp["text"].as_str().unwrap()).unwrap(),
        ids(&exp["text_ids"])
    );
}

#[test]
fn logits_match_transformers_on_the_gguf() {
    let Some(dir) = model_dir() else { return };
    let exp = expected();
    let l = &exp["logits"];
    let tokens = ids(&l["ids"]);
    let ckpt = Checkpoint::open(&dir).unwrap();
    let device = Default::default();
    let model = ckpt.load_model::<B>(ComputeDtype::F32, &device).unwrap();
    let rope = Rope::<B>::new(
        &ckpt.config,
        tokens.len(),
        ComputeDtype::F32.burn(),
        &device,
    );
    let logits: Vec<f32> = model
        .logits(
            eval::token_tensor(std::slice::from_ref(&tokens), &device),
            &rope,
        )
        .into_data()
        .to_vec()
        .unwrap();
    let vocab = ckpt.config.vocab_size;
    let probe = ids(&l["probe_vocab"]);
    let mut worst = 0f64;
    for (row, pos) in l["rows"]
        .as_array()
        .unwrap()
        .iter()
        .zip(ids(&l["positions"]))
    {
        let r = &logits[pos as usize * vocab..(pos as usize + 1) * vocab];
        let m = r.iter().fold(f32::MIN, |a, b| a.max(*b)) as f64;
        let lse = m + r.iter().map(|x| (*x as f64 - m).exp()).sum::<f64>().ln();
        worst = worst.max((lse - row["lse"].as_f64().unwrap()).abs());
        for (v, want) in probe.iter().zip(row["probe"].as_array().unwrap()) {
            worst = worst.max((r[*v as usize] as f64 - want.as_f64().unwrap()).abs());
        }
        let argmax = r
            .iter()
            .enumerate()
            .fold(
                (0, f32::MIN),
                |a, (i, x)| if *x > a.1 { (i, *x) } else { a },
            )
            .0;
        assert_eq!(
            argmax as u64,
            row["argmax"].as_u64().unwrap(),
            "position {pos}"
        );
    }
    println!("SmolLM2 max |Δlogit| vs transformers: {worst:e}");
    assert!(worst < 2e-3, "max |Δlogit| = {worst}");
}

#[test]
fn perplexity_matches_transformers_on_the_gguf() {
    let Some(dir) = model_dir() else { return };
    let exp = expected();
    let p = &exp["perplexity"];
    let seqlen = p["seqlen"].as_u64().unwrap() as usize;
    let ckpt = Checkpoint::open(&dir).unwrap();
    let windows = eval_windows(&ids(&exp["text_ids"]), seqlen, None).unwrap();
    assert_eq!(windows.len() as u64, p["windows"].as_u64().unwrap());
    let opts = EvalOptions {
        batch_size: 2,
        dtype: ComputeDtype::F32,
    };
    let got = eval::perplexity::<B>(
        Weights::Streamed(&ckpt),
        &windows,
        &opts,
        &Default::default(),
        None,
    )
    .unwrap();
    let want = p["value"].as_f64().unwrap();
    println!(
        "SmolLM2 perplexity: prunemem {} transformers {want}",
        got.perplexity
    );
    assert!(
        (got.perplexity / want - 1.0).abs() < 1e-4,
        "{} vs {want}",
        got.perplexity
    );
}

/// FNV-1a 64 over ids as little-endian u32 (as the fixture's script).
fn fnv1a64(ids: &[u32]) -> String {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for b in ids.iter().flat_map(|i| i.to_le_bytes()) {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01B3);
    }
    format!("{h:016x}")
}

/// prunemem's tokenizer is SmolLM2's original one: the ids of the tokenizer
/// built from the GGUF's vocabulary and merges with SmolLM2's published
/// pre-tokenization (tests/fixtures/make_smollm2_tokenizer_fixture.py, not
/// prunemem's converter) — on cases with non-ASCII numerics (`½`, `Ⅻ`, `١٢٣`,
/// where transformers' GGUF tokenizer differs) and on the whole of
/// wiki.test.raw, each half, when the shared data is there.
#[test]
fn tokenizer_matches_smollm2_original_tokenizer() {
    let Some(dir) = model_dir() else { return };
    let tok = Tokenizer::from_file(&dir.join("tokenizer.json")).unwrap();
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/smollm2-tokenizer-original.json");
    let exp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    for case in exp["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        assert_eq!(tok.encode(text).unwrap(), ids(&case["ids"]), "{text:?}");
    }
    // WikiText-2's test split ships with the project (data/).
    let wiki = Path::new(env!("CARGO_MANIFEST_DIR")).join("data/wikitext-2-raw/wiki.test.raw");
    let text = std::fs::read_to_string(&wiki).expect("data/wikitext-2-raw/wiki.test.raw ships");
    for (name, range) in [
        ("first-half", prunemem::data::LineRange::FirstHalf),
        ("second-half", prunemem::data::LineRange::SecondHalf),
    ] {
        let got = tok
            .encode(&prunemem::data::select_lines(&text, range))
            .unwrap();
        let want = &exp["wikitext"][name];
        assert_eq!(got.len() as u64, want["count"].as_u64().unwrap(), "{name}");
        assert_eq!(fnv1a64(&got), want["fnv1a64"].as_str().unwrap(), "{name}");
    }
}
