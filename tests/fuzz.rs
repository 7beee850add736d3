//! Property-based fuzzing of every parser that reads a file a user (or an
//! attacker) hands prunemem: the GGUF reader, the safetensors header reader
//! (through `Checkpoint::open` and tensor reads), the config.json parser, the
//! tokenizer.json readers,
//! `events.jsonl` (and the fold every reader puts it through) and
//! `memory_log.csv`. Inputs are random bytes and random mutations of valid
//! files; the property is "an error or a value, never a panic".
//!
//! `PRUNEMEM_FUZZ_CASES` sets the cases per target (CI: 256); a long run:
//! `PRUNEMEM_FUZZ_CASES=20000 cargo test --release --test fuzz`.

mod support;

use std::path::Path;
use std::sync::OnceLock;

use proptest::prelude::*;
use prunemem::events::fold::RunFold;
use prunemem::events::{Event, parse_log};
use prunemem::model::gguf::GgufFile;
use prunemem::model::synthetic::{SyntheticSpec, write_checkpoint};
use prunemem::model::{Checkpoint, LlamaConfig};

fn config() -> ProptestConfig {
    let cases = std::env::var("PRUNEMEM_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Valid inputs to mutate, made once.
struct Seeds {
    _dir: tempfile::TempDir,
    gguf: Vec<u8>,
    model: std::path::PathBuf,
    safetensors: Vec<u8>,
    config: String,
    tokenizer: String,
    events: String,
    csv: String,
}

fn seeds() -> &'static Seeds {
    static SEEDS: OnceLock<Seeds> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let (gguf, _) = support::write_gguf(dir.path(), 2);
        let model = dir.path().join("model");
        write_checkpoint(&model, &SyntheticSpec::default()).unwrap();
        let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/run-wanda-tiny");
        Seeds {
            gguf: std::fs::read(gguf).unwrap(),
            safetensors: std::fs::read(model.join("model.safetensors")).unwrap(),
            config: std::fs::read_to_string(model.join("config.json")).unwrap(),
            tokenizer: std::fs::read_to_string(model.join("tokenizer.json")).unwrap(),
            events: std::fs::read_to_string(fixture.join("events.jsonl")).unwrap(),
            csv: std::fs::read_to_string(fixture.join("memory_log.csv")).unwrap(),
            model,
            _dir: dir,
        }
    })
}

/// `base` with up to 8 bytes overwritten, a cut, or bytes spliced in.
fn mutated(base: &'static [u8]) -> impl Strategy<Value = Vec<u8>> {
    let n = base.len();
    (
        prop::collection::vec((0..n, any::<u8>()), 0..8),
        prop::option::of(0..n),
        prop::option::of((0..n, prop::collection::vec(any::<u8>(), 1..16))),
    )
        .prop_map(move |(flips, cut, splice)| {
            let mut v = base.to_vec();
            for (i, b) in flips {
                v[i] = b;
            }
            if let Some((at, bytes)) = splice {
                let at = at.min(v.len());
                v.splice(at..at, bytes);
            }
            if let Some(c) = cut {
                v.truncate(c);
            }
            v
        })
}

/// Mutations weighted towards the header, where the parsers live.
fn header_mutated(base: &'static [u8], header: usize) -> impl Strategy<Value = Vec<u8>> {
    let h = header.min(base.len()).max(1);
    (
        prop::collection::vec((0..h, any::<u8>()), 1..6),
        any::<bool>(),
    )
        .prop_map(move |(flips, cut)| {
            let mut v = base.to_vec();
            for (i, b) in flips {
                v[i] = b;
            }
            if cut {
                v.truncate(v.len() / 2);
            }
            v
        })
}

fn gguf_must_not_panic(bytes: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.gguf");
    std::fs::write(&path, bytes).unwrap();
    if let Ok(g) = GgufFile::open(&path) {
        for t in &g.tensors {
            let _ = g.dequantize(t);
        }
        let out = dir.path().join("out");
        let _ = prunemem::model::convert::convert_gguf(&path, &out, safetensors::Dtype::F32, false);
    }
}

fn checkpoint_must_not_panic(weights: &[u8], config: &str) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("model.safetensors"), weights).unwrap();
    std::fs::write(dir.path().join("config.json"), config).unwrap();
    if let Ok(ckpt) = Checkpoint::open(dir.path()) {
        let names: Vec<String> = ckpt.tensors.keys().cloned().collect();
        for n in names {
            let _ = ckpt.read_f32(&n);
        }
        let _ = ckpt.load_model::<burn::backend::Flex>(
            prunemem::model::ComputeDtype::F32,
            &Default::default(),
        );
    }
}

