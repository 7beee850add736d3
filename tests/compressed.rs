//! `prune --save-format compressed`, `convert --model --to ...` and `eval`
//! of compressed folders, through the binary on synthetic models: the
//! compressed files are smaller, carry compressed-tensors' tensors and
//! config section, convert back to exactly the dense save's weights, and
//! evaluate to the same perplexity.

mod support;

use std::collections::BTreeMap;
use std::path::Path;

use prunemem::model::synthetic::{SyntheticSpec, write_checkpoint};
use safetensors::Dtype;
use support::{json_line, run_prunemem as run, s};

/// Every tensor of a folder's weight files: name → (dtype, shape, bytes).
fn tensors(dir: &Path) -> BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        if !entry
            .file_name()
            .to_string_lossy()
            .ends_with(".safetensors")
        {
            continue;
        }
        let bytes = std::fs::read(entry.path()).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        for (name, v) in st.tensors() {
            out.insert(name, (v.dtype(), v.shape().to_vec(), v.data().to_vec()));
        }
    }
    out
}

/// `src`'s compressed model as two shards and an index in `out`.
fn shard_copy(src: &Path, out: &Path) {
    std::fs::create_dir_all(out).unwrap();
    for f in ["config.json", "tokenizer.json"] {
        if src.join(f).exists() {
            std::fs::copy(src.join(f), out.join(f)).unwrap();
        }
    }
    let all = tensors(src);
    let mut map = serde_json::Map::new();
    let names = [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ];
    for (k, file) in names.iter().enumerate() {
        let part: Vec<(String, safetensors::tensor::TensorView<'_>)> = all
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 2 == k)
            .map(|(_, (name, (dtype, shape, bytes)))| {
                map.insert(name.clone(), serde_json::json!(file));
                let view =
                    safetensors::tensor::TensorView::new(*dtype, shape.clone(), bytes).unwrap();
                (name.clone(), view)
            })
            .collect();
        safetensors::serialize_to_file(part, None, &out.join(file)).unwrap();
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(out.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

fn config(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap()
}

fn prune(model: &Path, text: &Path, pattern: &str, out: &Path, format: &str) -> serde_json::Value {
    let args = [
        "prune",
        "--model",
        s(model),
        "--method",
        "wanda",
        "--sparsity",
        "0.5",
        "--sparsity-type",
        pattern,
        "--nsamples",
        "8",
        "--seqlen",
        "64",
        "--calib-text",
        s(text),
        "--eval-text",
        s(text),
        "--eval-windows",
        "4",
        "--save",
        s(out),
        "--save-format",
        format,
        "--ui",
        "none",
        "--json",
    ];
    let (code, stdout, err) = run(&args);
    assert_eq!(code, Some(0), "{pattern} {format}: {err}");
    json_line(&stdout)
}

#[test]
fn compressed_saves_round_trip_to_the_dense_weights() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(&text, support::sample_text(6000)).unwrap();
    for (dtype, shards) in [(Dtype::F32, 1), (Dtype::BF16, 2)] {
        let model = dir.path().join(format!("model-{dtype:?}"));
        let spec = SyntheticSpec {
            dtype,
            shards,
            ..SyntheticSpec::default()
        };
        write_checkpoint(&model, &spec).unwrap();
        for (pattern, format, parts) in [
            ("unstructured", "sparse-bitmask", 4),
            ("2:4", "sparse-24-bitmask", 3),
        ] {
            let tag = format!("{dtype:?}-{}", pattern.replace(':', "of"));
            let dense_dir = dir.path().join(format!("dense-{tag}"));
            let comp_dir = dir.path().join(format!("comp-{tag}"));
            let dense = prune(&model, &text, pattern, &dense_dir, "dense");
            let comp = prune(&model, &text, pattern, &comp_dir, "compressed");
            // Same pruning, same perplexity: eval streamed from what was saved.
            assert_eq!(dense["perplexity"], comp["perplexity"], "{tag}");
            let (d_bytes, c_bytes) = (
                dense["saved_bytes"].as_u64().unwrap(),
                comp["saved_bytes"].as_u64().unwrap(),
            );
            println!("{tag}: dense {d_bytes} B, {format} {c_bytes} B");
            assert!(c_bytes < d_bytes, "{tag}: {c_bytes} >= {d_bytes}");

            let sc = &config(&comp_dir)["quantization_config"];
            assert_eq!(sc["quant_method"], "compressed-tensors");
            assert_eq!(sc["sparsity_config"]["format"], format);
            let g = sc["sparsity_config"]["global_sparsity"].as_f64().unwrap();
            assert!((g - 0.5).abs() < 1e-3, "{tag}: {g}");
            let t = tensors(&comp_dir);
            let q = "model.layers.0.self_attn.q_proj";
            assert!(!t.contains_key(&format!("{q}.weight")), "{tag}");
            let found = ["shape", "compressed", "bitmask", "row_offsets"]
                .iter()
                .filter(|p| t.contains_key(&format!("{q}.{p}")))
                .count();
            assert_eq!(found, parts, "{tag}");
            assert_eq!(t[&format!("{q}.compressed")].0, dtype, "{tag}");
            assert!(t.contains_key("model.embed_tokens.weight"), "{tag}");

            // The estimator's sizes of both layouts, from the architecture.
            let (code, out, err) = run(&[
                "estimate",
                "--model",
                s(&comp_dir),
                "--method",
                "inference",
                "--device",
                "cpu",
                "--seqlen",
                "64",
                "--json",
            ]);
            assert_eq!(code, Some(0), "{tag}: {err}");
            let saved = &json_line(&out)["estimate"]["saved_weights"];
            assert_eq!(saved["format"], format, "{tag}");
            let data = |m: &BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)>| {
                m.values().map(|(_, _, b)| b.len() as f64).sum::<f64>()
            };
            for (key, actual) in [
                ("dense", data(&tensors(&dense_dir))),
                ("compressed", data(&t)),
            ] {
                let predicted = saved[key].as_f64().unwrap();
                let err = (predicted - actual) / actual;
                println!(
                    "{tag}: {key} predicted {predicted} actual {actual} ({:+.2}%)",
                    100.0 * err
                );
                assert!(err.abs() < 0.01, "{tag} {key}: {predicted} vs {actual}");
            }

            // Back to dense: byte-identical to the dense save.
            let back = dir.path().join(format!("back-{tag}"));
            let (code, _, err) = run(&["convert", "--model", s(&comp_dir), "--out", s(&back)]);
            assert_eq!(code, Some(0), "{tag}: {err}");
            assert!(config(&back).get("quantization_config").is_none());
            let want = tensors(&dense_dir);
            let got = tensors(&back);
            assert_eq!(
                want.keys().collect::<Vec<_>>(),
                got.keys().collect::<Vec<_>>()
            );
            for (name, w) in &want {
                assert!(
                    w == &got[name],
                    "{tag}: {name} differs after the round trip"
                );
            }

            // eval reads the compressed folder as it is.
            let eval = |m: &Path| {
                let (code, out, err) = run(&[
                    "eval",
                    "--model",
                    s(m),
                    "--text",
                    s(&text),
                    "--seqlen",
                    "64",
                    "--windows",
                    "4",
                    "--ui",
                    "none",
                    "--json",
                ]);
                assert_eq!(code, Some(0), "{tag}: {err}");
                json_line(&out)["perplexity"].as_f64().unwrap()
            };
            assert_eq!(eval(&comp_dir), eval(&dense_dir), "{tag}");
            // llm-compressor shards its files: the same tensors over two
            // shards and an index read the same.
            let sharded = dir.path().join(format!("sharded-{tag}"));
            shard_copy(&comp_dir, &sharded);
            assert_eq!(eval(&sharded), eval(&dense_dir), "{tag}: sharded");

            // And the dense save compresses to the same files prune wrote.
            let again = dir.path().join(format!("again-{tag}"));
            let (code, _, err) = run(&[
                "convert",
                "--model",
                s(&dense_dir),
                "--out",
                s(&again),
                "--to",
                "compressed",
            ]);
            assert_eq!(code, Some(0), "{tag}: {err}");
            assert!(
                tensors(&again) == tensors(&comp_dir),
                "{tag}: convert and prune disagree"
            );
        }
    }
}

#[test]
fn unfit_formats_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    write_checkpoint(&model, &SyntheticSpec::default()).unwrap();
    let out = dir.path().join("out");
    for (args, needle) in [
        (
            vec!["--to", "sparse-24-bitmask"],
            "sparse-24-bitmask needs 2:4",
        ),
        (vec!["--to", "dense"], "declares no compressed-tensors"),
    ] {
        let mut a = vec!["convert", "--model", s(&model), "--out", s(&out)];
        a.extend(args);
        let (code, _, err) = run(&a);
        assert_eq!(code, Some(2), "{err}");
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
        assert_eq!(lines.len(), 1, "{err}");
        assert!(lines[0].contains(needle), "{err}");
        assert!(!out.exists(), "a failed convert left {}", out.display());
    }
    let (code, _, err) = run(&[
        "prune",
        "--model",
        s(&model),
        "--method",
        "magnitude",
        "--save-format",
        "compressed",
        "--ui",
        "none",
    ]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("--save-format compressed writes the saved model: give --save"),
        "{err}"
    );
}
