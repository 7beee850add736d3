//! `prunemem prune` through the binary on synthetic models: streamed and
//! resident runs agree, the saved model keeps the input's layout, the logs
//! carry the stages users know, the peak does not grow with depth, an
//! interrupted run leaves no model behind, and bad flags are one-line errors.

mod support;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use prunemem::events::{Event, RunStatus};
use prunemem::model::Checkpoint;
use prunemem::model::synthetic::{SyntheticSpec, write_checkpoint};
use support::{json_line, run_prunemem as run, s};

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    model: PathBuf,
    text: PathBuf,
}

fn fixture(spec: SyntheticSpec) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let model = root.join("model");
    write_checkpoint(&model, &spec).unwrap();
    let text = root.join("text.txt");
    std::fs::write(&text, support::sample_text(6000)).unwrap();
    Fixture {
        _dir: dir,
        root,
        model,
        text,
    }
}

fn prune_args<'a>(f: &'a Fixture, method: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "prune",
        "--model",
        s(&f.model),
        "--method",
        method,
        "--sparsity",
        "0.5",
        "--nsamples",
        "8",
        "--seqlen",
        "64",
        "--calib-text",
        s(&f.text),
        "--ui",
        "none",
        "--json",
    ];
    v.extend_from_slice(extra);
    v
}

#[test]
fn streamed_and_resident_save_the_same_model() {
    let f = fixture(SyntheticSpec {
        layers: 3,
        shards: 2,
        ..Default::default()
    });
    let (a, b) = (f.root.join("streamed"), f.root.join("resident"));
    for (dir, extra) in [(&a, vec![]), (&b, vec!["--resident"])] {
        let mut args = prune_args(
            &f,
            "wanda",
            &[
                "--save",
                s(dir),
                "--eval-text",
                s(&f.text),
                "--eval-windows",
                "4",
            ],
        );
        args.extend(extra);
        let (code, out, err) = run(&args);
        assert_eq!(code, Some(0), "{err}");
        let v = json_line(&out);
        assert!((v["sparsity"].as_f64().unwrap() - 0.5).abs() < 1e-9, "{v}");
        assert!(v["perplexity"].as_f64().unwrap() > 1.0);
        assert_eq!(
            v["layer_sparsity"],
            serde_json::json!([0.5, 0.5, 0.5]),
            "{v}"
        );
        assert_eq!(out.lines().count(), 1, "--json prints only the JSON line");
    }
    let (sa, sb) = (Checkpoint::open(&a).unwrap(), Checkpoint::open(&b).unwrap());
    let input = Checkpoint::open(&f.model).unwrap();
    assert!(
        sa.sharded && sa.shards.len() == 2,
        "same shard layout as the input"
    );
    for (name, e) in &input.tensors {
        let (ea, eb) = (&sa.tensors[name], &sb.tensors[name]);
        for got in [ea, eb] {
            assert_eq!(
                (got.start, got.end, got.dtype, &got.shape),
                (e.start, e.end, e.dtype, &e.shape),
                "{name}"
            );
        }
        assert_eq!(
            sa.read_f32(name).unwrap(),
            sb.read_f32(name).unwrap(),
            "{name}"
        );
        let pruned = name.contains("_proj.");
        assert_eq!(
            sa.read_f32(name).unwrap() == input.read_f32(name).unwrap(),
            !pruned,
            "{name}"
        );
    }
    for file in [
        "config.json",
        "tokenizer.json",
        "model.safetensors.index.json",
    ] {
        assert!(a.join(file).is_file(), "{file} copied");
    }
    assert!(
        a.join("logs/events.jsonl").is_file(),
        "logs default to SAVE/logs"
    );
    assert!(!f.root.join("streamed.partial").exists());
    // Per output row, exactly half of each linear's inputs are zero.
    let q = sa
        .read_f32("model.layers.1.self_attn.q_proj.weight")
        .unwrap();
    for row in q.chunks(64) {
        assert_eq!(row.iter().filter(|v| **v == 0.0).count(), 32);
    }
}

