//! The reference engine's CUDA estimate against traces of the authors'
//! scripts (`scripts/reference/trace_grid.sh`, fixtures committed in
//! `tests/fixtures/reference_traces.jsonl`), so the estimator is checked
//! without Python or a GPU. `cargo test --test reference_traces --
//! --nocapture` prints the table docs/estimator.md shows.

use prunemem::estimate::{self, Device, Engine, Task, Workload, presets, reference};
use prunemem::model::ComputeDtype;
use serde_json::Value;

const TRACES: &str = include_str!("fixtures/reference_traces.jsonl");
/// The bar: every grid point within 5% of the traced peak.
const TOLERANCE: f64 = 0.05;

fn workload(t: &Value) -> Workload {
    let task = match t["method"].as_str().unwrap() {
        "wanda" => Task::Wanda,
        "sparsegpt" => Task::SparseGpt,
        "magnitude" => Task::Magnitude,
        "gradprobe" => Task::GradProbe,
        other => panic!("method {other} has no reference trace model"),
    };
    let mut w = Workload::new(task);
    w.engine = Engine::Reference;
    w.device = match t["device"].as_str() {
        Some("cpu") => Device::Cpu,
        _ => Device::Cuda,
    };
    w.dtype = match t["dtype"].as_str().unwrap() {
        "float16" => ComputeDtype::F16,
        "bfloat16" => ComputeDtype::Bf16,
        _ => ComputeDtype::F32,
    };
    w.nsamples = t["nsamples"].as_u64().unwrap();
    w.seqlen = t["seqlen"].as_u64().unwrap();
    w.nm = t["sparsity_type"].as_str() != Some("unstructured");
    w.eval_windows = t["eval_windows"].as_u64().unwrap_or(2);
    if task == Task::GradProbe {
        // GradProbe's batches: one window each.
        w.num_batches = w.nsamples;
        w.batch_size = 1;
        w.sparsity = t["sparsity"].as_f64().unwrap();
        w.include_embeddings = t["include_embeddings"].as_bool().unwrap_or(false);
    }
    w
}

/// What a trace of op outputs cannot see inside `memory_allocated` at the
/// estimate's allocated peak: cuBLAS' workspace and, for Wanda on CUDA, the
/// row sort's own buffers (both measured on an H100,
/// `tests/fixtures/reference_cuda.jsonl`).
fn invisible_to_trace(est: &estimate::Estimate) -> u64 {
    if est.workload.device != Device::Cuda {
        return 0;
    }
    let peak = est
        .phases
        .iter()
        .max_by_key(|p| p.allocated())
        .expect("an estimate has phases");
    reference::CUBLAS_WORKSPACE + peak.named(reference::SORT_BUFFERS_NAME)
}

#[test]
fn reference_estimate_is_within_five_percent_of_every_trace() {
    let mut misses = Vec::new();
    let mut rows = 0;
    println!(
        "| shape | method | type | device | nsamples × seqlen | traced peak (phase) | estimated | error |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for line in TRACES.lines().filter(|l| !l.trim().is_empty()) {
        let t: Value = serde_json::from_str(line).expect("a trace is one JSON object");
        let arch =
            presets::load(t["model"].as_str().unwrap()).expect("the trace's model is a preset");
        assert_eq!(
            arch.params,
            t["params"].as_u64().unwrap(),
            "{} differs from the traced model",
            arch.name
        );
        let est = estimate::estimate(&arch, &workload(&t)).unwrap();
        let predicted = est.peak_allocated() - invisible_to_trace(&est);
        let traced = t["peak_allocated_bytes"].as_u64().unwrap();
        let err = predicted as f64 / traced as f64 - 1.0;
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        println!(
            "| {} | {} | {} | {} | {} × {} | {:.2} GiB ({}) | {:.2} GiB | {:+.1}% |",
            arch.name,
            t["method"].as_str().unwrap(),
            if t["include_embeddings"].as_bool() == Some(true) {
                "with embeddings"
            } else {
                t["sparsity_type"].as_str().unwrap()
            },
            t["device"].as_str().unwrap_or("cuda"),
            t["nsamples"],
            t["seqlen"],
            gib(traced),
            t["peak_phase"].as_str().unwrap(),
            gib(predicted),
            err * 100.0
        );
        if err.abs() > TOLERANCE {
            misses.push(format!(
                "{} {} {}: {:+.1}%",
                arch.name,
                t["method"],
                t["sparsity_type"],
                err * 100.0
            ));
        }
        rows += 1;
    }
    assert!(
        rows >= 49,
        "the fixture holds {rows} traces: the grid is 7 shapes × 7 runs and 6 of GradProbe"
    );
    assert!(
        misses.is_empty(),
        "estimates off by more than 5%:\n{}",
        misses.join("\n")
    );
}

/// Peak RSS of the reference scripts run for real on SmolLM2-135M (f32, on
/// this machine's CPU), against `--engine reference --device cpu`.
const CPU_RSS: &str = include_str!("fixtures/reference_cpu_rss.jsonl");
/// The bar for the CPU: within 10% of the real runs' peak RSS.
const CPU_TOLERANCE: f64 = 0.10;

