//! Nothing lost, nothing corrupted, whatever ends the run: a prune killed
//! with SIGKILL leaves a log that holds every stage up to the last finished
//! layer (and `report` makes a partial report of it); two prunes saving to
//! one folder cannot mix their work; scratch copies go on Ctrl-C; `watch`
//! passes SIGTERM on to its command and still writes whole logs.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use prunemem::events::{Event, RunStatus, parse_log, stages};
use prunemem::model::synthetic::{SyntheticSpec, write_checkpoint};
use support::{run_prunemem, s};

fn slow_model(root: &Path) -> (PathBuf, PathBuf) {
    let model = root.join("model");
    let spec = SyntheticSpec {
        layers: 24,
        hidden: 256,
        intermediate: 704,
        heads: 8,
        kv_heads: 2,
        ..Default::default()
    };
    write_checkpoint(&model, &spec).unwrap();
    let text = root.join("text.txt");
    std::fs::write(&text, support::sample_text(6000)).unwrap();
    (model, text)
}

/// A SparseGPT prune of the slow model long enough to be signalled in the
/// middle, logging into `logs`.
fn slow_prune<'a>(model: &'a Path, text: &'a Path, logs: &'a Path) -> Vec<&'a str> {
    vec![
        "prune",
        "--model",
        s(model),
        "--method",
        "sparsegpt",
        "--nsamples",
        "32",
        "--seqlen",
        "128",
        "--calib-text",
        s(text),
        "--ui",
        "none",
        "--log-memory",
        s(logs),
    ]
}

fn spawn(args: &[&str], env: &[(&str, &Path)]) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_prunemem"));
    cmd.args(args).stdout(Stdio::null()).stderr(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().unwrap()
}

/// Waits until `path` holds `needle`, or panics if the child exits first.
fn wait_for(child: &mut Child, path: &Path, needle: &str) {
    let start = Instant::now();
    while !std::fs::read_to_string(path)
        .map(|t| t.contains(needle))
        .unwrap_or(false)
    {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "exited ({status}) before {needle} reached {}",
                path.display()
            );
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "never saw {needle}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill sends a signal to a child we spawned.
    unsafe {
        libc::kill(child.id() as i32, sig);
    }
}

#[test]
fn sigkill_leaves_every_stage_up_to_the_last_layer_and_a_partial_report() {
    let dir = tempfile::tempdir().unwrap();
    let (model, text) = slow_model(dir.path());
    let logs = dir.path().join("logs");
    let mut child = spawn(&slow_prune(&model, &text, &logs), &[]);
    let jsonl = logs.join("events.jsonl");
    wait_for(&mut child, &jsonl, &stages::layer_pruned(3));
    signal(&child, libc::SIGKILL);
    child.wait().unwrap();

    let text = std::fs::read_to_string(&jsonl).unwrap();
    let log = parse_log(&text).expect("every line but a torn last one parses");
    let labels: Vec<String> = support::stage_labels(&log.events);
    let last_layer = (0..24)
        .rev()
        .find(|i| labels.contains(&stages::layer_pruned(*i)))
        .expect("some layer finished");
    assert!(last_layer >= 3);
    let mut expected: Vec<String> = [stages::START, stages::MODEL_LOADED, stages::BEFORE_PRUNING]
        .iter()
        .map(|s| s.to_string())
        .collect();
    for i in 0..=last_layer {
        expected.push(stages::layer_stats(i));
        expected.push(stages::layer_pruned(i));
    }
    let kept: Vec<String> = labels.iter().take(expected.len()).cloned().collect();
    assert_eq!(
        kept, expected,
        "every stage up to layer {last_layer}, in order"
    );
    assert!(
        !log.events
            .iter()
            .any(|e| matches!(e, Event::RunFinished { .. }))
    );
    let csv = std::fs::read_to_string(logs.join("memory_log.csv")).unwrap();
    assert!(csv.contains(&format!(",{},", stages::layer_pruned(last_layer))));

    let out = dir.path().join("report");
    let (code, _, err) = run_prunemem(&["report", s(&logs), "--out", s(&out)]);
    assert_eq!(code, Some(0), "{err}");
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("partial report"), "{md}");
}

#[test]
fn two_saves_to_one_folder_one_refused_result_identical_to_a_single_run() {
    let dir = tempfile::tempdir().unwrap();
    let (model, text) = slow_model(dir.path());
    let save = dir.path().join("pruned");
    let args = |to: &Path| -> Vec<String> {
        [
            "prune",
            "--model",
            s(&model),
            "--method",
            "wanda",
            "--nsamples",
            "16",
            "--seqlen",
            "128",
            "--calib-text",
            s(&text),
            "--ui",
            "none",
            "--save",
            s(to),
        ]
        .iter()
        .map(|a| a.to_string())
        .collect()
    };
    let first_args = args(&save);
    let first: Vec<&str> = first_args.iter().map(String::as_str).collect();
    let mut a = spawn(&first, &[]);
    wait_for(
        &mut a,
        &save.with_file_name("pruned.partial/logs/events.jsonl"),
        &stages::layer_pruned(0),
    );
    let (code, _, err) = run_prunemem(&first);
    assert_eq!(code, Some(2), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("another prunemem run"), "{}", lines[0]);
    assert!(
        lines[0].contains(&format!("pid {}", a.id())),
        "{}",
        lines[0]
    );
    assert!(a.wait().unwrap().success());

    let single = dir.path().join("single");
    let single_args = args(&single);
    let single_argv: Vec<&str> = single_args.iter().map(String::as_str).collect();
    let (code, _, err) = run_prunemem(&single_argv);
    assert_eq!(code, Some(0), "{err}");
    let (x, y) = (
        std::fs::read(save.join("model.safetensors")).unwrap(),
        std::fs::read(single.join("model.safetensors")).unwrap(),
    );
    assert!(
        x == y,
        "the saved model equals a single run's, byte for byte"
    );
    assert!(
        !dir.path().join("pruned.lock").exists(),
        "the lock goes with its run"
    );
}