#[test]
fn logs_carry_the_stages_and_layers() {
    let f = fixture(SyntheticSpec {
        layers: 2,
        ..Default::default()
    });
    let save = f.root.join("out");
    let log = f.root.join("log");
    let (code, _, err) = run(&prune_args(
        &f,
        "sparsegpt",
        &[
            "--save",
            s(&save),
            "--eval-text",
            s(&f.text),
            "--eval-windows",
            "2",
            "--log-memory",
            s(&log),
        ],
    ));
    assert_eq!(code, Some(0), "{err}");
    let text = std::fs::read_to_string(log.join("events.jsonl")).unwrap();
    let events: Vec<Event> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let stages: Vec<String> = support::stage_labels(&events);
    assert_eq!(
        stages,
        [
            "01_start",
            "02_model_loaded",
            "03_before_pruning",
            "layer_00_stats",
            "layer_00_pruned",
            "layer_01_stats",
            "layer_01_pruned",
            "04_after_pruning",
            "05_before_eval",
            "06_after_eval",
            "07_before_save_model",
            "08_after_save_model",
            "09_end"
        ]
    );
    let scopes: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            Event::ScopeEnd { report } => Some(report.label.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(scopes, ["layer_00", "layer_01", "eval"]);
    let Some(Event::RunStarted { plan }) = events.first() else {
        panic!("plan first")
    };
    assert_eq!(plan.method.as_deref(), Some("sparsegpt"));
    assert_eq!(plan.settings["nsamples"], 8);
    assert_eq!(plan.model.as_ref().unwrap().layers, 2);
    let Some(Event::RunFinished { summary }) = events.last() else {
        panic!("summary last")
    };
    assert_eq!(summary.status, RunStatus::Ok);
    assert_eq!(
        summary.results["layer_seconds"].as_array().unwrap().len(),
        2
    );
    assert!(events.iter().any(|e| matches!(
        e,
        Event::Progress {
            index: 1,
            total: 2,
            ..
        }
    )));
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::Components { stage, .. } if stage == "layer_00_stats"))
    );
}

/// Streaming keeps one layer resident: 8 layers peak about where 2 do.
#[test]
fn peak_does_not_grow_with_depth() {
    let peak = |layers: usize| {
        let f = fixture(SyntheticSpec {
            layers,
            hidden: 256,
            intermediate: 704,
            heads: 8,
            kv_heads: 2,
            ..Default::default()
        });
        let (code, out, err) = run(&prune_args(&f, "wanda", &["--sample-hz", "50"]));
        assert_eq!(code, Some(0), "{err}");
        json_line(&out)["heap_peak"].as_u64().unwrap()
    };
    let (two, eight) = (peak(2), peak(8));
    let layer_bytes = (4 * 256 * 256 + 3 * 256 * 704) as u64 * 4;
    println!("heap peak: 2 layers {two} B, 8 layers {eight} B, one layer {layer_bytes} B");
    assert!(
        eight < two + layer_bytes,
        "peak grew with depth: {two} -> {eight}"
    );
}

