//! The comparison of runs in words and tables: each run's configuration
//! with the settings that differ, training runs' gaps side by side, the
//! stages aligned (two runs: `compare::between`'s pairs and ratios), and
//! an explanation of why the peaks differ. `report compare` writes it as
//! `compare.md`, and `text::html` wraps it.

use std::fmt::Write;

use super::load::{RunData, Scope};
use super::text::delta;
use crate::events::stages;
use crate::units::{format_bytes, format_opt_bytes};

fn setting(run: &RunData, key: &str) -> String {
    if key == "scope" {
        return match run.scope {
            Scope::Continuous => "continuous peak".into(),
            Scope::Checkpoints => "checkpoint snapshots".into(),
        };
    }
    let Some(p) = &run.plan else {
        return "n/a".into();
    };
    match key {
        "method" => p.method.clone().unwrap_or_else(|| p.command.clone()),
        "engine" => p.engine.clone(),
        k => p
            .settings
            .get(k)
            .map_or("n/a".into(), |v| v.to_string().replace('"', "")),
    }
}

/// Training runs: each one's single-step peak, epoch peak and the gap's
/// main factors, side by side (`report::training`).
fn training_rows(s: &mut String, runs: &[RunData]) {
    let gaps: Vec<_> = runs
        .iter()
        .map(|r| {
            r.summary
                .as_ref()
                .and_then(|x| crate::train::analysis::from_results(&x.results))
        })
        .collect();
    s.push_str(&super::training::compare_rows(&gaps));
}

/// The comparison of runs.
pub fn compare_markdown(runs: &[RunData], charts: bool) -> String {
    let mut s = String::new();
    let names: Vec<&str> = runs.iter().map(|r| r.name.as_str()).collect();
    let _ = writeln!(s, "# Comparison: {}\n", names.join(" vs "));
    // A torn or unfinished log says so here too, not only in its own report.
    for r in runs {
        for n in r
            .notes
            .iter()
            .filter(|n| !n.starts_with("read from memory_log.csv"))
        {
            let _ = writeln!(s, "> note ({}): {n}\n", r.name);
        }
    }
    if charts {
        let _ = writeln!(
            s,
            "![timelines](compare.svg)\n\n![aligned by stage](compare_stages.svg)\n"
        );
    }
    let differs = configuration(&mut s, runs, &names);
    training_rows(&mut s, runs);
    match runs {
        // Two runs, perhaps by two approaches: every reading side by side.
        [a, b] => s.push_str(&super::compare::between(a, b)),
        _ => aligned_stages(&mut s, runs, &names),
    }
    explanation(&mut s, runs, &names, &differs);
    s
}

/// The settings side by side and the peaks; returns the settings that
/// differ between runs that all record them.
fn configuration(s: &mut String, runs: &[RunData], names: &[&str]) -> Vec<&'static str> {
    let _ = writeln!(
        s,
        "## Configuration\n\n| setting | {} |\n|---|{}",
        names.join(" | "),
        "---|".repeat(runs.len())
    );
    let keys = [
        "method",
        "engine",
        "scope",
        "batch_size",
        "seqlen",
        "nsamples",
        "grad_accum",
        "optimizer",
        "checkpointing",
        "dtype",
        "sparsity",
    ];
    let mut differs = Vec::new();
    for k in keys {
        let vals: Vec<String> = runs.iter().map(|r| setting(r, k)).collect();
        // "n/a" is unknown (a memory_log.csv records no plan), not a
        // difference; the scope is always known.
        let known: Vec<&String> = vals.iter().filter(|v| *v != "n/a").collect();
        // A watched script's "method" is `watch`: not a method that differs.
        let watched = k == "method" && vals.iter().any(|v| v == "watch");
        if known.len() == vals.len() && vals.iter().any(|v| v != &vals[0]) && !watched {
            differs.push(k);
        }
        let _ = writeln!(s, "| {k} | {} |", vals.join(" | "));
    }
    let peaks: Vec<String> = runs
        .iter()
        .map(|r| format_opt_bytes(r.peak_rss()))
        .collect();
    let _ = writeln!(s, "| **peak RSS** | {} |", peaks.join(" | "));
    // How busy each run kept the GPU (NVML's mean over its readings): the
    // authors' script watched beside prunemem's run of the same job.
    if runs.iter().any(|r| r.gpu_busy.run.percent().is_some()) {
        let busy: Vec<String> = runs
            .iter()
            .map(|r| {
                r.gpu_busy
                    .run
                    .percent()
                    .map_or("n/a".into(), |u| format!("{u:.1}%"))
            })
            .collect();
        let _ = writeln!(s, "| **GPU busy (mean)** | {} |", busy.join(" | "));
    }
    differs
}

