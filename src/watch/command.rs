//! `prunemem watch -- CMD`: runs any command (a PyTorch pruning script, say)
//! and turns what can be seen from outside into prunemem events: its whole
//! process tree's RSS (and, with NVML, the GPU memory of those processes)
//! sampled at a fixed rate, and stages from the lines it prints —
//! `PRUNEMEM_STAGE name` (prunemem's one-line protocol) or the memory
//! scripts' `Memory Checkpoint: NAME` headers. Its output still reaches the
//! terminal when no full-screen UI owns it.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::WatchError;
use super::checkpoint::{self, Figures};
use crate::events::{Event, HostInfo, Level, RunPlan, RunStatus, RunSummary, stages};
use crate::memory::process::TreeProbe;
use crate::memory::{MemorySnapshot, gpu, unix_ms_now};

/// How a command is watched.
pub struct WatchOptions {
    /// Samples per second of the process tree.
    pub hz: f64,
    /// Copy the command's output to this process's stdout/stderr.
    pub echo: bool,
}

/// The stage a line announces, if any.
pub fn parse_marker(line: &str) -> Option<String> {
    let t = line.trim();
    if let Some(rest) = t.strip_prefix("PRUNEMEM_STAGE") {
        let name = rest.trim();
        return (!name.is_empty() && rest.starts_with(char::is_whitespace))
            .then(|| name.to_string());
    }
    let at = t.find("Memory Checkpoint:")?;
    let name = t[at + "Memory Checkpoint:".len()..]
        .trim_matches(|c: char| c.is_whitespace() || "=-*#:".contains(c));
    (!name.is_empty()).then(|| name.to_string())
}

/// Whether `line` is a memory-logging script's `Memory Checkpoint:` header
/// (its figures follow on the next lines).
fn is_checkpoint_header(line: &str) -> bool {
    line.contains("Memory Checkpoint:")
}

/// How long a checkpoint's block may pause before its stage is emitted
/// with the figures read so far.
const BLOCK_WAIT: std::time::Duration = std::time::Duration::from_millis(300);

/// A `Memory Checkpoint` stage waiting for the figures printed under it.
pub(super) struct Pending {
    snapshot: MemorySnapshot,
    figures: Figures,
    last_line: Instant,
}

impl Pending {
    /// The stage, with the script's allocator figures where it printed a
    /// block (the card's NVML figures, when there are any, are kept).
    fn into_stage(self) -> Event {
        let mut s = self.snapshot;
        let f = self.figures;
        if f.any() {
            s.device_allocated = f.allocated;
            s.device_reserved = f.reserved;
            s.device_peak = f.peak;
            if s.gpu_total.is_none() {
                s.gpu_total = f.total;
                s.gpu_free = f.free;
            }
        }
        Event::Stage { snapshot: s }
    }
}

/// One line of the watched program's output: a stage marker, a line of a
/// checkpoint's block, a warning, or nothing to us.
pub(super) fn on_line(line: &str, probe: &Arc<Mutex<Probe>>, emit: &Emit) {
    let mut p = lock(probe);
    if let Some(pending) = p.pending.as_mut() {
        if parse_marker(line).is_none() && checkpoint::read_line(line, &mut pending.figures) {
            pending.last_line = Instant::now();
            return;
        }
        let done = p.pending.take();
        drop(p);
        if let Some(done) = done {
            send(emit, done.into_stage());
        }
        p = lock(probe);
    }
    let elapsed_s = p.start.elapsed().as_secs_f64();
    if let Some(stage) = parse_marker(line) {
        let snapshot = p.snapshot(&stage);
        if is_checkpoint_header(line) {
            p.pending = Some(Pending {
                snapshot,
                figures: Figures::default(),
                last_line: Instant::now(),
            });
        } else {
            drop(p);
            send(emit, Event::Stage { snapshot });
        }
    } else if let Some(level) = is_warning(line) {
        drop(p);
        let text = line.trim_end().to_string();
        send(
            emit,
            Event::Message {
                level,
                text,
                elapsed_s,
            },
        );
    }
}

/// Emits a checkpoint whose block has paused for [`BLOCK_WAIT`] (or any,
/// with `all`: the program ended).
pub(super) fn flush_pending(probe: &Arc<Mutex<Probe>>, emit: &Emit, all: bool) {
    let done = {
        let mut p = lock(probe);
        let stale = p
            .pending
            .as_ref()
            .is_some_and(|d| all || d.last_line.elapsed() > BLOCK_WAIT);
        if stale { p.pending.take() } else { None }
    };
    if let Some(done) = done {
        send(emit, done.into_stage());
    }
}

/// Whether a line of the command's output deserves the message pane.
pub(super) fn is_warning(line: &str) -> Option<Level> {
    let l = line.to_ascii_lowercase();
    if l.contains("out of memory") || l.contains("error") || l.contains("traceback") {
        Some(Level::Error)
    } else if l.contains("warning") {
        Some(Level::Warn)
    } else {
        None
    }
}

