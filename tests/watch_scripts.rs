//! The Python user's door (issue 44): a plain Python script that prints the
//! memory-logging fork's `Memory Checkpoint` blocks (no torch needed) is
//! watched, and its own figures land in the stage's allocator columns of
//! `memory_log.csv` exactly as printed; cut-off and malformed blocks leave
//! readings unknown, never 0. The wheel's probe (`python/prunemem`) prints a
//! block the parser reads back (a stub stands in for torch where torch is
//! absent). `report compare` puts the watched script beside a prunemem run.
//! These tests run `python3` (CI has it; torch is never needed).

mod support;

use std::path::Path;
use std::process::Command;

use prunemem::model::synthetic::{SyntheticSpec, write_checkpoint};

/// The CSV's rows as (checkpoint, allocated, reserved, peak) strings.
fn csv_rows(dir: &Path) -> Vec<(String, String, String, String)> {
    let text = std::fs::read_to_string(dir.join("memory_log.csv")).unwrap();
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .from_reader(text.as_bytes());
    reader
        .records()
        .map(|r| {
            let r = r.unwrap();
            let g = |i: usize| r.get(i).unwrap_or("").to_string();
            (g(1), g(2), g(3), g(4))
        })
        .collect()
}

fn watch(dir: &Path, logs: &Path, script: &str) -> std::process::Output {
    let file = dir.join("script.py");
    std::fs::write(&file, script).unwrap();
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("python");
    Command::new(env!("CARGO_BIN_EXE_prunemem"))
        .args(["watch", "--ui", "none", "--sample-hz", "20", "--log-memory"])
        .arg(logs)
        .args(["--", "python3", "-u"])
        .arg(&file)
        .env("PYTHONPATH", python)
        .output()
        .expect("python3 runs")
}

fn row<'a>(
    rows: &'a [(String, String, String, String)],
    name: &str,
) -> &'a (String, String, String, String) {
    rows.iter()
        .find(|r| r.0 == name)
        .unwrap_or_else(|| panic!("no row {name} in {rows:?}"))
}

#[test]
fn the_scripts_own_figures_fill_the_csv_as_printed() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    // The seed's format, then a block cut off by the next output line, a
    // malformed figure, and a header with no block at all.
    let script = r#"
import time
def block(name, alloc, reserved, peak):
    print(f"=== Memory Checkpoint: {name} ===")
    print("GPU Memory:")
    print(f"  Allocated: {alloc:.2f} GB")
    print(f"  Reserved: {reserved:.2f} GB")
    print(f"  Peak: {peak:.2f} GB")
    print("  Free: 77.50 GB")
    print("  Total: 80.00 GB")
    print("CPU Memory: Used: 2.45 GB (6.1%)")
block("after_load", 2.30, 2.50, 2.41)
time.sleep(0.5)
block("after_layer_0", 3.14, 4.00, 3.99)
print("=== Memory Checkpoint: cut_off ===")
print("GPU Memory:")
print("  Allocated: 1.00 GB")
print("pruning layer 1 ...")
time.sleep(0.5)
print("=== Memory Checkpoint: malformed ===")
print("  Allocated: lots GB")
print("  Reserved: 512.00 MB")
time.sleep(0.5)
print("=== Memory Checkpoint: header_only ===")
time.sleep(0.5)
"#;
    let out = watch(dir.path(), &logs, script);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let rows = csv_rows(&logs);
    let figures = |name: &str| {
        let r = row(&rows, name);
        (r.1.as_str(), r.2.as_str(), r.3.as_str())
    };
    // Byte-exact to what the script printed (3 decimals in the CSV).
    assert_eq!(figures("after_load"), ("2.300", "2.500", "2.410"));
    assert_eq!(figures("after_layer_0"), ("3.140", "4.000", "3.990"));
    // A cut-off block: what was printed, the rest unknown.
    assert_eq!(figures("cut_off"), ("1.000", "", ""));
    // A malformed figure is unknown; MB is 2^20 bytes.
    assert_eq!(figures("malformed"), ("", "0.500", ""));
    // No block: no allocator figures from the script (none is 0).
    assert_ne!(figures("header_only").0, "0.000");
}

#[test]
fn the_probe_prints_what_the_parser_reads() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    // A stub torch (the real one is never needed): 3 GiB allocated, 5
    // reserved, 4 at the peak, an 80 GiB card.
    let script = r#"
import sys, types
GIB = 1024 ** 3
torch = types.ModuleType("torch")
class props: total_memory = 80 * GIB
torch.cuda = types.SimpleNamespace(
    is_available=lambda: True,
    current_device=lambda: 0,
    memory_allocated=lambda d: 3 * GIB,
    memory_reserved=lambda d: 5 * GIB,
    max_memory_allocated=lambda d: 4 * GIB,
    get_device_properties=lambda d: props,
)
sys.modules["torch"] = torch
from prunemem import checkpoint
checkpoint("with_stub")
import time; time.sleep(0.5)
del sys.modules["torch"]
checkpoint("no_gpu")
time.sleep(0.5)
"#;
    let out = watch(dir.path(), &logs, script);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("=== Memory Checkpoint: with_stub ==="),
        "{stdout}"
    );
    assert!(stdout.contains("CPU figures only"), "{stdout}");
    let rows = csv_rows(&logs);
    let r = row(&rows, "with_stub");
    assert_eq!(
        (r.1.as_str(), r.2.as_str(), r.3.as_str()),
        ("3.000", "5.000", "4.000")
    );
    let r = row(&rows, "no_gpu");
    assert_eq!((r.1.as_str(), r.2.as_str(), r.3.as_str()), ("", "", ""));
}

#[test]
fn report_compare_puts_a_watched_script_beside_a_prunemem_run() {
    let dir = tempfile::tempdir().unwrap();
    let script_logs = dir.path().join("script");
    let script = r#"
import time
for name, a in [("model_loaded", 0.25), ("pruned", 0.5)]:
    print(f"=== Memory Checkpoint: {name} ===")
    print(f"  Allocated: {a:.2f} GB")
    print(f"  Reserved: {2 * a:.2f} GB")
    print(f"  Peak: {a:.2f} GB")
    time.sleep(0.4)
"#;
    assert!(watch(dir.path(), &script_logs, script).status.success());
    // A prunemem run with a log, on a synthetic model.
    let model = dir.path().join("model");
    write_checkpoint(&model, &SyntheticSpec::default()).unwrap();
    std::fs::write(dir.path().join("text.txt"), support::sample_text(2000)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_prunemem"))
        .args(["eval", "--model"])
        .arg(&model)
        .arg("--text")
        .arg(dir.path().join("text.txt"))
        .args([
            "--seqlen",
            "16",
            "--windows",
            "2",
            "--ui",
            "none",
            "--log-memory",
        ])
        .arg(dir.path().join("ours"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let report = dir.path().join("report");
    let out = Command::new(env!("CARGO_BIN_EXE_prunemem"))
        .args(["report", "compare"])
        .arg(&script_logs)
        .arg(dir.path().join("ours"))
        .arg("--out")
        .arg(&report)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let md = std::fs::read_to_string(report.join("compare.md")).unwrap();
    assert!(
        md.contains("## Stages, script (A) against ours (B)"),
        "{md}"
    );
    // The script's own figures in A's columns.
    assert!(
        md.contains("| model_loaded | 02_model_loaded | name |"),
        "{md}"
    );
    assert!(md.contains("| 256.0 MiB |"), "{md}");
    assert!(md.contains("| reserved | 1.000 GiB |"), "{md}");
    assert!(md.contains("No per-category split on both sides"), "{md}");
}
