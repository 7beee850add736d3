//! A finished run as reports see it, from either kind of log: prunemem's
//! `events.jsonl` (plan, stages, samples, summary), or a `memory_log.csv`
//! alone — the format of the Python memory-logging scripts (`Timestamp,
//! Checkpoint, GPU_Allocated_GB, GPU_Reserved_GB, GPU_Peak_GB, CPU_Used_GB,
//! CPU_Percent`), which prunemem also writes — so a PyTorch run and a
//! prunemem run are reported the same way. Sizes in that CSV are read as
//! GiB (the scripts divide by 1024³).

use std::ops::{Deref, DerefMut};
use std::path::Path;

use super::ReportError;
use crate::events::fold::RunFold;
pub use crate::events::fold::{Point, StageRow as Stage};
use crate::events::logdir::{self, CSV_HEADER, LogError, LogFile};
use crate::memory::MemorySnapshot;

/// How the run was measured, for comparisons.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Stage snapshots and a background sampler (prunemem).
    Continuous,
    /// Checkpoint snapshots only (the Python scripts' CSV).
    Checkpoints,
}

/// A loaded run: the events folded the way every reader folds them, plus
/// where it came from and what was missing. Reads as its [`RunFold`].
#[derive(Debug, Clone)]
pub struct RunData {
    pub name: String,
    pub fold: RunFold,
    pub scope: Scope,
    /// What was missing or skipped (a torn line, unknown columns...).
    pub notes: Vec<String>,
    /// A distributed run: every rank's figures (`events::ranks`).
    pub ranks: Option<Vec<crate::events::ranks::RankRun>>,
}

impl Deref for RunData {
    type Target = RunFold;
    fn deref(&self) -> &RunFold {
        &self.fold
    }
}

impl DerefMut for RunData {
    fn deref_mut(&mut self) -> &mut RunFold {
        &mut self.fold
    }
}

impl From<LogError> for ReportError {
    fn from(e: LogError) -> Self {
        ReportError::Invalid(e.to_string())
    }
}

/// Loads `dir` (or a CSV/JSONL file path).
pub fn load(path: &Path) -> Result<RunData, ReportError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    match logdir::locate(path)? {
        LogFile::Events(file) => from_jsonl(&file, name),
        LogFile::Csv(file) => from_csv(&file, name),
    }
}

fn from_jsonl(path: &Path, name: String) -> Result<RunData, ReportError> {
    let log = logdir::read_events(path)?;
    let mut notes = Vec::new();
    if log.torn_last_line {
        notes.push(format!(
            "the last line of {} is torn and was skipped",
            path.display()
        ));
    }
    let fold = RunFold::of(&log.events);
    if fold.summary.is_none() {
        notes.push("the run has no final event (still running, or killed): partial report".into());
    }
    if fold.stages.is_empty() {
        return Err(ReportError::Invalid(format!(
            "{}: no stage snapshots",
            path.display()
        )));
    }
    let ranks = crate::events::ranks::read(path).ok().flatten();
    Ok(RunData {
        name,
        fold,
        scope: Scope::Continuous,
        notes,
        ranks,
    })
}

const GIB: f64 = (1u64 << 30) as f64;

/// Where the Python scripts' columns are in a CSV header.
struct Columns {
    label: usize,
    allocated: Option<usize>,
    reserved: Option<usize>,
    gpu_peak: Option<usize>,
    cpu: Option<usize>,
    time: Option<usize>,
    /// Header names nobody reads.
    unknown: Vec<String>,
}

