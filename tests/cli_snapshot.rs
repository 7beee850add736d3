//! The `prunemem` binary: `snapshot`, bad input, and a real SIGINT.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use prunemem::events::{Event, RunStatus};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_prunemem"))
}

#[test]
fn snapshot_prints_text_and_json() {
    let out = bin().arg("snapshot").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("Process: RSS"), "{text}");
    assert!(text.contains("CPU memory: used"), "{text}");

    let out = bin().args(["snapshot", "--json"]).output().unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["rss"].as_u64().unwrap() > 0);
    assert!(
        v["heap_allocated"].as_u64().unwrap() > 0,
        "the binary installs the counting allocator"
    );
    assert!(v["system_total"].as_u64().unwrap() > 0);
}

#[test]
fn user_errors_are_one_line_with_status_2() {
    for args in [
        vec!["snapshot", "--every", "-1"],
        vec!["snapshot", "--count", "3"],
        vec!["no-such-command"],
        vec!["snapshot", "--log-memory", "/proc/no/such/dir"],
    ] {
        let out = bin().args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(err.to_lowercase().contains("error"), "{args:?}: {err}");
    }
}

#[test]
fn help_and_version() {
    let out = bin().arg("--version").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains(env!("CARGO_PKG_VERSION")));
    let out = bin().args(["snapshot", "--help"]).output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("--log-memory"));
}

/// A real Ctrl-C: the process exits 130, and its logs hold every stage it
/// wrote, ending with `RunFinished { Interrupted }`, no torn line.
#[test]
fn sigint_flushes_logs_and_exits_130() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let mut child = bin()
        .args(["snapshot", "--every", "0.01", "--log-memory"])
        .arg(&log)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until it has written a few stages.
    let csv = log.join("memory_log.csv");
    let start = Instant::now();
    while std::fs::read_to_string(&csv)
        .map(|t| t.lines().count())
        .unwrap_or(0)
        < 5
    {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no stages written"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));

    let text = std::fs::read_to_string(log.join("events.jsonl")).unwrap();
    assert!(text.ends_with('\n'));
    let events: Vec<Event> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let stages = events
        .iter()
        .filter(|e| matches!(e, Event::Stage { .. }))
        .count();
    assert!(stages >= 4);
    assert!(matches!(
        events.last(),
        Some(Event::RunFinished { summary }) if summary.status == RunStatus::Interrupted
    ));
    let rows = std::fs::read_to_string(&csv).unwrap().lines().count() - 1;
    assert_eq!(rows, stages, "every stage in the JSONL has its CSV row");
}
