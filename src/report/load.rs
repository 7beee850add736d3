//! A finished run as reports see it, from either kind of log: prunemem's
//! `events.jsonl` (plan, stages, samples, summary), or a `memory_log.csv`
//! alone — the format of the Python memory-logging scripts (`Timestamp,
//! Checkpoint, GPU_Allocated_GB, GPU_Reserved_GB, GPU_Peak_GB, CPU_Used_GB,
//! CPU_Percent`), which prunemem also writes — so a PyTorch run and a
//! prunemem run are reported the same way. Sizes in that CSV are read as
//! GiB (the scripts divide by 1024³).

use std::collections::BTreeMap;
use std::path::Path;

use super::ReportError;
use crate::events::{Event, RunPlan, RunSummary};
use crate::sinks::{CSV_FILE, JSONL_FILE};

/// One reading in time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Point {
    pub t: f64,
    pub rss: Option<u64>,
    pub allocated: Option<u64>,
    pub reserved: Option<u64>,
    pub gpu_used: Option<u64>,
}

/// A named stage and its reading.
#[derive(Debug, Clone, PartialEq)]
pub struct Stage {
    pub label: String,
    pub point: Point,
    /// Highest RSS (or allocated, for a CSV) since the previous stage.
    pub peak: Option<u64>,
}

/// How the run was measured, for comparisons.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Stage snapshots and a background sampler (prunemem).
    Continuous,
    /// Checkpoint snapshots only (the Python scripts' CSV).
    Checkpoints,
}

#[derive(Debug, Clone)]
pub struct RunData {
    pub name: String,
    pub plan: Option<RunPlan>,
    pub summary: Option<RunSummary>,
    pub points: Vec<Point>,
    pub stages: Vec<Stage>,
    /// The last component accounting the engine reported, by stage.
    pub components: Vec<(String, BTreeMap<String, u64>)>,
    pub scope: Scope,
    /// What was missing or skipped (a torn line, unknown columns...).
    pub notes: Vec<String>,
}

impl RunData {
    /// The highest RSS of the run (the kernel's mark when known).
    pub fn peak_rss(&self) -> Option<u64> {
        let sampled = self.points.iter().filter_map(|p| p.rss).max();
        [self.summary.as_ref().and_then(|s| s.rss_peak), sampled]
            .into_iter()
            .flatten()
            .max()
    }

    /// The highest allocated bytes of the run.
    pub fn peak_allocated(&self) -> Option<u64> {
        let sampled = self.points.iter().filter_map(|p| p.allocated).max();
        [self.summary.as_ref().and_then(|s| s.heap_peak), sampled]
            .into_iter()
            .flatten()
            .max()
    }

    /// The stage window (index of the stage that closes it) with the highest peak.
    pub fn peak_stage(&self) -> Option<usize> {
        self.stages
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.peak.map(|p| (i, p)))
            .max_by_key(|(_, p)| *p)
            .map(|(i, _)| i)
    }
}

/// Loads `dir` (or a CSV/JSONL file path).
pub fn load(path: &Path) -> Result<RunData, ReportError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    if path.is_file() {
        return match path.extension().and_then(|e| e.to_str()) {
            Some("csv") => from_csv(path, name),
            _ => from_jsonl(path, name),
        };
    }
    if !path.is_dir() {
        return Err(ReportError::Invalid(format!(
            "{}: no such run folder",
            path.display()
        )));
    }
    if path.join(JSONL_FILE).is_file() {
        from_jsonl(&path.join(JSONL_FILE), name)
    } else if path.join(CSV_FILE).is_file() {
        from_csv(&path.join(CSV_FILE), name)
    } else {
        Err(ReportError::Invalid(format!(
            "{}: no {JSONL_FILE} or {CSV_FILE} in this folder",
            path.display()
        )))
    }
}

fn read(path: &Path) -> Result<String, ReportError> {
    std::fs::read_to_string(path)
        .map_err(|e| ReportError::Invalid(format!("{}: {e}", path.display())))
}

fn point(s: &crate::memory::MemorySnapshot) -> Point {
    Point {
        t: s.elapsed_s,
        rss: s.rss,
        allocated: s.device_allocated.or(s.heap_allocated),
        reserved: s.device_reserved,
        gpu_used: s.gpu_used,
    }
}

