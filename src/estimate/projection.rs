//! A measured run projected onto a GPU: the same method and settings, run
//! by prunemem's engine with CUDA in f16, streamed one layer at a time (as
//! prunemem runs on a GPU), on the run's own model and on LLaMA 7B. The one
//! place reports turn a run into a GPU estimate.

use super::fit::{self, FitLimits};
use super::{Arch, Device, EstimateError, Workload, against, estimate, presets};
use crate::events::RunPlan;
use crate::model::ComputeDtype;

/// The run's workload as it would run on a GPU.
pub fn cuda_workload(plan: &RunPlan) -> Result<(Arch, Workload), EstimateError> {
    let (arch, mut w) = against::workload_of(plan)?;
    w.device = Device::Cuda;
    w.dtype = ComputeDtype::F16;
    w.stored_bytes = 2;
    w.resident = false;
    Ok((arch, w))
}

/// One model's projected peak, and what fits in a budget when one is given.
#[derive(Debug, Clone)]
pub struct Row {
    pub model: String,
    pub peak: u64,
    /// Longest seqlen and largest batch within the budget.
    pub limits: Option<FitLimits>,
}

/// The run's model, then LLaMA 7B, projected onto a GPU with `budget` bytes
/// usable (no limits without one).
pub fn rows(plan: &RunPlan, budget: Option<u64>) -> Result<Vec<Row>, EstimateError> {
    let (arch, w) = cuda_workload(plan)?;
    let mut models = vec![(arch.name.clone(), arch)];
    if let Ok(llama) = presets::load("llama-7b") {
        models.push(("LLaMA 7B".into(), llama));
    }
    let mut out = Vec::new();
    for (name, a) in models {
        let Ok(e) = estimate(&a, &w) else { continue };
        out.push(Row {
            model: name,
            peak: e.peak(),
            limits: budget.and_then(|b| fit::limits(&a, &w, b).ok()),
        });
    }
    Ok(out)
}
