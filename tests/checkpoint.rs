//! Loading checkpoints: single and sharded safetensors, layer-by-layer reads,
//! GGUF import, and the errors bad files must produce.

mod support;

use burn::backend::Flex;
use prunemem::data::windows::eval_windows;
use prunemem::model::convert::convert_gguf;
use prunemem::model::perplexity::{self as eval, EvalOptions, Weights};
use prunemem::model::synthetic::{SyntheticSpec, write_checkpoint};
use prunemem::model::tokenizer::Tokenizer;
use prunemem::model::{Checkpoint, ComputeDtype, prefetch};
use safetensors::Dtype;

type B = Flex;

fn spec(shards: usize) -> SyntheticSpec {
    SyntheticSpec {
        layers: 3,
        shards,
        seed: 11,
        ..Default::default()
    }
}

fn ppl(ckpt: &Checkpoint, tokens: &[u32]) -> f64 {
    let windows = eval_windows(tokens, 32, Some(4)).unwrap();
    let opts = EvalOptions {
        batch_size: 2,
        dtype: ComputeDtype::F32,
    };
    eval::perplexity::<B>(
        Weights::Streamed(ckpt),
        &windows,
        &opts,
        &Default::default(),
        None,
    )
    .unwrap()
    .perplexity
}

#[test]
fn sharded_checkpoint_equals_single_file() {
    let dir = tempfile::tempdir().unwrap();
    let (one, many) = (dir.path().join("one"), dir.path().join("many"));
    write_checkpoint(&one, &spec(1)).unwrap();
    write_checkpoint(&many, &spec(4)).unwrap();
    let (a, b) = (
        Checkpoint::open(&one).unwrap(),
        Checkpoint::open(&many).unwrap(),
    );
    assert!(!a.sharded && b.sharded);
    assert_eq!(b.shards.len(), 4);
    // Some layer's tensors are split across two shards.
    let split = (0..3).any(|l| {
        let p = format!("model.layers.{l}.");
        let shards: std::collections::BTreeSet<usize> = b
            .tensors
            .iter()
            .filter(|(n, _)| n.starts_with(&p))
            .map(|(_, e)| e.shard)
            .collect();
        shards.len() > 1
    });
    assert!(split, "the test needs a layer spanning shards");
    for name in a.tensors.keys() {
        assert_eq!(
            a.read_f32(name).unwrap(),
            b.read_f32(name).unwrap(),
            "{name}"
        );
    }
    let tok = Tokenizer::from_file(&one.join("tokenizer.json")).unwrap();
    let tokens = tok.encode(&support::sample_text(200)).unwrap();
    assert_eq!(ppl(&a, &tokens), ppl(&b, &tokens));
}

#[test]
fn loading_layer_k_reads_only_layer_k() {
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), &spec(2)).unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(ckpt.bytes_read(), 0, "opening reads headers only");
    let device = Default::default();
    let layer = ckpt.load_layer::<B>(1, ComputeDtype::F32, &device).unwrap();
    assert_eq!(ckpt.bytes_read(), ckpt.layer_bytes(1));
    assert!(ckpt.layer_bytes(1) > 0 && ckpt.layer_bytes(1) * 3 < ckpt.stored_bytes());
    // The loaded weights are the file's, transposed to Burn's [in, out].
    let w: Vec<f32> = layer
        .self_attn
        .q_proj
        .weight
        .val()
        .transpose()
        .into_data()
        .to_vec()
        .unwrap();
    assert_eq!(
        w,
        ckpt.read_f32("model.layers.1.self_attn.q_proj.weight")
            .unwrap()
    );
}

