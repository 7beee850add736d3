//! The configurations the estimator of prunemem's own engine is fitted and
//! tested on, and the runner that prunes each one through the binary (so
//! the counting allocator measures it as users run it) and compares the
//! estimate with the measured peaks. Shared by `examples/estimator_grid.rs`
//! (the calibration table) and `tests/estimate.rs` (the 5% check).

use std::path::Path;
use std::process::Command;

use prunemem::estimate::against::{self, Comparison};
use prunemem::events::Event;
use prunemem::model::synthetic::{SyntheticSpec, write_checkpoint};

/// One configuration: a synthetic model and the `prune` flags to run on it.
pub struct Case {
    pub name: &'static str,
    pub spec: SyntheticSpec,
    pub args: &'static [&'static str],
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

/// The grid, in the order it runs.
pub fn cases() -> Vec<Case> {
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
        Case {
            name: "ria-h512-l4",
            spec: spec(4, 512, 1408, 8, 2, 8192, true),
            args: &["--method", "ria", "--nsamples", "32", "--seqlen", "256"],
        },
        Case {
            name: "owl-wanda-h768-l3",
            spec: spec(3, 768, 2048, 12, 4, 4096, true),
            args: &[
                "--method",
                "wanda",
                "--owl",
                "--sparsity",
                "0.7",
                "--nsamples",
                "16",
                "--seqlen",
                "256",
            ],
        },
        Case {
            name: "dsnot-wanda-h512-l4",
            spec: spec(4, 512, 1408, 8, 2, 8192, true),
            args: &[
                "--method",
                "wanda",
                "--dsnot",
                "--nsamples",
                "16",
                "--seqlen",
                "512",
            ],
        },
        Case {
            name: "dsnot-sparsegpt-h640-l2",
            spec: spec(2, 640, 1728, 10, 5, 4096, true),
            args: &[
                "--method",
                "sparsegpt",
                "--dsnot",
                "--nsamples",
                "16",
                "--seqlen",
                "256",
            ],
        },
        Case {
            name: "dsnot-magnitude-h1024-l2",
            spec: spec(2, 1024, 2816, 16, 4, 4096, false),
            args: &[
                "--method",
                "magnitude",
                "--dsnot",
                "--nsamples",
                "8",
                "--seqlen",
                "256",
            ],
        },
    ]
}

/// Writes the case's model under `dir`, prunes it with `bin` (logging
/// memory at 50 Hz), and returns the run's events and the comparison.
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
    cmd.arg("prune").arg("--model").arg(&model).args(case.args);
    cmd.arg("--calib-text").arg(text);
    cmd.args(["--ui", "none", "--sample-hz", "50", "--log-memory"])
        .arg(&log);
    if case.args.contains(&"--eval-windows") {
        cmd.arg("--eval-text").arg(text);
    }
    run_logged(cmd, case.name, &log)
}

/// Runs `cmd`, a prunemem run logging to `log`, and compares its log with
/// the estimator's prediction for its plan. The binary is [`settle`]d first.
pub fn run_logged(
    mut cmd: Command,
    name: &str,
    log: &Path,
) -> Result<(Vec<Event>, Comparison), String> {
    settle(Path::new(cmd.get_program()));
    let out = cmd.output().map_err(|e| format!("running {cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let events = against::read_events(log).map_err(|e| e.to_string())?;
    let cmp = against::compare(&events).map_err(|e| e.to_string())?;
    Ok((events, cmp))
}

/// Drops `bin`'s pages from the page cache (written back first), so that a
/// measured run maps its code as a binary read back from disk does, as an
/// installed one is. A binary the linker (or `cp`) has just written sits in
/// the page cache as it was written, and a run maps more of it: on the
/// project's machine (Linux 6.18, ext4, 2026-12-07) a fresh copy of the
/// debug binary mapped 27.6 MiB of it against 21.8 MiB once its pages had
/// been dropped, and the grid's wanda-b2-h512-l8-s1024 read −9.5% against
/// −4.4%: the estimate tests' failures "on incremental builds" right after a
/// rebuild. Best effort: a binary another process maps keeps those pages.
pub fn settle(bin: &Path) {
    use std::os::fd::AsRawFd;
    let Ok(file) = std::fs::File::open(bin) else {
        return;
    };
    if file.sync_data().is_ok() {
        // SAFETY: a valid descriptor, and advice that only drops clean,
        // unmapped pages of the page cache.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
}

/// Where a grid example writes its models and logs: `PRUNEMEM_GRID_DIR`
/// when set (kept for inspection, created if missing), else `tmp`.
pub fn output_dir(tmp: &Path) -> std::path::PathBuf {
    let dir = std::env::var_os("PRUNEMEM_GRID_DIR")
        .map_or_else(|| tmp.to_path_buf(), std::path::PathBuf::from);
    std::fs::create_dir_all(&dir).expect("creating the output folder");
    dir
}
