//! The training configurations the estimator of prunemem's training engine
//! is fitted and tested on (batch, accumulation, seqlen, optimizer,
//! checkpointing, frozen layers, two model shapes), and the runner that
//! trains each one through the binary and compares the estimate with the
//! measured peaks (through `grid::run_logged`). Shared by `examples/train_grid.rs` (the calibration
//! table) and `tests/estimate_train.rs` (the 5% / 10% check).

use std::path::Path;
use std::process::Command;

use prunemem::estimate::against::Comparison;
use prunemem::events::Event;
use prunemem::model::synthetic::{SyntheticSpec, write_checkpoint};

pub struct Case {
    pub name: &'static str,
    pub spec: SyntheticSpec,
    pub args: &'static [&'static str],
}

fn m1() -> SyntheticSpec {
    SyntheticSpec {
        layers: 4,
        hidden: 256,
        intermediate: 704,
        heads: 4,
        kv_heads: 2,
        vocab: 4096,
        tied: true,
        max_positions: 1024,
        seed: 2,
        ..Default::default()
    }
}

fn m2() -> SyntheticSpec {
    SyntheticSpec {
        layers: 3,
        hidden: 384,
        intermediate: 1024,
        heads: 6,
        kv_heads: 2,
        vocab: 8192,
        tied: false,
        max_positions: 1024,
        seed: 3,
        ..Default::default()
    }
}

/// SmolLM2-135M's shape cut to two layers: its 49 152-entry vocabulary,
/// tied, the table four times the layers' parameters (where the
/// optimizer's update, not the backward, is the step's peak).
fn vocab49k() -> SyntheticSpec {
    SyntheticSpec {
        layers: 2,
        hidden: 576,
        intermediate: 1536,
        heads: 9,
        kv_heads: 3,
        vocab: 49152,
        tied: true,
        max_positions: 1024,
        seed: 4,
        ..Default::default()
    }
}

pub fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "adamw-m1-b4-s128",
            spec: m1(),
            args: &["--batch-size", "4", "--seqlen", "128"],
        },
        Case {
            name: "adamw-m1-b4-s256",
            spec: m1(),
            args: &["--batch-size", "4", "--seqlen", "256"],
        },
        Case {
            name: "adamw-m1-b8-s128-acc2",
            spec: m1(),
            args: &["--batch-size", "8", "--seqlen", "128", "--grad-accum", "2"],
        },
        Case {
            name: "sgd-m1-b4-s128",
            spec: m1(),
            args: &["--batch-size", "4", "--seqlen", "128", "--optimizer", "sgd"],
        },
        Case {
            name: "adamw-m1-b4-s128-ckpt",
            spec: m1(),
            args: &["--batch-size", "4", "--seqlen", "128", "--checkpointing"],
        },
        Case {
            name: "adamw-m1-b4-s128-freeze",
            spec: m1(),
            args: &[
                "--batch-size",
                "4",
                "--seqlen",
                "128",
                "--freeze",
                "embeddings,0-1",
            ],
        },
        Case {
            name: "adam-m2-b2-s256-acc3",
            spec: m2(),
            args: &[
                "--batch-size",
                "2",
                "--seqlen",
                "256",
                "--grad-accum",
                "3",
                "--optimizer",
                "adam",
            ],
        },
        Case {
            name: "adamw-m2-b4-s128-ckpt-acc2",
            spec: m2(),
            args: &[
                "--batch-size",
                "4",
                "--seqlen",
                "128",
                "--grad-accum",
                "2",
                "--checkpointing",
            ],
        },
        Case {
            name: "adamw-v49k-b2-s64-acc2",
            spec: vocab49k(),
            args: &["--batch-size", "2", "--seqlen", "64", "--grad-accum", "2"],
        },
        Case {
            name: "adamw-v49k-b4-s128-ckpt",
            spec: vocab49k(),
            args: &["--batch-size", "4", "--seqlen", "128", "--checkpointing"],
        },
    ]
}

/// Writes the case's model under `dir`, trains it for 2 steps with `bin`
/// (logging memory at 50 Hz), and returns the run's events and the
/// comparison.
pub fn run_case(
    bin: &Path,
    dir: &Path,
    text: &Path,
    case: &Case,
) -> Result<(Vec<Event>, Comparison), String> {
    let model = dir.join(case.name);
    write_checkpoint(&model, &case.spec).map_err(|e| e.to_string())?;
    let log = dir.join(format!("{}-log", case.name));
    let mut cmd = Command::new(bin);
    cmd.arg("train")
        .arg("--model")
        .arg(&model)
        .arg("--text")
        .arg(text);
    cmd.args(case.args)
        .args([
            "--steps",
            "2",
            "--ui",
            "none",
            "--sample-hz",
            "50",
            "--log-memory",
        ])
        .arg(&log);
    super::grid::run_logged(cmd, case.name, &log)
}