#[test]
fn reference_cpu_estimate_is_within_ten_percent_of_real_runs() {
    let arch = presets::load("smollm2-135m").unwrap();
    let mut misses = Vec::new();
    println!(
        "| method | nsamples × seqlen | eval windows | measured peak RSS | estimated | error |"
    );
    println!("|---|---|---|---|---|---|");
    for line in CPU_RSS.lines().filter(|l| !l.trim().is_empty()) {
        let mut t: Value = serde_json::from_str(line).unwrap();
        t["dtype"] = "float32".into();
        t["device"] = "cpu".into();
        t["sparsity_type"] = "unstructured".into();
        if t.get("eval_windows").is_none() {
            t["eval_windows"] = 0.into();
        }
        let est = estimate::estimate(&arch, &workload(&t)).unwrap();
        let measured = t["rss_peak"].as_u64().unwrap();
        let err = est.peak() as f64 / measured as f64 - 1.0;
        println!(
            "| {}{} | {} × {} | {} | {:.0} MB | {:.0} MB | {:+.1}% |",
            t["method"].as_str().unwrap(),
            if t["include_embeddings"].as_bool() == Some(true) {
                " (with embeddings)"
            } else {
                ""
            },
            t["nsamples"],
            t["seqlen"],
            t["eval_windows"],
            measured as f64 / 1e6,
            est.peak() as f64 / 1e6,
            err * 100.0
        );
        if err.abs() > CPU_TOLERANCE {
            misses.push(format!("{}: {:+.1}%", t["command"], err * 100.0));
        }
    }
    assert!(
        misses.is_empty(),
        "CPU estimates off by more than 10%:\n{}",
        misses.join("\n")
    );
}

#[test]
fn json_reports_the_allocated_peak_under_the_whole_peak() {
    let arch = presets::load("llama-2-7b").unwrap();
    let mut w = Workload::new(Task::Wanda);
    w.engine = Engine::Reference;
    w.device = Device::Cuda;
    w.dtype = ComputeDtype::F16;
    let est = estimate::estimate(&arch, &w).unwrap();
    let context = reference::CUDA_CONTEXT;
    assert!(
        est.peak_allocated() + context < est.peak(),
        "context and reserve are outside the allocated peak"
    );
    assert!(
        est.peak_allocated() > arch.params * 2,
        "the weights alone are allocated"
    );
}

/// The same scripts run on a real GPU (`scripts/reference/cuda_check.py` on
/// an H100: random weights of the real shapes, PyTorch's own
/// `max_memory_allocated`); each line also holds the fake trace of the same
/// run.
const CUDA_RUNS: &str = include_str!("fixtures/reference_cuda.jsonl");

#[test]
fn reference_estimate_is_within_five_percent_of_real_cuda_runs() {
    let mut misses = Vec::new();
    let mut rows = 0;
    println!(
        "| case | max_memory_allocated (phase) | traced (fake) | estimated allocated | error | max_memory_reserved | estimated allocated + reserve |"
    );
    println!("|---|---|---|---|---|---|---|");
    for line in CUDA_RUNS.lines().filter(|l| !l.trim().is_empty()) {
        let t: Value = serde_json::from_str(line).expect("one JSON object per run");
        let real = &t["real"];
        let cuda = &real["cuda"];
        let args: Vec<&str> = t["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let config = args[args.iter().position(|a| *a == "--config").unwrap() + 1];
        let preset = config.rsplit('/').next().unwrap().trim_end_matches(".json");
        let mut arch = presets::load(preset).expect("the run's config is a preset");
        // A shape built with fewer layers (`--layers`): the same layers, fewer.
        let layers = real["layers"].as_u64().unwrap();
        arch.params -= (arch.layers - layers) * arch.layer_params();
        arch.layers = layers;
        assert_eq!(arch.params, real["params"].as_u64().unwrap(), "{preset}");
        let est = estimate::estimate(&arch, &workload(real)).unwrap();
        let measured = cuda["max_memory_allocated"].as_u64().unwrap();
        let err = est.peak_allocated() as f64 / measured as f64 - 1.0;
        let reserve = est.phases[est.peak_phase()].named(reference::ALLOCATOR_RESERVE_NAME);
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        println!(
            "| {} | {:.2} GiB ({}) | {:.2} GiB | {:.2} GiB | {:+.1}% | {:.2} GiB | {:.2} GiB |",
            t["case"].as_str().unwrap(),
            gib(measured),
            cuda["peak_phase"].as_str().unwrap(),
            gib(t["fake"]["peak_allocated_bytes"].as_u64().unwrap()),
            gib(est.peak_allocated()),
            err * 100.0,
            gib(cuda["max_memory_reserved"].as_u64().unwrap()),
            gib(est.peak_allocated() + reserve),
        );
        if err.abs() > TOLERANCE {
            misses.push(format!("{}: {:+.1}%", t["case"], err * 100.0));
        }
        // The allocator's reserve on top: `max_memory_reserved` within 5%,
        // except GradProbe's, whose 13.9% reserve is not modelled (10%).
        let reserved = cuda["max_memory_reserved"].as_u64().unwrap();
        let reserved_err = (est.peak_allocated() + reserve) as f64 / reserved as f64 - 1.0;
        let bound = match real["method"].as_str() {
            Some("gradprobe") => 0.10,
            _ => TOLERANCE,
        };
        if reserved_err.abs() > bound {
            misses.push(format!(
                "{} max_memory_reserved: {:+.1}%",
                t["case"],
                reserved_err * 100.0
            ));
        }
        rows += 1;
    }
    assert!(rows >= 13, "the fixture holds {rows} real GPU runs");
    assert!(
        misses.is_empty(),
        "estimates off the real GPU by more than 5%:\n{}",
        misses.join("\n")
    );
}
