//! Report sections beyond the timeline: what the peak is made of (measured
//! accounting beside the estimator's components) and the projection of the
//! run to a GPU the user names.

use std::fmt::Write;

use super::breakdown::Bar;
use super::load::RunData;
use crate::estimate::{against, catalog, projection};
use crate::units::format_bytes;

/// "What the peak is made of": one table row per component, one column per
/// bar (measured, estimate).
pub fn breakdown(s: &mut String, bars: &[Bar], chart: bool) {
    if bars.is_empty() {
        return;
    }
    let _ = writeln!(s, "\n## What the peak is made of\n");
    if chart {
        let _ = writeln!(s, "![breakdown](breakdown.svg)\n");
    }
    let names = super::breakdown::component_names(bars);
    let head: Vec<&str> = bars.iter().map(|b| b.label.as_str()).collect();
    let _ = writeln!(s, "| component | {} |", head.join(" | "));
    let _ = writeln!(s, "|---|{}", "---|".repeat(bars.len()));
    for n in &names {
        let cells: Vec<String> = bars
            .iter()
            .map(|b| {
                b.parts
                    .iter()
                    .find(|(m, _)| m == n)
                    .map_or("—".into(), |(_, v)| format_bytes(*v))
            })
            .collect();
        let _ = writeln!(s, "| {n} | {} |", cells.join(" | "));
    }
    let totals: Vec<String> = bars.iter().map(|b| format_bytes(b.total())).collect();
    let _ = writeln!(s, "| **total** | {} |", totals.join(" | "));
}

/// "The heap at its peak, by category": what the counting allocator charged
/// to each category (`memory::tag`) at the instant of the run's heap peak —
/// measured, not estimated; "untagged" and "small allocations" are the
/// honest remainder.
pub fn categories(s: &mut String, run: &RunData, chart: bool) {
    if let Some(cats) = run.device_peak_composition() {
        let _ = writeln!(
            s,
            "\n## The device pool at its peak, by category (measured)\n\nBytes the engine held on the device by category (tensors' shape × dtype), and the rest of the pool's reading charged to what the engine was doing at that instant (`memory::held`).\n"
        );
        category_table(s, cats, "device peak");
    }
    let cats = &run.peak_categories;
    if cats.values().sum::<u64>() == 0 {
        return;
    }
    let _ = writeln!(s, "\n## The heap at its peak, by category (measured)\n");
    if chart && !run.category_points.is_empty() {
        let _ = writeln!(s, "![by category](categories.svg)\n");
    }
    category_table(s, cats, "heap peak");
}

fn category_table(s: &mut String, cats: &std::collections::BTreeMap<String, u64>, what: &str) {
    let total: u64 = cats.values().sum();
    let _ = writeln!(s, "| category | bytes | share |\n|---|---|---|");
    let mut parts: Vec<(&String, &u64)> = cats.iter().collect();
    parts.sort_by_key(|(_, v)| std::cmp::Reverse(**v));
    for (name, bytes) in parts {
        let share = 100.0 * *bytes as f64 / total as f64;
        let _ = writeln!(s, "| {name} | {} | {share:.1}% |", format_bytes(*bytes));
    }
    let _ = writeln!(s, "| **{what}** | {} | 100% |", format_bytes(total));
}

/// "Where the time went": wall seconds by phase and by kind of work, as the
/// run measured them (`timing`; results `seconds_by_phase`,
/// `seconds_by_work`), each with its share of the run's wall time.
pub fn time(s: &mut String, run: &RunData) {
    let Some(summary) = &run.summary else { return };
    let table = |key: &str| -> Vec<(String, f64)> {
        let mut v: Vec<(String, f64)> = summary
            .results
            .get(key)
            .and_then(|v| v.as_object())
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| Some((k.replace('_', " "), v.as_f64()?)))
                    .collect()
            })
            .unwrap_or_default();
        v.sort_by(|a, b| b.1.total_cmp(&a.1));
        v
    };
    let (phase, work) = (table("seconds_by_phase"), table("seconds_by_work"));
    if phase.is_empty() && work.is_empty() {
        return;
    }
    let wall = summary.wall_s.max(1e-9);
    let _ = writeln!(
        s,
        "\n## Where the time went\n\nWall seconds of the engine thread, measured where the work is done; kinds of work are exclusive (a matrix product inside a layer's forward counts once), phases are exclusive too (a phase opened inside another, such as a layer's load inside a GradProbe pass, pauses it). Run wall time {wall:.1} s.\n"
    );
    for (title, rows) in [("phase", phase), ("kind of work", work)] {
        if rows.is_empty() {
            continue;
        }
        let _ = writeln!(s, "| {title} | seconds | share of wall |\n|---|---|---|");
        for (name, secs) in rows {
            let _ = writeln!(s, "| {name} | {secs:.2} | {:.1}% |", 100.0 * secs / wall);
        }
        let _ = writeln!(s);
    }
}