impl Columns {
    fn find(headers: &csv::StringRecord, path: &Path) -> Result<Self, ReportError> {
        let col = |names: &[&str]| {
            headers
                .iter()
                .position(|h| names.iter().any(|n| h.trim().eq_ignore_ascii_case(n)))
        };
        let label = col(&["Checkpoint", "stage", "label"]);
        let allocated = col(&["GPU_Allocated_GB"]);
        let cpu = col(&["CPU_Used_GB"]);
        let (Some(label), true) = (label, allocated.is_some() || cpu.is_some()) else {
            return Err(ReportError::Invalid(format!(
                "{}: unknown columns ({}); expected {}",
                path.display(),
                headers.iter().collect::<Vec<_>>().join(", "),
                CSV_HEADER
            )));
        };
        let mut c = Columns {
            label,
            allocated,
            reserved: col(&["GPU_Reserved_GB"]),
            gpu_peak: col(&["GPU_Peak_GB"]),
            cpu,
            time: col(&["Timestamp"]),
            unknown: Vec::new(),
        };
        let known = [
            Some(label),
            c.allocated,
            c.reserved,
            c.gpu_peak,
            c.cpu,
            c.time,
            col(&["CPU_Percent"]),
        ];
        c.unknown = (headers.iter().enumerate())
            .filter(|(i, _)| !known.contains(&Some(*i)))
            .map(|(_, h)| h.to_string())
            .collect();
        Ok(c)
    }

    /// A row as a stage snapshot at `t` seconds.
    fn snapshot(&self, rec: &csv::StringRecord, t: f64) -> MemorySnapshot {
        let gib = |c: Option<usize>| -> Option<u64> {
            let v: f64 = rec.get(c?)?.trim().parse().ok()?;
            (v.is_finite() && v >= 0.0).then_some((v * GIB) as u64)
        };
        MemorySnapshot {
            label: rec.get(self.label).unwrap_or("?").to_string(),
            elapsed_s: t,
            rss: gib(self.cpu),
            device_allocated: gib(self.allocated),
            device_reserved: gib(self.reserved),
            device_peak: gib(self.gpu_peak),
            ..Default::default()
        }
    }
}

fn from_csv(path: &Path, name: String) -> Result<RunData, ReportError> {
    let text = logdir::read_text(path)?;
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .from_reader(text.as_bytes());
    let headers = reader
        .headers()
        .map_err(|e| ReportError::Invalid(format!("{}: {e}", path.display())))?
        .clone();
    let cols = Columns::find(&headers, path)?;
    let mut run = RunData {
        name,
        fold: RunFold::new(),
        scope: Scope::Checkpoints,
        ranks: None,
        notes: vec![
            "read from memory_log.csv: checkpoint snapshots only, no samples between them".into(),
        ],
    };
    if !cols.unknown.is_empty() {
        run.notes.push(format!(
            "ignored unknown columns: {}",
            cols.unknown.join(", ")
        ));
    }
    let mut t0: Option<f64> = None;
    for (i, rec) in reader.records().enumerate() {
        let rec = rec
            .map_err(|e| ReportError::Invalid(format!("{}: row {}: {e}", path.display(), i + 2)))?;
        let t = (cols.time)
            .and_then(|c| rec.get(c))
            .and_then(parse_time)
            .map(|t| t - *t0.get_or_insert(t))
            .unwrap_or(i as f64);
        let snapshot = cols.snapshot(&rec, t);
        run.fold.apply(&crate::events::Event::Stage { snapshot });
        // Checkpoints only: a row's peak is its own GPU_Peak column.
        if let Some(row) = run.fold.stages.last_mut() {
            row.peak = row.snapshot.device_peak.or(row.point.rss);
        }
    }
    if run.stages.is_empty() {
        return Err(ReportError::Invalid(format!("{}: no rows", path.display())));
    }
    Ok(run)
}

/// Seconds from an ISO-8601 time (`2025-01-02T03:04:05.678`, optional `Z`)
/// or a plain number.
fn parse_time(s: &str) -> Option<f64> {
    let s = s.trim().trim_end_matches('Z');
    if let Ok(v) = s.parse::<f64>() {
        return Some(v);
    }
    let (date, time) = s.split_once(['T', ' '])?;
    let d: Vec<f64> = date
        .split('-')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    let t: Vec<f64> = time
        .split(':')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    if d.len() != 3 || t.len() != 3 {
        return None;
    }
    // Day resolution is enough for offsets within a run.
    Some(((d[0] * 372.0 + d[1] * 31.0 + d[2]) * 86400.0) + t[0] * 3600.0 + t[1] * 60.0 + t[2])
}
