//! A CPU prune evaluates each pruned layer as soon as it is pruned
//! (`model::inline_eval`) instead of writing the pruned model to a scratch
//! checkpoint and streaming it back: on the grid's two cases with an
//! evaluation (Wanda and SparseGPT), the perplexity is the scratch
//! checkpoint's to the bit, no scratch is written, the place is recorded,
//! and the estimate of each run, phase by phase, follows what it holds.
//! `--keep-pruned disk` still streams from the scratch checkpoint;
//! `--keep-pruned device` is a device run's place, warned about on the CPU.
//! An evaluation ends with what it freed given back. GradProbe's step 6
//! evaluates inside the prune too: its phases are checked on a model whose
//! layers outweigh its head.

mod support;

use std::path::Path;
use std::process::Command;

use prunemem::events::Event;
use prunemem::model::synthetic::write_checkpoint;
use support::grid;

/// A finished run's results and its messages.
fn results(
    events: &[Event],
) -> (
    std::collections::BTreeMap<String, serde_json::Value>,
    Vec<String>,
) {
    let mut results = std::collections::BTreeMap::new();
    let mut messages = Vec::new();
    for e in events {
        match e {
            Event::RunFinished { summary } => results = summary.results.clone(),
            Event::Message { text, .. } => messages.push(text.clone()),
            _ => {}
        }
    }
    (results, messages)
}

struct Run {
    results: std::collections::BTreeMap<String, serde_json::Value>,
    messages: Vec<String>,
    /// Predicted and measured peak of the prune and the eval phases.
    phases: Vec<(String, u64, u64)>,
    peak_error: f64,
}

fn prune(dir: &Path, model: &Path, text: &Path, case: &grid::Case, keep: &str) -> Run {
    let log = dir.join(format!("{}-{keep}", case.name));
    let tmp = dir.join(format!("tmp-{}-{keep}", case.name));
    std::fs::create_dir_all(&tmp).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_prunemem"));
    cmd.arg("prune").arg("--model").arg(model).args(case.args);
    cmd.arg("--calib-text")
        .arg(text)
        .arg("--eval-text")
        .arg(text);
    cmd.args(["--keep-pruned", keep, "--ui", "none", "--sample-hz", "50"]);
    cmd.arg("--log-memory").arg(&log).env("TMPDIR", &tmp);
    let (events, cmp) = grid::run_logged(cmd, case.name, &log).unwrap();
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().flatten().collect();
    assert!(left.is_empty(), "{}: left in TMPDIR: {left:?}", case.name);
    let (results, messages) = results(&events);
    let phases = cmp
        .phases
        .iter()
        .filter(|p| ["prune", "eval", "modified pass"].contains(&p.phase.as_str()))
        .map(|p| (p.phase.clone(), p.predicted, p.measured.unwrap_or(0)))
        .collect();
    Run {
        results,
        messages,
        phases,
        peak_error: cmp.peak.error_percent.expect("a measured peak"),
    }
}

fn perplexity(r: &Run) -> f64 {
    r.results["perplexity"].as_f64().expect("a perplexity")
}

