//! Two runs of one job compared stage by stage, whatever wrote them: a
//! watched PyTorch script (its `Memory Checkpoint` figures) beside a
//! prunemem run, two scripts, or two prunemem runs. Stages are matched by
//! name first (ignoring a leading `02_`-style number and case), the rest in
//! order; each matched pair shows time, allocated, reserved, peak and RSS
//! side by side with B/A ratios, and where both runs name their memory by
//! category the difference is given in bytes per category.

use std::fmt::Write;

use super::load::{RunData, Stage};
use crate::events::stages;
use crate::units::{format_bytes, format_opt_bytes};

/// How two stages were paired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Matched {
    Name,
    Order,
    /// One side only.
    Alone,
}

/// `02_model_loaded` and `Model_Loaded` are one name.
fn key(label: &str) -> String {
    label
        .trim_start_matches(|c: char| c.is_ascii_digit())
        .trim_start_matches(['_', '-', ' '])
        .to_ascii_lowercase()
}

/// The stages worth comparing: per-layer stages left out.
fn comparable(run: &RunData) -> Vec<&Stage> {
    run.stages
        .iter()
        .filter(|s| !stages::is_layer(s.label()))
        .collect()
}

/// Pairs the stages of `a` and `b`: by name, then the unpaired in order.
pub fn pair<'r>(
    a: &'r RunData,
    b: &'r RunData,
) -> Vec<(Option<&'r Stage>, Option<&'r Stage>, Matched)> {
    let (sa, sb) = (comparable(a), comparable(b));
    let mut used = vec![false; sb.len()];
    let mut by_name: Vec<Option<usize>> = Vec::with_capacity(sa.len());
    for s in &sa {
        let k = key(s.label());
        let hit = (0..sb.len()).find(|&j| !used[j] && key(sb[j].label()) == k);
        if let Some(j) = hit {
            used[j] = true;
        }
        by_name.push(hit);
    }
    let mut rest_b = (0..sb.len())
        .filter(|&j| !used[j])
        .collect::<Vec<_>>()
        .into_iter();
    let mut out = Vec::new();
    for (i, s) in sa.iter().enumerate() {
        match by_name[i] {
            Some(j) => out.push((Some(*s), Some(sb[j]), Matched::Name)),
            None => match rest_b.next() {
                Some(j) => out.push((Some(*s), Some(sb[j]), Matched::Order)),
                None => out.push((Some(*s), None, Matched::Alone)),
            },
        }
    }
    out.extend(rest_b.map(|j| (None, Some(sb[j]), Matched::Alone)));
    out
}

fn ratio(a: Option<u64>, b: Option<u64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if a > 0 => format!("{:.2}×", b as f64 / a as f64),
        _ => "–".into(),
    }
}

/// The peak of the stage's allocator readings: its own peak, else what it
/// had allocated.
fn peak_of(s: &Stage) -> Option<u64> {
    s.snapshot.device_peak.or(s.point.allocated)
}

/// The stage table, the peaks and the per-category difference of `a` and
/// `b`, as markdown.
pub fn between(a: &RunData, b: &RunData) -> String {
    let mut s = String::new();
    let (na, nb) = (&a.name, &b.name);
    let _ = writeln!(
        s,
        "\n## Stages, {na} (A) against {nb} (B)\n\nMatched by name, else in order. Time is seconds since each run's start; × is B / A.\n"
    );
    let _ = writeln!(
        s,
        "| stage A | stage B | by | time A | time B | allocated A | allocated B | × | reserved A | reserved B | × | peak A | peak B | × | RSS A | RSS B | × |"
    );
    let _ = writeln!(s, "|{}", "---|".repeat(17));
    let cell = |st: Option<&Stage>, f: &dyn Fn(&Stage) -> Option<u64>| st.and_then(f);
    for (x, y, by) in pair(a, b) {
        let label = |st: Option<&Stage>| st.map_or("–".to_string(), |t| t.label().to_string());
        let time =
            |st: Option<&Stage>| st.map_or("–".to_string(), |t| format!("{:.1}", t.point.t));
        let by = match by {
            Matched::Name => "name",
            Matched::Order => "order",
            Matched::Alone => "–",
        };
        let mut row = format!(
            "| {} | {} | {by} | {} | {} |",
            label(x),
            label(y),
            time(x),
            time(y)
        );
        type Reading<'a> = &'a dyn Fn(&Stage) -> Option<u64>;
        let readings: [Reading; 4] = [
            &|t| t.point.allocated,
            &|t| t.point.reserved,
            &peak_of,
            &|t| t.point.rss,
        ];
        for f in readings {
            let (va, vb) = (cell(x, f), cell(y, f));
            let _ = write!(
                row,
                " {} | {} | {} |",
                format_opt_bytes(va),
                format_opt_bytes(vb),
                ratio(va, vb)
            );
        }
        let _ = writeln!(s, "{row}");
    }
    peaks(&mut s, a, b);
    categories(&mut s, a, b);
    s
}

