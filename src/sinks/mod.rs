//! Where events go: log files, the console summary, plain progress lines.
//!
//! Each sink implements [`crate::events::EventSink`]; the live terminal UI
//! (feature `tui`) is one more sink, in [`crate::tui`].

pub mod files;
pub mod progress;
pub mod summary;
pub mod worker;

use std::path::Path;

use crate::events::{Emitter, SinkError};
pub use files::{CSV_FILE, CSV_HEADER, CsvSink, JSONL_FILE, JsonlSink, SUMMARY_FILE};
pub use summary::{StageTable, SummarySink};

/// Creates `dir` and attaches its three files to `emitter`:
/// `memory_log.csv`, `events.jsonl` and `summary.txt`.
pub fn attach_log_dir(emitter: &Emitter, dir: &Path) -> Result<(), SinkError> {
    std::fs::create_dir_all(dir).map_err(|source| SinkError::Io {
        path: dir.display().to_string(),
        source,
    })?;
    emitter.add(Box::new(CsvSink::create(&dir.join(CSV_FILE))?));
    emitter.add(Box::new(JsonlSink::create(&dir.join(JSONL_FILE))?));
    let summary_path = dir.join(SUMMARY_FILE);
    let file = std::fs::File::create(&summary_path).map_err(|source| SinkError::Io {
        path: summary_path.display().to_string(),
        source,
    })?;
    emitter.add(Box::new(SummarySink::new(Box::new(file))));
    Ok(())
}
