//! What a finished prune prints: the `--json` line (the outcome, the
//! run's recorded results) and `check_sparsity`'s lines. Kept apart from
//! the job that produces the outcome.

use serde_json::{Value, json};

use super::config::PruneJob;
use super::prune::Outcome;
use crate::prune::engine;

/// The JSON line `prune --json` prints.
pub fn json_line(job: &PruneJob, o: &Outcome) -> Value {
    let layer_sparsity: Vec<f64> = o.prune.layers.iter().map(|l| l.sparsity()).collect();
    let fp32 = o.fp32_model_bytes;
    let s = &o.summary;
    let mut line = json!({
        "method": job.method.to_string(), "type": job.pattern.to_string(),
        "sparsity_target": job.sparsity, "sparsity": o.prune.sparsity(),
        "prune_seconds": o.prune.seconds, "wall_seconds": s.wall_s,
        "rss_peak": s.rss_peak, "heap_peak": s.heap_peak,
        "device": o.device, "dtype": job.dtype.name(),
        // On a device: cubecl's pool (bytes in use); on the CPU: the heap.
        "device_peak": s.device_peak,
        "perplexity": o.perplexity.as_ref().map(|p| p.perplexity),
        "eval_windows": o.perplexity.as_ref().map(|p| p.windows),
        "eval_seconds": o.perplexity.as_ref().map(|p| p.seconds),
        "eval_seqlen": o.perplexity.as_ref().map(|p| p.seqlen),
        "nsamples": job.nsamples, "resident": job.resident, "layer_sparsity": layer_sparsity,
        "fp32_model_bytes": fp32,
        "peak_over_fp32_model": s.rss_peak.map(|p| p as f64 / fp32.max(1) as f64),
        "dsnot": o.prune.dsnot(),
        "reallocation": o.prune.reallocation(),
        // Wanda's α-variant: each linear's α, in pruning order.
        "alpha": Some(o.prune.alphas()).filter(|a| !a.is_empty()),
        "save_format": job.save.as_ref().map(|_| job.save_format),
        "saved_bytes": o.saved_bytes,
        // Across MPI ranks: each rank's peak RSS, bytes moved in
        // reductions and seconds spent in them (absent for one process).
        "ranks": s.results.get("rank_rss_peaks").map(|peaks| json!({
            "rss_peaks": peaks,
            "reduced_bytes": s.results.get("rank_reduced_bytes"),
            "reduction_seconds": s.results.get("rank_reduction_seconds"),
        })),
        "layers": o.prune.layers.len(),
    });
    recorded_results(&mut line, s);
    line
}

/// The run's recorded results beside a `--json` line's own keys (prune's
/// and eval's).
pub(super) fn recorded_results(line: &mut Value, s: &crate::events::RunSummary) {
    for key in RESULTS_AS_THEY_ARE {
        line[key] = json!(s.results.get(key));
    }
}

/// The run's results `--json` prints as the run recorded them (`null`
/// where it has none): on a device the pool's reserved peak (what
/// nvidia-smi shows, less the context) and its phase, where the pruned
/// layers waited, bytes and kernels by phase, the attention kernel, which
/// of prunemem's kernels ran or handed work back, NVML's utilisation; and
/// the seconds by phase and by kind of work; GradProbe's, whether its layers
/// stayed on the device between its passes; OWL's, each layer's outlier
/// ratio and the sparsity it gave the layer.
const RESULTS_AS_THEY_ARE: [&str; 12] = [
    "device_reserved_peak",
    "device_reserved_peak_phase",
    "pruned_layers_kept",
    "gradprobe_layers",
    "transfers",
    "attention",
    "device_kernels",
    "gpu_util",
    "seconds_by_phase",
    "seconds_by_work",
    "owl_outlier_ratios",
    "owl_layer_sparsity",
];

/// What `check_sparsity` prints: each layer's sparsity, then the total.
pub fn sparsity_lines(outcome: &engine::PruneOutcome) -> String {
    let mut s = String::new();
    for l in &outcome.layers {
        s += &format!("layer {} sparsity {:.6}\n", l.index, l.sparsity());
    }
    s += &format!("sparsity sanity check {:.4}\n", outcome.sparsity());
    s
}
