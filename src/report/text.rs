//! The words and tables of a report: executive summary, timeline with
//! deltas, top consumers, the method's theoretical minimum, estimate vs
//! measured, the projection to 7B (the comparison of runs is
//! `compare_text`'s). Markdown first; the HTML page wraps it with the
//! charts inline.

use std::fmt::Write;
use std::path::Path;

use super::load::{RunData, Scope};
use crate::estimate::{self, against};
use crate::units::{format_bytes, format_opt_bytes};

/// The estimator's check of a prunemem run, when its log allows one.
pub fn estimate_check(source: &Path) -> Option<against::Comparison> {
    let dir = if source.is_dir() {
        source.to_path_buf()
    } else {
        source.parent()?.to_path_buf()
    };
    let events = against::read_events(&dir).ok()?;
    against::compare(&events).ok()
}

/// `b - a` as a signed size (`n/a` where either is unknown).
pub(super) fn delta(a: Option<u64>, b: Option<u64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b >= a => format!("+{}", format_bytes(b - a)),
        (Some(a), Some(b)) => format!("-{}", format_bytes(a - b)),
        _ => "n/a".into(),
    }
}

fn model_bytes(run: &RunData) -> Option<u64> {
    let plan = run.plan.as_ref()?;
    let m = plan.model.as_ref()?;
    let c = match plan.settings.get("dtype").and_then(|v| v.as_str()) {
        Some("f16" | "bf16") => 2,
        _ => 4,
    };
    Some(m.params * c)
}

/// The smallest memory a method needs on this model: one layer's weights
/// and the calibration activations for streamed methods, one layer alone
/// for magnitude (prunemem's engine achieves this plus its transients).
fn theoretical_minimum(run: &RunData) -> Option<(u64, String)> {
    let plan = run.plan.as_ref()?;
    let m = plan.model.as_ref()?;
    let (arch, w) = against::workload_of(plan).ok()?;
    let c = w.dtype.size();
    let layer = arch.layer_params() * c;
    let method = plan.method.as_deref().unwrap_or("");
    if method == "train" {
        // A step cannot hold less than the weights, their gradients and the
        // optimizer's state; activations can shrink to one layer's graph.
        let trained = w.trainable_params.unwrap_or(arch.params) * 4;
        let state = if w.optimizer == crate::estimate::Optimizer::Sgd {
            0
        } else {
            2 * trained
        };
        let tokens = w.batch_size * w.seqlen;
        let boundaries = (arch.layers + 1) * tokens * arch.hidden * 4;
        return Some((
            arch.params * 4 + trained + state + boundaries,
            format!(
                "weights ({}) + gradients ({}) + optimizer state ({}) + every layer's input for checkpointed recomputation ({})",
                format_bytes(arch.params * 4),
                format_bytes(trained),
                format_bytes(state),
                format_bytes(boundaries)
            ),
        ));
    }
    if method == "gradprobe" {
        // Streamed probing: one layer, the boundary activations, the head
        // for the loss, and per candidate its position and original maximum.
        let tokens = w.num_batches * w.batch_size * w.seqlen;
        let bounds = (arch.layers + 1) * tokens * arch.hidden * 4;
        let head = arch.embedding_params() * 4;
        let probed = arch.layers * arch.layer_linear_params()
            + if w.include_embeddings {
                arch.embedding_params()
            } else {
                0
            };
        let cand = (probed as f64 * w.sparsity) as u64 * 6;
        return Some((
            layer + bounds + head + cand,
            format!(
                "layer-by-layer probing: one decoder layer ({}) + boundary activations ({}) + the head for the loss ({}) + 6 bytes per candidate ({}); GradProbe's own report puts the minimum of its resident design at about 1.3× the model",
                format_bytes(layer),
                format_bytes(bounds),
                format_bytes(head),
                format_bytes(cand)
            ),
        ));
    }
    let calib = if method == "magnitude" {
        0
    } else {
        w.nsamples * w.seqlen * m.hidden as u64 * c
    };
    Some((
        layer + calib,
        format!(
            "one decoder layer ({}) + calibration activations ({})",
            format_bytes(layer),
            format_bytes(calib)
        ),
    ))
}

