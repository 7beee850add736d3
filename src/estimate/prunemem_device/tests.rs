//! The device estimate's own checks on llama-7b: what the pool holds in
//! each phase.

use super::*;
use crate::estimate::{Task, estimate, presets};
use crate::model::ComputeDtype;

fn llama7b(task: Task) -> (Arch, Workload) {
    let a = presets::load("llama-7b").unwrap();
    let mut w = Workload::new(task);
    (w.device, w.dtype, w.nsamples, w.seqlen, w.batch_size) =
        (Device::Wgpu, ComputeDtype::F16, 128, 2048, 8);
    (a, w)
}

fn component(e: &crate::estimate::Estimate, phase: &str, name: &str) -> u64 {
    let p = e.phases.iter().find(|p| p.name == phase).unwrap();
    p.components
        .iter()
        .filter(|c| c.name == name || c.name.starts_with(&format!("{name} (")))
        .map(|c| c.bytes)
        .sum()
}

#[test]
fn the_pool_holds_the_calibration_set_one_layer_and_its_statistics() {
    let (a, w) = llama7b(Task::SparseGpt);
    let e = estimate(&a, &w).unwrap();
    // 128 × 2048 × 4096 f16 hidden states: 2 GiB.
    assert_eq!(component(&e, "prune", "calibration buffers"), 2 << 30);
    assert_eq!(component(&e, "prune", "weights"), a.layer_params() * 2);
    // Four Hessians (q/k/v and gate/up share theirs), f32.
    let (h, i) = (4096u64, 11008u64);
    assert_eq!(
        component(&e, "prune", "statistics"),
        (3 * h * h + i * i) * 4
    );
    // SparseGPT's widest moment is the down projection's factorisation on
    // the device (`prune::factor_device`): its Hessian beside an `i × i`
    // product, a block column and its diagonal block.
    // (Here a 2048-token forward is wider still.) The pool keeps the
    // block's panel, its diagonal block and a row mask freed beside it.
    let (in_use, reserved) = super::moments::sparsegpt_moment(&a, &w);
    assert_eq!(in_use, (2 * i * i + i * 128 + 128 * 128) * 4);
    assert_eq!(reserved - in_use, (i * 128 + 128 * 128 + i) * 4);
    // Logs from before it: the host factored `Hinv`; the gate and up
    // projections' sweep was the widest (`Hinv`, working copy and product
    // beside the down projection's Hessian).
    let mut host = w.clone();
    host.factor_on_device = false;
    let sweep = (i * i + h * h + 2 * h * i + 128 * (h + i)) * 4;
    assert_eq!(super::moments::sparsegpt_moment(&a, &host), (sweep, sweep));
    // The windows' rows go up, never the table; it did before
    // `embedding_rows`.
    assert_eq!(component(&e, "calibration", "embeddings"), 0);
    let mut old = w.clone();
    old.embedding_rows = false;
    let e_old = estimate(&a, &old).unwrap();
    assert_eq!(
        component(&e_old, "calibration", "embeddings"),
        a.embedding_params() * 2
    );
    assert!(e.notes.iter().all(|n| !n.contains("CUDA")), "{:?}", e.notes);
}

#[test]
fn offloaded_activations_leave_one_batch_on_the_device() {
    let (a, mut w) = llama7b(Task::Wanda);
    let resident = estimate(&a, &w).unwrap();
    w.offload_activations = true;
    let offloaded = estimate(&a, &w).unwrap();
    assert_eq!(
        component(&offloaded, "prune", "calibration buffers"),
        (2 << 30) / 16
    );
    let prune = |e: &crate::estimate::Estimate| {
        e.phases.iter().find(|p| p.name == "prune").unwrap().total()
    };
    // And the batch, held by nothing else, takes the residual stream in
    // place: one batch's hidden states less in the forward.
    let saved = prune(&resident) - prune(&offloaded);
    let batch = 8 * 2048 * 4096 * 2;
    assert_eq!(saved, (2 << 30) - (2 << 30) / 16 + batch);
}

#[test]
fn cuda_is_the_same_pool_with_its_context_noted_not_added() {
    let (a, mut w) = llama7b(Task::Wanda);
    let wgpu = estimate(&a, &w).unwrap();
    w.device = Device::Cuda;
    let cuda = estimate(&a, &w).unwrap();
    assert_eq!(wgpu.peak(), cuda.peak());
    assert!(
        cuda.notes.iter().any(|n| n.contains("CUDA context")),
        "{:?}",
        cuda.notes
    );
}