/// The layer loops stream through the reader's loader
/// (`prefetch::load_layer`: converted on every core, transposed in the
/// conversion's pass); a resident model loads through burn-store's adapter.
/// Both give the same layer to the bit, from f32 and bf16 files, in f32 and
/// f16, and read only the layer's bytes.
#[test]
fn the_readers_layer_is_the_adapters() {
    let dir = tempfile::tempdir().unwrap();
    let device = Default::default();
    for (name, stored) in [("f32", Dtype::F32), ("bf16", Dtype::BF16)] {
        let p = dir.path().join(name);
        let spec = SyntheticSpec {
            dtype: stored,
            ..spec(1)
        };
        write_checkpoint(&p, &spec).unwrap();
        for dtype in [ComputeDtype::F32, ComputeDtype::F16] {
            let ckpt = Checkpoint::open(&p).unwrap();
            let a = ckpt.load_layer::<B>(1, dtype, &device).unwrap();
            let read = ckpt.bytes_read();
            let b = prefetch::load_layer::<B>(&ckpt, 1, None, dtype, &device).unwrap();
            assert_eq!(ckpt.bytes_read() - read, ckpt.layer_bytes(1));
            let values = |t: burn::tensor::TensorData| t.as_bytes().to_vec();
            for linear in prunemem::model::llama::LAYER_LINEARS {
                let (x, y) = (a.linear(linear).unwrap(), b.linear(linear).unwrap());
                let (x, y) = (x.weight.val(), y.weight.val());
                assert_eq!(x.dims(), y.dims(), "{name} {dtype:?} {linear}");
                assert_eq!(x.dtype(), y.dtype(), "{name} {dtype:?} {linear}");
                assert!(
                    values(x.into_data()) == values(y.into_data()),
                    "{name} {dtype:?} {linear}"
                );
            }
            for (x, y) in [
                (&a.input_layernorm, &b.input_layernorm),
                (&a.post_attention_layernorm, &b.post_attention_layernorm),
            ] {
                assert!(values(x.weight.val().into_data()) == values(y.weight.val().into_data()));
            }
        }
    }
}

#[test]
fn half_precision_checkpoints_load() {
    let dir = tempfile::tempdir().unwrap();
    for (name, dtype) in [("f16", Dtype::F16), ("bf16", Dtype::BF16)] {
        let p = dir.path().join(name);
        write_checkpoint(&p, &SyntheticSpec { dtype, ..spec(1) }).unwrap();
        let ckpt = Checkpoint::open(&p).unwrap();
        assert_eq!(ckpt.stored_dtype(), dtype);
        let tok = Tokenizer::from_file(&p.join("tokenizer.json")).unwrap();
        let tokens = tok.encode(&support::sample_text(200)).unwrap();
        assert!(ppl(&ckpt, &tokens).is_finite());
    }
}

fn expect_err(dir: &std::path::Path, needle: &str) {
    match Checkpoint::open(dir) {
        Ok(_) => panic!("{} opened but should not", dir.display()),
        Err(e) => assert!(e.to_string().contains(needle), "'{e}' lacks '{needle}'"),
    }
}

#[test]
fn bad_checkpoints_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good");
    write_checkpoint(&good, &spec(1)).unwrap();
    let copy = |name: &str| {
        let d = dir.path().join(name);
        std::fs::create_dir_all(&d).unwrap();
        for f in ["config.json", "model.safetensors", "tokenizer.json"] {
            std::fs::copy(good.join(f), d.join(f)).unwrap();
        }
        d
    };

    let d = copy("truncated");
    let bytes = std::fs::read(d.join("model.safetensors")).unwrap();
    std::fs::write(d.join("model.safetensors"), &bytes[..bytes.len() - 1000]).unwrap();
    expect_err(&d, "truncated");

    // A header whose last tensor claims more bytes than the file holds.
    let d = copy("lying");
    let mut bytes = std::fs::read(d.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(bytes[8..8 + n].to_vec()).unwrap();
    let total = bytes.len() - 8 - n;
    let lie = header.replacen(&format!(",{total}]"), &format!(",{}]", total + 4096), 1);
    assert_ne!(lie, header);
    let lie = format!("{lie:<width$}", width = n);
    bytes.splice(8..8 + n, lie.into_bytes());
    std::fs::write(d.join("model.safetensors"), bytes).unwrap();
    expect_err(&d, "not a valid safetensors file");

    let d = copy("no-hidden");
    let cfg = std::fs::read_to_string(d.join("config.json")).unwrap();
    let cfg: serde_json::Value = serde_json::from_str(&cfg).unwrap();
    let mut cfg = cfg.as_object().unwrap().clone();
    cfg.remove("hidden_size");
    std::fs::write(d.join("config.json"), serde_json::to_string(&cfg).unwrap()).unwrap();
    expect_err(&d, "missing required key 'hidden_size'");

    let d = dir.path().join("missing-shard");
    write_checkpoint(&d, &spec(3)).unwrap();
    std::fs::remove_file(d.join("model-00002-of-00003.safetensors")).unwrap();
    expect_err(&d, "model-00002-of-00003.safetensors, which does not exist");

    expect_err(&dir.path().join("nowhere"), "no such folder");
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::copy(good.join("config.json"), empty.join("config.json")).unwrap();
    expect_err(&empty, "no model.safetensors");
}