/// Readings of the watched tree, shared by the sampler and the output readers.
pub(super) struct Probe {
    pub(super) tree: TreeProbe,
    pub(super) start: Instant,
    pub(super) peak: Option<u64>,
    pub(super) gpu_peak: Option<u64>,
    /// A checkpoint header's stage, until its block ends.
    pub(super) pending: Option<Pending>,
    /// NVML's utilisation over every reading (the run's `gpu_util`).
    pub(super) busy: crate::events::fold::Mean,
}

impl Probe {
    pub(super) fn snapshot(&mut self, label: &str) -> MemorySnapshot {
        let reading = self.tree.read();
        let rss = reading.as_ref().map(|(r, _)| *r);
        self.peak = self.peak.max(rss);
        let pids = reading.map(|(_, p)| p).unwrap_or_default();
        let card = gpu::read(0);
        // GPU memory of the watched processes (NVML per process).
        let procs = gpu::processes(0);
        let mine: Vec<u64> = procs
            .iter()
            .filter(|u| pids.contains(&u.pid))
            .filter_map(|u| u.used)
            .collect();
        let tree_gpu = (card.is_some()).then(|| mine.iter().sum::<u64>());
        if let Some(u) = card.as_ref().and_then(|c| c.utilization_percent) {
            self.busy.add(u as f64);
        }
        self.gpu_peak = self.gpu_peak.max(tree_gpu);
        MemorySnapshot {
            label: label.to_string(),
            unix_ms: unix_ms_now(),
            elapsed_s: self.start.elapsed().as_secs_f64(),
            rss,
            rss_peak: self.peak,
            device_allocated: tree_gpu,
            device_peak: self.gpu_peak,
            gpu_used: card.as_ref().and_then(|c| c.used),
            gpu_free: card.as_ref().and_then(|c| c.free),
            gpu_total: card.as_ref().and_then(|c| c.total),
            gpu_util_percent: card.as_ref().and_then(|c| c.utilization_percent),
            ..Default::default()
        }
    }
}

/// Where the watcher sends its events (shared by its threads).
pub type Emit = Arc<Mutex<dyn FnMut(Event) + Send>>;

pub(super) fn send(emit: &Emit, e: Event) {
    let mut f = match emit.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    f(e);
}

fn reader_thread(
    stream: impl std::io::Read + Send + 'static,
    to_stderr: bool,
    echo: bool,
    probe: Arc<Mutex<Probe>>,
    emit: Emit,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            if echo {
                if to_stderr {
                    let _ = writeln!(std::io::stderr(), "{line}");
                } else {
                    let _ = writeln!(std::io::stdout(), "{line}");
                }
            }
            on_line(&line, &probe, &emit);
        }
    })
}

/// The end of a watch: the last stage (with the tree's peak) and the run's
/// closing event.
pub(super) fn finish(
    probe: &Arc<Mutex<Probe>>,
    emit: &Emit,
    status: RunStatus,
    results: std::collections::BTreeMap<String, serde_json::Value>,
) {
    flush_pending(probe, emit, true);
    let (wall_s, peak, gpu_peak) = {
        let p = lock(probe);
        (p.start.elapsed().as_secs_f64(), p.peak, p.gpu_peak)
    };
    let mut end = lock(probe).snapshot(stages::WATCH_END);
    end.rss_peak = peak;
    let mut results = results;
    // How busy the card was while the command ran (NVML), as a prunemem
    // run's `gpu_util`; the report's timeline says in which windows.
    let busy = lock(probe).busy;
    if let Some(mean) = busy.percent() {
        results.insert(
            "gpu_util".into(),
            serde_json::json!({"mean_percent": mean, "samples": busy.samples}),
        );
    }
    send(emit, Event::Stage { snapshot: end });
    let summary = RunSummary {
        status,
        wall_s,
        rss_peak: peak,
        heap_peak: None,
        device_peak: gpu_peak,
        results,
    };
    send(emit, Event::RunFinished { summary });
}

pub(super) fn lock<T: ?Sized>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Runs `argv`, emitting `RunStarted`, samples, stages, messages and
/// `RunFinished`; returns the command's exit code (128 + signal when it was
/// killed). A signal number stored in `forward` from outside (the UI's
/// quit: SIGINT; our own SIGINT or SIGTERM) is sent on to the command, and
/// the watch goes on until the command has exited, so the logs are whole.
/// The plan of a watch: a process tree sampled at `hz`, run by someone else.
pub(super) fn watch_plan(
    tool: String,
    argv: Vec<String>,
    hz: f64,
    started_unix_ms: u64,
) -> RunPlan {
    RunPlan {
        tool,
        command: "watch".into(),
        argv,
        device: "process tree".into(),
        engine: "external".into(),
        sampler_hz: Some(hz),
        started_unix_ms,
        host: HostInfo::current(),
        ..Default::default()
    }
}

