//! Plain progress lines (`--ui plain`): one line per stage, a progress bar
//! per unit of work with an ETA, and warnings, for logs and dumb terminals.

use std::io::Write;

use crate::events::fold::{RunFold, format_duration};
use crate::events::{Event, EventSink, Level, SinkError};
use crate::units::format_opt_bytes;

/// Writes progress as plain lines.
pub struct ProgressSink {
    out: Box<dyn Write + Send>,
    /// The run so far, for the ETA (no time series kept).
    fold: RunFold,
}

impl ProgressSink {
    pub fn new(out: Box<dyn Write + Send>) -> Self {
        Self {
            out,
            fold: RunFold::with_point_limit(2),
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
        self.fold.apply(event);
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
                index, total, name, ..
            } => {
                let done = index + 1;
                let width = 30usize;
                let filled = (done * width) / (*total).max(1);
                let bar = format!(
                    "{}{}",
                    "#".repeat(filled),
                    "-".repeat(width - filled.min(width))
                );
                let eta = (self.fold.eta_s())
                    .map(|e| format!("ETA {}", format_duration(e)))
                    .unwrap_or_default();
                self.line(format!("[{bar}] {done}/{total} {name} {eta}"))
            }
            // The error that ends a run is printed once, by the command.
            Event::Message {
                level: Level::Error,
                ..
            } => Ok(()),
            Event::Message { level, text, .. } => {
                let tag = if *level == Level::Warn {
                    "warning"
                } else {
                    "info"
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
    use std::sync::{Arc, Mutex};

    struct Shared(Arc<Mutex<Vec<u8>>>);
    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn progress_lines_carry_the_fold_eta() {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let mut sink = ProgressSink::new(Box::new(Shared(buf.clone())));
        let progress = |index, elapsed_s| Event::Progress {
            index,
            total: 4,
            name: format!("layer {index}"),
            pass: String::new(),
            elapsed_s,
        };
        sink.on_event(&progress(0, 10.0)).unwrap();
        sink.on_event(&progress(1, 20.0)).unwrap();
        let text = String::from_utf8(buf.lock().unwrap().clone()).unwrap();
        let last = text.lines().last().unwrap();
        assert!(
            last.starts_with("[###############---------------] 2/4 layer 1"),
            "{last}"
        );
        assert!(last.ends_with("ETA 20s"), "{last}");
    }
}
