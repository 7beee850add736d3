//! What the layer-by-layer prune job and GradProbe's job share: the opened
//! model, what a method's device part hands back, and how a prune's and an
//! evaluation's results are recorded. Kept apart so that `prune` (which
//! dispatches to GradProbe) and `gradprobe` (which reports like every
//! prune) each depend on it and not on each other.

use serde_json::json;

use super::context::Run;
use crate::model::Checkpoint;
use crate::model::perplexity::Perplexity;
use crate::model::tokenizer::Tokenizer;
use crate::prune::engine;

/// The model, its tokenizer and the resolved window length.
pub(super) struct Opened {
    pub ckpt: Checkpoint,
    pub tok: Tokenizer,
    pub seqlen: usize,
}

/// What the method-specific part hands back.
pub(super) struct Pruned {
    pub prune: engine::PruneOutcome,
    pub perplexity: Option<Perplexity>,
}

/// Records per-layer results of a prune.
pub(super) fn layer_results(run: &mut Run, prune: &engine::PruneOutcome) {
    run.result("sparsity", prune.sparsity());
    run.result("prune_seconds", prune.seconds);
    let sparsity: Vec<f64> = prune.layers.iter().map(|l| l.sparsity()).collect();
    run.result("layer_sparsity", sparsity);
    if let Some(d) = prune.dsnot() {
        run.result("dsnot", json!(d));
    }
    if let Some(r) = prune.reallocation() {
        run.result("reallocation", json!(r));
    }
}

/// Records an evaluation's results.
pub(super) fn eval_results(run: &mut Run, r: &Perplexity) {
    run.result("perplexity", r.perplexity);
    run.result("eval_windows", r.windows);
    run.result("eval_seconds", r.seconds);
}
