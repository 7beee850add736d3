//! The stage catalogue: every stage, scope and sample label a prunemem run
//! writes, named once.
//!
//! Stage names are part of the log format: `memory_log.csv` rows, the
//! estimator's phases, reports that align two runs and the Python scripts
//! whose logs we read all match on them. Engines take their labels from
//! here, and readers match on the same constants, so a rename is one edit
//! and a typo is a compile error. The numbered names follow the reference
//! scripts (Wanda's `01_start` … `09_end`; GradProbe's profiling script's
//! `00_initial` … `21_end`) so logs compare row by row.

/// The label of a background sample (not a stage).
pub const SAMPLE: &str = "sample";

// Sequential pruning (magnitude, Wanda, SparseGPT) and `eval`.
pub const START: &str = "01_start";
/// `prune --eval-dense`: the unpruned model evaluated before anything else.
pub const BEFORE_DENSE_EVAL: &str = "00_before_dense_eval";
pub const AFTER_DENSE_EVAL: &str = "00_after_dense_eval";
pub const MODEL_LOADED: &str = "02_model_loaded";
pub const BEFORE_PRUNING: &str = "03_before_pruning";
pub const AFTER_PRUNING: &str = "04_after_pruning";
pub const BEFORE_EVAL: &str = "05_before_eval";
pub const AFTER_EVAL: &str = "06_after_eval";
pub const BEFORE_SAVE: &str = "07_before_save_model";
pub const AFTER_SAVE: &str = "08_after_save_model";
pub const END: &str = "09_end";

// GradProbe, as its profiling script names them.
pub const GP_INITIAL: &str = "00_initial";
pub const GP_MODEL_LOADED: &str = "01_model_loaded";
pub const GP_DATA_PREPARED: &str = "02_data_prepared";
pub const GP_SAVED_TENTATIVE: &str = "04_saved_tentative_values";
pub const GP_ORIGINAL_GRADIENTS: &str = "08_original_gradients_computed";
pub const GP_TENTATIVE_MASKS: &str = "09_tentative_masks_created";
pub const GP_WEIGHTS_REDUCED: &str = "10_weights_reduced";
pub const GP_MODIFIED_GRADIENTS: &str = "14_modified_gradients_computed";
pub const GP_FINAL_MASKS: &str = "15_final_masks_computed";
pub const GP_PRUNING_APPLIED: &str = "16_final_pruning_applied";
pub const GP_BEFORE_EVAL: &str = "17_before_eval";
pub const GP_AFTER_EVAL: &str = "18_after_eval";
pub const GP_BEFORE_SAVE: &str = "19_before_save_model";
pub const GP_AFTER_SAVE: &str = "20_after_save_model";
pub const GP_END: &str = "21_end";

// `prunemem watch -- CMD`.
pub const WATCH_START: &str = "watch_start";
pub const WATCH_END: &str = "watch_end";

/// `prune --owl`: the dense pass measuring each layer's outliers, and
/// the stage when the per-layer sparsities are known.
pub const OWL_SCOPE: &str = "owl_outliers";
pub const OWL_RATIOS: &str = "03a_owl_ratios";

/// Scope around an evaluation.
pub const EVAL_SCOPE: &str = "eval";
pub const DENSE_EVAL_SCOPE: &str = "dense_eval";

/// Prefix of every per-layer stage and scope: views that show the run's
/// outline leave these out.
pub const LAYER_PREFIX: &str = "layer_";

/// The closing stages of a run: before save, after save, end.
pub type Closing = [&'static str; 3];
pub const SEQUENTIAL_CLOSING: Closing = [BEFORE_SAVE, AFTER_SAVE, END];
pub const GRADPROBE_CLOSING: Closing = [GP_BEFORE_SAVE, GP_AFTER_SAVE, GP_END];

/// Scope of decoder layer `i` (`layer_07`).
pub fn layer(i: usize) -> String {
    format!("{LAYER_PREFIX}{i:02}")
}

/// Stage after layer `i`'s statistics pass (`layer_07_stats`).
pub fn layer_stats(i: usize) -> String {
    format!("{}_stats", layer(i))
}

/// Stage after layer `i` was pruned (`layer_07_pruned`).
pub fn layer_pruned(i: usize) -> String {
    format!("{}_pruned", layer(i))
}

/// GradProbe's per-layer scope in one of its passes (`layer_07_original`).
pub fn layer_pass(i: usize, pass: &str) -> String {
    format!("{}_{pass}", layer(i))
}

/// Whether `label` is a per-layer stage or scope.
pub fn is_layer(label: &str) -> bool {
    label.starts_with(LAYER_PREFIX)
}

// `prunemem train`.
pub const TRAIN_START: &str = "00_train_start";
pub const TRAIN_DATA_PREPARED: &str = "01_train_data_prepared";
pub const TRAIN_MODEL_LOADED: &str = "02_train_model_loaded";
pub const TRAIN_END: &str = "99_train_end";
/// Prefix of every per-step stage and scope.
pub const STEP_PREFIX: &str = "step_";

/// Stage at the start of epoch `e` (1-based): the epoch's peak is measured
/// from here, as `reset_peak_memory_stats()` at an epoch's start would.
pub fn epoch_start(e: usize) -> String {
    format!("epoch_{e}_start")
}

/// Scope around epoch `e` (`epoch_1`).
pub fn epoch(e: usize) -> String {
    format!("epoch_{e}")
}

/// Scope around training step `s` (1-based, `step_0003`).
pub fn step(s: usize) -> String {
    format!("{STEP_PREFIX}{s:04}")
}

/// Stage after micro-batch `m` (1-based) of step `s` finished `what`
/// (`forward` or `backward`): `step_0003_mb2_backward`.
pub fn micro_batch(s: usize, m: usize, what: &str) -> String {
    format!("{}_mb{m}_{what}", step(s))
}

/// Stage after step `s`'s optimizer step or zero-grad
/// (`step_0003_optimizer_step`, `step_0003_zero_grad`).
pub fn step_end(s: usize, what: &str) -> String {
    format!("{}_{what}", step(s))
}

/// Parses a per-step stage: (step, micro-batch if any, what).
pub fn parse_step(label: &str) -> Option<(usize, Option<usize>, &str)> {
    let rest = label.strip_prefix(STEP_PREFIX)?;
    let (num, rest) = rest.split_once('_')?;
    let s = num.parse().ok()?;
    if let Some(mb) = rest.strip_prefix("mb") {
        let (m, what) = mb.split_once('_')?;
        return Some((s, Some(m.parse().ok()?), what));
    }
    Some((s, None, rest))
}

/// A snapshot command's `n`th reading (`snapshot_0003`).
pub fn snapshot(n: usize) -> String {
    format!("snapshot_{n:04}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_labels_keep_their_log_format() {
        assert_eq!(layer(7), "layer_07");
        assert_eq!(micro_batch(3, 2, "forward"), "step_0003_mb2_forward");
        assert_eq!(
            parse_step("step_0003_mb2_forward"),
            Some((3, Some(2), "forward"))
        );
        assert_eq!(
            parse_step(&step_end(12, "zero_grad")),
            Some((12, None, "zero_grad"))
        );
        assert_eq!(parse_step("layer_03_stats"), None);
        assert_eq!(layer_stats(3), "layer_03_stats");
        assert_eq!(layer_pruned(12), "layer_12_pruned");
        assert_eq!(layer_pass(0, "modified"), "layer_00_modified");
        assert!(is_layer(&layer_pruned(1)) && !is_layer(START));
        assert_eq!(snapshot(3), "snapshot_0003");
    }
}
