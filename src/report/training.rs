//! The training section: one step's component breakdown, each epoch's
//! peak, and the gap between the two approaches explained from measured
//! bytes ([`crate::train::analysis`]). Markdown, printed by `prunemem train`
//! and placed in `report.md`.

use std::fmt::Write;

use crate::train::analysis::Gap;
use crate::units::format_bytes;

fn signed(b: i64) -> String {
    let s = format_bytes(b.unsigned_abs());
    if b < 0 {
        format!("−{s}")
    } else {
        format!("+{s}")
    }
}

fn plain(b: i64) -> String {
    if b < 0 {
        format!("−{}", format_bytes(b.unsigned_abs()))
    } else {
        format_bytes(b as u64)
    }
}

/// The section's markdown.
pub fn gap_text(g: &Gap) -> String {
    let mut o = String::new();
    let mem = g.memory();
    let _ = writeln!(
        o,
        "\n## Training memory: one step vs the epoch peak ({mem})\n"
    );
    one_step(&mut o, g, mem);
    epoch_peaks(&mut o, g, mem);
    the_gap(&mut o, g, mem);
    accumulation_and_reserve(&mut o, g);
    o
}

/// Approach 1: one step's components, each a measured change.
fn one_step(o: &mut String, g: &Gap, mem: &str) {
    let s = &g.single_step;
    let _ = writeln!(
        o,
        "**Approach 1 — one step** (a fresh optimizer, one micro-batch's forward and backward): {mem} peak **{}** (in the window ending at `{}`).\n",
        format_bytes(s.peak.heap),
        s.peak.stage
    );
    let _ = writeln!(
        o,
        "| component (measured as the {mem}'s change) | bytes |\n|---|---|"
    );
    let rows = [
        (
            &*format!("{mem} before the step (parameters, data, runtime)"),
            plain(s.before as i64),
        ),
        ("  of which parameters", format_bytes(s.parameters)),
        (
            "activations kept for the backward (after forward − before)",
            plain(s.activations),
        ),
        ("gradients (after backward − before)", plain(s.gradients)),
        (
            "optimizer state (after the step and zero-grad − before)",
            plain(s.optimizer_state),
        ),
        (
            "temporaries (step peak − highest stage reading)",
            plain(s.temporaries),
        ),
        (
            "peak during the first optimizer step (moments created, gradients still held)",
            s.optimizer_step_peak.map_or("n/a".into(), format_bytes),
        ),
    ];
    for (k, v) in rows {
        let _ = writeln!(o, "| {k} | {v} |");
    }
}

/// Approach 2: each epoch's peak, where it was, and RSS in its window.
fn epoch_peaks(o: &mut String, g: &Gap, mem: &str) {
    let _ = writeln!(
        o,
        "\n**Approach 2 — the epoch peak** (`reset_peak_memory_stats()` at the epoch's start, `max_memory_allocated()` at its end):\n"
    );
    let _ = writeln!(
        o,
        "| epoch | {mem} peak | at stage | RSS in that window |\n|---|---|---|---|"
    );
    for (e, p) in &g.epochs {
        let rss = p.rss.map_or("n/a".into(), format_bytes);
        let _ = writeln!(
            o,
            "| {e} | {} | `{}` | {rss} |",
            format_bytes(p.heap),
            p.stage
        );
    }
}

/// The gap between the two, factor by factor.
fn the_gap(o: &mut String, g: &Gap, mem: &str) {
    let _ = writeln!(
        o,
        "\n**The gap: {}**, split by what the {mem} held at each peak:\n",
        signed(g.gap)
    );
    let _ = writeln!(o, "| factor | bytes | why |\n|---|---|---|");
    for f in &g.factors {
        let _ = writeln!(o, "| {} | {} | {} |", f.name, signed(f.bytes), f.why);
    }
    let _ = writeln!(
        o,
        "| unexplained (small allocations, runtime, untagged) | {} | no named mechanism |",
        signed(g.unexplained)
    );
}

/// Whether accumulation grew the gradients, and what RSS held beyond the
/// heap.
fn accumulation_and_reserve(o: &mut String, g: &Gap) {
    match g.accumulation_growth {
        Some(b) => {
            let _ = writeln!(
                o,
                "\nDoes gradient accumulation grow gradient memory? Measured: gradients after the last micro-batch of step 1 minus after the first = **{}** (the micro-batches add into the same buffers).",
                signed(b)
            );
        }
        None => {
            let _ = writeln!(
                o,
                "\nNo gradient accumulation in this run (one micro-batch per step)."
            );
        }
    }
    match g.reserve {
        Some(r) if r >= 0 => {
            let _ = writeln!(
                o,
                "Beyond the heap: RSS in the peak's window exceeds the heap peak by {} (allocator reserve, binary, stacks — what `nvidia-smi` adds over `max_memory_allocated()` on a GPU).",
                plain(r)
            );
        }
        Some(r) => {
            let _ = writeln!(
                o,
                "RSS in the peak's window stays {} below the heap peak: part of the heap was allocated but never touched (a page is resident only once written).",
                plain(-r)
            );
        }
        None => {}
    }
}

/// One cell of the comparison: a figure of one run's analysis.
type Cell = fn(&Gap) -> String;

fn factor(g: &Gap, name: &str) -> String {
    g.factors
        .iter()
        .find(|f| f.name == name)
        .map_or("n/a".into(), |f| plain(f.bytes))
}

/// Rows for `report compare`'s configuration table: one column per run,
/// `n/a` for runs that did not train. Empty when none did.
pub fn compare_rows(gaps: &[Option<Gap>]) -> String {
    if gaps.iter().all(Option::is_none) {
        return String::new();
    }
    let rows: [(&str, Cell); 6] = [
        ("one-step heap peak", |g| {
            format_bytes(g.single_step.peak.heap)
        }),
        ("epoch heap peak", |g| {
            let top = g.epochs.iter().map(|(_, p)| p.heap).max();
            top.map_or("n/a".into(), format_bytes)
        }),
        ("activations (one micro-batch)", |g| {
            plain(g.single_step.activations)
        }),
        ("gap: optimizer state", |g| factor(g, "optimizer state")),
        ("gap: gradients held", |g| {
            factor(g, "gradients held during a forward")
        }),
        ("accumulation growth", |g| {
            g.accumulation_growth
                .map_or("no accumulation".into(), signed)
        }),
    ];
    let mut o = String::new();
    for (name, cell) in rows {
        let cells: Vec<String> = gaps
            .iter()
            .map(|g| g.as_ref().map_or("n/a".into(), cell))
            .collect();
        let _ = writeln!(o, "| **{name}** | {} |", cells.join(" | "));
    }
    o
}