/// prunemem's own device kernels, by name: how often each ran and how
/// often it handed its work back to Burn's ops (`exec::tally`).
fn own_kernels(s: &mut String, k: &serde_json::Map<String, serde_json::Value>) {
    let n = |v: &serde_json::Value, f: &str| v[f].as_u64().unwrap_or(0);
    let back: u64 = k.values().map(|v| n(v, "fell_back")).sum();
    let _ = writeln!(
        s,
        "prunemem's own kernels: {}.\n",
        match back {
            0 => "every request ran".to_string(),
            b => format!("{b} requests handed back to Burn's ops (slower, and more of the pool)"),
        }
    );
    let _ = writeln!(s, "| kernel | ran | handed back |\n|---|---|---|");
    for (name, v) in k {
        let _ = writeln!(s, "| {name} | {} | {} |", n(v, "ran"), n(v, "fell_back"));
    }
    let _ = writeln!(s);
}

/// "The device": a device run's pool reserve against its bytes in use, the
/// mean GPU utilisation NVML reported, where the pruned layers waited, and
/// what crossed the bus and how many kernels ran, by phase — the answer to
/// "why is my GPU idle?" in bytes and launches (`exec::transfer`).
pub fn device(s: &mut String, run: &RunData) {
    let Some(summary) = &run.summary else { return };
    let r = &summary.results;
    let Some(transfers) = r.get("transfers").and_then(|v| v.as_object()) else {
        return;
    };
    let _ = writeln!(s, "\n## The device: bus traffic, kernels, utilisation\n");
    if let (Some(res), Some(used)) = (
        r.get("device_reserved_peak").and_then(|v| v.as_u64()),
        summary.device_peak,
    ) {
        let _ = writeln!(
            s,
            "The pool reserved at most {} (what nvidia-smi shows, less the CUDA context) for at most {} in use ({:.2}×).\n",
            format_bytes(res),
            format_bytes(used),
            res as f64 / used.max(1) as f64
        );
    }
    let seconds = r.get("seconds_by_phase");
    let phase_seconds = |p: &str| seconds.and_then(|t| t[p].as_f64());
    idle_gpu(s, run, phase_seconds);
    if let Some(k) = r.get("pruned_layers_kept").and_then(|v| v.as_str()) {
        let _ = match k {
            "inline" => writeln!(
                s,
                "The evaluation ran each pruned layer as it was pruned; no layer waited.\n"
            ),
            _ => writeln!(
                s,
                "The pruned layers waited for the evaluation on the {k}.\n"
            ),
        };
    }
    if let Some(a) = r.get("attention") {
        let n = |k: &str| a[k].as_u64().unwrap_or(0);
        let _ = match a["kernel"].as_str() {
            Some(k) if k != "fallback" => writeln!(
                s,
                "Attention ran as cubek's flash kernel (`{k}`) {} times, no scores stored; {} handed back to Burn's kernels.\n",
                n("fused"),
                n("fell_back")
            ),
            _ => writeln!(
                s,
                "Attention ran as Burn's separate kernels (its `[batch, heads, seq, seq]` scores in the pool).\n"
            ),
        };
    }
    if let Some(k) = r.get("device_kernels").and_then(|v| v.as_object()) {
        own_kernels(s, k);
    }
    // NVML's utilisation in each phase, where the run had readings (a
    // GPU's driver); lavapipe and the CPU have none, and no column.
    let util = run.gpu_busy.run.samples > 0;
    let _ = writeln!(
        s,
        "| phase | seconds |{} host → device | device → host | kernels |\n|---|---|{}---|---|---|",
        if util { " GPU busy |" } else { "" },
        if util { "---|" } else { "" }
    );
    let phases = transfers.iter().map(|(k, v)| (k.as_str(), v));
    for (phase, p) in crate::timing::in_run_order(phases) {
        let bytes = |k: &str| format_bytes(p[k].as_u64().unwrap_or(0));
        let kernels = p["kernels"]
            .as_u64()
            .map_or("n/a".into(), |k| k.to_string());
        let secs = phase_seconds(phase).map_or("—".into(), |x| format!("{x:.2}"));
        let busy = match util {
            true => run
                .gpu_busy
                .in_phase(phase)
                .map_or(" n/a |".into(), |u| format!(" {u:.0}% |")),
            false => String::new(),
        };
        let _ = writeln!(
            s,
            "| {} | {secs} |{busy} {} | {} | {kernels} |",
            phase.replace('_', " "),
            bytes("host_to_device_bytes"),
            bytes("device_to_host_bytes")
        );
    }
    let _ = writeln!(s);
    compiles(s, run, transfers);
}