#[test]
fn interrupted_run_leaves_no_model() {
    let f = fixture(SyntheticSpec {
        layers: 24,
        hidden: 256,
        intermediate: 704,
        heads: 8,
        kv_heads: 2,
        ..Default::default()
    });
    let save = f.root.join("pruned");
    let mut args = prune_args(
        &f,
        "sparsegpt",
        &["--save", s(&save), "--nsamples", "32", "--seqlen", "128"],
    );
    args.retain(|a| *a != "--json");
    let mut child = Command::new(env!("CARGO_BIN_EXE_prunemem"))
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let log = f.root.join("pruned.partial/logs/events.jsonl");
    let start = Instant::now();
    while !std::fs::read_to_string(&log)
        .map(|t| t.contains("layer_03_pruned"))
        .unwrap_or(false)
    {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("prune exited ({status}) before layer 3");
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "never reached layer 3"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    assert_eq!(child.wait().unwrap().code(), Some(130));
    assert!(!save.exists(), "no model at --save after an interrupt");
    let text = std::fs::read_to_string(&log).unwrap();
    let last: Event = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert!(
        matches!(last, Event::RunFinished { summary } if summary.status == RunStatus::Interrupted)
    );
}

/// `--owl`: a dense outlier pass first, then each layer at its own
/// sparsity, averaging the target; the ratios and sparsities are in the
/// results; magnitude and RIA take it too; a sparsity OWL pushes past 1 is
/// clamped with a warning.
#[test]
fn owl_sets_per_layer_sparsities() {
    let f = fixture(SyntheticSpec {
        layers: 4,
        ..SyntheticSpec::default()
    });
    for method in ["wanda", "magnitude", "ria"] {
        let logs = f.root.join(format!("owl-{method}"));
        let mut args = prune_args(
            &f,
            method,
            &["--owl", "--sparsity", "0.6", "--log-memory", s(&logs)],
        );
        args.push("--owl-lambda");
        args.push("0.1");
        let (code, out, err) = run(&args);
        assert_eq!(code, Some(0), "{method}: {err}");
        let j = json_line(&out);
        let layers: Vec<f64> = j["layer_sparsity"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        let spread = layers.iter().cloned().fold(f64::MIN, f64::max)
            - layers.iter().cloned().fold(f64::MAX, f64::min);
        assert!(
            spread > 0.1,
            "{method}: OWL left the layers uniform: {layers:?}"
        );
        let mean = layers.iter().sum::<f64>() / layers.len() as f64;
        assert!(
            (mean - 0.6).abs() < 0.02,
            "{method}: mean {mean} ({layers:?})"
        );
        let text = std::fs::read_to_string(logs.join("events.jsonl")).unwrap();
        assert!(text.contains("owl_layer_sparsity") && text.contains("03a_owl_ratios"));
    }
    let (code, _, err) = run(&prune_args(
        &f,
        "wanda",
        &[
            "--owl",
            "--sparsity",
            "0.95",
            "--owl-lambda",
            "0.2",
            "--ui",
            "plain",
        ],
    ));
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("clamped"), "{err}");
}

#[test]
fn dsnot_refines_every_method_at_the_target_sparsity() {
    let f = fixture(SyntheticSpec::default());
    for method in ["wanda", "magnitude", "sparsegpt", "ria"] {
        for pattern in ["unstructured", "2:4"] {
            let extra = [
                "--dsnot",
                "--dsnot-skip",
                "none",
                "--dsnot-threshold",
                "0",
                "--sparsity-type",
                pattern,
            ];
            let (code, out, err) = run(&prune_args(&f, method, &extra));
            assert_eq!(code, Some(0), "{method} {pattern}: {err}");
            let j = json_line(&out);
            for l in j["layer_sparsity"].as_array().unwrap() {
                assert!(
                    (l.as_f64().unwrap() - 0.5).abs() < 1e-9,
                    "{method} {pattern}: {j}"
                );
            }
            let changed = j["dsnot"]["changed_weights"].as_u64().unwrap();
            assert!(
                changed > 0,
                "{method} {pattern}: DSnoT swapped nothing: {j}"
            );
            assert_eq!(j["dsnot"]["refined_linears"], 14, "{method} {pattern}");
        }
    }
    // The authors' default leaves the MLP's three linears alone; the
    // moments are a component of each layer's statistics stage.
    let logs = f.root.join("dsnot-logs");
    let (code, out, err) = run(&prune_args(
        &f,
        "wanda",
        &["--dsnot", "--log-memory", s(&logs)],
    ));
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(json_line(&out)["dsnot"]["refined_linears"], 8);
    let events = std::fs::read_to_string(logs.join("events.jsonl")).unwrap();
    assert!(
        events.contains("dsnot_moments") && events.contains("dsnot_refine"),
        "{events:.300}"
    );
    // Magnitude without calibration text has no means to refine with.
    let (code, _, err) = run(&[
        "prune",
        "--model",
        s(&f.model),
        "--method",
        "magnitude",
        "--dsnot",
        "--ui",
        "none",
    ]);
    assert_eq!(code, Some(2));
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains("--dsnot needs") && lines[0].contains("--calib-text"),
        "{err}"
    );
}

#[test]
fn ria_reallocation_permutes_and_saves_as_a_bitmask() {
    let f = fixture(SyntheticSpec::default());
    let save = f.root.join("realloc");
    let (code, out, err) = run(&prune_args(
        &f,
        "ria",
        &[
            "--sparsity-type",
            "2:4",
            "--reallocation",
            "--lsa",
            "--save",
            s(&save),
            "--save-format",
            "compressed",
        ],
    ));
    assert_eq!(code, Some(0), "{err}");
    let j = json_line(&out);
    assert!((j["sparsity"].as_f64().unwrap() - 0.5).abs() < 1e-9, "{j}");
    let r = &j["reallocation"];
    let (before, after) = (
        r["kept_before"].as_f64().unwrap(),
        r["kept_after"].as_f64().unwrap(),
    );
    assert!(before > 0.0 && after > 0.0, "{j}");
    // The mask is 2:4 in the permuted order only: saved as a bitmask.
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(save.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        config["quantization_config"]["sparsity_config"]["format"],
        "sparse-bitmask"
    );
}