/// The report of one run.
pub fn markdown(
    run: &RunData,
    check: Option<&against::Comparison>,
    charts: bool,
    gpu: Option<&crate::estimate::catalog::Gpu>,
) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# Memory report: {}\n", run.name);
    if let Some(p) = &run.plan {
        let _ = writeln!(s, "`{}`\n", p.argv.join(" "));
    }
    for n in &run.notes {
        let _ = writeln!(s, "> note: {n}\n");
    }
    summary(&mut s, run);
    if charts {
        let _ = writeln!(s, "![timeline](timeline.svg)\n\n![stages](stages.svg)\n");
    }
    timeline(&mut s, run);
    top_consumers(&mut s, run);
    if let Some(g) = run
        .summary
        .as_ref()
        .and_then(|r| crate::train::analysis::from_results(&r.results))
    {
        s.push_str(&super::training::gap_text(&g));
    }
    let bars = super::breakdown::bars(run, check);
    super::sections::categories(&mut s, run, charts);
    super::sections::time(&mut s, run);
    super::sections::device(&mut s, run);
    super::sections::ranks(&mut s, run);
    super::sections::breakdown(&mut s, &bars, charts);
    if let (Some((min, how)), Some(p)) = (theoretical_minimum(run), run.peak_rss()) {
        let _ = writeln!(
            s,
            "\n## Against the theoretical minimum\n\nThe method needs at least {} ({how}); the run peaked at {} — {:.2}× that, {} above it.",
            format_bytes(min),
            format_bytes(p),
            p as f64 / min.max(1) as f64,
            format_bytes(p.saturating_sub(min))
        );
    }
    if let Some(cmp) = check {
        estimate_section(&mut s, run, cmp);
    }
    if let Some(g) = gpu {
        super::sections::gpu(&mut s, run, g);
    }
    s
}

/// The executive summary: the peak and where, the model's multiple, time,
/// how it was measured.
fn summary(s: &mut String, run: &RunData) {
    let peak = run.peak_rss();
    let at = run.peak_stage().map(|i| {
        let prev = if i > 0 {
            run.stages[i - 1].label()
        } else {
            "start"
        };
        format!("between {prev} and {}", run.stages[i].label())
    });
    let _ = writeln!(s, "## Summary\n");
    let _ = writeln!(
        s,
        "- Peak RSS: **{}** ({})",
        format_opt_bytes(peak),
        at.unwrap_or_else(|| "n/a".into())
    );
    let _ = writeln!(
        s,
        "- Peak allocated: {}",
        format_opt_bytes(run.peak_allocated())
    );
    if let (Some(p), Some(m)) = (peak, model_bytes(run)) {
        let _ = writeln!(
            s,
            "- Model size {}: the peak is **{:.2}×** the model",
            format_bytes(m),
            p as f64 / m as f64
        );
    }
    if let Some(sum) = &run.summary {
        let _ = writeln!(
            s,
            "- Wall time {:.1} s, status {:?}",
            sum.wall_s, sum.status
        );
    }
    let _ = writeln!(
        s,
        "- Measurement: {}\n",
        match run.scope {
            Scope::Continuous =>
                "stage snapshots plus continuous sampling and the kernel's high-water mark",
            Scope::Checkpoints =>
                "checkpoint snapshots only (peaks between checkpoints are not seen)",
        }
    );
}

/// Every stage with its deltas, the peak's row marked; with NVML's
/// readings, how busy the GPU was since the previous stage (a watched
/// script's `Memory Checkpoint:` windows say where its GPU idled).
fn timeline(s: &mut String, run: &RunData) {
    let busy = run.stages.iter().any(|st| st.gpu_busy.is_some());
    let (head, rule) = match busy {
        true => (" GPU busy since previous |", "---|"),
        false => ("", ""),
    };
    let _ = writeln!(
        s,
        "## Timeline\n\n| stage | t (s) | RSS | Δ RSS | allocated | Δ allocated | peak since previous |{head}"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|{rule}");
    let peak_row = run.peak_stage();
    for (i, st) in run.stages.iter().enumerate() {
        let prev = i.checked_sub(1).map(|j| &run.stages[j].point);
        let mark = if Some(i) == peak_row {
            " **← peak**"
        } else {
            ""
        };
        let gpu = match busy {
            true => st
                .gpu_busy
                .map_or(" n/a |".into(), |u| format!(" {u:.0}% |")),
            false => String::new(),
        };
        let _ = writeln!(
            s,
            "| {}{mark} | {:.1} | {} | {} | {} | {} | {} |{gpu}",
            st.label(),
            st.point.t,
            format_opt_bytes(st.point.rss),
            delta(prev.and_then(|p| p.rss), st.point.rss),
            format_opt_bytes(st.point.allocated),
            delta(prev.and_then(|p| p.allocated), st.point.allocated),
            format_opt_bytes(st.peak),
        );
    }
}

/// The stage windows whose peak rose most above what they began with.
fn top_consumers(s: &mut String, run: &RunData) {
    let mut rises: Vec<(String, i64)> = run
        .stages
        .windows(2)
        .filter_map(|w| {
            Some((
                format!("{} → {}", w[0].label(), w[1].label()),
                w[1].peak? as i64 - w[0].point.rss? as i64,
            ))
        })
        .collect();
    rises.sort_by_key(|(_, d)| -d);
    let _ = writeln!(
        s,
        "\n## Top consumers\n\nStage windows whose peak rose most above the memory held when they began:\n"
    );
    for (name, d) in rises.iter().take(5) {
        let _ = writeln!(s, "- {name}: +{}", format_bytes((*d).max(0) as u64));
    }
}

/// The estimate against the run, phase by phase and by category, and the
/// projection to a 7B model.
fn estimate_section(s: &mut String, run: &RunData, cmp: &against::Comparison) {
    let _ = writeln!(
        s,
        "\n## Estimate vs measured\n\n| phase | predicted | measured | error |\n|---|---|---|---|"
    );
    for p in cmp.phases.iter().chain([&cmp.peak]) {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} |",
            p.phase,
            format_bytes(p.predicted),
            format_opt_bytes(p.measured),
            p.error_percent
                .map_or("n/a".into(), |e| format!("{e:+.1}%"))
        );
    }
    super::sections::estimate_categories(s, &cmp.phases);
    projection(s, run);
}

