//! Runs `prunemem train` on the training grid (`tests/support/train_grid.rs`)
//! and prints, per run, the measured step components (activations,
//! gradients, optimizer state, backward temporaries — heap differences
//! between the stages of step 1) beside the estimator's prediction of each
//! phase and category. This is how the constants of
//! `estimate::prunemem_train` were fitted and how they are checked.
//!
//! ```text
//! cargo build --release && cargo run --release --example train_grid [-- FILTER]
//! ```
//! PRUNEMEM_BIN overrides the binary (default target/release/prunemem);
//! PRUNEMEM_GRID_DIR keeps the models and logs.

use std::path::PathBuf;

use prunemem::events::Event;

// Only its runner (`run_logged`) serves here.
#[allow(dead_code)]
#[path = "../tests/support/grid.rs"]
mod grid;
#[path = "../tests/support/train_grid.rs"]
mod train_grid;

fn main() {
    let filter = std::env::args().nth(1).unwrap_or_default();
    let bin = PathBuf::from(
        std::env::var("PRUNEMEM_BIN").unwrap_or_else(|_| "target/release/prunemem".into()),
    );
    let tmp = tempfile::tempdir().expect("a temporary folder");
    let dir = &grid::output_dir(tmp.path());
    let text = dir.join("text.txt");
    std::fs::write(&text, prunemem::model::tiny::corpus(6_000, 9)).expect("writing text");
    for case in train_grid::cases()
        .into_iter()
        .filter(|c| c.name.contains(&filter))
    {
        let (events, cmp) = match train_grid::run_case(&bin, dir, &text, &case) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("{e}");
                continue;
            }
        };
        let stages: Vec<_> = events
            .iter()
            .filter_map(|e| match e {
                Event::Stage { snapshot } => Some(snapshot.clone()),
                _ => None,
            })
            .collect();
        let s = &case.spec;
        if let Some(g) = prunemem::train::analysis::analyze(&stages) {
            let b = &g.single_step;
            println!(
                "{} h{} i{} L{} V{} nh{} | activations {} gradients {} optimizer {} temporaries {} | epoch peak {}",
                case.name,
                s.hidden,
                s.intermediate,
                s.layers,
                s.vocab,
                s.heads,
                b.activations,
                b.gradients,
                b.optimizer_state,
                b.temporaries,
                g.epochs.first().map_or(0, |(_, p)| p.heap)
            );
        }
        for p in cmp.phases.iter().chain([&cmp.peak]) {
            let cats: Vec<String> = p
                .categories
                .iter()
                .map(|c| {
                    format!(
                        "{} {}/{}",
                        c.category.name(),
                        c.predicted,
                        c.measured.unwrap_or(0)
                    )
                })
                .collect();
            println!(
                "    {:<14} predicted {:>11} measured {:>11} error {:>+6.1}%  {}",
                p.phase,
                p.predicted,
                p.measured.unwrap_or(0),
                p.error_percent.unwrap_or(f64::NAN),
                cats.join("  ")
            );
        }
    }
}
