//! Estimates checked against measured runs: `prunemem estimate --against
//! LOGDIR` reads a finished run's `events.jsonl`, rebuilds its workload from
//! the plan, estimates it, and sets each phase's prediction beside the peak
//! the profiler measured in that phase.
//!
//! A phase spans two stage snapshots (`03_before_pruning` →
//! `04_after_pruning`). Its measured peak is the shared fold's peak between
//! them ([`RunFold::peak_between`]): every snapshot inside the phase, and the
//! kernel's high-water mark when it rose during it.

use std::path::Path;

use serde::Serialize;

use super::{Arch, Device, Engine, Estimate, EstimateError, Task, Workload, estimate};
use crate::events::fold::RunFold;
use crate::events::{Event, RunPlan, logdir};
use crate::model::ComputeDtype;

/// Reads every event of a log folder's `events.jsonl` (a torn last line is
/// skipped).
pub fn read_events(dir: &Path) -> Result<Vec<Event>, EstimateError> {
    logdir::read_events(dir)
        .map(|log| log.events)
        .map_err(|e| EstimateError::Invalid(e.to_string()))
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
    let run = RunFold::of(events);
    let plan = run
        .plan
        .as_ref()
        .ok_or_else(|| EstimateError::Invalid("the log has no run_started event".into()))?;
    let (arch, mut workload) = workload_of(plan)?;
    if let Some(s) = &run.summary {
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
                (Some(a), Some(b)) => run.peak_between(a, b),
                _ => None,
            };
            check(&p.name, p.total(), measured)
        })
        .collect();
    let measured_peak = run.summary.as_ref().and_then(|s| s.rss_peak);
    let peak = check("peak", est.peak(), measured_peak);
    Ok(Comparison {
        estimate: est,
        phases,
        peak,
    })
}