pub fn watch_command(
    argv: &[String],
    options: &WatchOptions,
    emit: Emit,
    forward: Arc<AtomicI32>,
) -> Result<i32, WatchError> {
    let Some((program, args)) = argv.split_first() else {
        return Err(WatchError::Invalid("watch needs a command after --".into()));
    };
    if !(options.hz > 0.0 && options.hz <= 1000.0) {
        return Err(WatchError::Invalid(format!(
            "--sample-hz must be between 0 and 1000, got {}",
            options.hz
        )));
    }
    let mut child: Child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| WatchError::Io {
            path: program.clone(),
            source,
        })?;
    let started_unix_ms = unix_ms_now();
    let probe = Arc::new(Mutex::new(Probe {
        tree: TreeProbe::new(child.id()),
        start: Instant::now(),
        peak: None,
        gpu_peak: None,
        pending: None,
        busy: Default::default(),
    }));
    let mut full_argv = vec!["prunemem".to_string(), "watch".into(), "--".into()];
    full_argv.extend(argv.iter().cloned());
    let tool = format!("prunemem {}", env!("CARGO_PKG_VERSION"));
    let plan = watch_plan(tool, full_argv, options.hz, started_unix_ms);
    send(&emit, Event::RunStarted { plan });
    let first = lock(&probe).snapshot(stages::WATCH_START);
    send(&emit, Event::Stage { snapshot: first });
    let readers = [
        child
            .stdout
            .take()
            .map(|s| reader_thread(s, false, options.echo, probe.clone(), emit.clone())),
        child
            .stderr
            .take()
            .map(|s| reader_thread(s, true, options.echo, probe.clone(), emit.clone())),
    ];
    let period = crate::timing::duration(1.0 / options.hz);
    let mut signalled = false;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|source| WatchError::Io {
            path: program.clone(),
            source,
        })? {
            break status;
        }
        let sig = forward.swap(0, Ordering::SeqCst);
        if sig != 0 {
            // SAFETY: kill sends a signal to the child we spawned.
            unsafe { libc::kill(child.id() as libc::pid_t, sig) };
            signalled = true;
        }
        flush_pending(&probe, &emit, false);
        let snapshot = lock(&probe).snapshot(stages::SAMPLE);
        send(&emit, Event::Sample { snapshot });
        std::thread::sleep(period);
    };
    for r in readers.into_iter().flatten() {
        let _ = r.join();
    }
    let code = status.code().unwrap_or_else(|| {
        use std::os::unix::process::ExitStatusExt;
        128 + status.signal().unwrap_or(0)
    });
    let mut results = std::collections::BTreeMap::new();
    results.insert("exit_code".to_string(), code.into());
    let status = match (code, signalled) {
        (0, _) => RunStatus::Ok,
        (_, true) => RunStatus::Interrupted,
        (c, false) => RunStatus::Failed(format!("{program} exited with status {c}")),
    };
    finish(&probe, &emit, status, results);
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_of_both_kinds() {
        assert_eq!(
            parse_marker("PRUNEMEM_STAGE after_load"),
            Some("after_load".into())
        );
        assert_eq!(
            parse_marker("  PRUNEMEM_STAGE  layer 3 done "),
            Some("layer 3 done".into())
        );
        assert_eq!(parse_marker("PRUNEMEM_STAGEX"), None);
        assert_eq!(parse_marker("PRUNEMEM_STAGE "), None);
        assert_eq!(
            parse_marker("=== Memory Checkpoint: 02_model_loaded ==="),
            Some("02_model_loaded".into())
        );
        assert_eq!(
            parse_marker("[INFO] Memory Checkpoint: before pruning"),
            Some("before pruning".into())
        );
        assert_eq!(parse_marker("loss 0.3"), None);
    }

    #[test]
    fn watches_a_shell_command_with_markers() {
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        let emit: Emit = Arc::new(Mutex::new(move |e: Event| lock(&sink).push(e)));
        let argv: Vec<String> = [
            "sh",
            "-c",
            "echo PRUNEMEM_STAGE one; sleep 0.3; echo '== Memory Checkpoint: two =='; echo 'RuntimeError: boom' >&2; exit 3",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let options = WatchOptions {
            hz: 20.0,
            echo: false,
        };
        let code = watch_command(&argv, &options, emit, Arc::new(AtomicI32::new(0))).unwrap();
        assert_eq!(code, 3);
        let events = lock(&events);
        let stages: Vec<&str> = events
            .iter()
            .filter_map(|e| match e {
                Event::Stage { snapshot } => Some(snapshot.label.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(stages, ["watch_start", "one", "two", "watch_end"]);
        assert!(events.iter().any(|e| matches!(e, Event::Message { level: Level::Error, text, .. } if text.contains("boom"))));
        assert!(
            events
                .iter()
                .filter(|e| matches!(e, Event::Sample { .. }))
                .count()
                >= 3
        );
        match events.last() {
            Some(Event::RunFinished { summary }) => {
                assert!(matches!(summary.status, RunStatus::Failed(_)));
                assert!(summary.rss_peak.unwrap() > 0);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_missing_program_is_an_error() {
        let emit: Emit = Arc::new(Mutex::new(|_e: Event| {}));
        let r = watch_command(
            &["/no/such/program".to_string()],
            &WatchOptions {
                hz: 10.0,
                echo: false,
            },
            emit,
            Arc::new(AtomicI32::new(0)),
        );
        assert!(r.is_err());
    }
}
