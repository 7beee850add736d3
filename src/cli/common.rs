//! Pieces every run command shares: the flags of how a run reports
//! (`--log-memory`, `--ui`, `--sample-hz`), the one place the sinks for a
//! UI mode are built ([`for_ui`]), and turning a job's errors into lines
//! that name this CLI's flags.

use std::io::IsTerminal;
use std::path::PathBuf;

use crate::exec::DeviceSpec;
use crate::model::ComputeDtype;
use clap::{Args, ValueEnum};

use super::{CliError, CliResult};
use crate::events::EventSink;
use crate::jobs::{Field, JobError, RunOptions};
use crate::profiler::ProfilerConfig;
use crate::sinks::SummarySink;
use crate::sinks::progress::ProgressSink;

/// `--ui` as given, or its default: the live UI when stdout is a terminal
/// (and the `tui` feature is built), plain lines otherwise.
pub fn resolve_ui(ui: Option<UiMode>) -> UiMode {
    ui.unwrap_or(
        if std::io::stdout().is_terminal() && cfg!(feature = "tui") {
            UiMode::Tui
        } else {
            UiMode::Plain
        },
    )
}

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum UiMode {
    /// Live terminal UI (default when stdout is a terminal)
    Tui,
    /// Plain progress lines on stderr
    Plain,
    /// Nothing but the final result
    None,
}

impl UiMode {
    pub fn name(self) -> &'static str {
        match self {
            UiMode::Tui => "tui",
            UiMode::Plain => "plain",
            UiMode::None => "none",
        }
    }
}

/// Who the UI shows a run for, which decides what quitting does and
/// whether the summary table is printed.
pub enum Role {
    /// A run of this process: the summary table goes to stdout (after the
    /// live UI closes), and quitting the UI interrupts the run.
    Run,
    /// A command this process watches: quitting calls the abort function.
    Watch(#[cfg_attr(not(feature = "tui"), allow(dead_code))] Box<dyn Fn() + Send>),
    /// A log followed or replayed: quitting only closes the view.
    View,
}

/// The sinks of one UI mode, and the live UI's handle when there is one.
pub struct Ui {
    pub sinks: Vec<Box<dyn EventSink>>,
    #[cfg(feature = "tui")]
    pub tui: Option<crate::tui::TuiHandle>,
}

/// Builds the sinks for `mode`: the one place they are chosen. Without the
/// `tui` feature the live UI falls back to plain lines, saying so.
pub fn for_ui(mode: UiMode, role: Role) -> CliResult<Ui> {
    let mut ui = Ui {
        sinks: Vec::new(),
        #[cfg(feature = "tui")]
        tui: None,
    };
    let summary = |ui: &mut Ui| {
        ui.sinks
            .push(Box::new(SummarySink::new(Box::new(std::io::stdout()))))
    };
    let own_run = matches!(role, Role::Run);
    match mode {
        UiMode::None => {}
        UiMode::Plain => {
            ui.sinks
                .push(Box::new(ProgressSink::new(Box::new(std::io::stderr()))));
            summary(&mut ui);
        }
        #[cfg(feature = "tui")]
        UiMode::Tui => {
            use crate::tui::{Mode, TuiSink};
            let view = match role {
                Role::Run => {
                    TuiSink::start(Mode::Owner, Box::new(crate::jobs::request_interrupt), true)?
                }
                Role::Watch(abort) => TuiSink::start(Mode::Owner, abort, false)?,
                Role::View => TuiSink::start(Mode::Viewer, Box::new(|| {}), false)?,
            };
            ui.tui = Some(view.handle());
            ui.sinks.push(Box::new(view));
            if own_run {
                summary(&mut ui);
            }
        }
        #[cfg(not(feature = "tui"))]
        UiMode::Tui => {
            let _ = own_run;
            eprintln!(
                "note: this prunemem was built without the tui feature; showing plain progress"
            );
            return for_ui(UiMode::Plain, role);
        }
    }
    Ok(ui)
}

/// How a run reports.
#[derive(Args, Debug, Clone)]
pub struct RunFlags {
    /// Write memory_log.csv, events.jsonl and summary.txt to DIR
    #[arg(long = "log-memory", alias = "log_memory", value_name = "DIR")]
    pub log_memory: Option<PathBuf>,
    /// Progress display: tui, plain or none (default: tui on a terminal, else plain)
    #[arg(long, value_enum)]
    pub ui: Option<UiMode>,
    /// Background memory sampling rate in Hz (0 turns it off)
    #[arg(long, default_value_t = 10.0, value_name = "HZ")]
    pub sample_hz: f64,
    /// Memory the run should fit in (24GiB, 80GB): the live view forecasts
    /// whether it will, and at which phase it would not (default: the GPU's
    /// total, else the machine's memory); recorded in the log
    #[arg(long, value_name = "SIZE", value_parser = parse_budget)]
    pub budget: Option<u64>,
    #[command(flatten)]
    pub device: DeviceFlags,
}

/// Where a run computes.
#[derive(Args, Debug, Clone, Default)]
pub struct DeviceFlags {
    /// Compute device: cpu, wgpu (the best wgpu adapter: Vulkan, Metal, DX12), wgpu:N (N-th discrete GPU), wgpu:cpu (a software adapter such as lavapipe), cuda or cuda:N
    #[arg(long, default_value = "cpu", value_parser = parse_device)]
    pub device: DeviceSpec,
    /// Device memory the run may hold (8GiB, 80GB); past it the run ends with status oom and exit code 3
    #[arg(long, value_name = "SIZE", value_parser = parse_budget)]
    pub device_memory: Option<u64>,
}

impl DeviceFlags {
    /// `--dtype`, or the device's default: f16 on a GPU device (as the
    /// reference scripts), f32 on the CPU.
    pub fn dtype(&self, asked: Option<ComputeDtype>) -> ComputeDtype {
        asked.unwrap_or(match self.device.is_device() {
            true => ComputeDtype::F16,
            false => ComputeDtype::F32,
        })
    }
}

/// `--device`'s value.
pub fn parse_device(text: &str) -> Result<DeviceSpec, String> {
    text.parse()
}

/// `--budget`'s value: a size with its unit.
pub fn parse_budget(text: &str) -> Result<u64, String> {
    crate::units::parse_size(text).map_err(|e| e.to_string())
}

impl RunFlags {
    pub fn ui_mode(&self) -> UiMode {
        resolve_ui(self.ui)
    }

