//! The two log files of a run: `memory_log.csv` (one row per stage, in the
//! format the Wanda memory-logging scripts write and pandas users parse) and
//! `events.jsonl` (every event, lossless, which the live UI and reports
//! read).

use std::path::Path;

use crate::events::{Event, EventSink, SinkError};
use crate::memory::MemorySnapshot;
use crate::sinks::worker::LineFile;
use crate::units::to_gib;

pub use crate::events::logdir::{CSV_FILE, CSV_HEADER, JSONL_FILE, SUMMARY_FILE};

/// Writes stage snapshots to `memory_log.csv`.
///
/// Columns: ISO-8601 timestamp; checkpoint name; the backend allocator's
/// allocated / reserved / peak bytes (on the CPU backend: heap allocated,
/// malloc-held bytes, heap peak); process RSS; process CPU share in percent.
/// Sizes are GiB (bytes / 1024^3) with three decimals; an unavailable reading
/// is an empty cell, which pandas reads as NaN.
pub struct CsvSink {
    file: LineFile,
}

impl CsvSink {
    pub fn create(path: &Path) -> Result<Self, SinkError> {
        Ok(Self {
            file: LineFile::create(path, Some(CSV_HEADER), "csv")?,
        })
    }
}

/// One CSV row for a stage snapshot (without the newline).
pub fn csv_row(s: &MemorySnapshot) -> String {
    let gib = |v: Option<u64>| v.map(|b| format!("{:.3}", to_gib(b))).unwrap_or_default();
    let mut row = Vec::new();
    {
        let mut w = csv::WriterBuilder::new()
            .has_headers(false)
            .terminator(csv::Terminator::Any(b'\n'))
            .from_writer(&mut row);
        let fields = [
            s.timestamp_iso(),
            s.label.clone(),
            gib(s.device_allocated),
            gib(s.device_reserved),
            gib(s.device_peak),
            gib(s.rss),
            s.cpu_percent.map(|p| format!("{p:.1}")).unwrap_or_default(),
        ];
        // Writing into a Vec cannot fail.
        let _ = w.write_record(&fields);
        let _ = w.flush();
    }
    let mut line = String::from_utf8_lossy(&row).into_owned();
    while line.ends_with('\n') {
        line.pop();
    }
    line
}

impl EventSink for CsvSink {
    fn on_event(&mut self, event: &Event) -> Result<(), SinkError> {
        match event {
            // Durable before the engine moves on (see `worker`).
            Event::Stage { snapshot } => {
                self.file.write_line(csv_row(snapshot))?;
                self.file.flush()
            }
            Event::RunFinished { .. } => self.file.flush(),
            _ => Ok(()),
        }
    }
    fn flush(&mut self) -> Result<(), SinkError> {
        self.file.flush()
    }
}

/// Writes every event to `events.jsonl`, one JSON object per line.
pub struct JsonlSink {
    file: LineFile,
}

impl JsonlSink {
    pub fn create(path: &Path) -> Result<Self, SinkError> {
        Ok(Self {
            file: LineFile::create(path, None, "jsonl")?,
        })
    }
}

impl EventSink for JsonlSink {
    fn on_event(&mut self, event: &Event) -> Result<(), SinkError> {
        // Serialising our own plain data types cannot fail.
        let line = serde_json::to_string(event).unwrap_or_default();
        self.file.write_line(line)?;
        // Everything but samples is durable before the engine moves on;
        // samples reach the file within `worker::BATCH`.
        if !event.is_droppable() {
            self.file.flush()?;
        }
        Ok(())
    }
    fn flush(&mut self) -> Result<(), SinkError> {
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_row_has_gib_and_empty_unknowns() {
        let s = MemorySnapshot {
            label: "02_model_loaded".into(),
            unix_ms: 1_700_000_000_000,
            device_allocated: Some(3 << 29), // 1.5 GiB
            device_reserved: None,
            device_peak: Some(2 << 30),
            rss: Some(1 << 30),
            cpu_percent: Some(99.94),
            ..Default::default()
        };
        assert_eq!(
            csv_row(&s),
            "2023-11-14T22:13:20.000Z,02_model_loaded,1.500,,2.000,1.000,99.9"
        );
    }

    #[test]
    fn csv_quotes_awkward_labels() {
        let s = MemorySnapshot {
            label: "a,\"b\"".into(),
            ..Default::default()
        };
        assert!(csv_row(&s).contains("\"a,\"\"b\"\"\""));
    }
}
