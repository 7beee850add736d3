//! What the peak is made of: the run's own accounting (the `components`
//! events its engine emitted) topped up to the measured peak, and the
//! estimator's predicted components at its peak phase. Both feed the stacked
//! breakdown chart and the report's table.

use super::load::RunData;
use crate::estimate::against::Comparison;

/// One stacked bar: its label and its components (name, bytes).
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    pub label: String,
    pub parts: Vec<(String, u64)>,
}

impl Bar {
    pub fn total(&self) -> u64 {
        self.parts.iter().map(|(_, b)| b).sum()
    }
}

/// Every component name across `bars`, in order of first appearance (one
/// table row and one chart colour each).
pub fn component_names(bars: &[Bar]) -> Vec<&str> {
    let mut names: Vec<&str> = Vec::new();
    for b in bars {
        for (n, _) in &b.parts {
            if !names.contains(&n.as_str()) {
                names.push(n);
            }
        }
    }
    names
}

/// The measured bar: the fullest accounting the run reported, plus
/// "unaccounted" up to the peak RSS (runtime, allocator slack, transients):
/// the peak measured in the estimator's peak phase when there is an
/// estimate (so both bars describe the same moment), else the run's peak.
/// `None` when the run reported no components or no peak.
pub fn measured(run: &RunData, check: Option<&Comparison>) -> Option<Bar> {
    let phase_peak = check.and_then(|c| {
        let i = c.estimate.peak_phase();
        c.phases.get(i).and_then(|p| p.measured)
    });
    let peak = phase_peak
        .or_else(|| run.summary.as_ref().and_then(|s| s.rss_peak))
        .or_else(|| run.points.iter().filter_map(|p| p.rss).max())?;
    let (stage, bytes) = run
        .components
        .iter()
        .max_by_key(|(_, b)| b.values().sum::<u64>())?;
    let mut parts: Vec<(String, u64)> = bytes
        .iter()
        .filter(|(_, b)| **b > 0)
        .map(|(n, b)| (n.replace('_', " "), *b))
        .collect();
    let accounted: u64 = parts.iter().map(|(_, b)| b).sum();
    parts.push((
        "unaccounted (runtime, allocator, transients)".into(),
        peak.saturating_sub(accounted),
    ));
    Some(Bar {
        label: format!("measured peak (accounting at {stage})"),
        parts,
    })
}

/// The estimator's components at its peak phase.
pub fn predicted(check: &Comparison) -> Option<Bar> {
    let e = &check.estimate;
    let phase = e.phases.get(e.peak_phase())?;
    Some(Bar {
        label: format!("estimate ({})", phase.name),
        parts: phase
            .components
            .iter()
            .map(|c| (c.name.clone(), c.bytes))
            .collect(),
    })
}

/// The bars a report draws: measured, then predicted when there is one.
pub fn bars(run: &RunData, check: Option<&Comparison>) -> Vec<Bar> {
    measured(run, check)
        .into_iter()
        .chain(check.and_then(predicted))
        .collect()
}
