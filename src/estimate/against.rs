//! Estimates checked against measured runs: `prunemem estimate --against
//! LOGDIR` reads a finished run's `events.jsonl`, rebuilds its workload from
//! the plan, estimates it, and sets each phase's prediction beside the peak
//! the profiler measured in that phase.
//!
//! A phase spans two stage snapshots (`03_before_pruning` →
//! `04_after_pruning`). Its measured peak is the shared fold's peak between
//! them ([`RunFold::peak_between`]): every snapshot inside the phase, and the
//! kernel's high-water mark when it rose during it.
//!
//! Each phase is also compared category by category (`memory::tag`): the
//! estimator's components grouped by category against what the heap was made
//! of at the phase's heap peak ([`RunFold::categories_at_peak_between`]).
//! The measured "runtime" row is the rest of the phase's measured peak — the
//! runtime tag, untagged and small allocations, and everything resident that
//! is not heap (binary, stacks, arenas) — so both columns sum to their
//! phase's totals.
//!
//! What the comparison showed when it was first run (grid and SmolLM2,
//! 2026-11-23): weights, calibration buffers and logits match to the byte;
//! the forward's activations are measured one MLP-wide buffer above the
//! prediction (heap holds `T·(2h + 3i)`: burn-flex zero-allocates matmul
//! outputs whose pages are never touched, heap but not resident), and the
//! measured runtime is lower by about as much, so the phase totals (RSS)
//! still agree; the tokenizer's per-word buffers are small allocations, so
//! while text is tokenised they count as runtime, not tokenizer.

use std::path::Path;

use serde::Serialize;

use std::collections::BTreeMap;

use super::{
    Arch, Device, Engine, Estimate, EstimateError, Optimizer, Phase, Task, Workload, estimate,
};
use crate::events::fold::RunFold;
use crate::events::{Event, RunPlan, logdir};
use crate::memory::tag::Category;
use crate::model::ComputeDtype;
use crate::units::format_bytes;

/// Reads every event of a log folder's `events.jsonl` (a torn last line is
/// skipped).
pub fn read_events(dir: &Path) -> Result<Vec<Event>, EstimateError> {
    logdir::read_events(dir)
        .map(|log| log.events)
        .map_err(|e| EstimateError::Invalid(e.to_string()))
}

/// The workload a run's plan describes.
pub fn workload_of(plan: &RunPlan) -> Result<(Arch, Workload), EstimateError> {
    let model = plan
        .model
        .as_ref()
        .ok_or_else(|| EstimateError::Invalid("the run's plan names no model".into()))?;
    let arch = Arch::from_model_info(model);
    let task: Task = match plan.command.as_str() {
        "eval" => Task::Inference,
        _ => plan
            .method
            .as_deref()
            .ok_or_else(|| EstimateError::Invalid("the run's plan names no method".into()))?
            .parse()
            .map_err(EstimateError::Invalid)?,
    };
    let get = |k: &str| plan.settings.get(k);
    let num = |k: &str, default: u64| get(k).and_then(|v| v.as_u64()).unwrap_or(default);
    let mut w = Workload::new(task);
    w.engine = Engine::Prunemem;
    if let Some(b) = plan.host.matmul_workspace {
        w.matmul_workspace = b;
    }
    w.device = if plan.device.starts_with("cuda") {
        Device::Cuda
    } else if plan.device.starts_with("wgpu") {
        Device::Wgpu
    } else {
        Device::Cpu
    };
    w.dtype = get("dtype")
        .and_then(|v| v.as_str())
        .and_then(|s| s.parse::<ComputeDtype>().ok())
        .unwrap_or(ComputeDtype::F32);
    w.stored_bytes = match model.stored_dtype.as_str() {
        "f16" | "bf16" => 2,
        _ => 4,
    };
    w.nsamples = num("nsamples", 128);
    w.seqlen = num("seqlen", 2048);
    w.batch_size = num("batch_size", 8);
    w.resident = get("resident").and_then(|v| v.as_bool()).unwrap_or(false);
    w.eval_dense = get("eval_dense").and_then(|v| v.as_bool()).unwrap_or(false);
    // What the pre-flight check expected; a finished run's results replace
    // them (`compare`).
    w.eval_windows = num("expected_eval_windows", 0);
    w.text_bytes = num("expected_text_bytes", 0);
    w.tokenizer = get("tokenizer").and_then(|v| serde_json::from_value(v.clone()).ok());
    w.sparsity = get("sparsity").and_then(|v| v.as_f64()).unwrap_or(0.5);
    method_options(&mut w, &plan.settings);
    training_options(&mut w, &plan.settings);
    kernels(&mut w, &plan.settings);
    // Where the pruned layers would wait, as asked (`keep_pruned`; logs
    // from before it name none: none ran inline on the CPU). A finished
    // run's `pruned_layers_kept` replaces it (`compare`).
    w.eval_inline = match get("keep_pruned").and_then(|v| v.as_str()) {
        Some("inline") => w.can_evaluate_inline(),
        Some("auto") => w.inline_by_default(&arch),
        _ => false,
    };
    Ok((arch, w))
}

