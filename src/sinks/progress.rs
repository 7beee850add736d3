//! Plain progress lines (`--ui plain`): one line per stage, a progress bar
//! per unit of work with an ETA, and warnings, for logs and dumb terminals.

use std::io::Write;

use crate::events::{Event, EventSink, Level, SinkError};
use crate::units::format_opt_bytes;

/// Estimated seconds left after `done` of `total` units took `spent` seconds.
pub fn eta_s(done: usize, total: usize, spent: f64) -> Option<f64> {
    (done > 0 && total >= done).then(|| spent / done as f64 * (total - done) as f64)
}

/// `1h02m`, `3m05s`, `42s`.
pub fn format_duration(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, (s / 60) % 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

/// Writes progress as plain lines.
pub struct ProgressSink {
    out: Box<dyn Write + Send>,
    progress_started: Option<f64>,
}

impl ProgressSink {
    pub fn new(out: Box<dyn Write + Send>) -> Self {
        Self {
            out,
            progress_started: None,
        }
    }

    fn line(&mut self, text: String) -> Result<(), SinkError> {
        writeln!(self.out, "{text}").map_err(|source| SinkError::Io {
            path: "progress".into(),
            source,
        })
    }
}

impl EventSink for ProgressSink {
    fn on_event(&mut self, event: &Event) -> Result<(), SinkError> {
        match event {
            Event::Stage { snapshot: s } => self.line(format!(
                "[{:>7.1}s] {:<24} RSS {:>11}  allocated {:>11}  peak {:>11}",
                s.elapsed_s,
                s.label,
                format_opt_bytes(s.rss),
                format_opt_bytes(s.device_allocated),
                format_opt_bytes(s.device_peak),
            )),
            Event::Progress {
                index,
                total,
                name,
                elapsed_s,
            } => {
                let start = *self.progress_started.get_or_insert(*elapsed_s);
                let done = index + 1;
                let width = 30usize;
                let filled = (done * width) / (*total).max(1);
                let bar = format!(
                    "{}{}",
                    "#".repeat(filled),
                    "-".repeat(width - filled.min(width))
                );
                let eta = eta_s(done, *total, elapsed_s - start)
                    .map(|e| format!("ETA {}", format_duration(e)))
                    .unwrap_or_default();
                self.line(format!("[{bar}] {done}/{total} {name} {eta}"))
            }
            Event::Message { level, text, .. } => {
                let tag = match level {
                    Level::Info => "info",
                    Level::Warn => "warning",
                    Level::Error => "error",
                };
                self.line(format!("{tag}: {text}"))
            }
            _ => Ok(()),
        }
    }
    fn flush(&mut self) -> Result<(), SinkError> {
        self.out.flush().map_err(|source| SinkError::Io {
            path: "progress".into(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eta_and_durations() {
        assert_eq!(eta_s(0, 10, 5.0), None);
        assert_eq!(eta_s(5, 10, 50.0), Some(50.0));
        assert_eq!(format_duration(42.4), "42s");
        assert_eq!(format_duration(185.0), "3m05s");
        assert_eq!(format_duration(3720.0), "1h02m");
    }
}
