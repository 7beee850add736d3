//! `prunemem watch --pid PID --follow FILE` on a process it did not start:
//! samples until the process exits, stages from the lines appended to the
//! followed file, whole logs, and the process left alone.

mod support;

use std::io::Write;
use std::process::Command;
use std::time::Duration;

use prunemem::events::{Event, RunStatus, parse_log, stages};

#[test]
fn attaches_to_a_running_process_and_reads_stages_from_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let logfile = dir.path().join("train.log");
    std::fs::write(&logfile, "PRUNEMEM_STAGE before_attach\n").unwrap();
    let logs = dir.path().join("logs");
    // The process to watch: ours, but prunemem does not start it.
    let mut target = Command::new("sleep").arg("2").spawn().unwrap();
    let pid = target.id().to_string();
    let watcher = Command::new(env!("CARGO_BIN_EXE_prunemem"))
        .args(["watch", "--ui", "none", "--sample-hz", "20", "--pid", &pid])
        .arg("--follow")
        .arg(&logfile)
        .arg("--log-memory")
        .arg(&logs)
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(600));
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&logfile)
        .unwrap();
    writeln!(f, "=== Memory Checkpoint: 02_model_loaded ===").unwrap();
    writeln!(f, "RuntimeError: CUDA out of memory").unwrap();
    drop(f);
    assert!(
        target.wait().unwrap().success(),
        "the process was left alone"
    );
    let out = watcher.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));

    let log = parse_log(&std::fs::read_to_string(logs.join("events.jsonl")).unwrap()).unwrap();
    let labels: Vec<String> = support::stage_labels(&log.events);
    assert_eq!(
        labels,
        [stages::WATCH_START, "02_model_loaded", stages::WATCH_END],
        "markers written before attaching are not replayed"
    );
    let samples: Vec<_> = log
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Sample { snapshot } => snapshot.rss,
            _ => None,
        })
        .collect();
    assert!(samples.len() >= 10, "{} samples", samples.len());
    assert!(
        samples.iter().all(|r| *r > 0),
        "the process's RSS, not zero"
    );
    assert!(
        log.events
            .iter()
            .any(|e| matches!(e, Event::Message { text, .. } if text.contains("out of memory")))
    );
    assert!(matches!(
        log.events.last(),
        Some(Event::RunFinished { summary }) if summary.status == RunStatus::Ok
    ));
}