/// A run plan's settings, by name.
type Settings = BTreeMap<String, serde_json::Value>;

/// The pruning method's options a plan records (GradProbe's batches and
/// embeddings, OWL, DSnoT, the N:M pattern, RIA's reallocation).
fn method_options(w: &mut Workload, settings: &Settings) {
    let get = |k: &str| settings.get(k);
    let flag = |name: &str| get(name).and_then(|v| v.as_bool()).unwrap_or(false);
    w.num_batches = get("num_batches").and_then(|v| v.as_u64()).unwrap_or(1);
    w.include_embeddings = flag("include_embeddings");
    w.owl = get("owl_lambda").is_some();
    w.dsnot = get("dsnot_max_cycles").is_some();
    let pattern = get("sparsity_type").and_then(|v| v.as_str()).unwrap_or("");
    w.nm = pattern.contains(':');
    if let Ok(crate::prune::Pattern::NM { m, .. }) = pattern.parse::<crate::prune::Pattern>() {
        w.group = m as u64;
    }
    w.dsnot_skip = get("dsnot_skip")
        .and_then(|v| v.as_str())
        .and_then(|v| v.parse().ok())
        .unwrap_or(crate::prune::dsnot::DsnotSkip::Mlp);
    w.reallocation = w.nm && flag("reallocation");
    w.lsa = w.reallocation && flag("lsa");
    w.use_variant = !w.nm && flag("use_variant");
}

/// A training run's options (`prunemem train`).
fn training_options(w: &mut Workload, settings: &Settings) {
    let get = |k: &str| settings.get(k);
    w.grad_accum = get("grad_accum").and_then(|v| v.as_u64()).unwrap_or(1);
    w.optimizer = match get("optimizer").and_then(|v| v.as_str()) {
        Some("sgd") if get("momentum").and_then(|v| v.as_f64()).unwrap_or(0.0) == 0.0 => {
            Optimizer::Sgd
        }
        _ => Optimizer::AdamW,
    };
    w.checkpointing = get("checkpointing")
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
    w.trainable_params = get("trainable_params").and_then(|v| v.as_u64());
    w.first_trainable_layer = get("first_trainable_layer")
        .and_then(|v| v.as_u64())
        .unwrap_or(0);
    w.offload_activations = get("offload_activations")
        .and_then(|v| v.as_bool())
        .unwrap_or(false);
}

/// Which of prunemem's kernels the run used, and where its work ran.
fn kernels(w: &mut Workload, settings: &Settings) {
    let get = |k: &str| settings.get(k);
    let setting = |name: &str| get(name).and_then(|v| v.as_str());
    // Logs from before the flash kernel name none: Burn's attention ran.
    w.fused_attention = setting("attention").is_some_and(|n| n != "fallback");
    // Logs from before a kernel name none: Burn's ops ran. The SwiGLU's
    // kernel wrote a new tensor (`kernel`) before it wrote over the gate
    // (`in_place`).
    let kernel = |name: &str| matches!(setting(name), Some("kernel" | "in_place"));
    w.swiglu_kernel = kernel("swiglu");
    w.swiglu_in_place = setting("swiglu") == Some("in_place");
    w.norms_kernel = kernel("norms");
    w.rms_norm_kernel = kernel("rms_norm");
    // Logs from before the one-launch loop name none: Burn's ops ran.
    w.dsnot_kernel = kernel("dsnot");
    w.embedding_rows = setting("embedding") == Some("rows");
    w.factor_on_device = setting("factor") == Some("device");
    w.saliency_on_device = setting("dsnot_saliency") == Some("device");
}

