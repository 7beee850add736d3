//! The command line: parses arguments with clap, runs one subcommand, and
//! turns any error into one line on stderr with exit status 2.

mod common;
mod convert;
mod demo;
mod estimate;
mod eval;
mod prune;
mod report;
mod snapshot;
mod train;
mod watch;

use clap::{Parser, Subcommand};
use std::io::Write;

/// Errors reach the command line boxed; each is one line for the user.
pub type CliError = Box<dyn std::error::Error + Send + Sync>;
pub type CliResult<T = ()> = Result<T, CliError>;

/// Exit status for errors in what the user asked for.
pub const EXIT_USAGE: i32 = 2;

#[derive(Parser, Debug)]
#[command(
    name = "prunemem",
    version,
    about = "Prune Llama-family models with Burn, profile their memory as they run, and predict memory before you buy a GPU",
    propagate_version = true,
    args_override_self = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// The main job end to end: prune a model with Wanda, evaluate it, write logs to reports/demo
    Demo(demo::DemoArgs),
    /// Print the memory status of this machine and process (GPU when present)
    Snapshot(snapshot::SnapshotArgs),
    /// Import a llama.cpp GGUF file as a Hugging Face folder (--gguf), or rewrite a model folder dense or compressed-tensors sparse (--model --to)
    Convert(convert::ConvertArgs),
    /// Perplexity of a model on a text (non-overlapping windows, as the Wanda/SparseGPT eval)
    Eval(eval::EvalArgs),
    /// Predict memory before running: per-phase breakdown, peak, which GPUs fit
    Estimate(Box<estimate::EstimateArgs>),
    /// Prune a model layer by layer (magnitude, Wanda, SparseGPT), optionally evaluate and save it
    Prune(Box<prune::PruneArgs>),
    /// Train a model for some steps and measure where each step's memory goes (one step vs the epoch peak)
    Train(Box<train::TrainArgs>),
    /// Charts, report.md and report.html of a run, or `report compare A B` side by side
    Report(report::ReportArgs),
    /// Live memory view of a log being written (--log DIR) or of any command (-- CMD ARGS...)
    Watch(watch::WatchArgs),
    /// Play a finished run back in the live view (--speed, --from STAGE)
    Replay(watch::ReplayArgs),
}

/// Exit status of a run that ran out of device memory (`--device-memory` or
/// a failed device allocation); its logs are complete up to that point.
pub const EXIT_OOM: i32 = 3;

/// Exit status when standard output cannot be written (`> /dev/full`):
/// sysexits' EX_IOERR. A closed pipe exits 141, as a SIGPIPE death would.
pub const EXIT_IO: i32 = 74;

/// Exit status after a panic (a prunemem bug), as Rust's own.
pub const EXIT_INTERNAL: i32 = 101;

/// A run that ended out of device memory: the job's one line.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct OutOfMemory(pub String);

/// Parses `std::env::args`, runs the command and returns the exit status.
pub fn main() -> i32 {
    quiet_wayland_probe();
    // Started by `mpirun`/`srun`: join the world first (one line if this
    // build cannot).
    let dist = match crate::exec::launch::init() {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_USAGE;
        }
    };
    let (rank, world) = crate::exec::dist::world();
    if rank != 0 {
        // Rank 0 prints the results; the others' stdout would repeat them.
        silence_stdout();
    }
    // Arguments as the OS gave them: a path that is not UTF-8 is a path,
    // not a panic (clap refuses it in one line where text is required).
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let code = std::panic::catch_unwind(|| run_from(argv)).unwrap_or(EXIT_INTERNAL);
    if code != 0 && world > 1 {
        // The other ranks may be waiting in a reduction this rank will never
        // join: end them all now rather than hang in MPI's finalisation.
        eprintln!("rank {rank} of {world} failed (exit {code}): stopping every rank");
        dist.abort(code);
    }
    code
}