#[test]
fn wgpu_estimates_prunemem_pruning_and_evaluation_only() {
    // An evaluation: the embedding table and its windows on the device.
    let (a, mut w) = llama7b(Task::Inference);
    w.eval_windows = 8;
    let e = estimate(&a, &w).unwrap();
    let names: Vec<_> = e.phases.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["load", "eval"]);
    // The phase peaks at a layer's forward, and the head's table is
    // uploaded after the layers; before `embedding_rows` the embedding
    // (and an untied head) were there from the start.
    let table = a.embedding_params() * 2;
    assert!(component(&e, "eval", "activations") > 0);
    assert_eq!(component(&e, "eval", "logits chunk"), 0);
    assert_eq!(component(&e, "eval", "embeddings and head"), 0);
    let mut old = w.clone();
    old.embedding_rows = false;
    let tables = if a.tied { 1 } else { 2 };
    assert_eq!(
        component(&estimate(&a, &old).unwrap(), "eval", "embeddings and head"),
        tables * table
    );
    // Training and the reference scripts are not estimated on wgpu.
    w.task = Task::Train;
    assert!(estimate(&a, &w).is_err());
    w.task = Task::Wanda;
    w.engine = crate::estimate::Engine::Reference;
    assert!(estimate(&a, &w).is_err());
}

/// GradProbe evaluated inside step 6 on a device: a phase of its own with
/// one layer in f32 (every kept layer when the probe kept them), every
/// window's hidden states in f32, and the pool's pages of the zeroing
/// beside an evaluation batch's forward; none when evaluated afterwards.
#[test]
fn gradprobe_step6_holds_the_windows_and_one_layer_in_f32() {
    let (a, mut w) = llama7b(Task::GradProbe);
    (w.device, w.nsamples, w.seqlen, w.batch_size, w.eval_windows) = (Device::Cuda, 4, 512, 1, 40);
    let phase = |w: &Workload| {
        let e = estimate(&a, w).unwrap();
        e.phases.iter().find(|p| p.name == "step 6").cloned()
    };
    assert!(phase(&w).is_none(), "evaluated after step 6");
    w.eval_inline = true;
    let p = phase(&w).expect("a step 6");
    let states = 40 * 512 * a.hidden * 4;
    let named = |p: &crate::estimate::Phase, name: &str| {
        p.components
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.bytes)
    };
    assert_eq!(named(&p, "evaluation hidden states"), Some(states));
    assert_eq!(
        named(&p, "weights (layers on the device)"),
        Some(a.layer_params() * 4)
    );
    // Beyond what it holds, the pool keeps the larger of a linear's
    // zeroing (the largest's: its weight replaced, the zeros' mask, one
    // byte each on CUDA, and count, its positions twice, bounded by its
    // candidates) and the evaluation forward's pages, at least its
    // activations.
    let forward = named(&p, "activations (evaluation)").unwrap();
    let pages = p.reserved.unwrap() - (p.total() - forward);
    let positions = (a.largest_linear() as f64 * w.sparsity) as u64 * 8;
    assert!(pages >= 9 * a.largest_linear() + positions, "{p:?}");
    assert!(pages >= forward, "{p:?}");
    w.probe_layers_on_device = true;
    let kept = phase(&w).unwrap();
    assert_eq!(
        named(&kept, "weights (layers on the device)"),
        Some(a.layers * a.layer_params() * 4 + a.embedding_params() * 4)
    );
}

#[test]
fn dsnots_loop_in_one_launch_keeps_fewer_pages_at_n_m() {
    let (a, mut w) = llama7b(Task::Wanda);
    w.dsnot = true;
    w.dsnot_skip = crate::prune::dsnot::DsnotSkip::None;
    // The widest refined linear: the MLP's 4096 × 11008.
    let refined = 4096 * 11008u64;
    for (nm, fewer) in [(false, 0), (true, 2 * refined)] {
        w.nm = nm;
        w.dsnot_kernel = false;
        let ops = super::dsnot::dsnot_loop(&a, &w);
        w.dsnot_kernel = true;
        let launch = super::dsnot::dsnot_loop(&a, &w);
        // The widest moment in use is a window being picked either way.
        assert_eq!(ops.0, launch.0, "nm {nm}");
        assert_eq!(ops.1 - launch.1, fewer, "nm {nm}");
    }
}

