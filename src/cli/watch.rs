//! `prunemem watch` and `prunemem replay`: the live UI (or plain lines) for
//! runs this process does not perform — a log another process is writing,
//! a finished log played back, or any command watched from outside (whose
//! events are also written as a prunemem log, so reports work on it).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

use clap::Args;

use super::CliResult;
use super::common::{Role, UiMode, for_ui, resolve_ui as ui_mode};
use crate::events::{Emitter, Event};
use crate::sinks;
use crate::watch::{self, WatchOptions};

#[derive(Args, Debug)]
pub struct WatchArgs {
    /// Follow a run's log folder (events.jsonl) as it grows
    #[arg(long, value_name = "DIR", conflicts_with_all = ["command", "pid"])]
    log: Option<PathBuf>,
    /// Attach to a running process (and its children) until it exits
    #[arg(long, value_name = "PID", conflicts_with = "command")]
    pid: Option<u32>,
    /// With --pid: read stage markers (PRUNEMEM_STAGE name, Memory Checkpoint: NAME) from this log file
    #[arg(long, value_name = "FILE", requires = "pid")]
    follow: Option<PathBuf>,
    /// Write the watched command's memory_log.csv, events.jsonl and summary.txt to DIR
    #[arg(long = "log-memory", value_name = "DIR")]
    log_memory: Option<PathBuf>,
    /// tui, plain or none (default: tui on a terminal, else plain)
    #[arg(long, value_enum)]
    ui: Option<UiMode>,
    /// Samples per second of the watched command's process tree
    #[arg(long, default_value_t = 10.0, value_name = "HZ")]
    sample_hz: f64,
    /// The command to run and watch (after --)
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// A finished run's log folder
    dir: PathBuf,
    /// Playback speed (2 = twice real time)
    #[arg(long, default_value_t = 10.0)]
    speed: f64,
    /// Jump to this stage (e.g. 03_before_pruning)
    #[arg(long, value_name = "STAGE")]
    from: Option<String>,
    /// tui, plain or none (default: tui on a terminal, else plain)
    #[arg(long, value_enum)]
    ui: Option<UiMode>,
}

/// What stops the watched run when the user asks the UI to.
type Abort = Box<dyn Fn() + Send>;

/// The sinks of a watch or replay, and the live UI when there is one.
struct Outputs {
    emitter: Arc<Emitter>,
    #[cfg(feature = "tui")]
    tui: Option<crate::tui::TuiHandle>,
}

impl Outputs {
    fn new(mode: UiMode, role: Role, log_dir: Option<&PathBuf>) -> CliResult<Self> {
        let emitter = Arc::new(Emitter::new());
        if let Some(dir) = log_dir {
            sinks::attach_log_dir(&emitter, dir)?;
        }
        let ui = for_ui(mode, role)?;
        for sink in ui.sinks {
            emitter.add(sink);
        }
        Ok(Self {
            emitter,
            #[cfg(feature = "tui")]
            tui: ui.tui,
        })
    }

    fn emit(&self, e: Event) {
        self.emitter.emit(e);
    }

    /// A flag the feeding loop polls: set once the user closed the view.
    fn stopped(&self) -> bool {
        #[cfg(feature = "tui")]
        if let Some(t) = &self.tui {
            return t.quit_requested();
        }
        false
    }

    /// Flushes the logs, then waits for the user to leave the view.
    fn finish(self) {
        self.emitter.flush();
        #[cfg(feature = "tui")]
        if let Some(t) = &self.tui {
            let stats = t.wait();
            if std::env::var_os("PRUNEMEM_UI_STATS").is_some() {
                eprintln!("{}", stats.line());
            }
        }
    }
}

/// Stores each SIGINT/SIGTERM this process receives in `forward` (instead
/// of dying of it).
fn forward_signals(forward: Arc<AtomicI32>) -> CliResult<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])?;
    std::thread::Builder::new()
        .name("prunemem-watch-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                forward.store(sig, Ordering::SeqCst);
            }
        })?;
    Ok(())
}

/// A stop flag that mirrors the UI's quit.
fn poll_stop(out: &Outputs, flag: &AtomicBool) {
    if out.stopped() {
        flag.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

pub fn watch(args: WatchArgs) -> CliResult<i32> {
    let mode = ui_mode(args.ui);
    if let Some(dir) = &args.log {
        let out = Outputs::new(mode, Role::View, None)?;
        let stop = AtomicBool::new(false);
        let result = watch::follow(
            dir,
            &mut |e| {
                out.emit(e);
                poll_stop(&out, &stop);
            },
            &stop,
            None,
        );
        out.finish();
        result?;
        return Ok(0);
    }
    if args.command.is_empty() && args.pid.is_none() {
        return Err(
            "watch needs --log DIR, --pid PID or a command after -- (prunemem watch -- python main.py ...)"
                .into(),
        );
    }
    // Our own SIGINT/SIGTERM, and the UI's quit, go on to the command (or,
    // attached to a process, end the watch); logs are whole either way.
    let forward = Arc::new(AtomicI32::new(0));
    forward_signals(forward.clone())?;
    let abort_flag = forward.clone();
    let abort: Abort = Box::new(move || abort_flag.store(libc::SIGINT, Ordering::SeqCst));
    let out = Arc::new(Outputs::new(
        mode,
        Role::Watch(abort),
        args.log_memory.as_ref(),
    )?);
    let sink_out = out.clone();
    let emit: watch::Emit = Arc::new(Mutex::new(move |e: Event| sink_out.emit(e)));
    let options = WatchOptions {
        hz: args.sample_hz,
        echo: mode != UiMode::Tui,
    };
    let code = match args.pid {
        Some(pid) => watch::attach(pid, args.follow.as_deref(), &options, emit, forward),
        None => watch::watch_command(&args.command, &options, emit, forward),
    };
    // Release the emitter's other owner (the closure) before finishing.
    match Arc::try_unwrap(out) {
        Ok(out) => out.finish(),
        Err(out) => out.emitter.flush(),
    }
    Ok(code?)
}

pub fn replay(args: ReplayArgs) -> CliResult<i32> {
    let events = watch::read_all(&args.dir)?;
    let out = Outputs::new(ui_mode(args.ui), Role::View, None)?;
    let stop = AtomicBool::new(false);
    let result = watch::replay(
        &events,
        args.speed,
        args.from.as_deref(),
        &mut |e| {
            out.emit(e);
            poll_stop(&out, &stop);
        },
        &stop,
    );
    if result.is_err() {
        // Leave the screen before reporting.
        #[cfg(feature = "tui")]
        if let Some(t) = &out.tui {
            t.close();
        }
    }
    result?;
    out.finish();
    Ok(0)
}

impl Drop for Outputs {
    fn drop(&mut self) {
        #[cfg(feature = "tui")]
        if let Some(t) = &self.tui
            && !t.quit_requested()
        {
            t.close();
        }
    }
}