fn log_must_not_panic(text: &str) {
    if let Ok(log) = parse_log(text) {
        let fold = RunFold::of(&log.events);
        let _ = (fold.peak_stage(), fold.eta_s(), fold.peak_rss());
        let _ = prunemem::estimate::against::compare(&log.events);
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("events.jsonl"), text).unwrap();
    let _ = prunemem::report::load(dir.path());
}

fn csv_must_not_panic(text: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("memory_log.csv");
    std::fs::write(&path, text).unwrap();
    if let Ok(run) = prunemem::report::load(&path) {
        let _ = (run.peak_stage(), run.peak_rss());
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn gguf_random_bytes(tail in prop::collection::vec(any::<u8>(), 0..512), version in 0u32..5) {
        let mut bytes = b"GGUF".to_vec();
        bytes.extend(version.to_le_bytes());
        bytes.extend(tail);
        gguf_must_not_panic(&bytes);
    }

    #[test]
    fn gguf_mutations(bytes in header_mutated(&seeds().gguf, 4096)) {
        gguf_must_not_panic(&bytes);
    }

    #[test]
    fn safetensors_mutations(bytes in header_mutated(&seeds().safetensors, 2048)) {
        checkpoint_must_not_panic(&bytes, &seeds().config);
    }

    #[test]
    fn safetensors_random(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        checkpoint_must_not_panic(&bytes, &seeds().config);
    }

    /// The tokenizer reader (and what a loaded one is asked to do) on
    /// mutated tokenizer.json: an error or a tokenizer, never a panic.
    #[test]
    fn tokenizer_mutations(bytes in mutated(seeds().tokenizer.as_bytes())) {
        let text = String::from_utf8_lossy(&bytes);
        let _ = prunemem::model::tokenizer_size::TokenizerSize::from_json(&text);
        if let Ok(tok) = prunemem::model::tokenizer::Tokenizer::from_json(&text) {
            if let Ok(ids) = tok.encode("the quick brown fox, 42 times: naïve café") {
                let _ = tok.check_unknown(&ids, "a fuzzed text");
                let _ = tok.decode(&ids);
            }
            let _ = tok.check_vocab(1000);
        }
    }

    #[test]
    fn tokenizer_random(text in "[ -~]{0,200}") {
        let _ = prunemem::model::tokenizer::Tokenizer::from_json(&text);
        let _ = prunemem::model::tokenizer_size::TokenizerSize::from_json(&text);
    }

    #[test]
    fn config_mutations(bytes in mutated(seeds().config.as_bytes())) {
        let text = String::from_utf8_lossy(&bytes);
        if LlamaConfig::from_json(&text).is_ok() {
            let weights = std::fs::read(seeds().model.join("model.safetensors")).unwrap();
            checkpoint_must_not_panic(&weights, &text);
        }
    }

    #[test]
    fn config_numbers(key in prop::sample::select(vec![
        "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "vocab_size", "max_position_embeddings", "rms_norm_eps",
        "rope_theta", "head_dim",
    ]), value in prop_oneof![
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(serde_json::Value::from),
        Just(serde_json::Value::Null),
    ]) {
        let mut cfg: serde_json::Value = serde_json::from_str(&seeds().config).unwrap();
        cfg[key] = value;
        if let Ok(c) = LlamaConfig::from_json(&cfg.to_string()) {
            let _ = (c.param_count(), c.layer_param_count());
        }
    }

    #[test]
    fn events_mutations(bytes in mutated(seeds().events.as_bytes())) {
        log_must_not_panic(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn events_random_lines(lines in prop::collection::vec("[ -~]{0,80}", 0..20)) {
        log_must_not_panic(&lines.join("\n"));
    }

    #[test]
    fn events_in_any_order(picks in prop::collection::vec(any::<prop::sample::Index>(), 0..60)) {
        let events: Vec<Event> = parse_log(&seeds().events).unwrap().events;
        let shuffled: Vec<String> = picks
            .iter()
            .map(|i| serde_json::to_string(&events[i.index(events.len())]).unwrap())
            .collect();
        log_must_not_panic(&shuffled.join("\n"));
    }

    #[test]
    fn csv_mutations(bytes in mutated(seeds().csv.as_bytes())) {
        csv_must_not_panic(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn csv_random(rows in prop::collection::vec(prop::collection::vec("[-0-9.a-zA-Z_:]{0,12}", 0..9), 0..12)) {
        let mut text = prunemem::sinks::CSV_HEADER.to_string();
        for r in rows {
            text.push('\n');
            text.push_str(&r.join(","));
        }
        csv_must_not_panic(&text);
    }
}
