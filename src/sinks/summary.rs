//! The `MEMORY USAGE SUMMARY` table printed when a run ends: one row per
//! stage with allocated, peak and RSS and their change since the previous
//! stage, then where each peak was reached — the table users of the Python
//! scripts write by hand.

use std::io::Write;

use crate::events::fold::RunFold;
use crate::events::{Event, EventSink, SinkError};
use crate::memory::MemorySnapshot;
use crate::units::{format_bytes, format_opt_bytes};

/// Collects the run's stages (through the shared fold) and renders the
/// summary table.
#[derive(Clone)]
pub struct StageTable {
    fold: RunFold,
}

impl Default for StageTable {
    fn default() -> Self {
        // The table needs stages and peaks, not the time series.
        Self {
            fold: RunFold::with_point_limit(2),
        }
    }
}

impl StageTable {
    pub fn push(&mut self, event: &Event) {
        self.fold.apply(event);
    }

    fn stages(&self) -> impl Iterator<Item = &MemorySnapshot> {
        self.fold.stages.iter().map(|r| &r.snapshot)
    }

    /// The rendered table.
    pub fn render(&self) -> String {
        let rule = "=".repeat(96);
        let mut out = format!("{rule}\nMEMORY USAGE SUMMARY\n{rule}\n");
        out += &format!(
            "{:<26} {:>12} {:>12} {:>12} {:>13} {:>13} {:>9}\n",
            "Checkpoint", "Allocated", "Peak", "RSS", "Δ Allocated", "Δ RSS", "Time"
        );
        out += &format!("{}\n", "-".repeat(96));
        let mut prev: Option<&MemorySnapshot> = None;
        for s in self.stages() {
            let delta = |now: Option<u64>, before: Option<u64>| match (now, before) {
                (Some(a), Some(b)) => crate::units::format_delta(a as i128 - b as i128),
                _ => "".to_string(),
            };
            let (d_alloc, d_rss) = match prev {
                Some(p) => (
                    delta(s.device_allocated, p.device_allocated),
                    delta(s.rss, p.rss),
                ),
                None => (String::new(), String::new()),
            };
            out += &format!(
                "{:<26} {:>12} {:>12} {:>12} {:>13} {:>13} {:>8.1}s\n",
                truncate(&s.label, 26),
                format_opt_bytes(s.device_allocated),
                format_opt_bytes(s.device_peak),
                format_opt_bytes(s.rss),
                d_alloc,
                d_rss,
                s.elapsed_s
            );
            prev = Some(s);
        }
        out += &format!("{}\n", "-".repeat(96));
        out += &self.peak_line("Peak allocated", |s| s.device_peak);
        out += &self.peak_line("Peak RSS", |s| s.rss_peak);
        if let Some((rss, t)) = self.fold.sampled_rss_peak {
            out += &format!(
                "{:<16} {} (highest sampled RSS, at {t:.1}s)\n",
                "Sampled RSS",
                format_bytes(rss)
            );
        }
        out += &format!(
            "{:<16} {}\n",
            "Peak GPU used",
            format_opt_bytes(self.fold.gpu.peak)
        );
        out += &self.device_lines();
        out
    }

