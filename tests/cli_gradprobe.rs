//! `prunemem prune --method gradprobe` through the binary on a synthetic
//! model: the reference's stages in the log, the saved model, `--iterative`
//! stopping and keeping the best step, and one-line errors for bad flags.

mod support;

use prunemem::events::Event;
use prunemem::model::Checkpoint;
use prunemem::model::synthetic::{SyntheticSpec, write_checkpoint};
use support::{json_line, run_prunemem as run, s};

fn setup() -> (tempfile::TempDir, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    write_checkpoint(
        &model,
        &SyntheticSpec {
            layers: 2,
            ..Default::default()
        },
    )
    .unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(&text, support::sample_text(4000)).unwrap();
    let (m, t) = (s(&model).to_string(), s(&text).to_string());
    (dir, m, t)
}

fn args<'a>(model: &'a str, text: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "prune",
        "--model",
        model,
        "--method",
        "gradprobe",
        "--sparsity",
        "0.3",
        "--seqlen",
        "32",
        "--num-batches",
        "2",
        "--gradient-threshold",
        "2.0",
        "--calib-text",
        text,
        "--ui",
        "none",
        "--json",
    ];
    v.extend_from_slice(extra);
    v
}

#[test]
fn one_step_logs_the_reference_stages_and_saves_the_model() {
    let (dir, model, text) = setup();
    let save = dir.path().join("out");
    let log = dir.path().join("log");
    let (code, out, err) = run(&args(
        &model,
        &text,
        &[
            "--save",
            s(&save),
            "--log-memory",
            s(&log),
            "--eval-text",
            &text,
            "--eval-windows",
            "2",
        ],
    ));
    assert_eq!(code, Some(0), "{err}");
    let v = json_line(&out);
    let sparsity = v["sparsity"].as_f64().unwrap();
    // Candidates are 30% of each linear; the probe restores some of them.
    assert!(sparsity > 0.05 && sparsity <= 0.3 + 1e-9, "{v}");
    assert!(v["perplexity"].as_f64().unwrap() > 1.0, "{v}");

    let text_log = std::fs::read_to_string(log.join("events.jsonl")).unwrap();
    let events: Vec<Event> = text_log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let stages: Vec<String> = support::stage_labels(&events);
    assert_eq!(
        stages,
        [
            "00_initial",
            "01_model_loaded",
            "02_data_prepared",
            "04_saved_tentative_values",
            "08_original_gradients_computed",
            "09_tentative_masks_created",
            "10_weights_reduced",
            "14_modified_gradients_computed",
            "15_final_masks_computed",
            "16_final_pruning_applied",
            "17_before_eval",
            "18_after_eval",
            "19_before_save_model",
            "20_after_save_model",
            "21_end",
        ]
    );
    let scopes: Vec<String> = events
        .iter()
        .filter_map(|e| match e {
            Event::ScopeEnd { report } => Some(report.label.clone()),
            _ => None,
        })
        .collect();
    assert!(
        scopes.contains(&"layer_01_original".to_string()),
        "{scopes:?}"
    );
    assert!(
        scopes.contains(&"layer_00_modified".to_string()),
        "{scopes:?}"
    );
    let Some(Event::RunFinished { summary }) = events.last() else {
        panic!("summary last")
    };
    let r = &summary.results;
    let (t, p, k) = (
        r["tentative"].as_u64().unwrap(),
        r["pruned"].as_u64().unwrap(),
        r["restored"].as_u64().unwrap(),
    );
    assert_eq!(t, p + k);

    // The saved model holds exactly the zeros the run reported.
    let saved = Checkpoint::open(&save).unwrap();
    let (mut zeros, mut total) = (0usize, 0usize);
    for name in saved.tensors.keys().filter(|n| n.contains("_proj")) {
        let w = saved.read_f32(name).unwrap();
        zeros += w.iter().filter(|x| **x == 0.0).count();
        total += w.len();
    }
    assert!((zeros as f64 / total as f64 - sparsity).abs() < 1e-9);
}

