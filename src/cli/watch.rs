//! `prunemem watch` and `prunemem replay`: flags into a [`WatchJob`], the UI
//! chosen, the job run (`jobs::watch` builds the emitter, writes the log,
//! forwards signals), and the live view waited on or closed.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};

use clap::Args;

use super::CliResult;
use super::common::{Role, Ui, UiMode, for_ui, resolve_ui as ui_mode};
use crate::jobs::watch::{self, Source, WatchJob};

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

/// Runs `job` under the UI `ui`, then waits for the user to leave the live
/// view (or closes it first when the job failed, so the error is readable).
fn run_under(job: WatchJob, ui: Ui, forward: Option<Arc<AtomicI32>>) -> CliResult<i32> {
    #[cfg(feature = "tui")]
    let handle = ui.tui;
    #[cfg(feature = "tui")]
    let stopped = || handle.as_ref().is_some_and(|t| t.quit_requested());
    #[cfg(not(feature = "tui"))]
    let stopped = || false;
    let result = watch::run(&job, ui.sinks, &stopped, forward);
    #[cfg(feature = "tui")]
    if let Some(t) = &handle {
        if result.is_err() {
            t.close();
        } else {
            let stats = t.wait();
            if std::env::var_os("PRUNEMEM_UI_STATS").is_some() {
                eprintln!("{}", stats.line());
            }
        }
    }
    Ok(result?)
}

pub fn watch(args: WatchArgs) -> CliResult<i32> {
    let mode = ui_mode(args.ui);
    let echo = mode != UiMode::Tui;
    let job = |source| WatchJob {
        source,
        log_dir: args.log_memory.clone(),
        hz: args.sample_hz,
        echo,
    };
    if let Some(dir) = &args.log {
        let ui = for_ui(mode, Role::View)?;
        let follow = WatchJob {
            log_dir: None,
            ..job(Source::Log(dir.clone()))
        };
        return run_under(follow, ui, None);
    }
    let source = match (args.pid, args.command.is_empty()) {
        (Some(pid), _) => Source::Pid {
            pid,
            follow: args.follow.clone(),
        },
        (None, false) => Source::Command(args.command.clone()),
        (None, true) => {
            return Err(
                "watch needs --log DIR, --pid PID or a command after -- (prunemem watch -- python main.py ...)"
                    .into(),
            );
        }
    };
    // Our own SIGINT/SIGTERM, and the UI's quit, go on to the command (or,
    // attached to a process, end the watch); logs are whole either way.
    let forward = watch::forward_signals()?;
    let cell = forward.clone();
    let abort = Box::new(move || cell.store(libc::SIGINT, Ordering::SeqCst));
    let ui = for_ui(mode, Role::Watch(abort))?;
    run_under(job(source), ui, Some(forward))
}

pub fn replay(args: ReplayArgs) -> CliResult<i32> {
    let job = WatchJob {
        source: Source::Replay {
            dir: args.dir,
            speed: args.speed,
            from: args.from,
        },
        log_dir: None,
        hz: 0.0,
        echo: false,
    };
    run_under(job, for_ui(ui_mode(args.ui), Role::View)?, None)
}
