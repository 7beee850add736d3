//! What a pruning run is asked to do ([`PruneConfig`]) and what pruning one
//! linear did ([`LinearReport`]): the contract between the layer-by-layer
//! engine and the code that prunes each linear, kept apart from both.

use super::dsnot::{DsnotOptions, DsnotReport};
use super::reallocation::ReallocationReport;
use super::{LayerMethod, Pattern};
use crate::model::ComputeDtype;

/// How to prune.
#[derive(Debug, Clone)]
pub struct PruneConfig {
    pub method: LayerMethod,
    pub sparsity: f64,
    pub pattern: Pattern,
    pub use_variant: bool,
    pub seqlen: usize,
    /// Windows per forward pass.
    pub batch_size: usize,
    pub dtype: ComputeDtype,
    /// SparseGPT dampening (fraction of the mean Hessian diagonal).
    pub percdamp: f64,
    /// SparseGPT column block size.
    pub blocksize: usize,
    /// RIA: the activation exponent `a` (0.5 in the paper).
    pub ria_a: f64,
    /// RIA, unstructured: per output row (Wanda's comparison group)
    /// instead of one threshold over the matrix.
    pub per_outneuron: bool,
    /// Per-layer sparsities (OWL); `None`: `sparsity` everywhere.
    pub layer_sparsity: Option<Vec<f64>>,
    /// DSnoT's mask refinement after the method's metric.
    pub dsnot: Option<DsnotOptions>,
    /// RIA, N:M: channel reallocation (`Some(lsa)`: with the assignment rounds).
    pub reallocation: Option<bool>,
    /// Keep the calibration activations in host memory between layers
    /// (`prune::activations`).
    pub offload_activations: bool,
}

impl PruneConfig {
    /// The sparsity of decoder layer `i`.
    pub fn sparsity_of(&self, i: usize) -> f64 {
        self.layer_sparsity
            .as_ref()
            .and_then(|v| v.get(i).copied())
            .unwrap_or(self.sparsity)
    }
}

/// What pruning one linear did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LinearReport {
    pub name: String,
    pub zeros: u64,
    pub params: u64,
    /// Wanda variant: the α found.
    pub alpha: Option<f64>,
    /// SparseGPT: the reconstruction error it reports.
    pub error: Option<f64>,
    /// DSnoT: cycles run and weights swapped (absent where it skipped).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dsnot: Option<DsnotReport>,
    /// RIA's channel reallocation: metric kept before and after.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reallocation: Option<ReallocationReport>,
}

impl LinearReport {
    /// `zeros` of `params` pruned in `name`, nothing else reported.
    pub fn counts(name: &str, zeros: u64, params: u64) -> Self {
        Self {
            name: name.to_string(),
            zeros,
            params,
            alpha: None,
            error: None,
            dsnot: None,
            reallocation: None,
        }
    }
}
