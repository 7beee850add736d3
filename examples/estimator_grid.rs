//! Runs `prunemem prune` on synthetic models of varied shapes and workloads
//! and prints, per run, the estimator's prediction beside the measured peak
//! RSS of each phase (one JSON line per run, then a summary table). This is
//! how the constants of `estimate::prunemem_engine` were fitted and how they
//! are checked.
//!
//! ```text
//! cargo build --release && cargo run --release --example estimator_grid [-- FILTER]
//! ```
//! PRUNEMEM_BIN overrides the binary (default target/release/prunemem).

use std::path::Path;
use std::process::Command;

use prunemem::estimate::against;
use prunemem::model::synthetic::{SyntheticSpec, write_checkpoint};

struct Case {
    name: &'static str,
    spec: SyntheticSpec,
    args: &'static [&'static str],
}

fn spec(
    layers: usize,
    hidden: usize,
    intermediate: usize,
    heads: usize,
    kv: usize,
    vocab: usize,
    tied: bool,
) -> SyntheticSpec {
    SyntheticSpec {
        layers,
        hidden,
        intermediate,
        heads,
        kv_heads: kv,
        vocab,
        tied,
        max_positions: 4096,
        seed: 1,
        ..Default::default()
    }
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "wanda-h512-l4",
            spec: spec(4, 512, 1408, 8, 2, 8192, true),
            args: &["--method", "wanda", "--nsamples", "32", "--seqlen", "256"],
        },
        Case {
            name: "wanda-h768-l2-s512",
            spec: spec(2, 768, 2048, 12, 4, 4096, false),
            args: &["--method", "wanda", "--nsamples", "16", "--seqlen", "512"],
        },
        Case {
            name: "sparsegpt-h512-l3",
            spec: spec(3, 512, 1536, 8, 8, 4096, true),
            args: &[
                "--method",
                "sparsegpt",
                "--nsamples",
                "32",
                "--seqlen",
                "256",
            ],
        },
        Case {
            name: "sparsegpt-h1024-l2",
            spec: spec(2, 1024, 2816, 16, 4, 2048, true),
            args: &[
                "--method",
                "sparsegpt",
                "--nsamples",
                "8",
                "--seqlen",
                "512",
            ],
        },
        Case {
            name: "magnitude-h1024-l6",
            spec: spec(6, 1024, 2816, 16, 4, 8192, false),
            args: &["--method", "magnitude"],
        },
        Case {
            name: "wanda-eval-h512-l4",
            spec: spec(4, 512, 1408, 8, 2, 16384, true),
            args: &[
                "--method",
                "wanda",
                "--nsamples",
                "16",
                "--seqlen",
                "256",
                "--eval-windows",
                "24",
            ],
        },
        Case {
            name: "wanda-resident-h768-l4",
            spec: spec(4, 768, 2048, 12, 4, 8192, false),
            args: &[
                "--method",
                "wanda",
                "--nsamples",
                "16",
                "--seqlen",
                "256",
                "--resident",
            ],
        },
        Case {
            name: "wanda-b2-h512-l8-s1024",
            spec: spec(8, 512, 1408, 8, 2, 4096, true),
            args: &[
                "--method",
                "wanda",
                "--nsamples",
                "8",
                "--seqlen",
                "1024",
                "--batch-size",
                "2",
            ],
        },
        Case {
            name: "sparsegpt-eval-h640-l3",
            spec: spec(3, 640, 1728, 10, 5, 8192, false),
            args: &[
                "--method",
                "sparsegpt",
                "--nsamples",
                "24",
                "--seqlen",
                "384",
                "--eval-windows",
                "16",
            ],
        },
    ]
}

fn main() {
    let filter = std::env::args().nth(1).unwrap_or_default();
    let bin = std::env::var("PRUNEMEM_BIN").unwrap_or_else(|_| "target/release/prunemem".into());
    let dir = tempfile::tempdir().expect("a temporary folder");
    let text = dir.path().join("text.txt");
    std::fs::write(&text, prunemem::demo::corpus(30_000, 9)).expect("writing text");
    let mut rows = Vec::new();
    for case in cases().into_iter().filter(|c| c.name.contains(&filter)) {
        let model = dir.path().join(case.name);
        write_checkpoint(&model, &case.spec).expect("writing a model");
        let log = dir.path().join(format!("{}-log", case.name));
        let mut args: Vec<String> = vec![
            "prune".into(),
            "--model".into(),
            model.display().to_string(),
        ];
        args.extend(case.args.iter().map(|s| s.to_string()));
        args.extend(
            [
                "--calib-text",
                text.to_str().unwrap_or_default(),
                "--ui",
                "none",
                "--sample-hz",
                "50",
                "--log-memory",
            ]
            .iter()
            .map(|s| s.to_string()),
        );
        args.push(log.display().to_string());
        if case.args.contains(&"--eval-windows") {
            args.extend(["--eval-text".to_string(), text.display().to_string()]);
        }
        let out = Command::new(&bin)
            .args(&args)
            .output()
            .expect("running prunemem");
        if !out.status.success() {
            eprintln!("{}: {}", case.name, String::from_utf8_lossy(&out.stderr));
            continue;
        }
        let events = against::read_events(Path::new(&log)).expect("events");
        let cmp = against::compare(&events).expect("comparison");
        let phases: Vec<_> = cmp
            .phases
            .iter()
            .map(|p| {
                let est = cmp.estimate.phases.iter().find(|e| e.name == p.phase);
                let heap = est.and_then(|e| against::measured_heap_peak(&events, &e.stages[0], &e.stages[e.stages.len() - 1]));
                serde_json::json!({"phase": p.phase, "predicted": p.predicted, "measured": p.measured, "heap": heap,
                "components": est.map(|e| e.components.clone())})
            })
            .collect();
        let heap_peak = events.iter().rev().find_map(|e| match e {
            prunemem::events::Event::RunFinished { summary } => summary.heap_peak,
            _ => None,
        });
        println!(
            "{}",
            serde_json::json!({"case": case.name, "peak_predicted": cmp.peak.predicted, "peak_measured": cmp.peak.measured,
                               "heap_peak": heap_peak, "error_percent": cmp.peak.error_percent, "phases": phases})
        );
        rows.push((
            case.name,
            cmp.peak.predicted,
            cmp.peak.measured,
            cmp.peak.error_percent,
        ));
    }
    eprintln!(
        "{:<26} {:>12} {:>12} {:>8}",
        "case", "predicted", "measured", "error"
    );
    for (name, p, m, e) in rows {
        eprintln!(
            "{:<26} {:>12} {:>12} {:>8}",
            name,
            prunemem::units::format_bytes(p),
            m.map(prunemem::units::format_bytes).unwrap_or_default(),
            e.map(|e| format!("{e:+.1}%")).unwrap_or_default()
        );
    }
}