#[test]
fn ctrl_c_during_evaluation_leaves_no_scratch_model() {
    let dir = tempfile::tempdir().unwrap();
    let (model, text) = slow_model(dir.path());
    let tmp = dir.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let logs = dir.path().join("logs");
    let mut child = spawn(
        &[
            "prune",
            "--model",
            s(&model),
            "--method",
            "magnitude",
            "--seqlen",
            "128",
            "--eval-text",
            s(&text),
            "--keep-pruned",
            "disk",
            "--ui",
            "none",
            "--log-memory",
            s(&logs),
        ],
        &[("TMPDIR", &tmp)],
    );
    wait_for(&mut child, &logs.join("events.jsonl"), stages::BEFORE_EVAL);
    let scratch: Vec<_> = std::fs::read_dir(&tmp).unwrap().flatten().collect();
    assert_eq!(
        scratch.len(),
        1,
        "the evaluation streams from one scratch copy"
    );
    signal(&child, libc::SIGINT);
    assert_eq!(child.wait().unwrap().code(), Some(130));
    let left: Vec<_> = std::fs::read_dir(&tmp)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "scratch left behind: {left:?}");
}

#[test]
fn watch_passes_sigterm_on_and_writes_whole_logs() {
    let dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    let pidfile = dir.path().join("pid");
    let script = format!("echo $$ > {}; sleep 30", pidfile.display());
    let mut child = spawn(
        &[
            "watch",
            "--ui",
            "none",
            "--log-memory",
            s(&logs),
            "--",
            "sh",
            "-c",
            &script,
        ],
        &[],
    );
    wait_for(&mut child, &pidfile, "\n");
    std::thread::sleep(Duration::from_millis(300));
    signal(&child, libc::SIGTERM);
    let status = child.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(128 + libc::SIGTERM),
        "the command's own status"
    );
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "the command was stopped"
    );
    let text = std::fs::read_to_string(logs.join("events.jsonl")).unwrap();
    let log = parse_log(&text).unwrap();
    assert!(!log.torn_last_line);
    assert!(matches!(
        log.events.last(),
        Some(Event::RunFinished { summary }) if summary.status == RunStatus::Interrupted
    ));
}

#[test]
fn a_log_that_cannot_be_written_fails_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    write_checkpoint(&model, &SyntheticSpec::default()).unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    // Every write to events.jsonl fails as on a full disk.
    std::os::unix::fs::symlink("/dev/full", logs.join("events.jsonl")).unwrap();
    let (code, out, err) = run_prunemem(&[
        "prune",
        "--model",
        s(&model),
        "--method",
        "magnitude",
        "--ui",
        "none",
        "--log-memory",
        s(&logs),
    ]);
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(
        out.contains("sparsity sanity check"),
        "results are still printed: {out}"
    );
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("logs are incomplete"), "{}", lines[0]);
}

/// A closed terminal (SIGHUP) ends a run as SIGTERM does: its log ends with
/// the interrupted run's summary, and no partial save or lock is left
/// behind. A second run given a log folder that a first run is writing is
/// refused in one line, and the first run's log stays whole.
#[test]
fn sighup_finishes_the_logs_and_a_busy_log_folder_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (model, text) = slow_model(dir.path());
    let logs = dir.path().join("logs");
    let save = dir.path().join("pruned");
    let mut args = slow_prune(&model, &text, &logs);
    args.extend(["--save", s(&save)]);
    let mut child = spawn(&args, &[]);
    let jsonl = logs.join("events.jsonl");
    wait_for(&mut child, &jsonl, &stages::layer_pruned(1));
    // A second writer of the same log folder: one line, exit 2.
    let (code, _, err) = run_prunemem(&args);
    assert_eq!(code, Some(2), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("another prunemem run"), "{err}");
    signal(&child, libc::SIGHUP);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{status}");
    let log = parse_log(&std::fs::read_to_string(&jsonl).unwrap()).unwrap();
    let last = log.events.last().expect("events");
    assert!(
        matches!(last, Event::RunFinished { summary } if summary.status == RunStatus::Interrupted),
        "{last:?}"
    );
    for left in ["pruned.partial", "pruned.lock", "logs.lock", "pruned"] {
        assert!(!dir.path().join(left).exists(), "{left} left behind");
    }
}