    /// Run options for these flags: the UI's sinks, the log folder, the
    /// sampler.
    pub fn run_options(&self) -> CliResult<RunOptions> {
        if !(self.sample_hz >= 0.0 && self.sample_hz <= 1000.0) {
            return Err(format!(
                "--sample-hz must be between 0 and 1000, got {}",
                self.sample_hz
            )
            .into());
        }
        Ok(RunOptions {
            log_dir: self.log_memory.clone(),
            sinks: for_ui(self.ui_mode(), Role::Run)?.sinks,
            profiler: ProfilerConfig {
                sampler_hz: (self.sample_hz > 0.0).then_some(self.sample_hz),
                ..Default::default()
            },
            handle_signals: true,
            budget: self.budget,
            device: self.device.device,
            device_memory: self.device.device_memory,
            lock_logs: true,
        })
    }
}

/// A job setting's flag (`--sparsity-type`).
pub fn flag(f: Field) -> String {
    format!("--{}", f.key().replace('_', "-"))
}

/// A job's error for this CLI: configuration errors name its flags.
pub fn job_error(e: JobError) -> CliError {
    if let JobError::OutOfMemory { fit, .. } = &e {
        return Box::new(super::OutOfMemory(format!("{e}; {}", fit_advice(fit))));
    }
    if e.is_out_of_memory() {
        return Box::new(super::OutOfMemory(format!(
            "{e}; lower --batch-size, --nsamples or --seqlen, or raise --device-memory (prunemem estimate --device ... says what fits)"
        )));
    }
    match e {
        JobError::Config(c) => c.render(flag).into(),
        JobError::WontFit(w) => format!("{w}; --force runs it anyway").into(),
        other => Box::new(other),
    }
}

/// The estimator's largest sizes that fit a device's cap, as flags (each
/// with the others as the run had them).
fn fit_advice(l: &crate::estimate::fit::FitLimits) -> String {
    let flags = [
        ("--nsamples", l.max_nsamples),
        ("--seqlen", l.max_seqlen),
        ("--batch-size", l.max_batch_size),
        ("--eval-windows", l.max_eval_windows),
    ];
    let fits: Vec<String> = flags
        .iter()
        .filter_map(|(f, v)| v.map(|v| format!("{f} {v}")))
        .collect();
    let cap = crate::units::format_bytes(l.budget);
    if fits.is_empty() {
        return format!(
            "the estimator finds no size of this run that fits {cap}: raise --device-memory"
        );
    }
    let rest = match fits.len() < flags.len() {
        true => "; lowering any other size alone does not fit",
        false => "",
    };
    format!(
        "the estimator's largest that fit {cap}, each with the others as given: {}{rest}",
        fits.join(", ")
    )
}

/// A run whose logs could not be written did not succeed, whatever it
/// computed: its results are printed, then this is its one-line error.
pub fn logs_written(errors: &[String]) -> CliResult<i32> {
    match errors {
        [] => Ok(0),
        [one] => Err(format!("the run finished but its logs are incomplete: {one}").into()),
        [first, rest @ ..] => Err(format!(
            "the run finished but its logs are incomplete: {first} (and {} more)",
            rest.len()
        )
        .into()),
    }
}

/// `--model` and `--revision`, the same on every command that loads a model.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelFlags {
    /// Model folder (config.json + safetensors + tokenizer.json) or Hugging Face Hub id
    #[arg(long, value_name = "DIR|ORG/NAME")]
    pub model: String,
    /// Hub revision (branch, tag or commit) when --model is a Hub id
    #[arg(long, default_value = "main")]
    pub revision: String,
}

/// `--text` and `--lines`: a text and which of its lines to use.
#[derive(clap::Args, Debug, Clone)]
pub struct TextFlags {
    /// The text (plain text, or .jsonl with a "text" field)
    #[arg(long, value_name = "FILE")]
    pub text: std::path::PathBuf,
    /// Lines of --text to use: all, first-half, second-half or START:END
    #[arg(long, default_value = "all", value_name = "RANGE")]
    pub lines: crate::data::LineRange,
}

impl TextFlags {
    /// As the jobs take it.
    pub fn source(&self) -> crate::jobs::TextSource {
        crate::jobs::TextSource {
            path: self.text.clone(),
            lines: self.lines,
        }
    }
}