/// The same workload on LLaMA 7B in f16 on a GPU.
fn projection(s: &mut String, run: &RunData) {
    let Some(plan) = &run.plan else { return };
    let Ok(rows) = estimate::projection::rows(plan, None) else {
        return;
    };
    let Some(row) = rows.iter().find(|r| r.model == "LLaMA 7B") else {
        return;
    };
    let gpu = estimate::catalog::smallest_fitting(row.peak, 0.0)
        .map_or("none in the catalog".into(), |g| g.name);
    let _ = writeln!(
        s,
        "\n## Projection to LLaMA 7B\n\nThe same method and settings on LLaMA 7B in f16 with CUDA: estimated peak {} ({}); smallest GPU that fits: {gpu}.",
        format_bytes(row.peak),
        if plan.method.as_deref() == Some("train") {
            "PyTorch's accounting: prunemem trains on the CPU only"
        } else {
            "prunemem's engine"
        }
    );
}

fn escape(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A self-contained HTML page: the markdown's lines as simple HTML, with
/// the charts' SVG inline where the markdown links them.
pub fn html(md: &str, charts: &[(String, String)]) -> String {
    let mut body = String::new();
    let mut in_table = false;
    for line in md.lines() {
        let is_row = line.starts_with('|');
        if in_table && !is_row {
            body.push_str("</table>\n");
            in_table = false;
        }
        if let Some(h) = line.strip_prefix("## ") {
            let _ = writeln!(body, "<h2>{}</h2>", escape(h));
        } else if let Some(h) = line.strip_prefix("# ") {
            let _ = writeln!(body, "<h1>{}</h1>", escape(h));
        } else if let Some(img) = line.strip_prefix("![") {
            let name = img.split(']').next().unwrap_or("");
            for part in line.split("![").skip(1) {
                let file = part
                    .split('(')
                    .nth(1)
                    .and_then(|x| x.split(')').next())
                    .unwrap_or("");
                let key = file.trim_end_matches(".svg");
                if let Some((_, svg)) = charts.iter().find(|(k, _)| k == key) {
                    let _ = writeln!(body, "<figure>{svg}</figure>");
                }
            }
            let _ = name;
        } else if is_row {
            if line.starts_with("|---") {
                continue;
            }
            if !in_table {
                body.push_str("<table>\n");
                in_table = true;
            }
            let cells: Vec<String> = line
                .trim_matches('|')
                .split('|')
                .map(|c| format!("<td>{}</td>", escape(c.trim())))
                .collect();
            let _ = writeln!(body, "<tr>{}</tr>", cells.join(""));
        } else if let Some(item) = line.strip_prefix("- ") {
            let _ = writeln!(body, "<li>{}</li>", escape(item));
        } else if !line.trim().is_empty() {
            let _ = writeln!(body, "<p>{}</p>", escape(line.trim_start_matches("> ")));
        }
    }
    if in_table {
        body.push_str("</table>\n");
    }
    format!(
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>prunemem report</title>\n<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}}table{{border-collapse:collapse}}td{{border:1px solid #ccc;padding:2px 8px;text-align:right}}td:first-child{{text-align:left}}</style></head>\n<body>\n{body}</body></html>\n"
    )
}
