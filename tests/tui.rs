//! The live UI end to end: the real binary in a pseudo-terminal, its screen
//! read back through a terminal emulator (vt100). Replays a recorded run,
//! watches a shell command that prints stage markers, and prunes a small
//! model with `--ui tui`; checks what the screen shows, that `q` quits, and
//! that the terminal is handed back.

#![cfg(feature = "tui")]

mod support;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use portable_pty::{CommandBuilder, PtySize, native_pty_system};

struct Screen {
    parser: Arc<Mutex<vt100::Parser>>,
    writer: Box<dyn Write + Send>,
    child: Box<dyn portable_pty::Child + Send + Sync>,
    /// Every screen seen, so transient states can be checked afterwards.
    seen: Arc<Mutex<Vec<String>>>,
}

impl Screen {
    fn spawn(args: &[&str], cwd: &Path) -> Screen {
        let pty = native_pty_system()
            .openpty(PtySize {
                rows: 40,
                cols: 130,
                pixel_width: 0,
                pixel_height: 0,
            })
            .unwrap();
        let mut cmd = CommandBuilder::new(env!("CARGO_BIN_EXE_prunemem"));
        cmd.args(args);
        cmd.cwd(cwd);
        cmd.env("TERM", "xterm-256color");
        let child = pty.slave.spawn_command(cmd).unwrap();
        drop(pty.slave);
        let parser = Arc::new(Mutex::new(vt100::Parser::new(40, 130, 0)));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut reader = pty.master.try_clone_reader().unwrap();
        let (p, s) = (parser.clone(), seen.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let mut parser = p.lock().unwrap();
                parser.process(&buf[..n]);
                s.lock().unwrap().push(parser.screen().contents());
            }
        });
        let writer = pty.master.take_writer().unwrap();
        // Keep the master alive as long as the screen.
        std::mem::forget(pty.master);
        Screen {
            parser,
            writer,
            child,
            seen,
        }
    }

    fn text(&self) -> String {
        self.parser.lock().unwrap().screen().contents()
    }

    fn wait_for(&self, want: &str, timeout: Duration) -> String {
        let t = Instant::now();
        loop {
            let text = self.text();
            if text.contains(want) {
                return text;
            }
            assert!(
                t.elapsed() < timeout,
                "no {want:?} on screen after {timeout:?}:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn key(&mut self, k: &str) {
        self.writer.write_all(k.as_bytes()).unwrap();
        self.writer.flush().unwrap();
    }

    fn exit_code(&mut self, timeout: Duration) -> u32 {
        let t = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.exit_code();
            }
            assert!(t.elapsed() < timeout, "still running:\n{}", self.text());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn ever_showed(&self, want: &str) -> bool {
        self.seen.lock().unwrap().iter().any(|s| s.contains(want))
    }
}

/// A synthetic model of `layers` layers and a generated text, in a
/// temporary folder: (folder, model, text).
fn synthetic_model(layers: usize) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    let spec = prunemem::model::synthetic::SyntheticSpec {
        layers,
        hidden: 256,
        intermediate: 768,
        heads: 4,
        kv_heads: 2,
        vocab: 2048,
        ..Default::default()
    };
    prunemem::model::synthetic::write_checkpoint(&model, &spec).unwrap();
    let text = tmp.path().join("text.txt");
    std::fs::write(&text, prunemem::model::tiny::corpus(20_000, 5)).unwrap();
    (tmp, model, text)
}

fn fixture() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/run-wanda-tiny")
}

#[test]
fn replay_shows_the_recorded_run_and_q_quits() {
    let dir = fixture();
    let mut s = Screen::spawn(
        &[
            "replay",
            dir.to_str().unwrap(),
            "--speed",
            "20",
            "--ui",
            "tui",
        ],
        &dir,
    );
    let text = s.wait_for("finished", Duration::from_secs(30));
    for want in [
        "prunemem prune --model",
        "wanda 0.5",
        "RSS",
        "allocated",
        "stages (peak",
        "04_after_pruning",
        "09_end",
        "layers",
        "q quit",
    ] {
        assert!(text.contains(want), "missing {want:?}:\n{text}");
    }
    // Help opens and closes; pause shows in the header.
    s.key("?");
    s.wait_for("pause / resume", Duration::from_secs(5));
    s.key("x");
    s.key("q");
    assert_eq!(s.exit_code(Duration::from_secs(10)), 0);
    // The alternate screen is left: the UI's frame is gone.
    std::thread::sleep(Duration::from_millis(200));
    assert!(!s.text().contains("stages (peak"), "{}", s.text());
}