/// One phase: predicted vs measured, in total and by category.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseCheck {
    pub phase: String,
    pub predicted: u64,
    pub measured: Option<u64>,
    /// (predicted - measured) / measured, in percent.
    pub error_percent: Option<f64>,
    /// Per category, in display order; empty for the whole-run row.
    pub categories: Vec<CategoryCheck>,
}

/// One category of one phase.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CategoryCheck {
    pub category: Category,
    pub predicted: u64,
    /// `None` when the log has no categories (older logs, Python CSVs).
    pub measured: Option<u64>,
}

/// Predicted vs measured per category for `phase`, whose measured peak is
/// `total`; `heap` is the heap's composition at the phase's heap peak.
pub fn categories(
    phase: &Phase,
    heap: Option<&BTreeMap<String, u64>>,
    total: Option<u64>,
) -> Vec<CategoryCheck> {
    let measured = match (heap, total) {
        (Some(heap), Some(total)) => Some(measured_by_category(heap, total)),
        _ => None,
    };
    let predicted = phase.by_category();
    let mut cats: Vec<Category> = predicted.iter().map(|(c, _)| *c).collect();
    if let Some(m) = &measured {
        cats.extend(m.iter().filter(|(_, b)| **b > 0).map(|(c, _)| *c));
    }
    sort_for_display(&mut cats);
    cats.into_iter()
        .map(|c| CategoryCheck {
            category: c,
            predicted: predicted
                .iter()
                .find(|(k, _)| *k == c)
                .map_or(0, |(_, b)| *b),
            measured: measured.as_ref().map(|m| m.get(&c).copied().unwrap_or(0)),
        })
        .collect()
}

/// A measured peak of `total` bytes by category: the named categories of the
/// heap's composition `heap` as measured, and `Runtime` the rest of `total`
/// (the runtime tag, untagged and small allocations, resident memory that
/// is not heap).
pub fn measured_by_category(heap: &BTreeMap<String, u64>, total: u64) -> BTreeMap<Category, u64> {
    let mut out: BTreeMap<Category, u64> = heap
        .iter()
        .filter_map(|(name, bytes)| Some((Category::from_name(name)?, *bytes)))
        .filter(|(c, _)| !matches!(c, Category::Runtime | Category::Untagged))
        .collect();
    let named: u64 = out.values().sum();
    out.insert(Category::Runtime, total.saturating_sub(named));
    out
}

/// Every category any of `phases` names, in display order.
pub fn phase_categories(phases: &[PhaseCheck]) -> Vec<Category> {
    let mut cats: Vec<Category> = phases
        .iter()
        .flat_map(|p| p.categories.iter().map(|c| c.category))
        .collect();
    sort_for_display(&mut cats);
    cats
}

fn sort_for_display(cats: &mut Vec<Category>) {
    cats.sort_by_key(|c| crate::memory::tag::order(c.name()));
    cats.dedup();
}

impl PhaseCheck {
    /// "predicted / measured" for category `c` ("n/a" when not measured),
    /// "—" when the phase has no such category.
    pub fn cell(&self, c: Category) -> String {
        match self.categories.iter().find(|k| k.category == c) {
            Some(k) => format!(
                "{} / {}",
                format_bytes(k.predicted),
                k.measured.map_or("n/a".into(), format_bytes)
            ),
            None => "—".into(),
        }
    }
}

/// A run's estimate and the comparison per phase, plus the whole-run peak.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub estimate: Estimate,
    pub phases: Vec<PhaseCheck>,
    pub peak: PhaseCheck,
    /// A device run: the pool's reserved peak, predicted against measured.
    pub reserved: Option<PhaseCheck>,
}

fn check(phase: &str, predicted: u64, measured: Option<u64>) -> PhaseCheck {
    PhaseCheck {
        phase: phase.to_string(),
        predicted,
        measured,
        error_percent: measured
            .filter(|m| *m > 0)
            .map(|m| 100.0 * (predicted as f64 - m as f64) / m as f64),
        categories: Vec::new(),
    }
}