    /// A device run's pool reserve, GPU utilisation and bus traffic by
    /// phase, from the run's results (nothing on the CPU).
    fn device_lines(&self) -> String {
        let Some(summary) = &self.fold.summary else {
            return String::new();
        };
        let r = &summary.results;
        let mut out = String::new();
        if let Some(b) = r.get("device_reserved_peak").and_then(|v| v.as_u64()) {
            out += &format!("{:<16} {}\n", "Peak reserved", format_bytes(b));
        }
        if let Some(line) = r.get("gpu_util").and_then(gpu_util_line) {
            out += &format!("{:<16} {line}\n", "GPU utilisation");
        }
        if let Some(k) = r.get("pruned_layers_kept").and_then(|v| v.as_str()) {
            out += &match k {
                "inline" => format!("{:<16} evaluated as pruned, none kept\n", "Pruned layers"),
                _ => format!("{:<16} on the {k}\n", "Pruned layers"),
            };
        }
        if let Some(k) = r.get("gradprobe_layers").and_then(|v| v.as_str()) {
            out += &format!("{:<16} {k} between the passes\n", "Probed layers");
        }
        if let Some(a) = r.get("attention") {
            let n = |k: &str| a[k].as_u64().unwrap_or(0);
            out += &match a["kernel"].as_str() {
                Some(k) if k != "fallback" => format!(
                    "{:<16} flash ({k}): {} fused, {} handed back to Burn's\n",
                    "Attention",
                    n("fused"),
                    n("fell_back")
                ),
                _ => format!("{:<16} Burn's separate kernels\n", "Attention"),
            };
        }
        if let Some(k) = r.get("device_kernels").and_then(|v| v.as_object()) {
            out += &kernels_line(k);
        }
        if let Some(t) = r.get("transfers").and_then(|v| v.as_object()) {
            out += &compiled_line(t, self.fold.kernel_cache()).unwrap_or_default();
            out += &removed_line(self.fold.kernel_cache_removed()).unwrap_or_default();
            out += "Bus traffic      phase: host→device / device→host / kernels\n";
            let phases = t.iter().map(|(k, v)| (k.as_str(), v));
            for (phase, p) in crate::timing::in_run_order(phases) {
                let bytes = |k: &str| format_bytes(p[k].as_u64().unwrap_or(0));
                let kernels = p["kernels"]
                    .as_u64()
                    .map_or("n/a".to_string(), |k| k.to_string());
                out += &format!(
                    "  {phase:<14} {} / {} / {kernels}\n",
                    bytes("host_to_device_bytes"),
                    bytes("device_to_host_bytes")
                );
            }
        }
        out
    }

    /// "Peak X: value (reached by stage Y)": the first stage whose running
    /// peak equals the final one, i.e. the peak happened after the stage
    /// before it.
    fn peak_line(&self, name: &str, get: impl Fn(&MemorySnapshot) -> Option<u64>) -> String {
        let stages: Vec<&MemorySnapshot> = self.stages().collect();
        let Some(final_peak) = stages.iter().filter_map(|s| get(s)).max() else {
            return format!("{name:<16} n/a\n");
        };
        let idx = stages
            .iter()
            .position(|s| get(s) == Some(final_peak))
            .unwrap_or(0);
        let place = match idx {
            0 => format!("by {}", stages[0].label),
            i => format!("between {} and {}", stages[i - 1].label, stages[i].label),
        };
        format!("{name:<16} {} ({place})\n", format_bytes(final_peak))
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('…');
        t
    }
}

/// Prints the summary table to a writer when the run finishes.
pub struct SummarySink {
    table: StageTable,
    out: Box<dyn Write + Send>,
    printed: bool,
}

impl SummarySink {
    pub fn new(out: Box<dyn Write + Send>) -> Self {
        Self {
            table: StageTable::default(),
            out,
            printed: false,
        }
    }
}

impl EventSink for SummarySink {
    fn on_event(&mut self, event: &Event) -> Result<(), SinkError> {
        self.table.push(event);
        if matches!(event, Event::RunFinished { .. }) && !self.printed {
            self.printed = true;
            let text = self.table.render();
            self.out
                .write_all(text.as_bytes())
                .and_then(|_| self.out.flush())
                .map_err(|source| SinkError::Io {
                    path: "summary".into(),
                    source,
                })?;
        }
        Ok(())
    }
    fn flush(&mut self) -> Result<(), SinkError> {
        self.out.flush().map_err(|source| SinkError::Io {
            path: "summary".into(),
            source,
        })
    }
}

