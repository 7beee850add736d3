//! `prunemem prune --method gradprobe` through the binary on a synthetic
//! model: the reference's stages in the log, the saved model, the last
//! step evaluated as step 6 zeroes its layers when nothing is saved,
//! `--iterative` stopping and keeping the best step, and one-line errors
//! for bad flags.

mod support;

use prunemem::events::Event;
use prunemem::model::Checkpoint;
use prunemem::model::synthetic::{SyntheticSpec, write_checkpoint};
use support::{json_line, run_prunemem as run, run_prunemem_with, s};

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

/// Without a save, step 6 hands each pruned layer to the evaluation as it
/// zeroes it (`model::inline_eval`) instead of writing the pruned model to
/// a scratch checkpoint: the scratch checkpoint's perplexity to the bit,
/// nothing written to the temp folder, the place recorded, and the
/// windows' hidden states held through step 6 where the estimate counts
/// them. `--keep-pruned disk` still writes the scratch
/// model; with `--save` the model is evaluated from the save folder and
/// `--keep-pruned inline` is warned about.
#[test]
fn one_step_without_a_save_is_evaluated_as_step_6_zeroes_its_layers() {
    let (dir, model, text) = setup();
    let run_with = |name: &str, extra: &[&str]| {
        let mut argv = vec!["--eval-text", &text, "--eval-windows", "4"];
        argv.extend_from_slice(extra);
        run_in_tmp(dir.path(), name, &model, &text, &argv)
    };
    let (inline, inline_events, inline_log) = run_with("auto", &[]);
    let (disk, disk_events, disk_log) = run_with("disk", &["--keep-pruned", "disk"]);
    assert_eq!(inline["pruned_layers_kept"], "inline", "{inline}");
    assert_eq!(disk["pruned_layers_kept"], "disk", "{disk}");
    let ppl = |v: &serde_json::Value| v["perplexity"].as_f64().expect("a perplexity");
    assert_eq!(
        ppl(&inline).to_bits(),
        ppl(&disk).to_bits(),
        "the same zeroed layers through the same batches"
    );
    for key in ["sparsity", "layer_sparsity", "pruned", "restored"] {
        assert_eq!(inline[key], disk[key], "{key}");
    }
    // Only the scratch checkpoint's run writes the model, and says so.
    assert!(
        inline["seconds_by_phase"].get("write").is_none(),
        "{inline}"
    );
    assert!(disk["seconds_by_phase"].get("write").is_some(), "{disk}");
    let says =
        |events: &str| events.contains("the evaluation runs each pruned layer as it is pruned");
    assert!(says(&inline_events) && !says(&disk_events));
    // The estimate follows the place: a step-6 phase holding the
    // evaluation's hidden states (4 windows of 32 tokens, f32), which the
    // run held there too. (This model is too small for the totals to
    // mean much: the process is most of them; SmolLM2's are in
    // docs/estimator.md.)
    let cmp = support::against_json(&inline_log);
    let step6 = support::phase_of(&cmp, "step 6");
    println!("step 6: {step6}");
    let config =
        prunemem::model::LlamaConfig::from_file(&std::path::Path::new(&model).join("config.json"))
            .unwrap();
    let states = 4 * 32 * config.hidden_size as u64 * 4;
    let activations = step6["categories"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["category"] == "activations")
        .expect("activations in step 6");
    assert_eq!(activations["predicted"].as_u64(), Some(states), "{step6}");
    assert!(activations["measured"].as_u64() >= Some(states), "{step6}");
    let (code, out, err) = run(&["estimate", "--against", &disk_log, "--json"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        !out.contains("step 6"),
        "no step 6 phase from a scratch checkpoint: {out}"
    );
    // With a save, the model is evaluated from the save folder.
    let save = dir.path().join("saved");
    let (saved, saved_events, _) =
        run_with("save", &["--save", s(&save), "--keep-pruned", "inline"]);
    assert!(saved["pruned_layers_kept"].is_null(), "{saved}");
    assert!(saved_events.contains("evaluated from the save folder"));
    assert_eq!(ppl(&saved).to_bits(), ppl(&disk).to_bits());
}

/// A GradProbe run with `extra`, its own empty `TMPDIR` (checked empty
/// after it) and logs: its `--json` line, its events and its log folder.
fn run_in_tmp(
    dir: &std::path::Path,
    name: &str,
    model: &str,
    text: &str,
    extra: &[&str],
) -> (serde_json::Value, String, String) {
    let tmp = dir.join(format!("tmp-{name}"));
    let log = dir.join(format!("log-{name}"));
    std::fs::create_dir_all(&tmp).unwrap();
    let mut argv = vec!["--log-memory", s(&log)];
    argv.extend_from_slice(extra);
    let (code, out, err) = run_prunemem_with(&args(model, text, &argv), &[("TMPDIR", s(&tmp))]);
    assert_eq!(code, Some(0), "{name}: {err}");
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().flatten().collect();
    assert!(left.is_empty(), "{name}: left in TMPDIR: {left:?}");
    let events = std::fs::read_to_string(log.join("events.jsonl")).unwrap();
    (json_line(&out), events, s(&log).to_string())
}

/// `--iterative` evaluates each step's model as its layers are zeroed,
/// the probe's own layers untouched for the next step: every step's
/// sparsity and perplexity are the scratch checkpoints' to the bit
/// (`--keep-pruned disk`), and nothing is written.
#[test]
fn iterative_steps_are_evaluated_as_their_layers_are_zeroed() {
    let (dir, model, text) = setup();
    let iterate = [
        "--iterative",
        "--initial-sparsity",
        "0.2",
        "--sparsity-step",
        "0.3",
        "--max-ppl-increase",
        "1e9",
        "--eval-text",
        &text,
        "--eval-windows",
        "2",
    ];
    let (inline, inline_events, inline_log) =
        run_in_tmp(dir.path(), "auto", &model, &text, &iterate);
    let disk_args = [&iterate[..], &["--keep-pruned", "disk"]].concat();
    let (disk, disk_events, _) = run_in_tmp(dir.path(), "disk", &model, &text, &disk_args);
    assert_eq!(inline["pruned_layers_kept"], "inline", "{inline}");
    assert_eq!(disk["pruned_layers_kept"], "disk", "{disk}");
    let steps = |events: &str| -> Vec<(u64, u64)> {
        let last = events.lines().last().unwrap();
        let summary: serde_json::Value = serde_json::from_str(last).unwrap();
        let steps = summary["summary"]["results"]["iterations"]
            .as_array()
            .unwrap()
            .clone();
        steps
            .iter()
            .map(|s| {
                let bits = |k: &str| s[k].as_f64().unwrap().to_bits();
                (bits("sparsity"), bits("perplexity"))
            })
            .collect()
    };
    let (a, b) = (steps(&inline_events), steps(&disk_events));
    assert!(a.len() >= 2, "several steps: {a:?}");
    assert_eq!(a, b, "each step's sparsity and perplexity");
    assert_eq!(inline["perplexity"], disk["perplexity"]);
    assert!(
        inline["seconds_by_phase"].get("write").is_none(),
        "{inline}"
    );
    assert!(disk["seconds_by_phase"].get("write").is_some(), "{disk}");
    // `estimate --against` compares the phases on the last step, and says
    // so: the stages repeat once a step.
    let cmp = support::against_json(&inline_log);
    let said = format!("an --iterative run of {} steps", a.len());
    let notes = cmp["notes"].as_array().unwrap();
    assert!(
        notes.iter().any(|n| n.as_str().unwrap().starts_with(&said)),
        "{cmp}"
    );
    let step6 = support::phase_of(&cmp, "step 6");
    assert!(step6["measured"].as_u64().is_some(), "{cmp}");
    // The last step holds the positions the steps before it pruned: the
    // estimate counts them at the sparsity the step before reached.
    let earlier = summary_sparsity(&inline_events, a.len() - 2);
    let held = format!("(sparsity {earlier:.3}) held throughout");
    assert!(
        notes.iter().any(|n| n.as_str().unwrap().contains(&held)),
        "{held}: {cmp}"
    );
}

/// Step `i`'s sparsity, as the run's results record it.
fn summary_sparsity(events: &str, i: usize) -> f64 {
    let summary: serde_json::Value = serde_json::from_str(events.lines().last().unwrap()).unwrap();
    summary["summary"]["results"]["iterations"][i]["sparsity"]
        .as_f64()
        .unwrap()
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