#[test]
fn gguf_import_matches_the_quantised_weights() {
    let dir = tempfile::tempdir().unwrap();
    for ty in [0u32, 1, 2, 3, 8] {
        let sub = dir.path().join(format!("t{ty}"));
        std::fs::create_dir_all(&sub).unwrap();
        let (gguf, hf) = support::write_gguf(&sub, ty);
        let out = sub.join("hf");
        let report = convert_gguf(&gguf, &out, Dtype::F32, false).unwrap();
        assert_eq!(report.tensors, hf.len());
        let ckpt = Checkpoint::open(&out).unwrap();
        assert!(ckpt.config.tie_word_embeddings);
        assert_eq!(ckpt.config.num_kv_heads, 2);
        for (name, shape, values) in &hf {
            let stored_ty = if shape.len() == 1 {
                0
            } else if name.contains("embed") {
                8
            } else {
                ty
            };
            // q/k were permuted into the GGUF; conversion must undo it, so the
            // result is the quantised original in transformers' row order.
            let want = support::gguf::roundtrip(values, stored_ty);
            assert_eq!(ckpt.read_f32(name).unwrap(), want, "type {ty}: {name}");
        }
        let tok = Tokenizer::from_file(&out.join("tokenizer.json")).unwrap();
        let tokens = tok.encode(&support::sample_text(300)).unwrap();
        assert!(ppl(&ckpt, &tokens).is_finite());
    }
}

#[test]
fn gguf_tokenizer_encodes_like_the_hugging_face_file() {
    let dir = tempfile::tempdir().unwrap();
    let (gguf, _) = support::write_gguf(dir.path(), 0);
    convert_gguf(&gguf, &dir.path().join("hf"), Dtype::F32, false).unwrap();
    let ours = Tokenizer::from_file(&dir.path().join("hf/tokenizer.json")).unwrap();
    let reference = Tokenizer::from_json(&support::reference_tokenizer_json()).unwrap();
    for text in [
        "the theory in a thin tin",
        "In 2024, 12.5% of 1,000 tokens ½ cost 3×4",
        "<|im_start|>user\nhello<|im_end|>\n",
        "  leading spaces\r\n\r\n tabs\tand ünïcödé 東京",
        &support::sample_text(500),
    ] {
        assert_eq!(
            ours.encode(text).unwrap(),
            reference.encode(text).unwrap(),
            "{text:?}"
        );
    }
    let ids = ours.encode("<|im_end|> the").unwrap();
    assert_eq!(ids[0], 258, "control tokens stay whole");
}