/// prunemem's own device kernels: how many requests ran, and each kernel
/// that handed work back to Burn's ops by name (a silent slow path
/// otherwise).
fn kernels_line(k: &serde_json::Map<String, serde_json::Value>) -> String {
    let n = |v: &serde_json::Value, f: &str| v[f].as_u64().unwrap_or(0);
    let ran: u64 = k.values().map(|v| n(v, "ran")).sum();
    let back: Vec<String> = k
        .iter()
        .filter(|(_, v)| n(v, "fell_back") > 0)
        .map(|(name, v)| format!("{name} {}", n(v, "fell_back")))
        .collect();
    let back = match back.is_empty() {
        true => "none handed back to Burn's ops".to_string(),
        false => format!("handed back to Burn's ops: {}", back.join(", ")),
    };
    format!("{:<16} {ran} ran; {back}\n", "Own kernels")
}

/// How many kernels the run compiled and how many it loaded from the
/// kernel cache (`transfers`' `compiled` and `from_cache`, summed over the
/// phases): a first run of a build pays its compiles, which the next run
/// loads. `None` where they were not counted (older logs too).
pub fn compiled_line(
    transfers: &serde_json::Map<String, serde_json::Value>,
    cache: Option<&str>,
) -> Option<String> {
    let (compiled, loaded) = crate::events::fold::compiles(transfers)?;
    let where_ = match cache {
        Some("off") | None => "no kernel cache: every run compiles".to_string(),
        Some(dir) if compiled > 0 => format!("the next run loads them from {dir}"),
        Some(dir) => format!("kept in {dir}"),
    };
    Some(format!(
        "{:<16} {compiled} compiled, {loaded} loaded from the kernel cache ({where_})\n",
        "Kernels"
    ))
}

/// The older builds' kernel folders the run removed, least recently used
/// past `PRUNEMEM_KERNEL_CACHE_KEEP` (4 unless set); `None` where none.
pub fn removed_line(removed: Option<(usize, u64)>) -> Option<String> {
    let (n, bytes) = removed?;
    Some(format!(
        "{:<16} removed {} ({}), the least recently used (PRUNEMEM_KERNEL_CACHE_KEEP: how many builds are kept)\n",
        "",
        older_builds(n),
        format_bytes(bytes)
    ))
}

/// "1 older build's kernel folder", "2 older builds' kernel folders".
pub fn older_builds(n: usize) -> String {
    match n {
        1 => "1 older build's kernel folder".into(),
        n => format!("{n} older builds' kernel folders"),
    }
}