/// A distributed run's ranks against the estimate of one rank's peak
/// (`estimate --ranks`: the busiest rank's share of the windows), each
/// rank's measured peak from its own log: the device pool on a device run,
/// else the RSS.
pub fn rank_checks(cmp: &Comparison, ranks: &[crate::events::ranks::RankRun]) -> Vec<PhaseCheck> {
    let on_device = cmp.estimate.workload.device.is_gpu();
    ranks
        .iter()
        .map(|r| {
            let measured = match on_device {
                true => r.device_peak,
                false => r.rss_peak,
            };
            check(
                &format!("rank {} peak", r.rank),
                cmp.peak.predicted,
                measured,
            )
        })
        .collect()
}

/// GradProbe's `--iterative` steps as the run's results record them: how
/// many, the last one's target sparsity and the sparsity the steps before
/// it reached (0 for one step); `None` for a run that did not iterate.
fn iterations(run: &RunFold) -> Option<(usize, f64, f64)> {
    let steps = run
        .summary
        .as_ref()?
        .results
        .get("iterations")?
        .as_array()?;
    let target = steps.last()?.get("target")?.as_f64()?;
    let earlier = (steps.len().checked_sub(2))
        .and_then(|i| steps[i].get("sparsity")?.as_f64())
        .unwrap_or(0.0);
    Some((steps.len(), target, earlier))
}

/// Estimates a finished run and compares.
pub fn compare(events: &[Event]) -> Result<Comparison, EstimateError> {
    let run = RunFold::of(events);
    let plan = run
        .plan
        .as_ref()
        .ok_or_else(|| EstimateError::Invalid("the log has no run_started event".into()))?;
    let (arch, mut workload) = workload_of(plan)?;
    if let Some(s) = &run.summary {
        if let Some(n) = s.results.get("eval_windows").and_then(|v| v.as_u64()) {
            workload.eval_windows = n;
        }
        if let Some(n) = s.results.get("text_bytes").and_then(|v| v.as_u64()) {
            workload.text_bytes = n;
        }
        let kept = s.results.get("pruned_layers_kept").and_then(|v| v.as_str());
        workload.kept_on_device = kept == Some("device");
        workload.eval_inline = kept == Some("inline");
        workload.probe_layers_on_device =
            s.results.get("gradprobe_layers").and_then(|v| v.as_str()) == Some("device");
    }
    let steps = iterations(&run);
    if let Some((_, target, earlier)) = steps {
        workload.sparsity = target;
        workload.earlier_sparsity = earlier;
        workload.iterative = true;
    }
    let mut est = estimate(&arch, &workload)?;
    // An iterating run repeats its stages once a step: its phases are its
    // last step's, the largest target's.
    let run = match steps {
        Some((n, target, earlier)) => {
            est.notes.push(format!(
                "an --iterative run of {n} steps: its phases are compared on its last step \
                 (target sparsity {target:.3}), with the positions the steps before it pruned \
                 (sparsity {earlier:.3}) held throughout"
            ));
            run.last_of_each_stage()
        }
        None => run,
    };
    // A device run is compared on the device: cubecl's pool, and its
    // composition by category (`memory::held`).
    let on_device = workload.device.is_gpu();
    let phases = est
        .phases
        .iter()
        .map(|p| {
            let (measured, heap) = match (p.stages.first(), p.stages.last()) {
                (Some(a), Some(b)) if on_device => (
                    run.device_peak_between(a, b),
                    run.device_categories_at_peak_between(a, b),
                ),
                (Some(a), Some(b)) => {
                    (run.peak_between(a, b), run.categories_at_peak_between(a, b))
                }
                _ => (None, None),
            };
            PhaseCheck {
                categories: categories(p, heap.as_ref(), measured),
                ..check(&p.name, p.total(), measured)
            }
        })
        .collect();
    let measured_peak = run.summary.as_ref().and_then(|s| match on_device {
        true => s.device_peak,
        false => s.rss_peak,
    });
    let peak = check("peak", est.peak(), measured_peak);
    let reserved = est.device_pool.as_ref().map(|pool| {
        let measured = run.summary.as_ref().and_then(|s| {
            s.results
                .get("device_reserved_peak")
                .and_then(|v| v.as_u64())
        });
        check("reserved peak", pool.reserved, measured)
    });
    Ok(Comparison {
        estimate: est,
        phases,
        peak,
        reserved,
    })
}