#[test]
fn a_cpu_prune_evaluates_inline_with_the_scratch_checkpoints_perplexity() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(&text, prunemem::model::tiny::corpus(30_000, 9)).unwrap();
    let cases: Vec<_> = grid::cases()
        .into_iter()
        .filter(|c| c.args.contains(&"--eval-windows"))
        .collect();
    assert_eq!(cases.len(), 2, "the grid's cases with an evaluation");
    for case in &cases {
        let model = dir.path().join(case.name);
        write_checkpoint(&model, &case.spec).unwrap();
        let inline = prune(dir.path(), &model, &text, case, "auto");
        let disk = prune(dir.path(), &model, &text, case, "disk");
        for (r, place) in [(&inline, "inline"), (&disk, "disk")] {
            assert_eq!(r.results["pruned_layers_kept"], place, "{}", case.name);
            let streams = r
                .messages
                .iter()
                .any(|m| m.contains("streams the pruned layers"));
            assert_eq!(streams, place == "disk", "{}: {:?}", case.name, r.messages);
            // Only the scratch checkpoint's run writes the pruned model.
            let write = r.results["seconds_by_phase"].get("write").is_some();
            assert_eq!(write, place == "disk", "{}", case.name);
        }
        assert_eq!(
            perplexity(&inline).to_bits(),
            perplexity(&disk).to_bits(),
            "{}: the same layers, windows and batches give the same bits",
            case.name
        );
        for r in [&inline, &disk] {
            let place = r.results["pruned_layers_kept"].as_str().unwrap_or("");
            for (name, predicted, measured) in &r.phases {
                let err = (*predicted as f64 / *measured as f64 - 1.0) * 100.0;
                eprintln!(
                    "{:<24} {place:<6} {name:<6} predicted {predicted:>10} measured {measured:>10} {err:+.1}%",
                    case.name
                );
                // The evaluation's own phase too: inside the prune it is
                // the head after a trim (sparsegpt-eval read +15.1% while
                // the estimate cached the layers' freed blocks into it).
                assert!(
                    name != "eval" || err.abs() <= 5.0,
                    "{} {place}: eval phase off by {err:+.1}%",
                    case.name
                );
            }
            assert!(
                r.phases.iter().any(|p| p.0 == "eval"),
                "{}: an eval phase",
                case.name
            );
            assert!(
                r.peak_error.abs() <= 5.0,
                "{} {place}: peak off by {:+.1}%",
                case.name,
                r.peak_error
            );
        }
        // What the inline run adds to the prune phase, as predicted and as
        // measured: the windows' hidden states (and an evaluation batch's
        // forward where that is the layer loop's largest moment).
        let prune_of = |r: &Run| r.phases.iter().find(|p| p.0 == "prune").cloned().unwrap();
        let (_, p_in, m_in) = prune_of(&inline);
        let (_, p_disk, m_disk) = prune_of(&disk);
        let (predicted, measured) = (p_in as f64 - p_disk as f64, m_in as f64 - m_disk as f64);
        eprintln!(
            "{:<24} inline adds to the prune phase: predicted {predicted:.0} measured {measured:.0}",
            case.name
        );
        assert!(
            predicted > 0.0,
            "{}: the hidden states are counted",
            case.name
        );
        assert!(
            (predicted - measured).abs() <= 0.25 * predicted.max(measured) + 1_048_576.0,
            "{}: predicted +{predicted:.0} B, measured +{measured:.0} B",
            case.name
        );
    }
}

#[test]
fn keep_pruned_device_on_the_cpu_is_warned_about_and_runs_inline() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(&text, prunemem::model::tiny::corpus(8_000, 3)).unwrap();
    let case = grid::cases()
        .into_iter()
        .find(|c| c.name == "wanda-eval-h512-l4")
        .unwrap();
    let model = dir.path().join(case.name);
    write_checkpoint(&model, &case.spec).unwrap();
    let r = prune(dir.path(), &model, &text, &case, "device");
    assert_eq!(r.results["pruned_layers_kept"], "inline");
    assert!(
        r.messages
            .iter()
            .any(|m| m.starts_with("--keep-pruned device: a device run's place")),
        "{:?}",
        r.messages
    );
}