/// Points stdout at /dev/null.
fn silence_stdout() {
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        use std::os::fd::AsRawFd;
        // SAFETY: dup2 onto fd 1 replaces stdout; `null` stays open until
        // then and fd 1 keeps its own reference afterwards.
        unsafe { libc::dup2(null.as_raw_fd(), 1) };
    }
}

/// wgpu's Vulkan instance asks libwayland whether a compositor runs; with
/// no `XDG_RUNTIME_DIR` (a server, a container, CI) libwayland prints an
/// `error:` line to stderr for nothing. Pointing it at the temp folder keeps
/// the answer (no compositor) and the terminal clean.
fn quiet_wayland_probe() {
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() {
        // SAFETY: called first thing in `main`, before any thread exists.
        unsafe { std::env::set_var("XDG_RUNTIME_DIR", std::env::temp_dir()) };
    }
}

/// Runs the command line `argv` (`argv[0]` is the program name) and returns
/// the exit status, as the binary would.
pub fn run_from<S: Into<std::ffi::OsString>>(argv: Vec<S>) -> i32 {
    install_panic_hook();
    let argv: Vec<std::ffi::OsString> = argv.into_iter().map(Into::into).collect();
    let parsed = Cli::try_parse_from(&argv);
    // What the logs record of the command line.
    let argv: Vec<String> = argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let cli = match parsed {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind::{
                DisplayHelp, DisplayHelpOnMissingArgumentOrSubcommand, DisplayVersion,
            };
            return match e.kind() {
                DisplayHelp | DisplayVersion => {
                    let _ = e.print();
                    0
                }
                DisplayHelpOnMissingArgumentOrSubcommand => {
                    let _ = e.print();
                    EXIT_USAGE
                }
                _ => {
                    // One line, like every other error: the usage text
                    // clap appends is what `--help` prints.
                    let text = e.render().to_string();
                    let line = text
                        .lines()
                        .find(|l| !l.trim().is_empty())
                        .unwrap_or("error");
                    eprintln!("{} (see --help)", crate::input::escape(line.trim_end()));
                    EXIT_USAGE
                }
            };
        }
    };
    let outcome = match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Snapshot(args) => snapshot::run(args, argv),
        Command::Convert(args) => convert::run(args),
        Command::Eval(args) => eval::run(args, argv),
        Command::Prune(args) => prune::run(*args, argv),
        Command::Estimate(args) => estimate::run(*args),
        Command::Train(args) => train::run(*args, argv),
        Command::Report(args) => report::run(args),
        Command::Watch(args) => watch::watch(args),
        Command::Replay(args) => watch::replay(args),
    };
    match outcome {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", one_line(&*e));
            match e.downcast_ref::<OutOfMemory>() {
                Some(_) => EXIT_OOM,
                None => EXIT_USAGE,
            }
        }
    }
}

/// The error and its causes on one line.
pub fn one_line(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    // One line, and nothing from input can drive the terminal.
    crate::input::escape(&text.replace('\n', " "))
}

fn install_panic_hook() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        // A parser's panic that the library turns into an error.
        if crate::input::catching() {
            return;
        }
        if std::env::var_os("PRUNEMEM_BACKTRACE").is_some() {
            previous(info);
        }
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        // `prunemem ... | head`: the reader left. Quiet, as other tools
        // are, with the status a SIGPIPE death would give.
        if msg.starts_with("failed printing to std") {
            if msg.contains("Broken pipe") {
                std::process::exit(141);
            }
            // `> /dev/full`, a closed terminal: the output is lost, said
            // once on stderr (if it still works), with the usual status.
            let stream = if msg.starts_with("failed printing to stdout") {
                "standard output"
            } else {
                "standard error"
            };
            let why = msg.rsplit(": ").next().unwrap_or("write failed");
            let _ = writeln!(std::io::stderr(), "error: cannot write to {stream}: {why}");
            std::process::exit(EXIT_IO);
        }
        let place = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!(
            "internal error: {msg}{place} (this is a prunemem bug; set PRUNEMEM_BACKTRACE=1 for details)"
        );
    }));
}