/// How many kernels the run compiled, by phase, and how many it loaded
/// from the kernel cache: a first run of a build spends its first
/// launches compiling (NVRTC on CUDA), a later run loads them. Nothing
/// where they were not counted (older logs).
fn compiles(s: &mut String, run: &RunData, transfers: &serde_json::Map<String, serde_json::Value>) {
    let Some((compiled, loaded)) = crate::events::fold::compiles(transfers) else {
        return;
    };
    let by_phase: Vec<String> =
        crate::timing::in_run_order(transfers.iter().map(|(k, v)| (k.as_str(), v)))
            .into_iter()
            .filter_map(|(p, v)| Some((p, v["compiled"].as_u64().filter(|n| *n > 0)?)))
            .map(|(p, n)| format!("{p} {n}"))
            .collect();
    let cache = run.kernel_cache().unwrap_or("off");
    let _ = write!(
        s,
        "The run compiled {compiled} kernels and loaded {loaded} from the kernel cache (`{cache}`)"
    );
    let _ = match by_phase.is_empty() {
        true => writeln!(s, ".\n"),
        false => writeln!(
            s,
            "; compiled by phase: {}. A later run of this build loads them instead.\n",
            by_phase.join(", ")
        ),
    };
    if let Some((n, bytes)) = run.kernel_cache_removed() {
        let _ = writeln!(
            s,
            "Before its first launch the run removed {} ({}), \
             the least recently used past the builds kept (`PRUNEMEM_KERNEL_CACHE_KEEP`, {} unless set).\n",
            crate::sinks::summary::older_builds(n),
            crate::units::format_bytes(bytes),
            crate::exec::kernel_cache::DEFAULT_KEEP
        );
    }
}

/// NVML's utilisation over the run (the log's readings), and the phase
/// that left the GPU idle longest: its seconds times the share of them
/// the GPU was not busy — where to look first when the GPU sits at 4%.
fn idle_gpu(s: &mut String, run: &RunData, seconds: impl Fn(&str) -> Option<f64>) {
    let busy = &run.gpu_busy;
    let Some(mean) = busy.run.percent() else {
        return;
    };
    let _ = write!(
        s,
        "NVML's GPU utilisation averaged {mean:.1}% over {} samples",
        busy.run.samples
    );
    match crate::events::fold::idlest(&busy.by_phase, seconds) {
        Some((phase, secs, u, idle)) => {
            let _ = writeln!(
                s,
                "; the GPU idled longest in `{phase}`: {secs:.2} s at {u:.0}% busy, about {idle:.2} s idle.\n"
            );
        }
        None => {
            let _ = writeln!(s, ".\n");
        }
    }
}