#[test]
fn dsnot_from_sparsegpts_saliency_factors_where_the_hessians_are() {
    let (a, mut w) = llama7b(Task::SparseGpt);
    w.dsnot = true;
    w.dsnot_skip = crate::prune::dsnot::DsnotSkip::None;
    w.dsnot_kernel = true;
    // A short calibration set, so that the moment is the phase's widest.
    (w.nsamples, w.seqlen) = (8, 128);
    let (h, i) = (4096u64, 11008u64);
    // In use: the down projection's factorisation step (its Hessian beside
    // an `i × i` product) or the widest linear's loop, with no Hessian
    // beside it; here the loop (34 bytes a weight unstructured on wgpu).
    let (in_use, reserved) = super::dsnot::saliency_moment(&a, &w);
    let factor = (2 * i * i + i * 128 + 128 * 128) * 4;
    assert_eq!(in_use, (h * i * 34).max(factor));
    // Reserved: the gate/up loop beside the down projection's Hessian,
    // whose pages the pool keeps.
    assert_eq!(reserved, i * i * 4 + h * i * (34 + 9));
    let e = estimate(&a, &w).unwrap();
    let loop_part = component(&e, "prune", "DSnoT: SparseGPT's factorisation or swap loop");
    assert_eq!(loop_part, in_use - (3 * h * h + i * i) * 4);
    // Logs from before it ran the host path: the pruned weight went up.
    w.saliency_on_device = false;
    let e = estimate(&a, &w).unwrap();
    assert_eq!(component(&e, "prune", "pruned weight (upload)"), h * i * 2);
}

/// RIA's reallocation on a device holds and reserves what direct N:M
/// does (its report is one kernel's per-output sums, no slices), and
/// `--lsa` keeps the widest input's scores reserved more: nothing else
/// moves.
#[test]
fn reallocation_reserves_its_scores() {
    let (a, mut w) = llama7b(Task::Ria);
    // A short calibration, so the selection is the phase's widest moment
    // (at 128 × 2048 the forward's pages are).
    (w.nm, w.nsamples, w.seqlen, w.batch_size) = (true, 1, 128, 1);
    let prune = |w: &Workload| {
        let e = estimate(&a, w).unwrap();
        let p = e.phases.iter().find(|p| p.name == "prune").unwrap();
        (p.total(), p.reserved.unwrap_or(0))
    };
    let direct = prune(&w);
    w.reallocation = true;
    let heuristic = prune(&w);
    w.lsa = true;
    let lsa = prune(&w);
    assert_eq!(heuristic, direct);
    let scores = (a.intermediate / 4).pow(2) * 4;
    assert_eq!(lsa.1, heuristic.1 + scores, "{heuristic:?} {lsa:?}");
    assert_eq!(lsa.0, heuristic.0);
}

/// Wanda's α-variant on a device holds the largest of the linears'
/// tables beside its metric (8 bytes a weight and its keys padded to a
/// power of two: the down projection's 11 008 inputs take 16 384) and
/// keeps them reserved beside the pruned weight.
#[test]
fn the_variant_holds_its_sorted_tables() {
    let (a, mut w) = llama7b(Task::Wanda);
    (w.nsamples, w.seqlen, w.batch_size) = (1, 128, 1);
    let prune = |w: &Workload| {
        let e = estimate(&a, w).unwrap();
        let p = e.phases.iter().find(|p| p.name == "prune").unwrap();
        let part: u64 = p
            .components
            .iter()
            .filter(|c| c.name.starts_with("selection"))
            .map(|c| c.bytes)
            .sum();
        (part, p.total(), p.reserved.unwrap_or(0))
    };
    let direct = prune(&w);
    w.use_variant = true;
    let variant = prune(&w);
    let (h, i) = (a.hidden, a.intermediate);
    let tables = h * (8 * i + 4 * 16_384);
    assert_eq!(direct.0, h * i * 4);
    assert_eq!(variant.0, tables);
    assert_eq!(variant.1 - direct.1, tables - h * i * 4);
    assert!(
        variant.2 >= variant.1 + h * i * w.dtype.size(),
        "{variant:?}"
    );
}