#[test]
fn bad_flags_are_one_line_errors() {
    let f = fixture(SyntheticSpec::default());
    let short = f.root.join("short.txt");
    std::fs::write(&short, "a few words only").unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--sparsity", "1.0"], "[0, 1)"),
        (vec!["--sparsity", "-0.2"], "[0, 1)"),
        (
            vec!["--sparsity-type", "2:4", "--sparsity", "0.6"],
            "must be 0.5",
        ),
        (vec!["--sparsity-type", "4:4"], "0 < N < M"),
        (vec!["--sparsity-type", "2-4"], "unknown sparsity type"),
        (vec!["--nsamples", "0"], "--nsamples"),
        (vec!["--method", "obs"], "unknown method"),
        (vec!["--calib-text", s(&short)], "calibration text"),
        (vec!["--calib-text", "/nonexistent.txt"], "no such file"),
        (
            vec!["--use-variant", "--sparsity-type", "2:4"],
            "--use-variant",
        ),
        (vec!["--owl", "--sparsity-type", "2:4"], "--owl"),
        (vec!["--owl", "--owl-lambda", "-1"], "--owl-lambda"),
        (vec!["--owl", "--owl-m", "0"], "--owl-m"),
        (vec!["--per-outneuron"], "--per-outneuron"),
        (vec!["--dsnot", "--use-variant"], "--dsnot"),
        (
            vec!["--dsnot", "--dsnot-threshold", "-1"],
            "--dsnot-threshold",
        ),
        (vec!["--dsnot-skip", "attn"], "unknown DSnoT skip"),
        (vec!["--lsa"], "--lsa refines --reallocation"),
        (
            vec!["--reallocation", "--sparsity-type", "2:4"],
            "--reallocation permutes",
        ),
        (vec!["--save", s(&f.model)], "input model's folder"),
        (vec!["--save", s(&f.text)], "not a folder"),
    ];
    for (extra, needle) in cases {
        let (code, _, err) = run(&prune_args(&f, "wanda", &extra));
        assert_eq!(code, Some(2), "{extra:?}: {err}");
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
        assert_eq!(lines.len(), 1, "{extra:?}: {err}");
        assert!(lines[0].contains(needle), "{extra:?}: {}", lines[0]);
    }
    let (code, _, err) = run(&[
        "prune",
        "--model",
        s(&f.model),
        "--method",
        "wanda",
        "--ui",
        "none",
    ]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--calib-text is required"), "{err}");
    // Python spellings are accepted.
    let (code, out, err) = run(&[
        "prune",
        "--model",
        s(&f.model),
        "--prune_method",
        "magnitude",
        "--sparsity_ratio",
        "0.5",
        "--sparsity_type",
        "4:8",
        "--ui",
        "none",
        "--json",
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(json_line(&out)["type"], "4:8");
}

/// A save never deletes what prunemem did not write (issue 43): a project
/// folder that merely holds a `config.json` is refused untouched; with
/// `--overwrite` the model's files go in beside the project's; a folder
/// prunemem saved is replaced, the user's notes in it kept.
#[test]
fn saves_never_delete_foreign_files() {
    let f = fixture(SyntheticSpec::default());
    let project = f.root.join("project");
    std::fs::create_dir_all(project.join("src")).unwrap();
    std::fs::write(project.join("config.json"), "{\"mine\": true}").unwrap();
    std::fs::write(project.join("data.csv"), "a,b\n").unwrap();
    std::fs::write(project.join("src/main.py"), "print(1)\n").unwrap();
    let (code, _, err) = run(&prune_args(&f, "magnitude", &["--save", s(&project)]));
    assert_eq!(code, Some(2), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains("not written by prunemem") && lines[0].contains("--overwrite"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(project.join("config.json")).unwrap(),
        "{\"mine\": true}"
    );
    assert!(project.join("data.csv").exists() && project.join("src/main.py").exists());
    assert!(!f.root.join("project.partial").exists() && !f.root.join("project.lock").exists());

    let (code, _, err) = run(&prune_args(
        &f,
        "magnitude",
        &["--save", s(&project), "--overwrite"],
    ));
    assert_eq!(code, Some(0), "{err}");
    assert!(project.join("data.csv").exists() && project.join("src/main.py").exists());
    assert!(project.join("model.safetensors").exists());

    // A folder prunemem saved is replaced; a note the user put there stays.
    let saved = f.root.join("saved");
    let (code, _, err) = run(&prune_args(&f, "magnitude", &["--save", s(&saved)]));
    assert_eq!(code, Some(0), "{err}");
    std::fs::write(saved.join("NOTES.md"), "mine").unwrap();
    let (code, _, err) = run(&prune_args(&f, "magnitude", &["--save", s(&saved)]));
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        std::fs::read_to_string(saved.join("NOTES.md")).unwrap(),
        "mine"
    );
    assert!(saved.join(prunemem::model::owned::MARKER).exists());
}
