//! Pieces every model command shares: how a run reports (`--log-memory`,
//! `--ui`), reading and tokenising text, and resolving `--seqlen`.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};

use super::CliResult;
use crate::data::{self, Corpus, LineRange};
use crate::events::{EventSink, HostInfo, Level, RunPlan};
use crate::model::tokenizer::Tokenizer;
use crate::profiler::{Profiler, ProfilerConfig};
use crate::run::RunOptions;
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

#[derive(Args, Debug, Clone)]
pub struct ReportArgs {
    /// Write memory_log.csv, events.jsonl and summary.txt to DIR
    #[arg(long = "log-memory", alias = "log_memory", value_name = "DIR")]
    pub log_memory: Option<PathBuf>,
    /// Progress display: tui, plain or none (default: tui on a terminal, else plain)
    #[arg(long, value_enum)]
    pub ui: Option<UiMode>,
    /// Background memory sampling rate in Hz (0 turns it off)
    #[arg(long, default_value_t = 10.0, value_name = "HZ")]
    pub sample_hz: f64,
}

impl ReportArgs {
    pub fn ui_mode(&self) -> UiMode {
        resolve_ui(self.ui)
    }

    /// Run options for these flags, with `log_dir` overriding --log-memory.
    pub fn run_options(&self, log_dir: Option<PathBuf>) -> CliResult<RunOptions> {
        if !(self.sample_hz >= 0.0 && self.sample_hz <= 1000.0) {
            return Err(format!(
                "--sample-hz must be between 0 and 1000, got {}",
                self.sample_hz
            )
            .into());
        }
        let mut extra: Vec<Box<dyn EventSink>> = Vec::new();
        match self.ui_mode() {
            UiMode::Plain => extra.push(Box::new(ProgressSink::new(Box::new(std::io::stderr())))),
            UiMode::None => {}
            #[cfg(feature = "tui")]
            UiMode::Tui => extra.push(Box::new(crate::tui::TuiSink::start(
                crate::tui::Mode::Owner,
                Box::new(crate::run::request_interrupt),
                true,
            )?)),
            #[cfg(not(feature = "tui"))]
            UiMode::Tui => extra.push(Box::new(ProgressSink::new(Box::new(std::io::stderr())))),
        }
        Ok(RunOptions {
            log_dir: log_dir.or_else(|| self.log_memory.clone()),
            console_summary: self.ui_mode() != UiMode::None,
            extra_sinks: extra,
            profiler: ProfilerConfig {
                sampler_hz: (self.sample_hz > 0.0).then_some(self.sample_hz),
                ..Default::default()
            },
            handle_signals: true,
        })
    }
}

/// A plan with the fields every command fills.
pub fn base_plan(command: &str, argv: Vec<String>) -> RunPlan {
    RunPlan {
        command: command.into(),
        argv,
        host: HostInfo::current(),
        ..Default::default()
    }
}

/// The model folder's tokenizer.
pub fn load_tokenizer(model_dir: &Path) -> CliResult<Tokenizer> {
    Ok(Tokenizer::from_file(&model_dir.join("tokenizer.json"))?)
}

/// Reads `path` (restricted to `range`) and tokenises it as one text.
pub fn tokenize_text(tok: &Tokenizer, path: &Path, range: LineRange) -> CliResult<Vec<u32>> {
    Ok(tokenize_counting(tok, path, range)?.0)
}

/// [`tokenize_text`], also returning the bytes of text tokenised.
pub fn tokenize_counting(
    tok: &Tokenizer,
    path: &Path,
    range: LineRange,
) -> CliResult<(Vec<u32>, u64)> {
    let text = match data::read_corpus(path, range)? {
        Corpus::Text(text) => text,
        Corpus::Documents(docs) => docs.join("\n\n"),
    };
    let ids = tok.encode(&text)?;
    let bytes = text.len() as u64;
    drop(text);
    // Tokenisation leaves many small freed chunks; hand their pages back.
    crate::memory::alloc::trim();
    Ok((ids, bytes))
}

/// `--seqlen` resolved against the model's max positions, and the warning
/// to emit (once the run has started) when it was capped.
pub fn resolve_seqlen(
    requested: Option<usize>,
    max_positions: usize,
) -> CliResult<(usize, Option<String>)> {
    Ok(data::windows::resolve_seqlen(requested, max_positions)?)
}

/// Emits a capped-seqlen warning, if any.
pub fn warn_seqlen(warning: Option<String>, profiler: &Profiler) {
    if let Some(w) = warning {
        profiler.message(Level::Warn, w);
    }
}
