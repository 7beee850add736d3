//! Why one step's profile and the epoch's peak disagree, from measured
//! bytes: the two approaches users take, computed on the same run's stage
//! snapshots, and the gap between them split by what the heap held at each
//! peak.
//!
//! - **One step** (a profiling script's view: a fresh optimizer, one
//!   micro-batch's forward and backward): the highest heap of step 1's
//!   first micro-batch, before any `step()` has created optimizer state,
//!   with a component breakdown from the heap readings around each phase
//!   (the first `step()` included, reported on its own).
//! - **Epoch peak** (`reset_peak_memory_stats()` at the epoch's start,
//!   `max_memory_allocated()` at its end): the highest heap of any stage
//!   window in the epoch. Stage windows tile the run, so nothing escapes.
//!
//! The gap is split by category (`memory::tag`) between the two peaks'
//! compositions, which sum to the heap exactly; what no named mechanism
//! covers (small allocations, untagged, runtime) is reported as
//! unexplained.
//!
//! On a device run (`--device wgpu|cuda`) every figure is the device
//! pool's instead of the heap's: bytes in use, the peaks the profiler saw
//! inside passes, and the pool's composition (`memory::held`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::events::stages;
use crate::memory::MemorySnapshot;

/// The heap at its highest in some span, and what it held then.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Peak {
    /// The stage whose window held the peak.
    pub stage: String,
    pub heap: u64,
    pub rss: Option<u64>,
    pub categories: BTreeMap<String, u64>,
}

/// Approach 1: one step's components, measured as differences of the heap
/// between the stages around each phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepBreakdown {
    /// The heap before the step: parameters, data, the runtime's heap.
    pub before: u64,
    /// Parameters (the weights category before the step).
    pub parameters: u64,
    /// Held after the forward, before the backward: the graph's saved
    /// activations, logits and loss.
    pub activations: i64,
    /// Held after the backward: the gradients.
    pub gradients: i64,
    /// Held after the optimizer step and zero-grad: the optimizer's state.
    pub optimizer_state: i64,
    /// The peak above the highest stage reading of the forward and
    /// backward: the backward's temporaries.
    pub temporaries: i64,
    /// The heap's highest during the first optimizer step, when the
    /// moments are created while the gradients still exist.
    pub optimizer_step_peak: Option<u64>,
    pub peak: Peak,
}

/// A named part of the gap.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Factor {
    pub name: String,
    pub bytes: i64,
    pub why: String,
}

/// Both approaches and the gap between them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gap {
    pub single_step: StepBreakdown,
    /// Per epoch: its peak.
    pub epochs: Vec<(usize, Peak)>,
    /// The highest epoch peak minus the single step's peak, split.
    pub gap: i64,
    pub factors: Vec<Factor>,
    /// What no named factor covers.
    pub unexplained: i64,
    /// Gradient bytes after the last micro-batch of step 1 minus after the
    /// first: does accumulation grow gradient memory? (None without it.)
    pub accumulation_growth: Option<i64>,
    /// RSS at the epoch peak's window minus the heap peak: what the
    /// allocator and runtime hold beyond live tensors (`memory_reserved`
    /// minus `max_memory_allocated`, roughly).
    pub reserve: Option<i64>,
    /// True when every figure is the device pool's, not the heap's.
    #[serde(default)]
    pub on_device: bool,
}

impl Gap {
    /// What the figures measure, in words: "heap" or "device pool".
    pub fn memory(&self) -> &'static str {
        match self.on_device {
            true => "device pool",
            false => "heap",
        }
    }
}

/// The memory a run computes in, as one snapshot read it: the device pool
/// on a device run (whose stage snapshots carry a device window), else the
/// heap.
struct Mem<'a>(&'a MemorySnapshot);

impl Mem<'_> {
    fn on_device(&self) -> bool {
        self.0.window_device_peak.is_some()
    }
    fn allocated(&self) -> Option<u64> {
        match self.on_device() {
            true => self.0.device_allocated,
            false => self.0.heap_allocated,
        }
    }
    fn window_peak(&self) -> Option<u64> {
        match self.on_device() {
            true => self.0.window_device_peak,
            false => self.0.window_heap_peak,
        }
    }
    fn categories(&self) -> &BTreeMap<String, u64> {
        match self.on_device() {
            true => &self.0.device_categories,
            false => &self.0.categories,
        }
    }
    fn window_categories(&self) -> &BTreeMap<String, u64> {
        match self.on_device() {
            true => &self.0.window_device_peak_categories,
            false => &self.0.window_peak_categories,
        }
    }
}

fn peak_of(s: &MemorySnapshot) -> Option<Peak> {
    let m = Mem(s);
    let heap = m.window_peak().or(m.allocated())?;
    let categories = if m.window_categories().is_empty() {
        m.categories().clone()
    } else {
        m.window_categories().clone()
    };
    Some(Peak {
        stage: s.label.clone(),
        heap,
        rss: s.window_rss_peak.or(s.rss),
        categories,
    })
}

fn highest<'a>(it: impl Iterator<Item = &'a MemorySnapshot>) -> Option<Peak> {
    it.filter_map(peak_of).max_by_key(|p| p.heap)
}

fn cat(p: &BTreeMap<String, u64>, names: &[&str]) -> i64 {
    names
        .iter()
        .map(|n| p.get(*n).copied().unwrap_or(0) as i64)
        .sum()
}