/// The runs' peaks side by side.
fn peaks(s: &mut String, a: &RunData, b: &RunData) {
    let max = |r: &RunData, f: &dyn Fn(&Stage) -> Option<u64>| r.stages.iter().filter_map(f).max();
    let _ = writeln!(s, "\n| peak | A | B | × |\n|---|---|---|---|");
    let rows: [(&str, Option<u64>, Option<u64>); 3] = [
        (
            "allocated (allocator's peak)",
            max(a, &peak_of),
            max(b, &peak_of),
        ),
        (
            "reserved",
            max(a, &|t| t.point.reserved),
            max(b, &|t| t.point.reserved),
        ),
        ("RSS", a.peak_rss(), b.peak_rss()),
    ];
    for (name, va, vb) in rows {
        let _ = writeln!(
            s,
            "| {name} | {} | {} | {} |",
            format_opt_bytes(va),
            format_opt_bytes(vb),
            ratio(va, vb)
        );
    }
}

/// Where both runs name their memory by category: the difference at the
/// peak, in bytes per category.
fn categories(s: &mut String, a: &RunData, b: &RunData) {
    let (ca, cb) = (&a.peak_categories, &b.peak_categories);
    if ca.is_empty() || cb.is_empty() {
        let _ = writeln!(
            s,
            "\nNo per-category split on both sides (a watched script's log has none), so the difference is not explained by category."
        );
        return;
    }
    let _ = writeln!(
        s,
        "\n### The difference at the peak, by category\n\n| category | A | B | B − A |\n|---|---|---|---|"
    );
    let names: std::collections::BTreeSet<&String> = ca.keys().chain(cb.keys()).collect();
    for n in names {
        let (va, vb) = (
            ca.get(n).copied().unwrap_or(0),
            cb.get(n).copied().unwrap_or(0),
        );
        let sign = if vb >= va { "+" } else { "−" };
        let _ = writeln!(
            s,
            "| {n} | {} | {} | {sign}{} |",
            format_bytes(va),
            format_bytes(vb),
            format_bytes(va.abs_diff(vb))
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::fold::RunFold;
    use crate::events::{Event, RunSummary};
    use crate::memory::MemorySnapshot;

    fn run(name: &str, stages: &[(&str, f64, Option<u64>, Option<u64>)]) -> RunData {
        let mut events: Vec<Event> = stages
            .iter()
            .map(|(label, t, rss, alloc)| Event::Stage {
                snapshot: MemorySnapshot {
                    label: label.to_string(),
                    elapsed_s: *t,
                    rss: *rss,
                    device_allocated: *alloc,
                    ..Default::default()
                },
            })
            .collect();
        events.push(Event::RunFinished {
            summary: RunSummary {
                status: crate::events::RunStatus::Ok,
                wall_s: 4.0,
                rss_peak: None,
                heap_peak: None,
                device_peak: None,
                results: Default::default(),
            },
        });
        RunData {
            name: name.into(),
            fold: RunFold::of(&events),
            scope: super::super::load::Scope::Continuous,
            notes: Vec::new(),
            ranks: None,
        }
    }

    #[test]
    fn stages_pair_by_name_then_order() {
        let a = run(
            "script",
            &[
                ("model_loaded", 1.0, Some(100), Some(40)),
                ("calibrated", 2.0, Some(200), None),
                ("pruned", 3.0, Some(300), Some(80)),
            ],
        );
        let b = run(
            "prunemem",
            &[
                ("02_model_loaded", 0.5, Some(50), Some(20)),
                ("03_before_pruning", 1.0, Some(60), None),
                ("09_pruned", 2.0, Some(70), Some(40)),
            ],
        );
        let pairs = pair(&a, &b);
        let labels: Vec<_> = pairs
            .iter()
            .map(|(x, y, m)| (x.map(|s| s.label()), y.map(|s| s.label()), *m))
            .collect();
        assert_eq!(
            labels,
            [
                (Some("model_loaded"), Some("02_model_loaded"), Matched::Name),
                (
                    Some("calibrated"),
                    Some("03_before_pruning"),
                    Matched::Order
                ),
                (Some("pruned"), Some("09_pruned"), Matched::Name),
            ]
        );
        let md = between(&a, &b);
        assert!(
            md.contains(
                "| model_loaded | 02_model_loaded | name | 1.0 | 0.5 | 40 B | 20 B | 0.50× |"
            ),
            "{md}"
        );
        assert!(md.contains("| RSS | 300 B | 70 B | 0.23× |"), "{md}");
    }
}
