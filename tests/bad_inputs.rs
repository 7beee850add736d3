//! The bad-input census: what a hostile but fair user throws at prunemem,
//! one case a row. Every case must end with exit status 2, exactly one line
//! on stderr (an `error:` line), no panic, and nothing left behind: not in
//! the fixture folder, not in the temporary folder the run was given.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use prunemem::model::synthetic::{SyntheticSpec, write_checkpoint};

/// A copy of the model folder with `config.json` edited by `edit`.
fn variant(root: &Path, name: &str, edit: impl Fn(&mut serde_json::Value)) -> PathBuf {
    let src = root.join("model");
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["model.safetensors", "tokenizer.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let text = std::fs::read_to_string(src.join("config.json")).unwrap();
    let mut cfg: serde_json::Value = serde_json::from_str(&text).unwrap();
    edit(&mut cfg);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    dir
}

/// Overwrites `bytes` at `at` in a copy of `src` named `name`.
fn patched(src: &Path, name: &str, at: usize, bytes: &[u8]) -> PathBuf {
    let mut data = std::fs::read(src).unwrap();
    data[at..at + bytes.len()].copy_from_slice(bytes);
    let out = src.with_file_name(name);
    std::fs::write(&out, data).unwrap();
    out
}

/// Byte position of the dims of tensor `name` in a GGUF's directory.
fn gguf_dims_at(gguf: &[u8], name: &str) -> usize {
    let n = name.as_bytes();
    let at = gguf.windows(n.len()).position(|w| w == n).unwrap();
    at + n.len() + 4
}

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Fixture {
    fn p(&self, rel: &str) -> String {
        self.root.join(rel).display().to_string()
    }
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    write_checkpoint(&root.join("model"), &SyntheticSpec::default()).unwrap();
    std::fs::write(root.join("text.txt"), support::sample_text(6000)).unwrap();
    std::fs::write(root.join("short.txt"), "a few words only").unwrap();
    std::fs::write(root.join("binary.txt"), [0xffu8, 0xfe, 0x00, 0x80]).unwrap();
    std::fs::write(root.join("afile"), "not a folder").unwrap();
    std::fs::create_dir_all(root.join("empty")).unwrap();
    variant(&root, "layers-huge", |c| {
        c["num_hidden_layers"] = 1_000_000_000_000u64.into()
    });
    variant(&root, "positions-0", |c| {
        c["max_position_embeddings"] = 0.into()
    });
    variant(&root, "eps-negative", |c| c["rms_norm_eps"] = (-1.0).into());
    variant(&root, "vocab-small", |c| c["vocab_size"] = 100.into());
    // A tokenizer from a larger vocabulary than the model's.
    let other_tok = variant(&root, "other-tokenizer", |_| {});
    let tok_path = other_tok.join("tokenizer.json");
    let mut tok: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&tok_path).unwrap()).unwrap();
    tok["model"]["vocab"]["zzzz"] = 5000.into();
    std::fs::write(&tok_path, tok.to_string()).unwrap();
    let no_config = variant(&root, "no-config", |_| {});
    std::fs::remove_file(no_config.join("config.json")).unwrap();
    let no_tok = variant(&root, "no-tokenizer", |_| {});
    std::fs::remove_file(no_tok.join("tokenizer.json")).unwrap();
    let bad_json = variant(&root, "bad-json", |_| {});
    std::fs::write(bad_json.join("config.json"), "{ not json").unwrap();
    // Weights: a NaN, a truncated file, a garbage header.
    let st = root.join("model/model.safetensors");
    let bytes = std::fs::read(&st).unwrap();
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let nan = variant(&root, "nan", |_| {});
    patched(
        &nan.join("model.safetensors"),
        "model.safetensors",
        8 + header + 16,
        &f32::NAN.to_le_bytes(),
    );
    let trunc = variant(&root, "truncated", |_| {});
    std::fs::write(trunc.join("model.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    let garbage = variant(&root, "garbage", |_| {});
    patched(
        &garbage.join("model.safetensors"),
        "model.safetensors",
        8,
        b"[[[[not json",
    );
    // GGUF: a valid one, then offsets that wrap, a zero dimension, bad magic.
    let (gguf, _) = support::write_gguf(&root, 1);
    let g = std::fs::read(&gguf).unwrap();
    let dims = gguf_dims_at(&g, "blk.0.attn_q.weight");
    let n_dims = u32::from_le_bytes(g[dims - 4..dims].try_into().unwrap()) as usize;
    let offset_at = dims + 8 * n_dims + 4;
    patched(&gguf, "wrap.gguf", offset_at, &(u64::MAX - 7).to_le_bytes());
    patched(&gguf, "zero-dim.gguf", dims, &0u64.to_le_bytes());
    patched(&gguf, "magic.gguf", 0, b"GGUX");
    std::fs::write(root.join("cut.gguf"), &g[..g.len() / 3]).unwrap();
    Fixture { _dir: dir, root }
}

/// The census: (what, argv).
fn cases(f: &Fixture) -> Vec<(&'static str, Vec<String>)> {
    let (m, t) = (f.p("model"), f.p("text.txt"));
    let prune = |extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = [
            "prune",
            "--model",
            &m,
            "--calib-text",
            &t,
            "--nsamples",
            "4",
            "--seqlen",
            "32",
            "--ui",
            "none",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        v.extend(extra.iter().map(|a| a.to_string()));
        v
    };
    let with_model = |model: &str, extra: &[&str]| -> Vec<String> {
        let mut v = prune(extra);
        v[2] = f.p(model);
        v
    };
    let eval = |model: &str, extra: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = [
            "eval",
            "--model",
            &f.p(model),
            "--text",
            &t,
            "--seqlen",
            "32",
            "--windows",
            "2",
            "--ui",
            "none",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        v.extend(extra.iter().map(|a| a.to_string()));
        v
    };
    let argv = |a: &[&str]| a.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let gp = |extra: &[&str]| {
        let mut v = prune(&["--method", "gradprobe"]);
        v.extend(extra.iter().map(|a| a.to_string()));
        v
    };
    vec![
        ("sparsity 1.0", prune(&["--sparsity", "1.0"])),
        ("sparsity negative", prune(&["--sparsity", "-0.2"])),
        ("sparsity NaN", prune(&["--sparsity", "nan"])),
        (
            "2:4 with sparsity 0.6",
            prune(&["--sparsity-type", "2:4", "--sparsity", "0.6"]),
        ),
        ("4:4", prune(&["--sparsity-type", "4:4"])),
        ("pattern 2-4", prune(&["--sparsity-type", "2-4"])),
        ("nsamples 0", prune(&["--nsamples", "0"])),
        ("unknown method", prune(&["--method", "obs"])),
        (
            "calibration text too short",
            prune(&["--calib-text", &f.p("short.txt")]),
        ),
        (
            "calibration text missing",
            prune(&["--calib-text", "/nonexistent.txt"]),
        ),
        (
            "calibration text not UTF-8",
            prune(&["--calib-text", &f.p("binary.txt")]),
        ),
        (
            "calibration lines reversed",
            prune(&["--calib-lines", "5:2"]),
        ),
        (
            "variant with 2:4",
            prune(&["--use-variant", "--sparsity-type", "2:4"]),
        ),
        ("save into the input folder", prune(&["--save", &m])),
        ("save onto a file", prune(&["--save", &f.p("afile")])),
        ("batch size 0", prune(&["--batch-size", "0"])),
        ("block size 0", prune(&["--blocksize", "0"])),
        (
            "eval windows 0",
            prune(&["--eval-windows", "0", "--eval-text", &t]),
        ),
        (
            "percdamp -1",
            prune(&["--method", "sparsegpt", "--percdamp", "-1"]),
        ),
        ("sample rate 5000", prune(&["--sample-hz", "5000"])),
        ("needs 4 TiB", prune(&["--nsamples", "100000000000"])),
        ("gradprobe in f16", gp(&["--dtype", "f16"])),
        ("gradprobe resident", gp(&["--resident"])),
        ("gradprobe 0 batches", gp(&["--num-batches", "0"])),
        ("gradprobe iterative without eval", gp(&["--iterative"])),
        (
            "gradprobe initial sparsity 1.5",
            gp(&[
                "--iterative",
                "--eval-text",
                &t,
                "--initial-sparsity",
                "1.5",
            ]),
        ),
        ("gradprobe 2:4", gp(&["--sparsity-type", "2:4"])),
        ("model folder missing", with_model("missing", &[])),
        ("model is a file", with_model("afile", &[])),
        ("model folder empty", with_model("empty", &[])),
        ("config.json missing", with_model("no-config", &[])),
        ("config.json not JSON", with_model("bad-json", &[])),
        ("1e12 layers", with_model("layers-huge", &[])),
        ("0 positions", with_model("positions-0", &[])),
        ("negative eps", with_model("eps-negative", &[])),
        (
            "embedding smaller than the config says",
            with_model("vocab-small", &[]),
        ),
        (
            "tokenizer beyond vocabulary",
            with_model("other-tokenizer", &[]),
        ),
        ("tokenizer.json missing", with_model("no-tokenizer", &[])),
        ("NaN weights (prune)", with_model("nan", &[])),
        ("truncated safetensors", with_model("truncated", &[])),
        ("garbage safetensors header", with_model("garbage", &[])),
        ("NaN weights (eval)", eval("nan", &[])),
        ("eval batch size 0", eval("model", &["--batch-size", "0"])),
        ("eval windows 0", eval("model", &["--windows", "0"])),
        (
            "eval text missing",
            eval("model", &["--text", "/nonexistent.txt"]),
        ),
        ("eval of a model folder missing", eval("missing", &[])),
        (
            "GGUF offset wraps around",
            argv(&[
                "convert",
                "--gguf",
                &f.p("wrap.gguf"),
                "--out",
                &f.p("out1"),
            ]),
        ),
        (
            "GGUF zero dimension",
            argv(&[
                "convert",
                "--gguf",
                &f.p("zero-dim.gguf"),
                "--out",
                &f.p("out2"),
            ]),
        ),
        (
            "GGUF bad magic",
            argv(&[
                "convert",
                "--gguf",
                &f.p("magic.gguf"),
                "--out",
                &f.p("out3"),
            ]),
        ),
        (
            "GGUF truncated",
            argv(&["convert", "--gguf", &f.p("cut.gguf"), "--out", &f.p("out4")]),
        ),
        (
            "convert onto a file",
            argv(&[
                "convert",
                "--gguf",
                &f.p("tiny.gguf"),
                "--out",
                &f.p("afile"),
            ]),
        ),
        (
            "report of an empty folder",
            argv(&["report", &f.p("empty")]),
        ),
        (
            "report of a missing folder",
            argv(&["report", &f.p("missing")]),
        ),
        (
            "estimate 0 parameters",
            argv(&["estimate", "--params", "0"]),
        ),
        (
            "estimate seqlen 0",
            argv(&["estimate", "--params", "7B", "--seqlen", "0"]),
        ),
        ("watch without a command", argv(&["watch", "--ui", "none"])),
        (
            "watch a process that does not exist",
            argv(&["watch", "--ui", "none", "--pid", "999999999"]),
        ),
        (
            "replay of a missing folder",
            argv(&["replay", &f.p("missing"), "--ui", "none"]),
        ),
        ("snapshot every 0 s", argv(&["snapshot", "--every", "0"])),
    ]
}

#[test]
fn every_bad_input_is_one_line_exit_2_and_leaves_nothing() {
    let f = fixture();
    let tmp = tempfile::tempdir().unwrap();
    let before = support::listing(&f.root);
    let mut table = Vec::new();
    let mut failures = Vec::new();
    let all = cases(&f);
    assert!(all.len() >= 40, "the census has {} cases", all.len());
    for (what, argv) in &all {
        let out = Command::new(env!("CARGO_BIN_EXE_prunemem"))
            .args(argv)
            .env("TMPDIR", tmp.path())
            .env("HF_HUB_OFFLINE", "1")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        let first = lines.first().copied().unwrap_or("");
        table.push(format!("| {what} | {:?} | {first} |", out.status.code()));
        let mut why = Vec::new();
        if out.status.code() != Some(2) {
            why.push(format!("exit {:?}", out.status.code()));
        }
        if lines.len() != 1 || !first.starts_with("error") {
            why.push(format!("stderr {lines:?}"));
        }
        if err.contains("internal error") || err.contains("panicked") {
            why.push("panic".into());
        }
        let after = support::listing(&f.root);
        if after != before {
            let new: Vec<_> = after.difference(&before).collect();
            why.push(format!("left {new:?}"));
        }
        let left = support::listing(tmp.path());
        if !left.is_empty() {
            why.push(format!("left in TMPDIR {left:?}"));
        }
        if !why.is_empty() {
            failures.push(format!("{what}: {}", why.join("; ")));
        }
    }
    // The census as a table, for the record (`cargo test -- --nocapture`).
    println!(
        "| case | exit | first line |\n|---|---|---|\n{}",
        table.join("\n")
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