/// RSS per stage, aligned by label (per-layer stages left out).
fn aligned_stages(s: &mut String, runs: &[RunData], names: &[&str]) {
    let _ = writeln!(
        s,
        "\n## Stages\n\n| stage | {} | difference |\n|---|{}---|",
        names.join(" | "),
        "---|".repeat(runs.len())
    );
    for st in runs[0]
        .stages
        .iter()
        .filter(|s| !stages::is_layer(s.label()))
    {
        let vals: Vec<Option<u64>> = runs
            .iter()
            .map(|r| {
                r.stages
                    .iter()
                    .find(|x| x.label() == st.label())
                    .and_then(|x| x.point.rss)
            })
            .collect();
        let diff = delta(vals[0], *vals.last().unwrap_or(&None));
        let _ = writeln!(
            s,
            "| {} | {} | {diff} |",
            st.label(),
            vals.iter()
                .map(|v| format_opt_bytes(*v))
                .collect::<Vec<_>>()
                .join(" | ")
        );
    }
}

/// Why one setting moves memory, for the explanation.
fn why_setting_matters(k: &str) -> &'static str {
    match k {
        "engine" => {
            "the engine: the reference scripts keep the whole model and 128-sample input/output buffers resident, prunemem streams one layer"
        }
        "method" => {
            "the method: SparseGPT adds Hessians (in² f32 per linear), Wanda only column norms, magnitude no calibration at all"
        }
        "batch_size" | "seqlen" | "nsamples" => {
            "the calibration workload: activations and calibration buffers scale with batch × seqlen and nsamples × seqlen"
        }
        "grad_accum" => {
            "gradient accumulation: activations scale with the micro-batch, not the effective batch; accumulating keeps the gradients alive through the next micro-batch's forward (they add into the same buffers, so they do not grow with k)"
        }
        "optimizer" => {
            "the optimizer: Adam/AdamW keep two f32 moments per trained parameter from the first step on, SGD without momentum none"
        }
        "checkpointing" => {
            "activation checkpointing: each layer's graph is rebuilt in the backward instead of kept from the forward"
        }
        "dtype" => "the compute dtype: f16/bf16 halve weights and activations",
        _ => "a setting",
    }
}

/// Where the difference comes from: missing plans, the measurement scope,
/// each differing setting, and the net.
fn explanation(s: &mut String, runs: &[RunData], names: &[&str], differs: &[&str]) {
    let _ = writeln!(s, "\n## Where the difference comes from\n");
    for r in runs.iter().filter(|r| r.plan.is_none()) {
        let _ = writeln!(
            s,
            "- {}'s log records no configuration (a memory_log.csv has no plan): only the measurement scope is compared for it.",
            r.name
        );
    }
    if runs.iter().any(|r| r.scope != runs[0].scope) {
        let _ = writeln!(
            s,
            "- The runs were measured differently: a checkpoint-only log sees memory at its snapshots, while a continuous log also catches the peaks between them (activations, statistics and transients freed before the next checkpoint). Expect the continuous figure to be higher for the same work."
        );
    }
    // The scope has its own sentence above.
    for k in differs.iter().filter(|k| **k != "scope") {
        let _ = writeln!(s, "- `{k}` differs — {}.", why_setting_matters(k));
    }
    let first = runs.first().and_then(|r| r.peak_rss());
    let last = runs.last().and_then(|r| r.peak_rss());
    if let (Some(a), Some(b)) = (first, last) {
        let (hi, lo) = if a >= b {
            (names[0], names[names.len() - 1])
        } else {
            (names[names.len() - 1], names[0])
        };
        let _ = writeln!(
            s,
            "- Net: {hi} peaked {} higher than {lo} ({:.2}×).",
            format_bytes(a.abs_diff(b)),
            a.max(b) as f64 / a.min(b).max(1) as f64
        );
    }
    if differs.is_empty() && runs.iter().all(|r| r.scope == runs[0].scope) {
        let _ = writeln!(
            s,
            "- The recorded configurations agree; the difference is in the implementation or the machine."
        );
    }
}
