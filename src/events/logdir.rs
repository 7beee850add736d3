//! A run's log folder, as writers and readers both know it: the file names,
//! the CSV header, and reading the events back into a typed error.
//!
//! The file sinks write these names; reports, `watch`, `replay` and
//! `estimate --against` read them through [`read_events`] and [`locate`],
//! so every reader tolerates the same torn last line and fails with the
//! same one-line errors.

use std::path::{Path, PathBuf};

use thiserror::Error;

use super::{Event, ParsedLog, parse_log};

/// `memory_log.csv`: one row per stage, as the Python scripts write it.
pub const CSV_FILE: &str = "memory_log.csv";
/// `events.jsonl`: every event, lossless.
pub const JSONL_FILE: &str = "events.jsonl";
/// `summary.txt`: the stage table printed at the end.
pub const SUMMARY_FILE: &str = "summary.txt";

/// Header of `memory_log.csv`, exactly.
pub const CSV_HEADER: &str =
    "Timestamp,Checkpoint,GPU_Allocated_GB,GPU_Reserved_GB,GPU_Peak_GB,CPU_Used_GB,CPU_Percent";

/// Why a log could not be read.
#[derive(Debug, Error)]
pub enum LogError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}: no such run folder")]
    NoFolder(String),
    #[error("{0}: no {JSONL_FILE} or {CSV_FILE} in this folder")]
    NoLog(String),
    #[error("{0}: empty log")]
    Empty(String),
    #[error("{path}: {why}")]
    BadLine { path: String, why: String },
    #[error(transparent)]
    Input(#[from] crate::input::InputError),
}

/// An `events.jsonl` another process is writing, read as it grows: each
/// poll returns the whole lines appended since the last (a line still being
/// written waits for its end). `watch --log` follows a run with it, and a
/// distributed run's rank 0 the other ranks' logs.
#[derive(Debug)]
pub struct Tail {
    path: PathBuf,
    offset: u64,
    /// Bytes read past the last complete line (kept as bytes: a read may
    /// end inside a character).
    pending: Vec<u8>,
}

impl Tail {
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            offset: 0,
            pending: Vec::new(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The events of the lines completed since the last poll; `Ok(None)`
    /// while the file does not exist yet. A line that is not an event is
    /// an error naming the file.
    pub fn poll(&mut self) -> Result<Option<Vec<Event>>, LogError> {
        use std::io::{Read, Seek, SeekFrom};
        let io = |source| LogError::Io {
            path: self.path.display().to_string(),
            source,
        };
        // A FIFO or a device here would block or never end: refused.
        match crate::input::check(&self.path) {
            Err(crate::input::InputError::Missing { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
            Ok(_) => {}
        }
        let mut file = match std::fs::File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(e)),
        };
        file.seek(SeekFrom::Start(self.offset)).map_err(io)?;
        self.offset += file.read_to_end(&mut self.pending).map_err(io)? as u64;
        let Some(end) = self.pending.iter().rposition(|b| *b == b'\n') else {
            return Ok(Some(Vec::new()));
        };
        let lines: Vec<u8> = self.pending.drain(..=end).collect();
        let bad = |why: String| LogError::BadLine {
            path: self.path.display().to_string(),
            why,
        };
        let lines = String::from_utf8(lines).map_err(|e| bad(e.to_string()))?;
        let events = lines
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).map_err(|e| bad(e.to_string())))
            .collect::<Result<Vec<Event>, _>>()?;
        Ok(Some(events))
    }
}

/// Which log a path names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogFile {
    /// prunemem's `events.jsonl`.
    Events(PathBuf),
    /// A `memory_log.csv` alone (a Python script's, or prunemem's).
    Csv(PathBuf),
}

/// The log inside `path`: a folder (its `events.jsonl`, else its
/// `memory_log.csv`) or a file (`.csv`, else read as events).
pub fn locate(path: &Path) -> Result<LogFile, LogError> {
    if path.is_file() {
        return Ok(match path.extension().and_then(|e| e.to_str()) {
            Some("csv") => LogFile::Csv(path.to_path_buf()),
            _ => LogFile::Events(path.to_path_buf()),
        });
    }
    if !path.is_dir() {
        return Err(LogError::NoFolder(path.display().to_string()));
    }
    if path.join(JSONL_FILE).is_file() {
        Ok(LogFile::Events(path.join(JSONL_FILE)))
    } else if path.join(CSV_FILE).is_file() {
        Ok(LogFile::Csv(path.join(CSV_FILE)))
    } else {
        Err(LogError::NoLog(path.display().to_string()))
    }
}

/// The events file of `path`: `path` itself when it is a file, else
/// `path/events.jsonl`.
pub fn events_file(path: &Path) -> PathBuf {
    if path.is_file() {
        path.to_path_buf()
    } else {
        path.join(JSONL_FILE)
    }
}

/// Reads a file into text, naming it in the error.
pub fn read_text(path: &Path) -> Result<String, LogError> {
    let bytes = crate::input::read(path, crate::input::LOG_LIMIT, "a log")?;
    String::from_utf8(bytes).map_err(|e| LogError::Io {
        path: crate::input::shown(path),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })
}

/// Every event of the log at `path` (a folder or an `events.jsonl`): a torn
/// last line is skipped and reported in [`ParsedLog::torn_last_line`]; an
/// empty file or a bad line elsewhere is an error.
pub fn read_events(path: &Path) -> Result<ParsedLog, LogError> {
    let file = events_file(path);
    let text = read_text(&file)?;
    let shown = file.display().to_string();
    if text.trim().is_empty() {
        return Err(LogError::Empty(shown));
    }
    parse_log(&text).map_err(|why| LogError::BadLine { path: shown, why })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locates_and_reads_with_typed_errors() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            locate(&dir.path().join("nope")),
            Err(LogError::NoFolder(_))
        ));
        assert!(matches!(locate(dir.path()), Err(LogError::NoLog(_))));
        std::fs::write(dir.path().join(CSV_FILE), CSV_HEADER).unwrap();
        assert_eq!(
            locate(dir.path()).unwrap(),
            LogFile::Csv(dir.path().join(CSV_FILE))
        );
        let events = dir.path().join(JSONL_FILE);
        std::fs::write(&events, "\n").unwrap();
        assert_eq!(locate(dir.path()).unwrap(), LogFile::Events(events.clone()));
        assert!(matches!(read_events(dir.path()), Err(LogError::Empty(_))));
        std::fs::write(&events, "{\"event\":\"nope\"}\n{}\n").unwrap();
        let err = read_events(dir.path()).unwrap_err().to_string();
        assert!(err.contains("line 1"), "{err}");
        let line = r#"{"event":"message","level":"info","text":"hi","elapsed_s":0.0}"#;
        std::fs::write(&events, format!("{line}\n{{\"event\":\"mess")).unwrap();
        let log = read_events(&events).unwrap();
        assert_eq!(log.events.len(), 1);
        assert!(log.torn_last_line);
    }
}
