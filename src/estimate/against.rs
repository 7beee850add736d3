//! Estimates checked against measured runs: `prunemem estimate --against
//! LOGDIR` reads a finished run's `events.jsonl`, rebuilds its workload from
//! the plan, estimates it, and sets each phase's prediction beside the peak
//! the profiler measured in that phase.
//!
//! A phase spans two stage snapshots (`03_before_pruning` →
//! `04_after_pruning`). Its measured peak is the highest of: the RSS of every
//! sample and snapshot inside it, and the run's peak RSS at its end when that
//! rose during the phase (so the kernel's high-water mark counts even between
//! samples).

use std::path::Path;

use serde::Serialize;

use super::{Arch, Device, Engine, Estimate, EstimateError, Task, Workload, estimate};
use crate::events::{Event, RunPlan};
use crate::model::ComputeDtype;

/// Reads every event of a log folder's `events.jsonl` (a torn last line is
/// skipped).
pub fn read_events(dir: &Path) -> Result<Vec<Event>, EstimateError> {
    let path = dir.join(crate::sinks::JSONL_FILE);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| EstimateError::Invalid(format!("{}: {e}", path.display())))?;
    crate::events::parse_log(&text)
        .map(|log| log.events)
        .map_err(|e| EstimateError::Invalid(format!("{}: {e}", path.display())))
}

/// The measured peak live heap between two stages of a run (exact: the
/// counting allocator's peak, from snapshots, samples and scope reports).
pub fn measured_heap_peak(events: &[Event], from: &str, to: &str) -> Option<u64> {
    let stage_at = |label: &str| {
        events.iter().find_map(|e| match e {
            Event::Stage { snapshot } if snapshot.label == label => Some(snapshot),
            _ => None,
        })
    };
    let (a, b) = (stage_at(from)?, stage_at(to)?);
    let mut peak = a.heap_allocated?.max(b.heap_allocated?);
    if let (Some(pa), Some(pb)) = (a.heap_peak, b.heap_peak)
        && pb > pa
    {
        peak = peak.max(pb);
    }
    for e in events {
        match e {
            Event::Sample { snapshot }
                if snapshot.elapsed_s > a.elapsed_s && snapshot.elapsed_s <= b.elapsed_s =>
            {
                peak = peak.max(snapshot.heap_allocated.unwrap_or(0));
            }
            Event::ScopeEnd { report }
                if report.elapsed_s >= a.elapsed_s && report.elapsed_s <= b.elapsed_s =>
            {
                peak = peak.max(report.peak_heap.unwrap_or(0));
            }
            _ => {}
        }
    }
    Some(peak)
}

/// The measured peak RSS between two stages of a run.
pub fn measured_peak(events: &[Event], from: &str, to: &str) -> Option<u64> {
    let stage_at = |label: &str| {
        events.iter().find_map(|e| match e {
            Event::Stage { snapshot } if snapshot.label == label => Some(snapshot),
            _ => None,
        })
    };
    let (a, b) = (stage_at(from)?, stage_at(to)?);
    let mut peak = a.rss.unwrap_or(0).max(b.rss.unwrap_or(0));
    if let (Some(pa), Some(pb)) = (a.rss_peak, b.rss_peak)
        && pb > pa
    {
        peak = peak.max(pb);
    }
    for e in events {
        if let Event::Sample { snapshot } = e
            && snapshot.elapsed_s > a.elapsed_s
            && snapshot.elapsed_s <= b.elapsed_s
        {
            peak = peak.max(snapshot.rss.unwrap_or(0));
        }
    }
    Some(peak)
}

/// The workload a run's plan describes.
pub fn workload_of(plan: &RunPlan) -> Result<(Arch, Workload), EstimateError> {
    let model = plan
        .model
        .as_ref()
        .ok_or_else(|| EstimateError::Invalid("the run's plan names no model".into()))?;
    let arch = Arch::from_model_info(model);
    let task: Task = match plan.command.as_str() {
        "eval" => Task::Inference,
        _ => plan
            .method
            .as_deref()
            .ok_or_else(|| EstimateError::Invalid("the run's plan names no method".into()))?
            .parse()
            .map_err(EstimateError::Invalid)?,
    };
    let get = |k: &str| plan.settings.get(k);
    let num = |k: &str, default: u64| get(k).and_then(|v| v.as_u64()).unwrap_or(default);
    let mut w = Workload::new(task);
    w.engine = Engine::Prunemem;
    w.device = if plan.device.starts_with("cuda") {
        Device::Cuda
    } else {
        Device::Cpu
    };
    w.dtype = get("dtype")
        .and_then(|v| v.as_str())
        .and_then(|s| s.parse::<ComputeDtype>().ok())
        .unwrap_or(ComputeDtype::F32);
    w.stored_bytes = match model.stored_dtype.as_str() {
        "f16" | "bf16" => 2,
        _ => 4,
    };
    w.nsamples = num("nsamples", 128);
    w.seqlen = num("seqlen", 2048);
    w.batch_size = num("batch_size", 8);
    w.resident = get("resident").and_then(|v| v.as_bool()).unwrap_or(false);
    w.eval_windows = num("eval_windows_used", 0);
    w.sparsity = get("sparsity").and_then(|v| v.as_f64()).unwrap_or(0.5);
    w.num_batches = num("num_batches", 1);
    w.include_embeddings = get("include_embeddings")
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    Ok((arch, w))
}

/// One phase: predicted vs measured.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseCheck {
    pub phase: String,
    pub predicted: u64,
    pub measured: Option<u64>,
    /// (predicted - measured) / measured, in percent.
    pub error_percent: Option<f64>,
}

/// A run's estimate and the comparison per phase, plus the whole-run peak.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub estimate: Estimate,
    pub phases: Vec<PhaseCheck>,
    pub peak: PhaseCheck,
}

fn check(phase: &str, predicted: u64, measured: Option<u64>) -> PhaseCheck {
    PhaseCheck {
        phase: phase.to_string(),
        predicted,
        measured,
        error_percent: measured
            .filter(|m| *m > 0)
            .map(|m| 100.0 * (predicted as f64 - m as f64) / m as f64),
    }
}

/// Estimates a finished run and compares.
pub fn compare(events: &[Event]) -> Result<Comparison, EstimateError> {
    let plan = events
        .iter()
        .find_map(|e| match e {
            Event::RunStarted { plan } => Some(plan.clone()),
            _ => None,
        })
        .ok_or_else(|| EstimateError::Invalid("the log has no run_started event".into()))?;
    let (arch, mut workload) = workload_of(&plan)?;
    let summary = events.iter().find_map(|e| match e {
        Event::RunFinished { summary } => Some(summary.clone()),
        _ => None,
    });
    if let Some(s) = &summary {
        if let Some(n) = s.results.get("eval_windows").and_then(|v| v.as_u64()) {
            workload.eval_windows = n;
        }
        if let Some(n) = s.results.get("text_bytes").and_then(|v| v.as_u64()) {
            workload.text_bytes = n;
        }
    }
    let est = estimate(&arch, &workload)?;
    let phases = est
        .phases
        .iter()
        .map(|p| {
            let measured = match (p.stages.first(), p.stages.last()) {
                (Some(a), Some(b)) => measured_peak(events, a, b),
                _ => None,
            };
            check(&p.name, p.total(), measured)
        })
        .collect();
    let measured_peak = summary.and_then(|s| s.rss_peak);
    let peak = check("peak", est.peak(), measured_peak);
    Ok(Comparison {
        estimate: est,
        phases,
        peak,
    })
}