/// The analysis a finished training run recorded in its results.
pub fn from_results(results: &BTreeMap<String, serde_json::Value>) -> Option<Gap> {
    serde_json::from_value(results.get("training_gap")?.clone()).ok()
}

/// Analyses a training run's stage snapshots, in order. `None` when the
/// log has no complete first step.
pub fn analyze(stages_in_order: &[MemorySnapshot]) -> Option<Gap> {
    let find = |label: &str| stages_in_order.iter().find(|s| s.label == label);
    let heap = |label: &str| find(label).and_then(|s| Mem(s).allocated());
    let start = stages::epoch_start(1);
    let fwd = stages::micro_batch(1, 1, "forward");
    let bwd = stages::micro_batch(1, 1, "backward");
    let opt = stages::step_end(1, "optimizer_step");
    let zero = stages::step_end(1, "zero_grad");
    let before = heap(&start)?;
    let (h_fwd, h_bwd) = (heap(&fwd)?, heap(&bwd)?);
    let h_zero = heap(&zero)?;
    // A fresh optimizer: the forward and backward before the first step().
    let single = highest([&fwd, &bwd].iter().filter_map(|l| find(l)))?;
    let highest_reading = h_fwd.max(h_bwd);
    let parameters = find(&start)
        .and_then(|s| Mem(s).categories().get("weights").copied())
        .unwrap_or(0);
    let single_step = StepBreakdown {
        before,
        parameters,
        activations: h_fwd as i64 - before as i64,
        gradients: h_bwd as i64 - before as i64,
        optimizer_state: h_zero as i64 - before as i64,
        temporaries: single.heap as i64 - highest_reading as i64,
        optimizer_step_peak: find(&opt).and_then(peak_of).map(|p| p.heap),
        peak: single.clone(),
    };
    let epochs = epoch_peaks(stages_in_order);
    let top = epochs
        .iter()
        .map(|(_, p)| p)
        .max_by_key(|p| p.heap)?
        .clone();
    let (a, b) = (&top.categories, &single.categories);
    let delta = |names: &[&str]| cat(a, names) - cat(b, names);
    let factors = vec![
        Factor {
            name: "optimizer state".into(),
            bytes: delta(&["optimizer"]),
            why: "created by the first step(); a single step with a fresh optimizer holds none while its activations live".into(),
        },
        Factor {
            name: "gradients held during a forward".into(),
            bytes: delta(&["gradients"]),
            why: "with accumulation, the earlier micro-batches' gradients stay while the next micro-batch's graph is built".into(),
        },
        Factor {
            name: "activations and logits".into(),
            bytes: delta(&["activations", "logits"]),
            why: "the graph saved for the backward at the peak's moment (same batch: only the moment differs)".into(),
        },
        Factor {
            name: "weights".into(),
            bytes: delta(&["weights"]),
            why: "parameters, and an update's new copy while the step writes it".into(),
        },
    ];
    let gap = top.heap as i64 - single.heap as i64;
    let named: i64 = factors.iter().map(|f| f.bytes).sum();
    let accumulation_growth = accumulation_growth(stages_in_order);
    // RSS beyond the heap; a device pool's reserve is not this.
    let on_device = stages_in_order.iter().any(|s| Mem(s).on_device());
    let reserve = top
        .rss
        .filter(|_| !on_device)
        .map(|r| r as i64 - top.heap as i64);
    Some(Gap {
        single_step,
        epochs,
        gap,
        factors,
        unexplained: gap - named,
        accumulation_growth,
        reserve,
        on_device,
    })
}

/// Each epoch's peak: the highest stage window from its start stage to the
/// next epoch's.
pub fn epoch_peaks(stages_in_order: &[MemorySnapshot]) -> Vec<(usize, Peak)> {
    let mut out: Vec<(usize, Peak)> = Vec::new();
    let mut epoch = 0;
    let mut best: Option<Peak> = None;
    for s in stages_in_order {
        if let Some(e) = s
            .label
            .strip_prefix("epoch_")
            .and_then(|r| r.strip_suffix("_start"))
            .and_then(|n| n.parse::<usize>().ok())
        {
            if let Some(b) = best.take() {
                out.push((epoch, b));
            }
            epoch = e;
            continue;
        }
        if epoch == 0 || stages::parse_step(&s.label).is_none() {
            continue;
        }
        if let Some(p) = peak_of(s)
            && best.as_ref().is_none_or(|b| p.heap > b.heap)
        {
            best = Some(p);
        }
    }
    if let Some(b) = best {
        out.push((epoch, b));
    }
    out
}

/// Gradient bytes after step 1's last micro-batch minus after its first.
fn accumulation_growth(stages_in_order: &[MemorySnapshot]) -> Option<i64> {
    let grads = |label: String| {
        stages_in_order
            .iter()
            .find(|s| s.label == label)
            .map(|s| Mem(s).categories().get("gradients").copied().unwrap_or(0) as i64)
    };
    let k = stages_in_order
        .iter()
        .filter_map(|s| stages::parse_step(&s.label))
        .filter(|(step, mb, what)| *step == 1 && mb.is_some() && *what == "backward")
        .filter_map(|(_, mb, _)| mb)
        .max()?;
    if k < 2 {
        return None;
    }
    Some(
        grads(stages::micro_batch(1, k, "backward"))?
            - grads(stages::micro_batch(1, 1, "backward"))?,
    )
}