/// The evaluation gives back what it freed when it ends: its logits
/// chunks and the head's table are large blocks the allocator caches, and
/// before 2026-12-07 the resident set stayed at the evaluation's peak to
/// the end of the run, which a library caller's process outlives (SmolLM2
/// Wanda, 8 windows of 256: 220.6 MiB resident after the evaluation for
/// 12.3 MiB live). Checked on what is resident beside the live heap,
/// before the evaluation, after it and at the run's end.
#[test]
fn the_evaluation_gives_back_what_it_freed() {
    use prunemem::model::synthetic::SyntheticSpec;
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(&text, prunemem::model::tiny::corpus(30_000, 5)).unwrap();
    let model = dir.path().join("model");
    // A 16 Ki vocabulary: a 16 MiB f32 head and 8 MiB of logits a window.
    let spec = SyntheticSpec {
        hidden: 256,
        intermediate: 704,
        heads: 8,
        kv_heads: 2,
        vocab: 16_384,
        ..Default::default()
    };
    write_checkpoint(&model, &spec).unwrap();
    let log = dir.path().join("logs");
    let out = Command::new(env!("CARGO_BIN_EXE_prunemem"))
        .arg("prune")
        .arg("--model")
        .arg(&model)
        .args(["--method", "wanda", "--sparsity", "0.5", "--nsamples", "4"])
        .args(["--seqlen", "128", "--eval-windows", "4", "--ui", "none"])
        .arg("--calib-text")
        .arg(&text)
        .arg("--eval-text")
        .arg(&text)
        .arg("--log-memory")
        .arg(&log)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events = prunemem::estimate::against::read_events(&log).unwrap();
    let stage = |label: &str| {
        events
            .iter()
            .find_map(|e| match e {
                Event::Stage { snapshot } if snapshot.label == label => Some(snapshot.clone()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no stage {label}"))
    };
    let (before, after, end) = (
        stage("05_before_eval"),
        stage("06_after_eval"),
        stage("09_end"),
    );
    let beside = |s: &prunemem::memory::MemorySnapshot| {
        s.rss.expect("an RSS reading") as i64 - s.heap_allocated.expect("a heap reading") as i64
    };
    let freed = after.window_heap_peak.unwrap() - after.heap_allocated.unwrap();
    let grew = beside(&after) - beside(&before);
    eprintln!(
        "the evaluation freed {freed} B of its heap peak; resident beside the live heap: {} B before it, {} B after (+{grew} B), {} B at the end",
        beside(&before),
        beside(&after),
        beside(&end)
    );
    // The check has teeth: the evaluation freed far more than it may keep.
    assert!(freed > 24 << 20, "the evaluation's heap peak: {freed} B");
    assert!(
        grew < 4 << 20,
        "resident beside the live heap grew {grew} B over the evaluation"
    );
    let at_end = beside(&end) - beside(&before);
    assert!(
        at_end < 4 << 20,
        "resident beside the live heap grew {at_end} B by the run's end"
    );
}

/// GradProbe evaluates inside its step 6 the same way: the layers as it
/// zeroes them, then the head after a give-back, estimated as the head with
/// the head step's own freed blocks (`estimate::prunemem::gradprobe`). On a
/// model whose layers outweigh its head (2 layers 2048 wide, an untied
/// 4096-row head), its gradient passes peak in a layer's backward, every
/// weight gradient alive (`estimate::reference::gradprobe_backward_layer`):
/// both passes' phases, the evaluation's and the peak within 5%
/// (2026-12-07: modified pass −1.0%, eval −0.6%; the pass had been
/// estimated from the head's moment, without the gradients).
#[test]
fn gradprobe_s_passes_and_evaluation_are_estimated_where_layers_outweigh_the_head() {
    use prunemem::model::synthetic::SyntheticSpec;
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(&text, prunemem::model::tiny::corpus(30_000, 9)).unwrap();
    let case = grid::Case {
        name: "gradprobe-h2048-l2",
        spec: SyntheticSpec {
            layers: 2,
            hidden: 2048,
            intermediate: 5632,
            heads: 16,
            kv_heads: 16,
            vocab: 4096,
            tied: false,
            max_positions: 4096,
            seed: 1,
            ..Default::default()
        },
        args: &[
            "--method",
            "gradprobe",
            "--sparsity",
            "0.1",
            "--num-batches",
            "2",
            "--seqlen",
            "128",
            "--eval-windows",
            "2",
        ],
    };
    let model = dir.path().join(case.name);
    write_checkpoint(&model, &case.spec).unwrap();
    let r = prune(dir.path(), &model, &text, &case, "auto");
    assert_eq!(r.results["pruned_layers_kept"], "inline");
    for phase in ["modified pass", "eval"] {
        let (_, predicted, measured) = r
            .phases
            .iter()
            .find(|p| p.0 == phase)
            .cloned()
            .unwrap_or_else(|| panic!("a {phase} phase"));
        let err = (predicted as f64 / measured as f64 - 1.0) * 100.0;
        eprintln!(
            "{} {phase}: predicted {predicted} measured {measured} {err:+.1}%",
            case.name
        );
        assert!(err.abs() <= 5.0, "{phase} off by {err:+.1}%");
    }
    assert!(
        r.peak_error.abs() <= 5.0,
        "peak off by {:+.1}%",
        r.peak_error
    );
}
