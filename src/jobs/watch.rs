//! The watch jobs: runs this process does not perform — a log another
//! process is writing (followed), a finished log (replayed), any command run
//! and watched from outside, or a process already running (attached). Its
//! events are written as a prunemem log when asked, so reports and
//! `estimate --against` work on a PyTorch run.
//!
//! The caller gives the sinks (the live UI among them) and a poll that says
//! when the user asked to stop (the UI's quit); the job builds the emitter,
//! attaches the log files, feeds it, and flushes the logs before it returns.
//! SIGINT/SIGTERM to this process go on to the watched command through
//! [`forward_signals`], so the logs are whole however the watch ends.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

use super::JobError;
use crate::events::{Emitter, Event, EventSink};
use crate::sinks;
use crate::watch::{self, WatchOptions};

/// What is watched.
#[derive(Debug, Clone)]
pub enum Source {
    /// A run's log folder, followed as it grows.
    Log(PathBuf),
    /// A finished run's log folder, played back at `speed` from `from`.
    Replay {
        dir: PathBuf,
        speed: f64,
        from: Option<String>,
    },
    /// A command to start and watch.
    Command(Vec<String>),
    /// A process already running, with a log file to read stage markers from.
    Pid { pid: u32, follow: Option<PathBuf> },
}

/// A watch: its source, where to write its log, and how to sample.
#[derive(Debug, Clone)]
pub struct WatchJob {
    pub source: Source,
    /// `memory_log.csv`, `events.jsonl`, `summary.txt` of a watched command
    /// or process.
    pub log_dir: Option<PathBuf>,
    /// Samples per second of a watched process tree.
    pub hz: f64,
    /// Copy a watched command's output to this process's stdout/stderr.
    pub echo: bool,
}

/// Stores each SIGINT/SIGTERM this process receives (instead of dying of
/// it) in the returned cell, which a watched command's loop reads and
/// forwards; storing `SIGINT` there by hand stops the command the same way.
pub fn forward_signals() -> Result<Arc<AtomicI32>, JobError> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let forward = Arc::new(AtomicI32::new(0));
    let cell = forward.clone();
    let io = |e: std::io::Error| JobError::io(std::path::Path::new("signal handler"), e);
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]).map_err(io)?;
    std::thread::Builder::new()
        .name("prunemem-watch-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                cell.store(sig, Ordering::SeqCst);
            }
        })
        .map_err(io)?;
    Ok(forward)
}

/// Runs `job`, feeding `sinks`; `stopped` says when the user asked to stop
/// (polled between events of a log), `forward` is [`forward_signals`]'s
/// cell for a command or process. Returns the watched command's exit code
/// (0 for logs).
pub fn run(
    job: &WatchJob,
    sinks: Vec<Box<dyn EventSink>>,
    stopped: &(dyn Fn() -> bool + Sync),
    forward: Option<Arc<AtomicI32>>,
) -> Result<i32, JobError> {
    let emitter = Arc::new(Emitter::new());
    if let Some(dir) = &job.log_dir {
        sinks::attach_log_dir(&emitter, dir)
            .map_err(|e| JobError::io(dir, std::io::Error::other(e.to_string())))?;
    }
    for sink in sinks {
        emitter.add(sink);
    }
    let stop = AtomicBool::new(false);
    let mut feed = |e: Event| {
        emitter.emit(e);
        if stopped() {
            stop.store(true, Ordering::SeqCst);
        }
    };
    let result = match &job.source {
        Source::Log(dir) => watch::follow(dir, &mut feed, &stop, None).map(|_| 0),
        Source::Replay { dir, speed, from } => watch::read_all(dir)
            .and_then(|events| watch::replay(&events, *speed, from.as_deref(), &mut feed, &stop))
            .map(|_| 0),
        Source::Command(_) | Source::Pid { .. } => {
            let forward = forward.unwrap_or_default();
            let sink = emitter.clone();
            let emit: watch::Emit = Arc::new(Mutex::new(move |e: Event| {
                sink.emit(e);
            }));
            let options = WatchOptions {
                hz: job.hz,
                echo: job.echo,
            };
            match &job.source {
                Source::Pid { pid, follow } => {
                    watch::attach(*pid, follow.as_deref(), &options, emit, forward)
                }
                Source::Command(argv) => watch::watch_command(argv, &options, emit, forward),
                _ => unreachable!("matched above"),
            }
        }
    };
    emitter.flush();
    Ok(result?)
}