#[test]
fn long_texts_encode_like_one_call() {
    let dir = tempfile::tempdir().unwrap();
    let (gguf, _) = support::write_gguf(dir.path(), 0);
    convert_gguf(&gguf, &dir.path().join("hf"), Dtype::F32, false).unwrap();
    let text = std::fs::read_to_string(dir.path().join("hf/tokenizer.json")).unwrap();
    let tok = Tokenizer::from_json(&text).unwrap();
    let raw: tokenizers::Tokenizer = text.parse().unwrap();
    // Lines that start with a space, blank lines and CRLF, like WikiText.
    let body: String = (0..4000)
        .map(|i| match i % 7 {
            0 => " \r\n".to_string(),
            3 => format!(" = Section {i} = \r\n"),
            _ => format!(" {} \r\n", support::sample_text(12).replace('\n', " ")),
        })
        .collect();
    assert!(body.len() > 200_000);
    let whole = raw.encode(body.as_str(), true).unwrap().get_ids().to_vec();
    assert_eq!(tok.encode(&body).unwrap(), whole);
}

#[test]
fn unsupported_gguf_quantisation_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let (gguf, _) = support::write_gguf(dir.path(), 12);
    let err = convert_gguf(&gguf, &dir.path().join("hf"), Dtype::F32, false).unwrap_err();
    assert!(err.to_string().contains("Q4_K"), "{err}");
    assert!(!dir.path().join("hf").exists(), "nothing half-written");
}

#[test]
fn embedding_rows_read_on_the_host_are_the_tables_lookup() {
    use prunemem::model::perplexity::token_tensor;
    use prunemem::model::vocab;
    let dir = tempfile::tempdir().unwrap();
    let device = Default::default();
    let windows = vec![vec![0, 258, 7, 7, 100], vec![3, 1, 2, 258, 0]];
    for (k, stored) in [Dtype::F32, Dtype::BF16, Dtype::F16]
        .into_iter()
        .enumerate()
    {
        let path = dir.path().join(format!("m{k}"));
        let spec = SyntheticSpec {
            dtype: stored,
            seed: 5,
            ..Default::default()
        };
        write_checkpoint(&path, &spec).unwrap();
        let ckpt = Checkpoint::open(&path).unwrap();
        for dtype in [ComputeDtype::F32, ComputeDtype::F16, ComputeDtype::Bf16] {
            let got = vocab::embed_windows::<B>(&ckpt, &windows, dtype, &device).unwrap();
            assert_eq!(got.dims(), [2, 5, spec.hidden]);
            let table = ckpt.load_embedding::<B>(dtype, &device).unwrap();
            let want = table.forward(token_tensor::<B>(&windows, &device));
            assert_eq!(got.into_data(), want.into_data(), "{stored:?} -> {dtype:?}");
        }
        let err = vocab::embed_windows::<B>(&ckpt, &[vec![1, 259]], ComputeDtype::F32, &device)
            .unwrap_err();
        assert!(err.to_string().contains("token 259"), "{err}");
    }
}

#[test]
fn a_damaged_embedding_is_refused_without_reading_the_table_whole() {
    use prunemem::model::vocab;
    let dir = tempfile::tempdir().unwrap();
    let spec = SyntheticSpec::default();
    write_checkpoint(dir.path(), &spec).unwrap();
    // Row 9, column 3 of the f32 table becomes NaN.
    let start = Checkpoint::open(dir.path())
        .unwrap()
        .entry(vocab::EMBEDDING)
        .unwrap()
        .start;
    let file = dir.path().join("model.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    let at = start + (9 * spec.hidden + 3) * 4;
    bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&file, bytes).unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let element = format!("element {}", 9 * spec.hidden + 3);
    // Windows that miss the row read fine; the whole-table check and a
    // window that reads the row name the element.
    let device = Default::default();
    let f32s = ComputeDtype::F32;
    assert!(vocab::embed_windows::<B>(&ckpt, &[vec![1, 8, 10]], f32s, &device).is_ok());
    let err = vocab::check_finite(&ckpt, vocab::EMBEDDING).unwrap_err();
    assert!(err.to_string().contains(&element), "{err}");
    let err = vocab::embed_windows::<B>(&ckpt, &[vec![1, 9, 10]], f32s, &device).unwrap_err();
    assert!(err.to_string().contains(&element), "{err}");
}
