//! Runs `prunemem prune` on the estimator grid (`tests/support/grid.rs`, synthetic
//! models of varied shapes and workloads) and prints, per run, the
//! estimator's prediction beside the measured peak RSS of each phase (one
//! JSON line per run, then a summary table). This is how the constants of
//! `estimate::prunemem` were fitted and how they are checked.
//!
//! ```text
//! cargo build --release && cargo run --release --example estimator_grid [-- FILTER]
//! ```
//! PRUNEMEM_BIN overrides the binary (default target/release/prunemem);
//! PRUNEMEM_GRID_DIR keeps the models and logs.

use std::path::PathBuf;

#[path = "../tests/support/grid.rs"]
mod grid;

fn main() {
    let filter = std::env::args().nth(1).unwrap_or_default();
    let bin = std::env::var("PRUNEMEM_BIN").unwrap_or_else(|_| "target/release/prunemem".into());
    let tmp = tempfile::tempdir().expect("a temporary folder");
    let dir = &grid::output_dir(tmp.path());
    let text = dir.join("text.txt");
    std::fs::write(&text, prunemem::model::tiny::corpus(30_000, 9)).expect("writing text");
    let mut rows = Vec::new();
    let bin = PathBuf::from(bin);
    for case in grid::cases()
        .into_iter()
        .filter(|c| c.name.contains(&filter))
    {
        let (events, cmp) = match grid::run_case(&bin, dir, &text, &case) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("{e}");
                continue;
            }
        };
        let phases: Vec<_> = cmp
            .phases
            .iter()
            .map(|p| {
                let est = cmp.estimate.phases.iter().find(|e| e.name == p.phase);
                let fold = prunemem::events::fold::RunFold::of(&events);
                let heap = est.and_then(|e| fold.heap_peak_between(&e.stages[0], &e.stages[e.stages.len() - 1]));
                serde_json::json!({"phase": p.phase, "predicted": p.predicted, "measured": p.measured, "heap": heap,
                "components": est.map(|e| e.components.clone())})
            })
            .collect();
        let heap_peak = events.iter().rev().find_map(|e| match e {
            prunemem::events::Event::RunFinished { summary } => summary.heap_peak,
            _ => None,
        });
        println!(
            "{}",
            serde_json::json!({"case": case.name, "peak_predicted": cmp.peak.predicted, "peak_measured": cmp.peak.measured,
                               "heap_peak": heap_peak, "error_percent": cmp.peak.error_percent, "phases": phases})
        );
        rows.push((
            case.name,
            cmp.peak.predicted,
            cmp.peak.measured,
            cmp.peak.error_percent,
        ));
    }
    eprintln!(
        "{:<26} {:>12} {:>12} {:>8}",
        "case", "predicted", "measured", "error"
    );
    for (name, p, m, e) in rows {
        eprintln!(
            "{:<26} {:>12} {:>12} {:>8}",
            name,
            prunemem::units::format_bytes(p),
            m.map(prunemem::units::format_bytes).unwrap_or_default(),
            e.map(|e| format!("{e:+.1}%")).unwrap_or_default()
        );
    }
}