#[test]
fn iterative_steps_until_perplexity_rises_and_keeps_the_best() {
    let (_dir, model, text) = setup();
    let (code, out, err) = run(&args(
        &model,
        &text,
        &[
            "--iterative",
            "--initial-sparsity",
            "0.2",
            "--sparsity-step",
            "0.2",
            "--max-ppl-increase",
            "0.5",
            "--eval-text",
            &text,
            "--eval-windows",
            "2",
            "--include-embeddings",
            "--log-memory",
            s(&_dir.path().join("log")),
        ],
    ));
    assert_eq!(code, Some(0), "{err}");
    let v = json_line(&out);
    let log = std::fs::read_to_string(_dir.path().join("log/events.jsonl")).unwrap();
    let summary = log.lines().last().unwrap();
    let summary: serde_json::Value = serde_json::from_str(summary).unwrap();
    let results = &summary["summary"]["results"];
    let steps = results["iterations"].as_array().unwrap();
    let dense = results["dense_perplexity"].as_f64().unwrap();
    assert!(!steps.is_empty());
    // Every kept step is within the budget; the run stops at the first that
    // is not (or after two steps without progress), and the result is the
    // last step within budget.
    let within: Vec<&serde_json::Value> = steps
        .iter()
        .take_while(|s| s["perplexity"].as_f64().unwrap() - dense <= 0.5)
        .collect();
    let last_ok = within
        .last()
        .map(|s| s["perplexity"].as_f64().unwrap())
        .unwrap_or(dense);
    assert!(
        (v["perplexity"].as_f64().unwrap() - last_ok).abs() < 1e-9,
        "{v} vs {steps:?}"
    );
    assert!(steps.len() <= within.len() + 1);
    // Sparsity grows step by step while it is kept.
    for w in within.windows(2) {
        assert!(w[1]["sparsity"].as_f64() >= w[0]["sparsity"].as_f64());
    }
}

#[test]
fn bad_gradprobe_flags_are_one_line_errors() {
    let (_dir, model, text) = setup();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--sparsity-type", "2:4", "--sparsity", "0.5"],
            "unstructured",
        ),
        (vec!["--dtype", "bf16"], "--dtype f32"),
        (vec!["--resident"], "--resident"),
        (vec!["--num-batches", "0"], "--num-batches"),
        (vec!["--iterative"], "--eval-text"),
        (vec!["--strategy", "random"], "unknown strategy"),
        (vec!["--grad-precision", "f8"], "gradient precision"),
        (vec!["--num-batches", "100000"], "windows"),
    ];
    for (extra, needle) in cases {
        let (code, _, err) = run(&args(&model, &text, &extra));
        assert_eq!(code, Some(2), "{extra:?}: {err}");
        let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
        assert_eq!(lines.len(), 1, "{extra:?}: {err}");
        assert!(lines[0].contains(needle), "{extra:?}: {}", lines[0]);
    }
}

/// The passes embed their batches from the rows they look up, never the
/// whole table; a damaged table is still refused, even where the damage is
/// in a row no batch reads (an untied model: the head never reads it).
#[test]
fn a_damaged_embedding_is_refused_though_only_its_rows_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    let spec = SyntheticSpec {
        layers: 2,
        tied: false,
        ..Default::default()
    };
    write_checkpoint(&model, &spec).unwrap();
    let file = model.join("model.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let meta: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header]).unwrap();
    let end = meta["model.embed_tokens.weight"]["data_offsets"][1]
        .as_u64()
        .unwrap() as usize;
    // The last value of the last row (a special token the text never has).
    let at = 8 + header + end - 4;
    bytes[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&file, bytes).unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(&text, support::sample_text(4000)).unwrap();
    let (code, out, err) = run(&args(s(&model), s(&text), &[]));
    assert_ne!(code, Some(0), "{out}\n{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("model.embed_tokens.weight") && err.contains("NaN"),
        "{err}"
    );
}