/// "Ranks": a distributed run's ranks side by side (`events::ranks`):
/// each rank's peaks and time in reductions, then per layer the slowest
/// rank, how much faster the fastest was, and the longest wait.
pub fn ranks(s: &mut String, run: &RunData) {
    let Some(ranks) = &run.ranks else { return };
    let _ = writeln!(
        s,
        "\n## Ranks\n\nEach rank's own log (rank 0 in this folder, rank R in `rank-R/`). Time in reductions includes waiting for the slowest rank.\n"
    );
    let _ = writeln!(
        s,
        "| rank | status | peak RSS | device peak | wall s | s in reductions | bytes reduced |\n|---|---|---|---|---|---|---|"
    );
    let bytes = |v: Option<u64>| v.map_or("n/a".to_string(), format_bytes);
    for r in ranks {
        let wait: f64 = r.layer_reduction_seconds.iter().sum();
        let moved: u64 = r.layer_reduced_bytes.iter().sum();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {wait:.3} | {} |",
            r.rank,
            r.status.as_deref().unwrap_or("no summary"),
            bytes(r.rss_peak),
            bytes(r.device_peak),
            r.wall_s.map_or("n/a".into(), |w| format!("{w:.1}")),
            format_bytes(moved)
        );
    }
    let layers = crate::events::ranks::layers(ranks);
    if layers.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "\n| layer | slowest rank | its seconds | fastest rank's | longest wait in reductions | bytes rank 0 moved |\n|---|---|---|---|---|---|"
    );
    for l in layers {
        let _ = writeln!(
            s,
            "| {} | {} | {:.3} | {:.3} | {:.3} | {} |",
            l.layer,
            l.slowest_rank,
            l.slowest_s,
            l.fastest_s,
            l.max_wait_s,
            format_bytes(l.bytes)
        );
    }
}

/// "By category": each estimated phase's prediction beside the measured
/// heap composition at the phase's peak, one row per category, one
/// "predicted / measured" cell per phase (`estimate::against`).
pub fn estimate_categories(s: &mut String, phases: &[against::PhaseCheck]) {
    let cats = against::phase_categories(phases);
    let measured = phases
        .iter()
        .any(|p| p.categories.iter().any(|c| c.measured.is_some()));
    if cats.is_empty() || !measured {
        return;
    }
    let _ = writeln!(
        s,
        "\nBy category at each phase's peak, predicted / measured (measured runtime is the rest of the phase's measured peak: on the CPU backend the runtime tag, untagged and small allocations, and resident memory that is not heap; on a device, the pool's untagged intermediates):\n"
    );
    let names: Vec<&str> = phases.iter().map(|p| p.phase.as_str()).collect();
    let _ = writeln!(s, "| category | {} |", names.join(" | "));
    let _ = writeln!(s, "|---|{}", "---|".repeat(phases.len()));
    for c in cats {
        let cells: Vec<String> = phases.iter().map(|p| p.cell(c)).collect();
        let _ = writeln!(s, "| {} | {} |", c.name(), cells.join(" | "));
    }
}

/// "Projection to GPU": this run's method and settings, on its own model and
/// on LLaMA 7B, in f16 with CUDA, against `gpu`'s usable memory; when it
/// does not fit, the longest seqlen and largest batch that do.
pub fn gpu(s: &mut String, run: &RunData, gpu: &catalog::Gpu) {
    let Some(plan) = &run.plan else {
        let _ = writeln!(
            s,
            "\n## Projection to {}\n\nn/a: the log has no plan to project.",
            gpu.name
        );
        return;
    };
    let usable = gpu.usable();
    let Ok(rows) = projection::rows(plan, Some(usable)) else {
        return;
    };
    let _ = writeln!(
        s,
        "\n## Projection to {}\n\n{} has {} usable ({} total, less {} for the CUDA context). The same method and settings in f16 with CUDA (prunemem's engine):\n",
        gpu.name,
        gpu.name,
        format_bytes(usable),
        format_bytes(gpu.total()),
        format_bytes(gpu.context_mib << 20)
    );
    let _ = writeln!(
        s,
        "| model | estimated peak | fits | longest seqlen that fits | largest batch that fits |\n|---|---|---|---|---|"
    );
    for row in rows {
        let fits = if row.peak <= usable {
            format!("yes, {} to spare", format_bytes(usable - row.peak))
        } else {
            format!("no, {} short", format_bytes(row.peak - usable))
        };
        let show = |v: Option<u64>| v.map_or("none".into(), |v| v.to_string());
        let _ = writeln!(
            s,
            "| {} | {} | {fits} | {} | {} |",
            row.model,
            format_bytes(row.peak),
            show(row.limits.as_ref().and_then(|l| l.max_seqlen)),
            show(row.limits.as_ref().and_then(|l| l.max_batch_size)),
        );
    }
}
