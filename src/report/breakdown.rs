//! What the peak is made of, measured and predicted in the same categories
//! (`memory::tag`): the heap's composition at the peak of the estimator's
//! peak phase, with "runtime" the rest of that phase's measured peak, beside
//! the estimator's components grouped the same way. Logs without categories
//! (older logs, Python CSVs) fall back to the engine's own `components`
//! accounting topped up to the peak. Both feed the stacked breakdown chart
//! and the report's table.

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

/// The two bars by category, from the estimator's peak phase, when the log
/// has categories.
fn by_category(check: &Comparison) -> Option<[Bar; 2]> {
    let i = check.estimate.peak_phase();
    let phase = check.phases.get(i)?;
    if phase.categories.iter().any(|c| c.measured.is_none()) || phase.categories.is_empty() {
        return None;
    }
    let parts = |f: &dyn Fn(&crate::estimate::against::CategoryCheck) -> u64| {
        phase
            .categories
            .iter()
            .map(|c| (c.category.name().to_string(), f(c)))
            .collect()
    };
    Some([
        Bar {
            label: format!("measured peak (by category, {} phase)", phase.phase),
            parts: parts(&|c| c.measured.unwrap_or(0)),
        },
        Bar {
            label: format!("estimate ({})", phase.phase),
            parts: parts(&|c| c.predicted),
        },
    ])
}

/// The measured bar without an estimate: the heap at the run's heap peak by
/// category, "runtime" the rest of the run's peak RSS.
fn measured_categories(run: &RunData) -> Option<Bar> {
    let peak = run.summary.as_ref().and_then(|s| s.rss_peak)?;
    let measured = crate::estimate::against::measured_by_category(&run.peak_categories, peak);
    if measured.len() < 2 {
        return None; // runtime alone: the log has no named categories
    }
    let mut parts: Vec<(String, u64)> = measured
        .into_iter()
        .map(|(c, b)| (c.name().to_string(), b))
        .collect();
    parts.sort_by_key(|(n, _)| crate::memory::tag::order(n));
    Some(Bar {
        label: "measured peak (by category, at the heap peak)".into(),
        parts,
    })
}

/// The measured bar from the engine's accounting: the fullest accounting the run reported, plus
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

/// The bars a report draws: measured, then predicted when there is one —
/// by category when the log has categories.
pub fn bars(run: &RunData, check: Option<&Comparison>) -> Vec<Bar> {
    if let Some(pair) = check.and_then(by_category) {
        return pair.to_vec();
    }
    if check.is_none()
        && let Some(bar) = measured_categories(run)
    {
        return vec![bar];
    }
    measured(run, check)
        .into_iter()
        .chain(check.and_then(predicted))
        .collect()
}