/// `gpu_util`'s line: the mean over the run, then each phase's in the
/// order the run went through them ("38.7% mean over 120 samples; by
/// phase: load_layer 5%, prune 41%, eval 85%"); `None` without a mean.
pub fn gpu_util_line(u: &serde_json::Value) -> Option<String> {
    let mean = u["mean_percent"].as_f64()?;
    let n = u["samples"].as_u64().unwrap_or(0);
    let mut line = format!("{mean:.1}% mean over {n} samples");
    if let Some(by) = u["by_phase"].as_object() {
        let phases: Vec<String> =
            crate::timing::in_run_order(by.iter().map(|(k, v)| (k.as_str(), v)))
                .into_iter()
                .filter_map(|(p, v)| Some(format!("{p} {:.0}%", v["mean_percent"].as_f64()?)))
                .collect();
        if !phases.is_empty() {
            line += &format!("; by phase: {}", phases.join(", "));
        }
    }
    Some(line)
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_kernels_line_sums_compiles_and_cache_loads() {
        let t = serde_json::json!({
            "load_layer": {"kernels": 3, "compiled": 2, "from_cache": 0},
            "prune": {"kernels": 90, "compiled": 11, "from_cache": 4},
        });
        let t = t.as_object().unwrap();
        assert_eq!(
            compiled_line(t, Some("/c/k/0.1.0-ab")).unwrap(),
            "Kernels          13 compiled, 4 loaded from the kernel cache (the next run loads them from /c/k/0.1.0-ab)\n"
        );
        assert!(
            compiled_line(t, Some("off"))
                .unwrap()
                .contains("no kernel cache: every run compiles")
        );
        let warm = serde_json::json!({"prune": {"compiled": 0, "from_cache": 15}});
        assert!(
            compiled_line(warm.as_object().unwrap(), Some("/c"))
                .unwrap()
                .contains("0 compiled, 15 loaded from the kernel cache (kept in /c)")
        );
        // An older log, or launches not counted: no line.
        let old = serde_json::json!({"prune": {"kernels": 90}});
        assert!(compiled_line(old.as_object().unwrap(), None).is_none());
        assert_eq!(
            super::removed_line(Some((2, 3 << 20))).unwrap(),
            "                 removed 2 older builds' kernel folders (3.000 MiB), the least recently used (PRUNEMEM_KERNEL_CACHE_KEEP: how many builds are kept)\n"
        );
        assert!(super::removed_line(None).is_none());
        assert_eq!(super::older_builds(1), "1 older build's kernel folder");
    }

    #[test]
    fn the_utilisation_line_gives_each_phase_in_run_order() {
        let u = serde_json::json!({
            "mean_percent": 38.66,
            "samples": 120,
            "by_phase": {
                "prune": {"mean_percent": 41.2, "samples": 30},
                "eval": {"mean_percent": 85.0, "samples": 8},
                "other": {"mean_percent": 0.0, "samples": 2},
                "load_layer": {"mean_percent": 4.6, "samples": 80},
            },
        });
        assert_eq!(
            gpu_util_line(&u).unwrap(),
            "38.7% mean over 120 samples; by phase: load_layer 5%, prune 41%, eval 85%, other 0%"
        );
        // A watched script's: the mean alone; no mean, no line.
        let watched = serde_json::json!({"mean_percent": 12.0, "samples": 4});
        assert_eq!(
            gpu_util_line(&watched).unwrap(),
            "12.0% mean over 4 samples"
        );
        assert!(gpu_util_line(&serde_json::json!({"samples": 0})).is_none());
    }

    use super::*;
    use crate::units::MIB;

    fn stage(label: &str, alloc: u64, peak: u64, rss: u64) -> Event {
        Event::Stage {
            snapshot: MemorySnapshot {
                label: label.into(),
                device_allocated: Some(alloc * MIB),
                device_peak: Some(peak * MIB),
                rss: Some(rss * MIB),
                rss_peak: Some(rss * MIB),
                ..Default::default()
            },
        }
    }

    #[test]
    fn table_has_rows_deltas_and_peak_location() {
        let mut t = StageTable::default();
        t.push(&stage("01_start", 10, 10, 50));
        t.push(&stage("02_model_loaded", 500, 520, 600));
        t.push(&stage("03_before_pruning", 600, 900, 700));
        t.push(&stage("09_end", 100, 900, 400));
        let text = t.render();
        assert!(text.contains("MEMORY USAGE SUMMARY"));
        assert!(text.contains("02_model_loaded"));
        assert!(text.contains("+490.0 MiB"), "{text}");
        assert!(text.contains("-500.0 MiB"), "{text}");
        assert!(
            text.contains(
                "Peak allocated   900.0 MiB (between 02_model_loaded and 03_before_pruning)"
            ),
            "{text}"
        );
        assert!(text.contains("Peak GPU used    n/a"));
    }

    #[test]
    fn a_kernel_handing_work_back_is_named() {
        let k = serde_json::json!({
            "swiglu": {"ran": 10, "fell_back": 0},
            "norms": {"ran": 4, "fell_back": 3},
        });
        let line = kernels_line(k.as_object().unwrap());
        assert_eq!(
            line,
            "Own kernels      14 ran; handed back to Burn's ops: norms 3\n"
        );
        let k = serde_json::json!({"swiglu": {"ran": 2, "fell_back": 0}});
        let line = kernels_line(k.as_object().unwrap());
        assert!(
            line.ends_with("2 ran; none handed back to Burn's ops\n"),
            "{line}"
        );
    }
}