fn from_jsonl(path: &Path, name: String) -> Result<RunData, ReportError> {
    let text = read(path)?;
    if text.trim().is_empty() {
        return Err(ReportError::Invalid(format!(
            "{}: empty log",
            path.display()
        )));
    }
    let log = crate::events::parse_log(&text)
        .map_err(|e| ReportError::Invalid(format!("{}: {e}", path.display())))?;
    let mut run = RunData {
        name,
        plan: None,
        summary: None,
        points: Vec::new(),
        stages: Vec::new(),
        components: Vec::new(),
        scope: Scope::Continuous,
        notes: Vec::new(),
    };
    if log.torn_last_line {
        run.notes.push(format!(
            "the last line of {} is torn and was skipped",
            path.display()
        ));
    }
    let mut window_peak: Option<u64> = None;
    let mut last_kernel_peak: Option<u64> = None;
    for event in log.events {
        match event {
            Event::RunStarted { plan } => run.plan = Some(plan),
            Event::Sample { snapshot } | Event::Stage { snapshot } => {
                let is_stage = snapshot.label != "sample";
                let p = point(&snapshot);
                // The kernel's high-water mark counts when it rose in this window.
                let rose = snapshot
                    .rss_peak
                    .filter(|k| last_kernel_peak.is_some_and(|l| *k > l));
                last_kernel_peak = last_kernel_peak.max(snapshot.rss_peak);
                window_peak = [window_peak, p.rss, rose].into_iter().flatten().max();
                run.points.push(p);
                if is_stage {
                    run.stages.push(Stage {
                        label: snapshot.label,
                        point: p,
                        peak: window_peak,
                    });
                    window_peak = p.rss;
                }
            }
            Event::Components { stage, bytes, .. } => run.components.push((stage, bytes)),
            Event::RunFinished { summary } => run.summary = Some(summary),
            _ => {}
        }
    }
    if run.summary.is_none() {
        run.notes
            .push("the run has no final event (still running, or killed): partial report".into());
    }
    if run.stages.is_empty() {
        return Err(ReportError::Invalid(format!(
            "{}: no stage snapshots",
            path.display()
        )));
    }
    Ok(run)
}

const GIB: f64 = (1u64 << 30) as f64;

fn from_csv(path: &Path, name: String) -> Result<RunData, ReportError> {
    let text = read(path)?;
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .from_reader(text.as_bytes());
    let headers = reader
        .headers()
        .map_err(|e| ReportError::Invalid(format!("{}: {e}", path.display())))?
        .clone();
    let col = |names: &[&str]| {
        headers
            .iter()
            .position(|h| names.iter().any(|n| h.trim().eq_ignore_ascii_case(n)))
    };
    let label = col(&["Checkpoint", "stage", "label"]);
    let allocated = col(&["GPU_Allocated_GB"]);
    let reserved = col(&["GPU_Reserved_GB"]);
    let gpu_peak = col(&["GPU_Peak_GB"]);
    let cpu = col(&["CPU_Used_GB"]);
    let time = col(&["Timestamp"]);
    let (Some(label), true) = (label, allocated.is_some() || cpu.is_some()) else {
        return Err(ReportError::Invalid(format!(
            "{}: unknown columns ({}); expected {}",
            path.display(),
            headers.iter().collect::<Vec<_>>().join(", "),
            crate::sinks::CSV_HEADER
        )));
    };
    let known = [
        Some(label),
        allocated,
        reserved,
        gpu_peak,
        cpu,
        time,
        col(&["CPU_Percent"]),
    ];
    let unknown: Vec<&str> = headers
        .iter()
        .enumerate()
        .filter(|(i, _)| !known.contains(&Some(*i)))
        .map(|(_, h)| h)
        .collect();
    let mut run = RunData {
        name,
        plan: None,
        summary: None,
        points: Vec::new(),
        stages: Vec::new(),
        components: Vec::new(),
        scope: Scope::Checkpoints,
        notes: vec![
            "read from memory_log.csv: checkpoint snapshots only, no samples between them".into(),
        ],
    };
    if !unknown.is_empty() {
        run.notes
            .push(format!("ignored unknown columns: {}", unknown.join(", ")));
    }
    let gib = |rec: &csv::StringRecord, c: Option<usize>| -> Option<u64> {
        let v: f64 = rec.get(c?)?.trim().parse().ok()?;
        (v.is_finite() && v >= 0.0).then_some((v * GIB) as u64)
    };
    let mut t0: Option<f64> = None;
    for (i, rec) in reader.records().enumerate() {
        let rec = rec
            .map_err(|e| ReportError::Invalid(format!("{}: row {}: {e}", path.display(), i + 2)))?;
        let t = time
            .and_then(|c| rec.get(c))
            .and_then(parse_time)
            .map(|t| t - *t0.get_or_insert(t))
            .unwrap_or(i as f64);
        let p = Point {
            t,
            rss: gib(&rec, cpu),
            allocated: gib(&rec, allocated),
            reserved: gib(&rec, reserved),
            gpu_used: None,
        };
        let peak = gib(&rec, gpu_peak).or(p.rss);
        run.points.push(p);
        run.stages.push(Stage {
            label: rec.get(label).unwrap_or("?").to_string(),
            point: p,
            peak,
        });
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
