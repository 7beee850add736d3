//! The estimator's own invariants: every component has a measured category,
//! and a phase's categories sum to its total; the run machine's matmul
//! workspace is counted; an `--iterative` GradProbe step holds its earlier
//! steps' positions.

use super::*;

/// Every component any estimate names belongs to a measured category,
/// so no prediction lands in "untagged".
#[test]
fn every_component_has_a_category() {
    let arch = presets::all().into_iter().next().expect("a preset");
    let tasks = [
        Task::Magnitude,
        Task::Wanda,
        Task::SparseGpt,
        Task::GradProbe,
        Task::Ria,
        Task::Inference,
        Task::Train,
    ];
    for task in tasks {
        for engine in [Engine::Prunemem, Engine::Reference] {
            for device in [Device::Cpu, Device::Cuda, Device::Wgpu] {
                for (resident, eval) in [(false, 0), (true, 8), (false, 8)] {
                    let mut w = Workload::new(task);
                    (w.engine, w.device, w.resident, w.eval_windows) =
                        (engine, device, resident, eval);
                    w.text_bytes = 1 << 20;
                    let Ok(e) = estimate(&arch, &w) else {
                        assert_eq!(device, Device::Wgpu, "{task:?} {engine:?}");
                        continue;
                    };
                    for c in e.phases.iter().flat_map(|p| &p.components) {
                        assert_ne!(c.category, Category::Untagged, "{c:?} in {task:?}");
                    }
                }
            }
        }
    }
    assert_eq!(category_of("weights (one layer)"), Category::Weights);
    assert_eq!(category_of("OBS sweep transient"), Category::Statistics);
    assert_eq!(category_of("embedding maxima (f32)"), Category::Statistics);
    assert_eq!(category_of("something new"), Category::Untagged);
}

#[test]
fn categories_of_a_phase_sum_to_its_total() {
    let p = Phase::new("x", &[])
        .add("weights", 5)
        .add("embeddings", 7)
        .add("logits chunk", 3);
    assert_eq!(
        p.by_category(),
        vec![(Category::Weights, 12), (Category::Logits, 3)]
    );
    assert_eq!(
        p.by_category().iter().map(|(_, b)| b).sum::<u64>(),
        p.total()
    );
}

/// The CPU's products keep a packing block per pool thread
/// (`model::matmul::workspace_bytes`): a run's plan records its machine's,
/// `--against` reads it, and every phase after compute counts it, while a
/// run without products (plain magnitude) does not.
#[test]
fn the_run_machines_matmul_workspace_is_counted() {
    use crate::events::plan::{HostInfo, ModelInfo, RunPlan};
    let (small, large) = (2u64 << 20, 10u64 << 20);
    let plan = |method: &str| RunPlan {
        command: "prune".into(),
        method: Some(method.into()),
        model: Some(ModelInfo {
            params: 15_471_104,
            layers: 4,
            hidden: 512,
            intermediate: 1408,
            heads: 8,
            kv_heads: 2,
            head_dim: 64,
            vocab: 8192,
            max_positions: 4096,
            tied_embeddings: true,
            stored_dtype: "f32".into(),
            ..Default::default()
        }),
        host: HostInfo {
            matmul_workspace: Some(small),
            ..Default::default()
        },
        ..Default::default()
    };
    let peak = |method: &str, bytes: u64| {
        let (arch, mut w) = against::workload_of(&plan(method)).unwrap();
        assert_eq!(w.matmul_workspace, small, "read from the plan");
        w.matmul_workspace = bytes;
        estimate(&arch, &w).unwrap().peak()
    };
    assert_eq!(peak("wanda", large) - peak("wanda", small), large - small);
    assert_eq!(peak("magnitude", large), peak("magnitude", small));
}

/// An `--iterative` GradProbe step holds the positions the steps before it
/// pruned (u32, once) in every phase of the step, and evaluates its model
/// inside step 6, the head included: that phase is no smaller than the
/// one-step estimate's evaluation with the step's positions held.
#[test]
fn an_iterative_step_holds_the_earlier_steps_positions() {
    let arch = presets::all().into_iter().next().expect("a preset");
    let mut w = Workload::new(Task::GradProbe);
    (w.eval_windows, w.eval_inline, w.sparsity, w.num_batches) = (8, true, 0.5, 2);
    let one = estimate(&arch, &w).unwrap();
    (w.iterative, w.earlier_sparsity) = (true, 0.3);
    let it = estimate(&arch, &w).unwrap();
    let held = (arch.layers as f64 * arch.layer_linear_params() as f64 * 0.3) as u64 * 4;
    let total = |e: &Estimate, name: &str| {
        (e.phases.iter().find(|p| p.name == name))
            .unwrap_or_else(|| panic!("no {name}"))
            .total()
    };
    for phase in ["modified pass", "end of the modified pass"] {
        assert_eq!(total(&it, phase) - total(&one, phase), held, "{phase}");
    }
    assert!(total(&it, "step 6") >= total(&one, "eval") + held);
    assert!(total(&it, "step 6") >= total(&one, "step 6") + held);
    // The step's evaluation is inside step 6: no phase of its own.
    assert!(it.phases.iter().all(|p| p.name != "eval"));
}