#[test]
fn watch_runs_a_command_and_shows_its_markers() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    let mut s = Screen::spawn(
        &[
            "watch",
            "--ui",
            "tui",
            "--sample-hz",
            "20",
            "--log-memory",
            logs.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "echo PRUNEMEM_STAGE loaded_model; sleep 0.5; echo '=== Memory Checkpoint: pruned ==='; echo 'UserWarning: slow' ; sleep 0.5",
        ],
        tmp.path(),
    );
    let text = s.wait_for("finished", Duration::from_secs(30));
    for want in [
        "loaded_model",
        "pruned",
        "watch_end",
        "UserWarning: slow",
        "sh -c",
    ] {
        assert!(text.contains(want), "missing {want:?}:\n{text}");
    }
    s.key("q");
    assert_eq!(s.exit_code(Duration::from_secs(10)), 0);
    // The watched run is a prunemem log like any other.
    let events = std::fs::read_to_string(logs.join("events.jsonl")).unwrap();
    assert!(events.contains("\"label\":\"pruned\""));
    assert!(events.lines().last().unwrap().contains("run_finished"));
}

#[test]
fn prune_with_the_tui_shows_progress_then_prints_the_summary() {
    let (tmp, model, text) = synthetic_model(6);
    let mut s = Screen::spawn(
        &[
            "prune",
            "--model",
            model.to_str().unwrap(),
            "--method",
            "sparsegpt",
            "--nsamples",
            "32",
            "--seqlen",
            "256",
            "--calib-text",
            text.to_str().unwrap(),
            "--ui",
            "tui",
        ],
        tmp.path(),
    );
    assert_eq!(s.exit_code(Duration::from_secs(120)), 0);
    std::thread::sleep(Duration::from_millis(300));
    assert!(s.ever_showed("stages (peak"), "the UI was never drawn");
    assert!(
        s.ever_showed("q stop run"),
        "a running prune offers to stop"
    );
    // After the UI closes, the summary is printed on the normal screen.
    let after = s.text();
    assert!(after.contains("04_after_pruning"), "{after}");
    assert!(!after.contains("stages (peak"), "{after}");
}

#[test]
fn the_live_view_shows_gauges_within_a_second_even_during_a_dense_evaluation() {
    let (tmp, model, text) = synthetic_model(4);
    let t = text.to_str().unwrap();
    let started = Instant::now();
    let mut s = Screen::spawn(
        &[
            "prune",
            "--model",
            model.to_str().unwrap(),
            "--method",
            "wanda",
            "--nsamples",
            "16",
            "--seqlen",
            "256",
            "--calib-text",
            t,
            "--eval-text",
            t,
            "--eval-windows",
            "4",
            "--eval-dense",
            "--budget",
            "64GiB",
            "--ui",
            "tui",
        ],
        tmp.path(),
    );
    // The first stage of the run is the dense evaluation's; the gauges and
    // the forecast are drawn with figures from it.
    let screen = s.wait_for("00_before_dense_eval", Duration::from_secs(1));
    let shown = started.elapsed();
    let rss = screen
        .lines()
        .find(|l| l.contains("RSS "))
        .unwrap_or_default();
    assert!(
        rss.contains("MiB"),
        "the RSS gauge has a figure: {rss}\n{screen}"
    );
    assert!(shown < Duration::from_secs(1), "{shown:?}");
    s.wait_for("fits --budget", Duration::from_secs(5));
    assert_eq!(s.exit_code(Duration::from_secs(120)), 0);
    std::thread::sleep(Duration::from_millis(300));
    let after = s.text();
    assert!(after.contains("00_after_dense_eval"), "{after}");
}
