//! `prunemem convert` and `prunemem eval` through the binary, and the
//! one-line errors (exit 2) bad inputs must give.

mod support;

use prunemem::model::synthetic::{SyntheticSpec, write_checkpoint};
use support::{run_prunemem as prunemem, s};

fn assert_user_error(args: &[&str], needle: &str) {
    let (code, _, err) = prunemem(args);
    assert_eq!(code, Some(2), "{args:?}: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "{args:?}: {err}");
    assert!(
        lines[0].contains(needle),
        "{args:?}: '{}' lacks '{needle}'",
        lines[0]
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn convert_then_eval() {
    let dir = tempfile::tempdir().unwrap();
    let (gguf, _) = support::write_gguf(dir.path(), 3);
    let out = dir.path().join("model");
    let (code, stdout, err) = prunemem(&["convert", "--gguf", s(&gguf), "--out", s(&out)]);
    assert_eq!(code, Some(0), "{err}");
    assert!(stdout.contains("Q4_1"), "{stdout}");
    let text = dir.path().join("text.txt");
    std::fs::write(&text, support::sample_text(3000)).unwrap();
    let log = dir.path().join("log");
    let (code, stdout, err) = prunemem(&[
        "eval",
        "--model",
        s(&out),
        "--text",
        s(&text),
        "--seqlen",
        "1000",
        "--windows",
        "3",
        "--ui",
        "plain",
        "--log-memory",
        s(&log),
        "--json",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("exceeds the model's max_position_embeddings (128)"),
        "{err}"
    );
    let last = stdout.lines().last().unwrap();
    let v: serde_json::Value = serde_json::from_str(last).unwrap();
    assert_eq!(v["seqlen"], 128, "seqlen capped at max positions");
    assert_eq!(v["windows"], 3);
    assert!(v["perplexity"].as_f64().unwrap() > 1.0);
    let csv = std::fs::read_to_string(log.join("memory_log.csv")).unwrap();
    for stage in [
        "01_start",
        "02_model_loaded",
        "05_before_eval",
        "06_after_eval",
        "09_end",
    ] {
        assert!(
            csv.contains(&format!(",{stage},")),
            "{stage} missing from {csv}"
        );
    }
}

#[test]
fn bad_inputs_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    write_checkpoint(&model, &SyntheticSpec::default()).unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(&text, support::sample_text(2000)).unwrap();

    assert_user_error(
        &["eval", "--model", "/nonexistent/model", "--text", s(&text)],
        "no such folder",
    );

    let trunc = dir.path().join("trunc");
    std::fs::create_dir_all(&trunc).unwrap();
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(model.join(f), trunc.join(f)).unwrap();
    }
    let bytes = std::fs::read(model.join("model.safetensors")).unwrap();
    std::fs::write(trunc.join("model.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    assert_user_error(
        &["eval", "--model", s(&trunc), "--text", s(&text)],
        "truncated",
    );

    let sharded = dir.path().join("sharded");
    write_checkpoint(
        &sharded,
        &SyntheticSpec {
            shards: 2,
            ..Default::default()
        },
    )
    .unwrap();
    std::fs::remove_file(sharded.join("model-00002-of-00002.safetensors")).unwrap();
    assert_user_error(
        &["eval", "--model", s(&sharded), "--text", s(&text)],
        "does not exist",
    );

    let nohidden = dir.path().join("nohidden");
    write_checkpoint(&nohidden, &SyntheticSpec::default()).unwrap();
    let cfg = std::fs::read_to_string(nohidden.join("config.json")).unwrap();
    std::fs::write(
        nohidden.join("config.json"),
        cfg.replace("\"hidden_size\"", "\"hidden_sz\""),
    )
    .unwrap();
    assert_user_error(
        &["eval", "--model", s(&nohidden), "--text", s(&text)],
        "hidden_size",
    );

    let (q4k, _) = support::write_gguf(dir.path(), 12);
    assert_user_error(
        &[
            "convert",
            "--gguf",
            s(&q4k),
            "--out",
            s(&dir.path().join("x")),
        ],
        "Q4_K",
    );
    assert_user_error(
        &[
            "convert",
            "--gguf",
            s(&text),
            "--out",
            s(&dir.path().join("y")),
        ],
        "not a GGUF file",
    );

    let latin1 = dir.path().join("latin1.txt");
    std::fs::write(&latin1, b"caf\xe9 au lait").unwrap();
    assert_user_error(
        &["eval", "--model", s(&model), "--text", s(&latin1)],
        "not UTF-8",
    );

    let short = dir.path().join("short.txt");
    std::fs::write(&short, "too short").unwrap();
    assert_user_error(
        &[
            "eval",
            "--model",
            s(&model),
            "--text",
            s(&short),
            "--seqlen",
            "64",
        ],
        "tokens",
    );

    assert_user_error(
        &[
            "eval",
            "--model",
            s(&model),
            "--text",
            s(&text),
            "--lines",
            "9:3",
        ],
        "bad line range",
    );
    assert_user_error(
        &[
            "eval",
            "--model",
            s(&model),
            "--text",
            s(&text),
            "--dtype",
            "int4",
        ],
        "int4",
    );
    assert_user_error(
        &[
            "eval",
            "--model",
            s(&model.join("model.safetensors")),
            "--text",
            s(&text),
        ],
        "is a file",
    );
}
