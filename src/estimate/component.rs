//! What an estimate is made of: named amounts of memory, each in the
//! measured category (`memory::tag`) its buffers are allocated under, so
//! that `estimate --against` compares predictions and measurements
//! category by category.

use serde::Serialize;

use crate::memory::tag::Category;

/// One named amount of memory, and the measured category
/// (`memory::tag`) it belongs to, so predictions and measurements compare
/// category by category.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Component {
    pub name: String,
    pub category: Category,
    pub bytes: u64,
}

/// The category of an estimator component, by its name: the buffers the
/// name describes and the tag the engine holds while it allocates them
/// (`prune::engine`, `model::perplexity`, `model::checkpoint`). Runtime takes
/// what is not the heap (binary, stacks, arenas, CUDA context) and the base
/// heap.
pub fn category_of(name: &str) -> Category {
    let has = |k: &str| name.contains(k);
    let activations = ["activation", "calibration", "hidden", "rotary", "KV cache"];
    if has("runtime") || has("CUDA context") || has("workspace") || has("reserve") {
        Category::Runtime
    } else if has("text and tokens") || has("tokenizer") {
        Category::Tokenizer
    } else if has("optimizer") {
        Category::Optimizer
    } else if has("logit") {
        Category::Logits
    } else if has("maxima") || has("statistic") || has("OBS") {
        Category::Statistics
    } else if has("gradient") || has("backward") {
        Category::Gradients
    } else if has("mask") || has("positions") || has("pruning transient") {
        Category::Masks
    } else if has("weight") || has("embedding") || has("load") || has("saved values") {
        Category::Weights
    } else if activations.map(has).contains(&true) {
        Category::Activations
    } else {
        Category::Untagged
    }
}
