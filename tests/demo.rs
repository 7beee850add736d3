//! `prunemem demo`, the README's first command: the tiny path end to end
//! (trained, pruned, evaluated, logged, saved), and the fallbacks when
//! SmolLM2-135M is missing and cannot or may not be fetched — said plainly,
//! never a failure. The SmolLM2 path itself is the benchmark protocol,
//! covered by the SmolLM2 tests.

use std::path::Path;
use std::process::Command;

fn demo(cwd: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_prunemem"))
        .current_dir(cwd)
        .arg("demo")
        .args(["--ui", "none", "--steps", "30"])
        .args(args)
        .output()
        .expect("prunemem runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn finished(text: &str) -> (f64, f64) {
    let line = text
        .lines()
        .find(|l| l.starts_with("demo finished: perplexity"))
        .unwrap_or_else(|| panic!("no result line in:\n{text}"));
    let nums: Vec<f64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    (nums[0], nums[1])
}

#[test]
fn tiny_demo_trains_prunes_evaluates_logs_and_saves() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("demo");
    let (ok, text) = demo(dir.path(), &["--tiny", "--out", out.to_str().unwrap()]);
    assert!(ok, "{text}");
    assert!(text.contains("training a tiny model (--tiny)"), "{text}");
    let (dense, pruned) = finished(&text);
    assert!(dense.is_finite() && dense > 1.0, "{text}");
    assert!(
        pruned.is_finite() && pruned >= dense * 0.9,
        "the pruned model beat the dense one by over 10%: {text}"
    );
    for f in [
        "logs/memory_log.csv",
        "logs/events.jsonl",
        "model-wanda-0.5/model.safetensors",
        "model-wanda-0.5/config.json",
    ] {
        assert!(out.join(f).is_file(), "{f} missing after the demo:\n{text}");
    }
    let csv = std::fs::read_to_string(out.join("logs/memory_log.csv")).unwrap();
    assert!(csv.lines().count() > 10, "{csv}");
}

/// The demo run from an empty folder with SmolLM2 absent, `extra` flags
/// added: it must finish on the tiny model; returns what it printed.
fn fallback(extra: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("demo");
    let absent = dir.path().join("no-smollm2");
    let mut args = vec![
        "--smollm2",
        absent.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let (ok, text) = demo(dir.path(), &args);
    assert!(ok, "{text}");
    finished(&text);
    text
}

#[test]
fn missing_model_without_fetching_falls_back_to_the_tiny_model_and_says_so() {
    let text = fallback(&["--no-fetch"]);
    assert!(
        text.contains("fetching is off (--no-fetch)") && text.contains("a toy, not the real job"),
        "{text}"
    );
}

#[test]
fn a_fetch_that_cannot_run_falls_back_and_says_why() {
    // From a folder without the project's scripts the fetch cannot start.
    let text = fallback(&[]);
    assert!(
        text.contains("could not fetch SmolLM2-135M")
            && text.contains("fetch-smollm2.sh is not in the working folder"),
        "{text}"
    );
}
