//! Will this run fit? The estimator's prediction for a run in progress,
//! corrected by what has been measured so far, set against a budget: the
//! user's `--budget`, else the GPU's total, else the machine's memory.
//!
//! Phase by phase, in the estimate's order: a phase whose closing stage has
//! been seen counts at its measured peak; the phase under way counts at the
//! larger of its peak so far and its prediction; phases not yet begun count
//! at their prediction scaled by how the last finished phase compared with
//! its own (measured / predicted, kept within ½…2, so one odd phase cannot
//! swing the forecast wildly). The forecast peak is the largest of these,
//! and the first phase above the budget is where the run will exceed it.
//!
//! A device run is forecast on the device: the pool's peaks (readings
//! inside passes included) against the device's budget (`--budget`, else
//! `--device-memory` or the card's memory), never the host's.

use serde::Serialize;

use super::{Estimate, Phase};
use crate::events::fold::RunFold;

/// What the budget is.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Budget {
    pub bytes: u64,
    /// "--budget", "GPU total", "host memory".
    pub source: &'static str,
}

/// The forecast for a run so far.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Forecast {
    /// The estimator's whole-run peak, before any measurement.
    pub predicted_peak: u64,
    /// The whole-run peak as forecast now.
    pub peak: u64,
    /// The phase the forecast peak falls in.
    pub peak_phase: String,
    pub budget: Option<Budget>,
    /// The first phase forecast above the budget, and its forecast.
    pub exceeds_at: Option<(String, u64)>,
    /// Whether that phase's figure was measured (it already went over).
    pub exceeded: bool,
    /// Phases whose closing stage has been seen.
    pub phases_done: usize,
}

impl Forecast {
    /// "fits", "will exceed" or "exceeded"; `None` without a budget.
    pub fn verdict(&self) -> Option<&'static str> {
        self.budget.as_ref()?;
        Some(match (&self.exceeds_at, self.exceeded) {
            (None, _) => "fits",
            (Some(_), true) => "exceeded",
            (Some(_), false) => "will exceed",
        })
    }
}

/// The phase's measured peak so far: between its stages when both are seen
/// (`done`), or from its first stage to the latest reading.
fn measured(fold: &RunFold, p: &Phase) -> (Option<u64>, bool) {
    let (Some(first), Some(last)) = (p.stages.first(), p.stages.last()) else {
        return (None, false);
    };
    let Some(start) = fold.stage_index(first) else {
        return (None, false);
    };
    let device = fold.on_device();
    if fold.stage_index(last).is_some() {
        return match device {
            true => (fold.device_peak_between(first, last), true),
            false => (fold.peak_between(first, last), true),
        };
    }
    let t0 = fold.stages[start].point.t;
    let points = fold.points.iter().filter(|q| q.t >= t0);
    let later = fold.stages[start + 1..].iter();
    let so_far = match device {
        true => points
            .filter_map(|q| q.allocated)
            .chain(later.filter_map(|s| s.snapshot.window_device_peak))
            .max(),
        false => points
            .filter_map(|q| q.rss)
            .chain(later.filter_map(|s| s.peak))
            .max(),
    };
    (so_far, false)
}

/// The forecast for `estimate` (this run's plan) given the events so far.
pub fn forecast(estimate: &Estimate, fold: &RunFold, budget: Option<Budget>) -> Forecast {
    let mut ratio = 1.0f64;
    let mut done = 0;
    // (phase, bytes, measured)
    let mut values: Vec<(String, u64, bool)> = Vec::new();
    for p in &estimate.phases {
        let predicted = p.total();
        let (value, was_measured) = match measured(fold, p) {
            (Some(m), true) => {
                done += 1;
                if predicted > 0 {
                    ratio = (m as f64 / predicted as f64).clamp(0.5, 2.0);
                }
                (m, true)
            }
            (Some(m), false) => (m.max(predicted), m > predicted),
            (None, _) => ((predicted as f64 * ratio) as u64, false),
        };
        values.push((p.name.clone(), value, was_measured));
    }
    let (peak_phase, peak) = values
        .iter()
        .max_by_key(|(_, v, _)| *v)
        .map(|(n, v, _)| (n.clone(), *v))
        .unwrap_or_default();
    let over = budget
        .as_ref()
        .and_then(|b| values.iter().find(|(_, v, _)| *v > b.bytes));
    Forecast {
        predicted_peak: estimate.peak(),
        peak,
        peak_phase,
        exceeds_at: over.map(|(n, v, _)| (n.clone(), *v)),
        exceeded: over.is_some_and(|(_, _, m)| *m),
        budget,
        phases_done: done,
    }
}

/// The first of `candidates` that is known, as a budget.
fn first_known(candidates: [(Option<u64>, &'static str); 3]) -> Option<Budget> {
    candidates
        .into_iter()
        .find_map(|(bytes, source)| bytes.map(|bytes| Budget { bytes, source }))
}

/// The budget a run is held to: the user's, else the GPU's total, else the
/// machine's memory.
pub fn budget(
    user: Option<u64>,
    gpu_total: Option<u64>,
    host_total: Option<u64>,
) -> Option<Budget> {
    first_known([
        (user, "--budget"),
        (gpu_total, "GPU total"),
        (host_total, "host memory"),
    ])
}

/// The budget a device run is held to: the user's, else the device pool's
/// cap (`--device-memory`, or the card's memory as the run found it), else
/// the GPU's total; `None` when the device's size is unknown (wgpu adapters
/// report none): the host's memory says nothing about a device.
pub fn device_budget(
    user: Option<u64>,
    cap: Option<u64>,
    gpu_total: Option<u64>,
) -> Option<Budget> {
    first_known([
        (user, "--budget"),
        (cap, "device memory"),
        (gpu_total, "GPU total"),
    ])
}

/// The estimate for a run's plan, as `estimate --against` makes it; `None`
/// where the estimator cannot place the plan.
pub fn estimate_plan(plan: &crate::events::RunPlan) -> Option<Estimate> {
    let (arch, w) = super::against::workload_of(plan).ok()?;
    super::estimate(&arch, &w).ok()
}

#[cfg(test)]
mod tests;
