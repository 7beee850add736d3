//! The device path (Burn's wgpu backend through cubecl) against the CPU
//! path, on a real Vulkan device: in CI and on a machine without a GPU,
//! Mesa's lavapipe (`apt-get install mesa-vulkan-drivers libvulkan1`).
//!
//! Masks of tests/fixtures/tiny-llama pruned on the device equal the CPU
//! backend's (or agree ≥ 99.9% where f32 summation order differs, with
//! every differing position a near-tie), perplexity agrees within 0.1%,
//! every stage of a device run carries device bytes, and a run over its
//! `--device-memory` ends with status `oom`, exit code 3 and complete logs.
//!
//! Built only with `--features wgpu`; with the feature, a missing Vulkan
//! driver fails these tests (they never skip).
#![cfg(feature = "wgpu")]

mod support;

use std::collections::HashMap;
use std::path::Path;

use prunemem::events::{Event, RunStatus};
use prunemem::exec::{Compute, DeviceSpec, Exec, OnDevice, WgpuSelect};
use prunemem::model::llama::LAYER_LINEARS;
use prunemem::model::perplexity::{self, EvalOptions, Weights};
use prunemem::model::{Checkpoint, ComputeDtype};
use prunemem::prune::engine::{self, PruneConfig, Source, weight_out_in};
use prunemem::prune::{Method, Pattern};
use support::{quiet_profiler, run_prunemem, s};

const WGPU: DeviceSpec = DeviceSpec::Wgpu(WgpuSelect::Default);

fn tiny_llama() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama")
}

/// Deterministic calibration windows over tiny-llama's vocabulary.
fn windows(n: usize, len: usize, vocab: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..n)
        .map(|_| {
            (0..len)
                .map(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((x >> 33) % vocab as u64) as u32
                })
                .collect()
        })
        .collect()
}

/// What one pruning of tiny-llama gave: each linear's weights `[out, in]`
/// and the pruned model's perplexity on held-out windows.
struct Pruned {
    weights: HashMap<String, Vec<f32>>,
    perplexity: f64,
}

/// Prunes tiny-llama (resident, f32) with `method`/`pattern` and evaluates it.
struct PruneTiny {
    method: Method,
    pattern: Pattern,
    /// `--offload-activations`.
    offload: bool,
}

impl OnDevice for PruneTiny {
    type Output = Pruned;
    fn run<B: Compute>(self, device: &B::Device) -> Pruned {
        let ckpt = Checkpoint::open(&tiny_llama()).unwrap();
        let vocab = ckpt.config.vocab_size;
        let mut model = ckpt.load_model::<B>(ComputeDtype::F32, device).unwrap();
        let profiler = quiet_profiler();
        let config = PruneConfig {
            method: self.method.try_into().unwrap(),
            sparsity: 0.5,
            pattern: self.pattern,
            use_variant: false,
            seqlen: 24,
            batch_size: 4,
            dtype: ComputeDtype::F32,
            percdamp: 0.01,
            blocksize: 128,
            ria_a: 0.5,
            per_outneuron: false,
            layer_sparsity: None,
            dsnot: None,
            reallocation: None,
            offload_activations: self.offload,
        };
        let calib = windows(16, 24, vocab, 1);
        engine::prune::<B>(
            &ckpt,
            Source::Resident(&mut model),
            &config,
            &calib,
            None,
            None,
            device,
            &profiler,
        )
        .unwrap();
        let mut weights = HashMap::new();
        for (i, layer) in model.model.layers.iter().enumerate() {
            for name in LAYER_LINEARS {
                weights.insert(
                    format!("model.layers.{i}.{name}"),
                    weight_out_in(layer, name).0,
                );
            }
        }
        let eval = windows(8, 24, vocab, 2);
        let options = EvalOptions {
            batch_size: 4,
            dtype: ComputeDtype::F32,
        };
        let weights_ref = Weights::Resident(&model, &ckpt.config);
        let ppl = perplexity::perplexity::<B>(weights_ref, &eval, &options, device, None)
            .unwrap()
            .perplexity;
        Pruned {
            weights,
            perplexity: ppl,
        }
    }
}

/// Fraction of positions whose pruned/kept status agrees.
fn agreement(a: &HashMap<String, Vec<f32>>, b: &HashMap<String, Vec<f32>>) -> (f64, usize) {
    let (mut same, mut total) = (0usize, 0usize);
    for (name, wa) in a {
        let wb = &b[name];
        assert_eq!(wa.len(), wb.len(), "{name}");
        for (x, y) in wa.iter().zip(wb) {
            same += ((*x == 0.0) == (*y == 0.0)) as usize;
            total += 1;
        }
    }
    (same as f64 / total as f64, total - same)
}

fn wgpu() -> Exec {
    Exec::open(WGPU, None)
        .unwrap_or_else(|e| panic!("the wgpu device must open (CI installs lavapipe): {e}"))
}

#[test]
fn device_masks_and_perplexity_match_the_cpu_backend() {
    let (cpu, gpu) = (Exec::cpu(), wgpu());
    println!("device: {}", gpu.adapter());
    for (method, pattern) in [
        (Method::Magnitude, Pattern::Unstructured),
        (Method::Wanda, Pattern::Unstructured),
        (Method::Wanda, Pattern::NM { n: 2, m: 4 }),
        (Method::SparseGpt, Pattern::Unstructured),
        (Method::Ria, Pattern::Unstructured),
    ] {
        let on_cpu = cpu.run(PruneTiny {
            method,
            pattern,
            offload: false,
        });
        let on_gpu = gpu.run(PruneTiny {
            method,
            pattern,
            offload: false,
        });
        // Activations kept in host memory between layers: the same bits.
        let offloaded = gpu.run(PruneTiny {
            method,
            pattern,
            offload: true,
        });
        assert_eq!(
            offloaded.weights, on_gpu.weights,
            "{method} {pattern} offloaded"
        );
        assert_eq!(offloaded.perplexity, on_gpu.perplexity);
        let (agree, differ) = agreement(&on_cpu.weights, &on_gpu.weights);
        let dppl = (on_gpu.perplexity / on_cpu.perplexity - 1.0).abs();
        println!(
            "{method} {pattern}: mask agreement {agree:.6} ({differ} positions differ), perplexity cpu {:.6} wgpu {:.6} ({:.4}%)",
            on_cpu.perplexity,
            on_gpu.perplexity,
            dppl * 100.0
        );
        if method == Method::Magnitude {
            // No calibration: the same weights give the same mask, bit for bit.
            assert_eq!(differ, 0, "{method} {pattern}");
        } else {
            assert!(agree >= 0.999, "{method} {pattern}: {agree}");
        }
        assert!(
            dppl < 1e-3,
            "{method} {pattern}: perplexity differs by {dppl}"
        );
        // Kept weights are the same values (SparseGPT's updates within f32
        // rounding of a different summation order).
        let worst = on_cpu
            .weights
            .iter()
            .flat_map(|(n, w)| w.iter().zip(&on_gpu.weights[n]))
            .filter(|(a, b)| **a != 0.0 && **b != 0.0)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let tol = if method == Method::SparseGpt {
            1e-3
        } else {
            0.0
        };
        assert!(
            worst <= tol,
            "{method} {pattern}: kept weights differ by {worst}"
        );
    }
}

/// GradProbe's step (both gradient passes, Wanda strategy, embeddings
/// probed) on tiny-llama: the weights it prunes and the two losses.
struct ProbeTiny;

impl OnDevice for ProbeTiny {
    type Output = (prunemem::prune::gradprobe::Masks, f64, f64);
    fn run<B: Compute>(self, device: &B::Device) -> Self::Output {
        use prunemem::prune::gradprobe::{
            GradPrecision, GradProbe, GradProbeConfig, Masks, Strategy,
        };
        let ckpt = Checkpoint::open(&tiny_llama()).unwrap();
        let wins = windows(4, 25, ckpt.config.vocab_size, 3);
        let profiler = quiet_profiler();
        let config = GradProbeConfig {
            strategy: Strategy::Wanda,
            sparsity: 0.5,
            reduction_factor: 0.1,
            gradient_threshold: 1.0,
            include_embeddings: true,
            precision: GradPrecision::F32,
        };
        let mut probe =
            GradProbe::<B>::new(&ckpt, config, &wins, 2, &profiler, device.clone()).unwrap();
        let step = probe.step(&Masks::new()).unwrap();
        (step.pruned, step.loss_original, step.loss_modified)
    }
}

#[test]
fn gradprobe_decides_the_same_on_the_device() {
    let (cpu, gpu) = (Exec::cpu().run(ProbeTiny), wgpu().run(ProbeTiny));
    let count = |m: &prunemem::prune::gradprobe::Masks| m.values().map(Vec::len).sum::<usize>();
    let (mut same, mut total) = (0usize, 0usize);
    for (name, want) in &cpu.0 {
        let got: std::collections::BTreeSet<u32> = gpu.0[name].iter().copied().collect();
        same += want.iter().filter(|p| got.contains(p)).count();
        total += want.len().max(got.len());
    }
    let agree = same as f64 / total.max(1) as f64;
    println!(
        "gradprobe: cpu prunes {}, wgpu {}, agreement {agree:.6}; loss cpu {:.6}/{:.6} wgpu {:.6}/{:.6}",
        count(&cpu.0),
        count(&gpu.0),
        cpu.1,
        cpu.2,
        gpu.1,
        gpu.2
    );
    assert!(count(&cpu.0) > 0, "the step must prune something");
    assert!(agree >= 0.999, "decisions agree {agree}");
    assert!(
        (cpu.1 / gpu.1 - 1.0).abs() < 1e-4,
        "loss {} vs {}",
        cpu.1,
        gpu.1
    );
}

/// A synthetic model and text for the command-line runs.
fn cli_fixture() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    prunemem::model::synthetic::write_checkpoint(
        &model,
        &prunemem::model::synthetic::SyntheticSpec::default(),
    )
    .unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(&text, support::sample_text(6000)).unwrap();
    (dir, model, text)
}

/// `prune --method wanda` on the fixture on `--device wgpu`, then `extra`.
fn wanda_on_wgpu<'a>(model: &'a Path, text: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut argv = vec![
        "prune",
        "--model",
        s(model),
        "--method",
        "wanda",
        "--nsamples",
        "4",
        "--seqlen",
        "32",
        "--calib-text",
        s(text),
        "--device",
        "wgpu",
        "--ui",
        "none",
    ];
    argv.extend_from_slice(extra);
    argv
}

fn events(dir: &Path) -> Vec<Event> {
    let text = std::fs::read_to_string(dir.join("events.jsonl")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn a_device_run_logs_device_bytes_at_every_stage() {
    let (dir, model, text) = cli_fixture();
    let logs = dir.path().join("logs");
    let (code, stdout, stderr) = run_prunemem(&wanda_on_wgpu(
        &model,
        &text,
        &[
            "--eval-text",
            s(&text),
            "--eval-windows",
            "2",
            "--log-memory",
            s(&logs),
            "--json",
        ],
    ));
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let events = events(&logs);
    let Some(Event::RunStarted { plan }) = events.first() else {
        panic!("no plan")
    };
    assert_eq!(plan.device, "wgpu");
    assert!(plan.settings.contains_key("adapter"), "{:?}", plan.settings);
    assert_eq!(
        plan.settings["dtype"], "f16",
        "a GPU device defaults to f16"
    );
    // Every stage reads the device pool (a reading, never a missing one);
    // each layer's stages hold its weights and the calibration inputs on
    // the device, and the pool stays reserved after the first.
    let mut stages = 0;
    let mut on_device = false;
    for e in &events {
        if let Event::Stage { snapshot } = e {
            stages += 1;
            let (a, r, p) = (
                snapshot.device_allocated,
                snapshot.device_reserved,
                snapshot.device_peak,
            );
            assert!(
                a.is_some() && r.is_some() && p.is_some(),
                "{}",
                snapshot.label
            );
            let layer = prunemem::events::stages::is_layer(&snapshot.label);
            on_device |= layer;
            if layer {
                assert!(a > Some(0), "{}: {a:?}", snapshot.label);
            }
            // The pool is handed back between phases (`exec::release_free`),
            // so reserved may fall to what is in use, never below it.
            assert!(r >= a, "{}: reserved {r:?} below {a:?}", snapshot.label);
            if on_device {
                assert!(p > Some(0), "{}: {p:?}", snapshot.label);
                assert!(p >= a, "{}: peak {p:?} below {a:?}", snapshot.label);
            }
        }
    }
    assert!(on_device, "no layer stage");
    assert!(stages >= 7, "{stages} stages");
    the_pool_is_split_by_category(&events, &model);
    let csv = std::fs::read_to_string(logs.join("memory_log.csv")).unwrap();
    for row in csv.lines().skip(1) {
        let cells: Vec<&str> = row.split(',').collect();
        assert!(!cells[4].is_empty(), "device peak column empty: {row}");
    }
    let Some(Event::RunFinished { summary }) = events.last() else {
        panic!("no summary")
    };
    assert!(summary.device_peak.is_some_and(|p| p > 0));
    // The computing thread's uploads and its waits on the reader thread
    // are timed (is the device waiting on the host?).
    let work = &summary.results["seconds_by_work"];
    for kind in ["upload", "waiting_for_reader", "checkpoint_io"] {
        assert!(work[kind].as_f64() > Some(0.0), "{kind}: {work}");
    }
    // The attention the plan named (f16 on wgpu: the flash kernel) ran in
    // every layer's forward, and the run says so.
    assert_eq!(plan.settings["attention"], "unit", "{:?}", plan.settings);
    assert_eq!(plan.settings["head_matmul"], "auto", "{:?}", plan.settings);
    let attention = &summary.results["attention"];
    assert_eq!(attention["kernel"], "unit", "{attention}");
    assert!(attention["fused"].as_u64() > Some(0), "{attention}");
    assert_eq!(attention["fell_back"], 0, "{attention}");
    let printed = std::fs::read_to_string(logs.join("summary.txt")).unwrap();
    assert!(printed.contains("flash (unit)"), "{printed}");
    // Every kernel the plan asks for ran, none handed its work back to
    // Burn's ops, and the run says so: Wanda's norms, the RMS norm, the
    // SwiGLU, the per-output selection and the evaluation's losses.
    let kernels = &summary.results["device_kernels"];
    for name in [
        "attention",
        "swiglu",
        "norms",
        "rms_norm",
        "select_per_output",
        "row_nll",
    ] {
        assert!(kernels[name]["ran"].as_u64() > Some(0), "{name}: {kernels}");
    }
    for (name, uses) in kernels.as_object().unwrap() {
        assert_eq!(uses["fell_back"], 0, "{name}: {kernels}");
    }
    assert!(
        printed.contains("none handed back to Burn's ops"),
        "{printed}"
    );
    let report = prunemem_report(&logs, &dir.path().join("report"));
    assert!(
        report.contains("prunemem's own kernels: every request ran."),
        "{report}"
    );
    assert!(report.contains("| swiglu | "), "{report}");

    // The estimator predicts this engine's device pool, phase by phase,
    // from its buffers: within 5% of what the run measured.
    let (code, stdout, stderr) = run_prunemem(&["estimate", "--against", s(&logs), "--json"]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let cmp: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    // The pool's reserved peak (what nvidia-smi shows, less the context):
    // the bytes in use outside a pass and the pages a layer's forward
    // keeps (`estimate::device_pool`), within 5%.
    let reserved = &cmp["reserved"];
    println!("reserved: {reserved}");
    let error = reserved["error_percent"]
        .as_f64()
        .expect("a measured reserve");
    assert!(error.abs() <= 5.0, "reserved: {reserved}");
    let mut checked = 0;
    for p in cmp["phases"]
        .as_array()
        .unwrap()
        .iter()
        .chain([&cmp["peak"]])
    {
        let (predicted, measured) = (p["predicted"].as_u64().unwrap(), p["measured"].as_u64());
        let Some(measured) = measured.filter(|m| *m > 0) else {
            assert_eq!(
                predicted, 0,
                "{p}: predicted bytes where none were measured"
            );
            continue;
        };
        let error = p["error_percent"].as_f64().unwrap();
        println!(
            "{}: predicted {predicted}, measured {measured} ({error:+.2}%)",
            p["phase"]
        );
        assert!(error.abs() <= 5.0, "{p}");
        checked += 1;
        // The pool's composition at the phase's peak is measured too: the
        // weights the engine held are the estimate's to the byte.
        for c in p["categories"].as_array().into_iter().flatten() {
            println!(
                "  {}: predicted {} measured {}",
                c["category"], c["predicted"], c["measured"]
            );
            assert!(
                c["measured"].is_u64(),
                "{p}: a category without a measurement"
            );
            if c["category"] == "weights" {
                assert_eq!(c["predicted"], c["measured"], "{p}");
            }
        }
    }
    assert!(
        checked >= 4,
        "calibration, prune, eval and the peak: {stdout}"
    );
}

/// Where a device run's pool went (`memory::held`): at every reading the
/// categories sum to the bytes in use, and each stage window's composition
/// to its peak; inside a layer's statistics pass the pool holds the
/// layer's f16 weights and the calibration batches, and the statistics.
fn the_pool_is_split_by_category(events: &[Event], model: &Path) {
    let config = prunemem::model::LlamaConfig::from_file(&model.join("config.json")).unwrap();
    let layer_bytes = config.layer_param_count() * 2;
    let mut stats_windows = 0;
    for e in events {
        let s = match e {
            Event::Stage { snapshot } | Event::Sample { snapshot } => snapshot,
            _ => continue,
        };
        let sum = |c: &std::collections::BTreeMap<String, u64>| c.values().sum::<u64>();
        if let Some(a) = s.device_allocated.filter(|a| *a > 0) {
            assert_eq!(
                sum(&s.device_categories),
                a,
                "{}: {:?}",
                s.label,
                s.device_categories
            );
        }
        if !s.window_device_peak_categories.is_empty() {
            let w = &s.window_device_peak_categories;
            assert_eq!(Some(sum(w)), s.window_device_peak, "{}: {w:?}", s.label);
        }
        if s.label.ends_with("_stats") {
            let w = &s.window_device_peak_categories;
            assert_eq!(w.get("weights"), Some(&layer_bytes), "{}: {w:?}", s.label);
            // Four windows of 32 tokens in f16, at least.
            assert!(
                w.get("activations") >= Some(&(4 * 32 * config.hidden_size as u64 * 2)),
                "{w:?}"
            );
            assert!(w.get("statistics") > Some(&0), "{}: {w:?}", s.label);
            stats_windows += 1;
        }
    }
    assert_eq!(
        stats_windows, config.num_layers,
        "one statistics stage per layer"
    );
}

/// Every device allocation is on the computing thread's stream: work
/// split over short-lived threads gave each thread a cubecl pool of its own
/// that outlived it, and the process's RSS grew with every layer (lavapipe:
/// about 12 MiB per SmolLM2 layer) while the probe saw none of it.
#[test]
fn a_streamed_device_run_holds_steady_from_layer_to_layer() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    let spec = prunemem::model::synthetic::SyntheticSpec {
        layers: 12,
        ..Default::default()
    };
    prunemem::model::synthetic::write_checkpoint(&model, &spec).unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(&text, support::sample_text(6000)).unwrap();
    let logs = dir.path().join("logs");
    let (code, stdout, stderr) = run_prunemem(&wanda_on_wgpu(
        &model,
        &text,
        &["--batch-size", "1", "--log-memory", s(&logs)],
    ));
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let rss = |label: &str| {
        events(&logs)
            .into_iter()
            .find_map(|e| match e {
                Event::Stage { snapshot } if snapshot.label == label => snapshot.rss,
                _ => None,
            })
            .unwrap_or_else(|| panic!("no {label}"))
    };
    let (early, late) = (rss("layer_02_stats"), rss("layer_11_stats"));
    let growth = late as f64 - early as f64;
    println!(
        "RSS layer 2 → 11: {early} → {late} ({:+.1} MiB)",
        growth / (1u64 << 20) as f64
    );
    assert!(
        growth < (4u64 << 20) as f64,
        "RSS grew {growth} bytes over 9 layers"
    );
}

#[test]
fn a_run_past_its_device_memory_ends_oom_with_complete_logs() {
    let (dir, model, text) = cli_fixture();
    let logs = dir.path().join("logs");
    let (code, stdout, stderr) = run_prunemem(&wanda_on_wgpu(
        &model,
        &text,
        &["--device-memory", "64KiB", "--log-memory", s(&logs)],
    ));
    assert_eq!(code, Some(3), "{stdout}\n{stderr}");
    let line: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(line.len(), 1, "one line: {stderr}");
    assert!(
        line[0].contains("out of device memory") && line[0].contains("model.layers.0"),
        "{stderr}"
    );
    let events = events(&logs);
    let Some(Event::RunFinished { summary }) = events.last() else {
        panic!("the log ends with the run's summary")
    };
    assert!(
        matches!(summary.status, RunStatus::Oom(_)),
        "{:?}",
        summary.status
    );
    let csv = std::fs::read_to_string(logs.join("memory_log.csv")).unwrap();
    assert!(csv.lines().count() >= 3, "{csv}");
    assert!(
        line[0].contains("no size of this run that fits"),
        "{stderr}"
    );

    // A cap just under the run's estimated pool: the error carries the
    // estimator's largest sizes that fit, and the advised --seqlen runs. The
    // cap is on reserved bytes; on the 64-wide fixture the pool's per-buffer
    // padding dominates them, so this half runs on the wide one, whose
    // reserved bytes the estimator predicts (`pool`).
    let (dir, model, text) = wide_fixture();
    let logs = dir.path().join("logs-plan");
    let (code, _, stderr) = run_prunemem(&wanda_on_wgpu(
        &model,
        &text,
        &["--device-memory", "64KiB", "--log-memory", s(&logs)],
    ));
    assert_eq!(code, Some(3), "{stderr}");
    let Some(Event::RunStarted { plan }) = self::events(&logs).into_iter().next() else {
        panic!("no plan")
    };
    // The cap: just under what the whole run reserved, measured, so the
    // run's 32 tokens do not fit; the advice must name a --seqlen that does.
    let _ = plan;
    // 256 tokens, so the calibration's activations, not the weights, set
    // the pool's size and a shorter --seqlen can fit.
    fn seqlen<'a>(mut argv: Vec<&'a str>, tokens: &'a str) -> Vec<&'a str> {
        let at = argv.iter().position(|a| *a == "--seqlen").unwrap();
        argv[at + 1] = tokens;
        argv
    }
    let (code, stdout, stderr) =
        run_prunemem(&seqlen(wanda_on_wgpu(&model, &text, &["--json"]), "256"));
    assert_eq!(code, Some(0), "{stderr}");
    let json: serde_json::Value =
        serde_json::from_str(stdout.lines().last().unwrap_or("{}")).unwrap();
    let reserved = json["device_reserved_peak"]
        .as_u64()
        .expect("a reserved peak");
    let cap = format!("{}B", reserved * 97 / 100);
    let logs = dir.path().join("logs-advice");
    let argv = wanda_on_wgpu(
        &model,
        &text,
        &["--device-memory", &cap, "--log-memory", s(&logs)],
    );
    let (code, stdout, stderr) = run_prunemem(&seqlen(argv, "256"));
    assert_eq!(code, Some(3), "{stdout}\n{stderr}");
    println!("{stderr}");
    assert!(stderr.contains("largest that fit"), "{stderr}");
    let Some(Event::RunFinished { summary }) = self::events(&logs).pop() else {
        panic!("no summary")
    };
    let fit = &summary.results["fits_device_memory"];
    // The advice is the estimator's, searched against the pool's predicted
    // reserved bytes (what the cap is on)...
    let Some(Event::RunStarted { plan }) = self::events(&logs).into_iter().next() else {
        panic!("no plan")
    };
    let (arch, w) = prunemem::estimate::against::workload_of(&plan).unwrap();
    let limits = prunemem::estimate::fit::limits(&arch, &w, reserved * 97 / 100).unwrap();
    assert_eq!(
        fit["max_seqlen"].as_u64(),
        limits.max_seqlen,
        "the advice is the estimator's: {fit}"
    );
    assert_eq!(fit["max_nsamples"].as_u64(), limits.max_nsamples, "{fit}");
    // ... and the advised --seqlen runs under the same cap.
    let advised = fit["max_seqlen"].as_u64().expect("an advised --seqlen");
    let advised = advised.to_string();
    let argv = wanda_on_wgpu(&model, &text, &["--device-memory", &cap]);
    let (code, stdout, stderr) = run_prunemem(&seqlen(argv, &advised));
    assert_eq!(
        code,
        Some(0),
        "--seqlen {advised} under {cap}: {stdout}\n{stderr}"
    );
}

/// A model wide enough that the pool's per-buffer padding is small beside
/// its tensors (the 64-wide fixture's many tiny buffers are not).
fn wide_fixture() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    let spec = prunemem::model::synthetic::SyntheticSpec {
        hidden: 256,
        intermediate: 704,
        vocab: 2048,
        ..Default::default()
    };
    prunemem::model::synthetic::write_checkpoint(&model, &spec).unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(&text, support::sample_text(6000)).unwrap();
    (dir, model, text)
}

/// The device path keeps the weights where they are (issue 42): pruning a
/// layer with magnitude, Wanda or RIA reads back counts and flags only,
/// SparseGPT adds its factorisation's diagonal blocks (and is estimated),
/// an evaluation window reads back one loss, no scratch checkpoint is
/// written, the pool reserves no more than 1.25× its bytes in use plus the
/// largest buffer (at every stage and over the run), and kernel launches
/// are counted by phase.
#[test]
fn a_device_prune_moves_no_weights_across_the_bus() {
    let (dir, model, text) = wide_fixture();
    let config = prunemem::model::LlamaConfig::from_file(&model.join("config.json")).unwrap();
    for (method, cap) in [
        ("wanda", None),
        ("magnitude", None),
        ("ria", Some("1GiB")),
        ("sparsegpt", None),
    ] {
        let logs = dir.path().join(format!("logs-{method}"));
        let mut extra = vec![
            "--eval-text",
            s(&text),
            "--eval-windows",
            "3",
            "--log-memory",
            s(&logs),
            "--json",
        ];
        if let Some(cap) = cap {
            extra.extend(["--device-memory", cap]);
        }
        let mut argv = wanda_on_wgpu(&model, &text, &extra);
        let at = argv.iter().position(|a| *a == "wanda").unwrap();
        argv[at] = method;
        let (code, stdout, stderr) = run_prunemem(&argv);
        assert_eq!(code, Some(0), "{method}: {stdout}\n{stderr}");
        let json: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
        println!("{method}: transfers {}", json["transfers"]);
        let t = &json["transfers"];
        let layers = config.num_layers as u64;
        let per_layer = t["prune"]["device_to_host_bytes"].as_u64().unwrap_or(0) / layers;
        // SparseGPT factors each input's Hessian where it is
        // (`prune::factor_device`): its diagonal and its diagonal blocks
        // come back, never the `in × in` Hessian.
        let factor = match method {
            "sparsegpt" => {
                let (h, i) = (config.hidden_size, config.intermediate_size);
                [h, h, h, i].iter().map(|n| (n * n.min(&128) + n) * 4).sum()
            }
            _ => 0,
        } as u64;
        assert!(
            per_layer <= (64 << 10) + factor,
            "{method}: {per_layer} bytes back per layer: {t}"
        );
        // The calibration's embedding uploads the windows' hidden states
        // (4 × 32 tokens, f16), never the vocabulary table; magnitude has
        // no calibration.
        let windows = match method {
            "magnitude" => 0,
            _ => (4 * 32 * config.hidden_size * 2) as u64,
        };
        assert_eq!(
            t["other"]["host_to_device_bytes"].as_u64(),
            Some(windows),
            "{method}: {t}"
        );
        // Statistics stay on the device for these methods.
        assert_eq!(
            t["stats_pass"]["device_to_host_bytes"]
                .as_u64()
                .unwrap_or(0),
            0,
            "{t}"
        );
        let per_window = t["eval"]["device_to_host_bytes"].as_u64().unwrap() / 3;
        assert!(
            per_window <= 4 << 10,
            "{method}: {per_window} bytes back per window: {t}"
        );
        assert!(
            t["prune"]["kernels"].as_u64() > Some(0),
            "kernels not counted: {t}"
        );
        // No scratch checkpoint: the layers waited in memory.
        let kept = json["pruned_layers_kept"].as_str().unwrap();
        assert_eq!(
            kept,
            if cap.is_some() { "device" } else { "host" },
            "{method}"
        );
        let events = events(&logs);
        assert!(
            events.iter().all(|e| !matches!(e, Event::Message { text, .. } if text.contains("streams the pruned layers"))),
            "a scratch checkpoint was written"
        );
        // The pool's reserve follows its use: at every stage, and over the run.
        let largest = [
            config.vocab_size * config.hidden_size * 2,
            config.intermediate_size * config.hidden_size * 8,
            prunemem::model::perplexity::device_chunk_rows(config.vocab_size).min(31)
                * config.vocab_size
                * 4,
            // SparseGPT's factorisation: the widest input's `in × in` product.
            match method {
                "sparsegpt" => config.intermediate_size.pow(2) * 4,
                _ => 0,
            },
        ]
        .into_iter()
        .max()
        .unwrap() as u64;
        let mut top_used = 0;
        for e in &events {
            let Event::Stage { snapshot } = e else {
                continue;
            };
            let (Some(used), Some(reserved)) =
                (snapshot.device_allocated, snapshot.device_reserved)
            else {
                continue;
            };
            top_used = top_used.max(snapshot.device_peak.unwrap_or(used));
            assert!(
                reserved as f64 <= 1.25 * used as f64 + largest as f64,
                "{method} {}: reserved {reserved} for {used} in use (largest buffer {largest})",
                snapshot.label
            );
        }
        let reserved_peak = json["device_reserved_peak"].as_u64().unwrap();
        println!(
            "{method}: in use peak {top_used}, reserved peak {reserved_peak} (in {}), largest buffer {largest}",
            json["device_reserved_peak_phase"]
        );
        assert!(
            reserved_peak as f64 <= 1.25 * top_used as f64 + largest as f64,
            "{method}: reserved peak {reserved_peak} for an in-use peak of {top_used}"
        );
        if method == "sparsegpt" {
            // Every f32 product took the exact (unit) matmul: none handed
            // its operands back to Burn's, which runs TF32 on CUDA.
            let k = &json["device_kernels"]["matmul"];
            assert!(k["ran"].as_u64() > Some(0), "{k}");
            assert_eq!(k["fell_back"].as_u64(), Some(0), "{k}");
            // The factorisation on the device is in the estimate: the
            // pool's peak in use and reserved within 5%.
            let (code, stdout, stderr) =
                run_prunemem(&["estimate", "--against", s(&logs), "--json"]);
            assert_eq!(code, Some(0), "{stdout}\n{stderr}");
            let cmp: serde_json::Value = serde_json::from_str(&stdout).unwrap();
            for p in [&cmp["peak"], &cmp["reserved"]] {
                println!("{method}: {p}");
                let error = p["error_percent"].as_f64().expect("measured");
                assert!(error.abs() <= 5.0, "{method}: {p}");
            }
        }
    }
}

/// Two AdamW steps on tiny-llama (full graph, then checkpointed): the
/// losses and the trained weights.
struct TrainTiny {
    checkpointing: bool,
}

impl OnDevice for TrainTiny {
    type Output = (Vec<f64>, Vec<f32>);
    fn run<B: Compute>(self, device: &B::Device) -> Self::Output {
        use prunemem::train::{self, Freeze, OptimizerConfig, OptimizerKind, TrainConfig};
        let ckpt = Checkpoint::open(&tiny_llama()).unwrap();
        let wins = windows(8, 17, ckpt.config.vocab_size, 4);
        let config = TrainConfig {
            batch_size: 2,
            grad_accum: 2,
            seqlen: 16,
            steps: Some(2),
            epochs: 1,
            optimizer: OptimizerConfig::new(OptimizerKind::AdamW),
            lr: 1e-3,
            dtype: ComputeDtype::F32,
            checkpointing: self.checkpointing,
            freeze: Freeze::default(),
            seed: 0,
        };
        let profiler = quiet_profiler();
        let o = train::train_on::<B>(&ckpt, &wins, &config, &profiler, device).unwrap();
        let losses = o.steps.iter().map(|r| r.loss).collect();
        let w = o.model.model.layers[0].mlp.down_proj.weight.val();
        (losses, w.into_data().into_vec().unwrap())
    }
}

#[test]
fn training_steps_match_the_cpu_backend() {
    for checkpointing in [false, true] {
        let cpu = Exec::cpu().run(TrainTiny { checkpointing });
        let gpu = wgpu().run(TrainTiny { checkpointing });
        let worst = cpu
            .1
            .iter()
            .zip(&gpu.1)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        println!(
            "train (checkpointing {checkpointing}): losses cpu {:?} wgpu {:?}, trained weights differ by at most {worst:e}",
            cpu.0, gpu.0
        );
        assert_eq!(cpu.0.len(), 2);
        for (a, b) in cpu.0.iter().zip(&gpu.0) {
            assert!((a / b - 1.0).abs() < 1e-5, "loss {a} vs {b}");
        }
        // AdamW's first steps move each weight by about lr: the same update
        // on both backends, up to f32 rounding.
        assert!(worst < 1e-5, "trained weights differ by {worst}");
    }
}

#[test]
fn unsupported_device_requests_are_one_line() {
    let (_dir, model, text) = cli_fixture();
    let prune_bf16 = wanda_on_wgpu(&model, &text, &["--dtype", "bf16"]);
    let eval_cuda = [
        "eval",
        "--model",
        s(&model),
        "--text",
        s(&text),
        "--seqlen",
        "16",
        "--windows",
        "1",
        "--ui",
        "none",
        "--device",
        "cuda",
    ];
    for (argv, expect) in [(&prune_bf16[..], "bf16"), (&eval_cuda[..], "cuda")] {
        let (code, _, stderr) = run_prunemem(argv);
        assert_eq!(code, Some(2), "{stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        assert!(stderr.contains(expect), "{stderr}");
    }
}

/// `prunemem eval` of two 32-token windows of `text` with `args`, the
/// device's largest buffer lowered to `max_buffer` when given, and `env`
/// set.
fn eval_windows(
    model: &Path,
    text: &Path,
    args: &[&str],
    max_buffer: Option<&str>,
    env: &[(&str, &str)],
) -> (Option<i32>, String, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_prunemem"));
    cmd.args([
        "eval",
        "--model",
        s(model),
        "--text",
        s(text),
        "--windows",
        "2",
        "--seqlen",
        "32",
    ])
    .args(["--ui", "none", "--json"])
    .args(args);
    if let Some(m) = max_buffer {
        cmd.env("PRUNEMEM_MAX_BUFFER", m);
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `prunemem eval --device wgpu` is estimated as the device engine's own
/// evaluation (inference on wgpu had been refused by the estimator): every
/// measured phase within 5%, the weights to the byte.
#[test]
fn a_device_eval_is_estimated_from_its_buffers() {
    let (dir, model, text) = cli_fixture();
    let logs = dir.path().join("eval-logs");
    let (code, stdout, stderr) = eval_windows(
        &model,
        &text,
        &["--device", "wgpu", "--log-memory", s(&logs)],
        None,
        &[],
    );
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let (code, stdout, stderr) = run_prunemem(&["estimate", "--against", s(&logs), "--json"]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let cmp: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let phases: Vec<_> = cmp["phases"].as_array().unwrap().iter().collect();
    assert_eq!(phases.len(), 2, "load and eval: {stdout}");
    let eval = phases[1];
    let measured = eval["measured"].as_u64().expect("the eval phase measured");
    let error = eval["error_percent"].as_f64().unwrap();
    println!(
        "eval: predicted {}, measured {measured} ({error:+.2}%)",
        eval["predicted"]
    );
    assert!(measured > 0 && error.abs() <= 5.0, "{eval}");
    for c in eval["categories"].as_array().into_iter().flatten() {
        println!(
            "  {}: predicted {} measured {}",
            c["category"], c["predicted"], c["measured"]
        );
        if c["category"] == "weights" {
            assert_eq!(c["predicted"], c["measured"], "{eval}");
        }
    }
}

/// The perplexity of a run that must have succeeded.
fn perplexity_of((code, stdout, stderr): (Option<i32>, String, String)) -> f64 {
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    support::json_line(&stdout)["perplexity"].as_f64().unwrap()
}

/// An untied head goes up in shards like the embedding: the same bits as
/// one table (f16, `PRUNEMEM_MAX_BUFFER=256KiB`: four shards). And with
/// `PRUNEMEM_HEAD_MATMUL` naming cubek's unit kernel, the head's product
/// reads the table in its stored layout, whole or in shards, every launch
/// taken (none handed back to Burn's matmul), to the perplexity Burn's
/// matmul gives.
fn untied_head_in_shards() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    let spec = prunemem::model::synthetic::SyntheticSpec {
        tied: false,
        vocab: 4096,
        ..Default::default()
    };
    prunemem::model::synthetic::write_checkpoint(&model, &spec).unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(&text, support::sample_text(2000)).unwrap();
    let run = |max_buffer, env: &[(&str, &str)]| {
        eval_windows(&model, &text, &["--device", "wgpu"], max_buffer, env)
    };
    let eval = |max_buffer| perplexity_of(run(max_buffer, &[]));
    let (whole, sharded) = (eval(None), eval(Some("256KiB")));
    println!("untied head: perplexity whole {whole}, in shards {sharded}");
    assert_eq!(whole.to_bits(), sharded.to_bits(), "{whole} vs {sharded}");
    let unit = [("PRUNEMEM_HEAD_MATMUL", "simple_unit")];
    for (max_buffer, burns) in [(None, whole), (Some("256KiB"), sharded)] {
        let out = run(max_buffer, &unit);
        let json = support::json_line(&out.1);
        let named = perplexity_of(out);
        println!("untied head, unit kernel ({max_buffer:?}): perplexity {named}");
        assert!((named / burns - 1.0).abs() < 1e-6, "{named} vs {burns}");
        let matmul = &json["device_kernels"]["matmul"];
        assert!(matmul["ran"].as_u64() > Some(0), "{json}");
        assert_eq!(matmul["fell_back"], 0, "{json}");
    }
}

/// A table past the device's largest buffer (lavapipe: 128 MiB; a 49 152 ×
/// 768 f32 embedding is 144 MiB) used to be refused inside cubecl's server
/// thread, which left the embedding empty and the run going to a garbage
/// perplexity with exit 0, then failed the run in one line. Streamed, it now
/// goes up in shards (`model::vocab`); a resident model, which keeps Burn's
/// one-tensor table, still fails in one line (exit 2) and its log says so.
#[test]
fn a_table_past_the_devices_largest_buffer_is_sharded_and_a_resident_model_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    // SmolLM2's vocabulary at 768 wide: 144 MiB in f32, past lavapipe's
    // 128 MiB buffers; 72 MiB in f16.
    let spec = prunemem::model::synthetic::SyntheticSpec {
        hidden: 768,
        intermediate: 256,
        layers: 1,
        heads: 12,
        kv_heads: 4,
        vocab: 49152,
        dtype: safetensors::Dtype::F16,
        ..Default::default()
    };
    prunemem::model::synthetic::write_checkpoint(&model, &spec).unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(&text, support::sample_text(2000)).unwrap();
    let logs = dir.path().join("logs");
    let eval = |device: &str, dtype: &str, extra: &[&str], max_buffer: Option<&str>| {
        let mut args = vec!["--device", device, "--dtype", dtype];
        args.extend_from_slice(extra);
        eval_windows(&model, &text, &args, max_buffer, &[])
    };
    let ppl = perplexity_of;
    // Streamed, the f32 table goes up in shards: the CPU backend's figure.
    let cpu = ppl(eval("cpu", "f32", &[], None));
    let sharded = ppl(eval("wgpu", "f32", &[], None));
    println!("f32 perplexity: cpu {cpu}, wgpu (table in shards) {sharded}");
    assert!((sharded / cpu - 1.0).abs() < 1e-4, "{sharded} vs {cpu}");
    // In f16 the table fits one buffer; in shards of 16 MiB it gives the
    // same bits.
    let whole = ppl(eval("wgpu", "f16", &[], None));
    let small = ppl(eval("wgpu", "f16", &[], Some("16MiB")));
    assert_eq!(whole.to_bits(), small.to_bits(), "{whole} vs {small}");
    untied_head_in_shards();

    // A resident model keeps Burn's one-tensor table: refused in one line.
    let (code, stdout, stderr) = eval(
        "wgpu",
        "f32",
        &["--resident", "--log-memory", s(&logs)],
        None,
    );
    let adapter = wgpu().adapter().to_string();
    if !adapter.contains("llvmpipe") {
        // A real GPU's buffers are larger: the run must simply succeed.
        assert_eq!(code, Some(0), "{adapter}: {stdout}\n{stderr}");
        return;
    }
    assert_eq!(code, Some(2), "{stdout}\n{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(
        lines[0].contains("passes the device's largest buffer"),
        "{stderr}"
    );
    assert!(
        !stdout.contains("perplexity"),
        "no result from a failed device: {stdout}"
    );
    let Some(Event::RunFinished { summary }) = events(&logs).pop() else {
        panic!("the log ends with the run's summary")
    };
    assert!(
        matches!(summary.status, RunStatus::Failed(_)),
        "{:?}",
        summary.status
    );
}

/// A training run on the device analyses the device pool, not the heap:
/// the parameters and the optimizer's moments are the pool's, measured by
/// category (`memory::held`).
#[test]
fn a_device_training_run_analyses_the_device_pool() {
    let (dir, model, text) = cli_fixture();
    let logs = dir.path().join("logs");
    let (code, stdout, stderr) = run_prunemem(&[
        "train",
        "--model",
        s(&model),
        "--text",
        s(&text),
        "--seqlen",
        "32",
        "--batch-size",
        "2",
        "--grad-accum",
        "2",
        "--steps",
        "2",
        "--device",
        "wgpu",
        "--ui",
        "none",
        "--json",
        "--log-memory",
        s(&logs),
    ]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let j: serde_json::Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON line: {stdout}"));
    let gap = &j["gap"];
    let params = j["params"].as_u64().unwrap();
    println!("device training gap: {gap}");
    assert_eq!(gap["on_device"], true, "{gap}");
    // f32 training: the parameters' four bytes each, held on the device.
    assert_eq!(gap["single_step"]["parameters"].as_u64(), Some(params * 4));
    // Adam's two f32 moments per parameter, created by the first step().
    let opt = gap["factors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "optimizer state")
        .and_then(|f| f["bytes"].as_i64())
        .unwrap();
    assert_eq!(opt, 8 * params as i64, "{gap}");
    let report = prunemem_report(&logs, &dir.path().join("report"));
    assert!(
        report.contains("one step vs the epoch peak (device pool)"),
        "{report}"
    );
}

/// `prunemem report LOGS --out OUT`, and the report's markdown.
fn prunemem_report(logs: &Path, out: &Path) -> String {
    let (code, stdout, stderr) = run_prunemem(&["report", s(logs), "--out", s(out)]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    std::fs::read_to_string(out.join("report.md")).unwrap()
}

/// SparseGPT's sweep as the device runs it (`exec::kernels`' one launch
/// per block on wgpu) against the host's `fasterprune`, over three blocks,
/// unstructured and 2:4, with ties, its `Hinv` factored on the host and on
/// the device (`prune::factor_device`): the same weights to rounding, the
/// same zeros.
struct SweepAgainstHost;

impl OnDevice for SweepAgainstHost {
    type Output = Vec<(String, usize, usize, f32)>;
    fn run<B: Compute>(self, device: &B::Device) -> Self::Output {
        use burn::prelude::{Tensor, TensorData};
        use prunemem::prune::sparsegpt::{SparseGptOptions, fasterprune};
        let (rows, cols, n) = (96usize, 300usize, 400usize);
        let mut rng = prunemem::model::synthetic::Normal::new(5);
        let w: Vec<f32> = rng
            .vec(rows * cols, 1.0)
            .iter()
            .map(|v| (v * 8.0).round() / 8.0)
            .collect();
        let (h, _) = prunemem::model::synthetic::correlated_hessian(&mut rng, cols, n);
        let mut out = Vec::new();
        for pattern in [Pattern::Unstructured, Pattern::NM { n: 2, m: 4 }] {
            let options = SparseGptOptions {
                sparsity: 0.5,
                pattern,
                percdamp: 0.01,
                blocksize: 128,
            };
            let host = fasterprune(&w, rows, cols, h.clone(), options).unwrap();
            let mut t = vec![0f32; rows * cols];
            for r in 0..rows {
                for c in 0..cols {
                    t[c * rows + r] = w[r * cols + c];
                }
            }
            let wt = Tensor::<B, 2>::from_data(TensorData::new(t, [cols, rows]), device);
            use prunemem::prune::sparsegpt_device::Factored;
            // Factored on the host and uploaded (a distributed run), and
            // factored on the device (`prune::factor_device`).
            let on_host = Factored::<B>::of(h.clone(), cols, 0.01, 128, device).unwrap();
            let hd = Tensor::<B, 2>::from_data(TensorData::new(h.clone(), [cols, cols]), device);
            let on_device = Factored::<B>::on_device(hd, 0.01, 128).unwrap();
            for (factored, name) in [(on_host, "host"), (on_device, "device")] {
                let dev = prunemem::prune::sparsegpt_device::prune(wt.clone(), &factored, options);
                let got: Vec<f32> = dev.weight.transpose().into_data().iter::<f32>().collect();
                let differ = host
                    .weight
                    .iter()
                    .zip(&got)
                    .filter(|(a, b)| (**a == 0.0) != (**b == 0.0))
                    .count();
                let worst = host
                    .weight
                    .iter()
                    .zip(&got)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                out.push((
                    format!("{pattern:?}, Hinv factored on the {name}"),
                    differ,
                    dev.zeros as usize,
                    worst,
                ));
            }
        }
        out
    }
}

#[test]
fn the_sparsegpt_sweep_kernel_gives_the_hosts_weights() {
    for (pattern, differ, zeros, worst) in wgpu().run(SweepAgainstHost) {
        println!("{pattern}: {differ} positions differ, {zeros} zeros, weights within {worst}");
        assert_eq!(differ, 0, "{pattern}");
        assert!(worst < 1e-4, "{pattern}: {worst}");
        assert!(zeros >= 96 * 300 / 2, "{pattern}: {zeros}");
    }
}

/// The selection kernels and the evaluation's loss kernel
/// (`exec::kernels`, one launch each on wgpu) against plain host
/// computations: the `k` smallest of every column and the `n` smallest of
/// every group of `m` rows by a stable sort (keys with many ties, read in
/// both layouts), the per-matrix threshold, and each row's `logsumexp - x[t]`
/// in f64 over a vocabulary wider than cubecl's reductions reach.
struct KernelsAgainstHost;

/// `keys` (`[rows, cols]`) on the device in both layouts a weight comes in
/// (`[in, out]` and its transpose), each through `kernel`, its mask
/// compared with `expected`: (case, positions that differ, kernel ran).
fn in_both_layouts<B: Compute>(
    keys: &[i32],
    (rows, cols): (usize, usize),
    device: &B::Device,
    expected: &[bool],
    case: &str,
    kernel: impl Fn(
        burn::prelude::Tensor<B, 2, burn::prelude::Int>,
    ) -> Option<burn::prelude::Tensor<B, 2, burn::prelude::Bool>>,
) -> Vec<(String, f64, bool)> {
    use burn::prelude::{Int, Tensor, TensorData};
    let mut t = vec![0i32; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = keys[r * cols + c];
        }
    }
    let straight =
        Tensor::<B, 2, Int>::from_data(TensorData::new(keys.to_vec(), [rows, cols]), device);
    let transposed =
        Tensor::<B, 2, Int>::from_data(TensorData::new(t, [cols, rows]), device).transpose();
    [("[rows, cols]", straight), ("transposed", transposed)]
        .into_iter()
        .map(|(layout, k)| {
            let (differ, ran) = match kernel(k) {
                Some(mask) => {
                    let got: Vec<bool> = mask.into_data().iter::<bool>().collect();
                    let differ = got.iter().zip(expected).filter(|(a, b)| a != b).count();
                    (differ as f64, true)
                }
                None => (f64::NAN, false),
            };
            (format!("{case} {layout}"), differ, ran)
        })
        .collect()
}

/// The N:M kernel against a stable sort of each group, in both layouts,
/// on the first 296 rows of `keys` (`[_, cols]`, heavy ties).
fn group_cases<B: Compute>(
    keys: &[i32],
    cols: usize,
    device: &B::Device,
) -> Vec<(String, f64, bool)> {
    let rows = 296;
    let keys = &keys[..rows * cols];
    let mut out = Vec::new();
    for (n, m) in [(2, 4), (4, 8), (1, 4)] {
        let mut expected = vec![false; rows * cols];
        for c in 0..cols {
            for g in (0..rows).step_by(m) {
                let mut order: Vec<usize> = (g..g + m).collect();
                order.sort_by_key(|&r| keys[r * cols + c]);
                for &r in &order[..n] {
                    expected[r * cols + c] = true;
                }
            }
        }
        out.extend(in_both_layouts::<B>(
            keys,
            (rows, cols),
            device,
            &expected,
            &format!("select {n}:{m}"),
            |k| B::smallest_per_group(k, n, m).ok(),
        ));
    }
    out
}

/// Causal attention in f64 on the host: `[b, h, s, d]` row-major.
fn host_attention(q: &[f32], k: &[f32], v: &[f32], [b, h, s, d]: [usize; 4]) -> Vec<f64> {
    let mut out = vec![0f64; b * h * s * d];
    let scale = 1.0 / (d as f64).sqrt();
    for bh in 0..b * h {
        let at = |t: &[f32], i: usize, c: usize| t[(bh * s + i) * d + c] as f64;
        for i in 0..s {
            let scores: Vec<f64> = (0..=i)
                .map(|j| (0..d).map(|c| at(q, i, c) * at(k, j, c)).sum::<f64>() * scale)
                .collect();
            let max = scores.iter().cloned().fold(f64::MIN, f64::max);
            let weights: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for c in 0..d {
                let mix: f64 = (0..=i).map(|j| weights[j] * at(v, j, c)).sum();
                out[(bh * s + i) * d + c] = mix / total;
            }
        }
    }
    out
}

/// The fused attention against the host's, for shapes a plane does and
/// does not divide, both dtypes, and a query laid out `[b, s, h, d]` and
/// swapped (as a layer makes it): the worst error relative to the largest
/// output.
fn attention_cases<B: Compute>(
    rng: &mut prunemem::model::synthetic::Normal,
    device: &B::Device,
) -> Vec<(String, f64, bool)> {
    use burn::prelude::{Tensor, TensorData};
    use burn::tensor::FloatDType;
    let mut out = Vec::new();
    for (shape, dtype) in [
        ([2, 3, 37, 64], FloatDType::F32),
        ([2, 3, 37, 64], FloatDType::F16),
        ([1, 4, 128, 32], FloatDType::F16),
        ([1, 2, 300, 64], FloatDType::F16),
    ] {
        let [b, h, s, d] = shape;
        let n = b * h * s * d;
        // The query is made as `[b, s, h, d]` and swapped, as a layer's is.
        let q_bshd = rng.vec(n, 1.0);
        let (k, v) = (rng.vec(n, 1.0), rng.vec(n, 1.0));
        let tensor = |x: &[f32], dims: [usize; 4]| {
            Tensor::<B, 4>::from_data(TensorData::new(x.to_vec(), dims), device).cast(dtype)
        };
        let q = tensor(&q_bshd, [b, s, h, d]).swap_dims(1, 2);
        let seen = |t: &Tensor<B, 4>| host_f32(t.clone());
        let (qt, kt, vt) = (q, tensor(&k, shape), tensor(&v, shape));
        let want = host_attention(&seen(&qt), &seen(&kt), &seen(&vt), shape);
        let scale = want.iter().fold(0f64, |a, x| a.max(x.abs())).max(1e-12);
        let error = |got: &Tensor<B, 4>| {
            seen(got)
                .iter()
                .zip(&want)
                .map(|(g, w)| (*g as f64 - w).abs() / scale)
                .fold(0f64, f64::max)
        };
        // Burn's own attention (its separate kernels) on the same inputs,
        // for the record.
        let options = burn::tensor::ops::AttentionModuleOptions {
            scale: None,
            softcap: None,
            is_causal: true,
        };
        let burns = error(&burn::tensor::module::attention(
            qt.clone(),
            kt.clone(),
            vt.clone(),
            None,
            None,
            options,
        ));
        let (worst, ran) = match B::fused_attention(qt, kt, vt) {
            Ok(got) => (error(&got), true),
            Err(_) => (f64::NAN, false),
        };
        out.push((
            format!("attention {shape:?} {dtype:?} (Burn's kernels: {burns:.2e})"),
            worst,
            ran,
        ));
    }
    out
}

impl OnDevice for KernelsAgainstHost {
    /// (case, positions that differ or worst relative error, kernel ran).
    type Output = Vec<(String, f64, bool)>;
    fn run<B: Compute>(self, device: &B::Device) -> Self::Output {
        use burn::prelude::{Int, Tensor, TensorData};
        use burn::tensor::FloatDType;
        let mut out = Vec::new();
        let mut rng = prunemem::model::synthetic::Normal::new(11);
        let (rows, cols) = (300usize, 70usize);
        // Non-negative keys, a few hundred distinct values: ties everywhere.
        let keys: Vec<i32> = rng
            .vec(rows * cols, 1.0)
            .iter()
            .map(|v| ((v.abs() * 64.0).round() as i32) * 1000)
            .collect();
        for k in [1, 150, 299] {
            let mut expected = vec![false; rows * cols];
            for c in 0..cols {
                let mut order: Vec<usize> = (0..rows).collect();
                order.sort_by_key(|&r| keys[r * cols + c]);
                for &r in &order[..k] {
                    expected[r * cols + c] = true;
                }
            }
            out.extend(in_both_layouts::<B>(
                &keys,
                (rows, cols),
                device,
                &expected,
                &format!("select k={k}"),
                |t| B::smallest_per_column(t, k).ok(),
            ));
        }
        out.extend(group_cases::<B>(&keys, cols, device));
        let mut sorted = keys.clone();
        sorted.sort();
        for k in [1, 777, rows * cols] {
            let t =
                Tensor::<B, 2, Int>::from_data(TensorData::new(keys.clone(), [rows, cols]), device);
            let (miss, ran) = match B::kth_smallest(&t.transpose(), k) {
                Some(got) => {
                    let got = got.into_data().iter::<i64>().next().unwrap_or(-1);
                    ((got - sorted[k - 1] as i64).abs() as f64, true)
                }
                None => (f64::NAN, false),
            };
            out.push((format!("select kth k={k}"), miss, ran));
        }
        let (rows, vocab, skip) = (37usize, 70_000usize, 5usize);
        let logits: Vec<f32> = rng.vec(rows * vocab, 3.0);
        let targets: Vec<i64> = (0..rows).map(|r| ((r * 7919) % vocab) as i64).collect();
        for dtype in [FloatDType::F32, FloatDType::F16] {
            let x =
                Tensor::<B, 2>::from_data(TensorData::new(logits.clone(), [rows, vocab]), device)
                    .cast(dtype);
            let seen: Vec<f32> = x
                .clone()
                .cast(FloatDType::F32)
                .into_data()
                .iter::<f32>()
                .collect();
            let t =
                Tensor::<B, 1, Int>::from_data(TensorData::new(targets.clone(), [rows]), device);
            let (worst, ran) = match B::row_nll(x, t, skip) {
                Ok(nll) => {
                    let got: Vec<f32> = nll.into_data().iter::<f32>().collect();
                    let worst = (0..rows)
                        .map(|r| {
                            let row = &seen[r * vocab..(r + 1) * vocab];
                            let max = row.iter().fold(f64::MIN, |a, v| a.max(*v as f64));
                            let lse = max
                                + row
                                    .iter()
                                    .map(|v| (*v as f64 - max).exp())
                                    .sum::<f64>()
                                    .ln();
                            let want = if r < skip {
                                0.0
                            } else {
                                lse - row[targets[r] as usize] as f64
                            };
                            (got[r] as f64 - want).abs() / want.abs().max(1.0)
                        })
                        .fold(0f64, f64::max);
                    (worst, true)
                }
                Err(_) => (f64::NAN, false),
            };
            out.push((format!("nll {dtype:?}"), worst, ran));
        }
        out.extend(attention_cases::<B>(&mut rng, device));
        out.extend(swiglu_cases::<B>(&mut rng, device));
        out.extend(square_sum_cases::<B>(&mut rng, device));
        out.extend(rms_norm_cases::<B>(&mut rng, device));
        out.extend(head_cases::<B>(&mut rng, device));
        out
    }
}

/// The head's product with its `[vocab, hidden]` table in the stored
/// layout (`Compute::matmul_rows`, what `PRUNEMEM_HEAD_MATMUL` names) with
/// cubek's unit kernel, the strategy lavapipe runs, against f64 on the
/// host: a chunk's 261 rows by a vocabulary no multiple of a tile, worst
/// error relative to the largest logit.
fn head_cases<B: Compute>(
    rng: &mut prunemem::model::synthetic::Normal,
    device: &B::Device,
) -> Vec<(String, f64, bool)> {
    use burn::prelude::{Tensor, TensorData};
    use burn::tensor::FloatDType;
    let (n, k, m) = (261usize, 96usize, 1000usize);
    let (a, b) = (rng.vec(n * k, 1.0), rng.vec(m * k, 1.0));
    let mut out = Vec::new();
    for dtype in [FloatDType::F32, FloatDType::F16] {
        let h = Tensor::<B, 2>::from_data(TensorData::new(a.clone(), [n, k]), device).cast(dtype);
        let table =
            Tensor::<B, 2>::from_data(TensorData::new(b.clone(), [m, k]), device).cast(dtype);
        let (sa, sb) = (host_f32(h.clone()), host_f32(table.clone()));
        let want: Vec<f64> = (0..n * m)
            .map(|i| {
                let (r, c) = (i / m, i % m);
                (0..k)
                    .map(|j| sa[r * k + j] as f64 * sb[c * k + j] as f64)
                    .sum()
            })
            .collect();
        let scale = want.iter().fold(0f64, |x, v| x.max(v.abs()));
        let error = |got: Tensor<B, 2>| {
            assert_eq!(got.dims(), [n, m]);
            let got = host_f32(got);
            got.iter()
                .zip(&want)
                .map(|(g, w)| (*g as f64 - w).abs())
                .fold(0f64, f64::max)
                / scale
        };
        let burns = error(h.clone().matmul(table.clone().transpose()));
        let (worst, ran) = match B::matmul_rows(h, table, "simple_unit") {
            Ok(product) => (error(product), true),
            Err(_) => (f64::NAN, false),
        };
        out.push((
            format!("head product {dtype:?} (Burn's matmul: {burns:.2e})"),
            worst,
            ran,
        ));
    }
    out
}

/// The RMS norm's kernel against f64 on the host (`x / sqrt(mean(x²) +
/// eps) · weight`), in output ulps: a row wider than a cube, not a
/// multiple of it, and more rows than one grid (the cubes stride).
fn rms_norm_cases<B: Compute>(
    rng: &mut prunemem::model::synthetic::Normal,
    device: &B::Device,
) -> Vec<(String, f64, bool)> {
    use burn::prelude::{Tensor, TensorData};
    use burn::tensor::FloatDType;
    let eps = 1e-5;
    let mut out = Vec::new();
    for (rows, d) in [(100usize, 1000usize), (70_000, 8)] {
        let (x, wt) = (rng.vec(rows * d, 2.0), rng.vec(d, 1.0));
        for dtype in [FloatDType::F32, FloatDType::F16] {
            let xt = Tensor::<B, 2>::from_data(TensorData::new(x.clone(), [rows, d]), device)
                .cast(dtype);
            let wt =
                Tensor::<B, 1>::from_data(TensorData::new(wt.clone(), [d]), device).cast(dtype);
            let (xs, ws) = (host_f32(xt.clone()), host_f32(wt.clone()));
            let ulp = unit_of(dtype);
            let error = |got: Tensor<B, 2>| {
                let got = host_f32(got);
                (0..rows)
                    .map(|r| {
                        let row = &xs[r * d..(r + 1) * d];
                        let ms = row.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / d as f64;
                        let inv = 1.0 / (ms + eps).sqrt();
                        (0..d)
                            .map(|i| {
                                let want = row[i] as f64 * inv * ws[i] as f64;
                                (got[r * d + i] as f64 - want).abs() / (want.abs().max(1e-3) * ulp)
                            })
                            .fold(0f64, f64::max)
                    })
                    .fold(0f64, f64::max)
            };
            // Burn's ops, as `LlamaRmsNorm` ran them before the kernel.
            let xf = xt.clone().cast(FloatDType::F32);
            let variance = xf.clone().square().mean_dim(1);
            let normed = (xf * variance.add_scalar(eps).sqrt().recip()).cast(dtype);
            let burns = error(normed * wt.clone().unsqueeze::<2>());
            let (worst, ran) = match B::rms_norm(xt, &wt, eps) {
                Ok(got) => (error(got), true),
                Err(_) => (f64::NAN, false),
            };
            out.push((
                format!("rms norm {rows}x{d} {dtype:?} (worst error in output ulps; Burn's ops: {burns:.2})"),
                worst,
                ran,
            ));
        }
    }
    out
}

/// A tensor's values on the host, in f32 (what a kernel's test compares).
fn host_f32<B: Compute, const D: usize>(t: burn::prelude::Tensor<B, D>) -> Vec<f32> {
    t.cast(burn::tensor::FloatDType::F32)
        .into_data()
        .iter::<f32>()
        .collect()
}

/// One unit in the last place of an f32 or f16 value of magnitude 1.
fn unit_of(dtype: burn::tensor::FloatDType) -> f64 {
    if dtype == burn::tensor::FloatDType::F32 {
        1.2e-7
    } else {
        9.8e-4
    }
}

/// Wanda's column norms (`Σ_rows x²` per column) straight from the input,
/// against f64 on the host: one slab of rows and 64 of them, a width that
/// is no multiple of a cube's 256 columns, in f32 and f16.
fn square_sum_cases<B: Compute>(
    rng: &mut prunemem::model::synthetic::Normal,
    device: &B::Device,
) -> Vec<(String, f64, bool)> {
    use burn::prelude::{Tensor, TensorData};
    use burn::tensor::FloatDType;
    let mut out = Vec::new();
    for (rows, cols) in [(100usize, 601usize), (20_000, 601)] {
        let x = rng.vec(rows * cols, 2.0);
        for dtype in [FloatDType::F32, FloatDType::F16] {
            let t = Tensor::<B, 2>::from_data(TensorData::new(x.clone(), [rows, cols]), device)
                .cast(dtype);
            let seen = host_f32(t.clone());
            let want: Vec<f64> = (0..cols)
                .map(|c| (0..rows).map(|r| (seen[r * cols + c] as f64).powi(2)).sum())
                .collect();
            let error = |got: Tensor<B, 1>| {
                let got = host_f32(got);
                (0..cols)
                    .map(|c| (got[c] as f64 - want[c]).abs() / want[c].max(1e-30))
                    .fold(0f64, f64::max)
            };
            // Burn's ops on the same input: an f32 copy, squared and summed.
            let burns = error(
                t.clone()
                    .cast(FloatDType::F32)
                    .square()
                    .sum_dim(0)
                    .reshape([cols]),
            );
            let (worst, ran) = match B::column_square_sums(t) {
                Ok(sums) => (error(sums), true),
                Err(_) => (f64::NAN, false),
            };
            out.push((
                format!("square sums {rows}x{cols} {dtype:?} (Burn's ops: {burns:.2e})"),
                worst,
                ran,
            ));
        }
    }
    out
}

/// The MLP's `silu(gate) · up` kernel against f64 on the host, in each
/// dtype, over more elements than one grid's pass (the units stride).
fn swiglu_cases<B: Compute>(
    rng: &mut prunemem::model::synthetic::Normal,
    device: &B::Device,
) -> Vec<(String, f64, bool)> {
    use burn::prelude::{Tensor, TensorData};
    use burn::tensor::FloatDType;
    let dims = [3, 700, 601];
    let n = dims.iter().product::<usize>();
    let (g, u) = (rng.vec(n, 3.0), rng.vec(n, 1.0));
    let mut out = Vec::new();
    for dtype in [FloatDType::F32, FloatDType::F16] {
        let t = |x: &[f32]| {
            Tensor::<B, 3>::from_data(TensorData::new(x.to_vec(), dims), device).cast(dtype)
        };
        let (gt, ut) = (t(&g), t(&u));
        let (gs, us) = (host_f32(gt.clone()), host_f32(ut.clone()));
        // Each output's own rounding: f32 or f16.
        let ulp = unit_of(dtype);
        let error = |h: Tensor<B, 3>| {
            let h = host_f32(h);
            (0..n)
                .map(|i| {
                    let (g, u) = (gs[i] as f64, us[i] as f64);
                    let want = g / (1.0 + (-g).exp()) * u;
                    (h[i] as f64 - want).abs() / (want.abs().max(1e-3) * ulp)
                })
                .fold(0f64, f64::max)
        };
        // Burn's ops on the same inputs, for the record.
        let burns = error(burn::tensor::activation::silu(gt.clone()) * ut.clone());
        // A gate another tensor holds gets a new output, and keeps its
        // values; an unshared one is written over.
        let held = gt.clone();
        let (worst, ran) = match B::swiglu(gt, ut.clone()) {
            Ok(h) => (error(h), true),
            Err(_) => (f64::NAN, false),
        };
        let kept = host_f32(held.clone()) == gs;
        out.push((
            format!("swiglu {dtype:?} beside a held gate (worst error in output ulps; Burn's ops: {burns:.2})"),
            if kept { worst } else { f64::INFINITY },
            ran,
        ));
        let (worst, ran) = match B::swiglu(held, ut) {
            Ok(h) => (error(h), true),
            Err(_) => (f64::NAN, false),
        };
        out.push((
            format!("swiglu {dtype:?} over its gate (worst error in output ulps; Burn's ops: {burns:.2})"),
            worst,
            ran,
        ));
    }
    out
}

/// The error of Burn's own path that a case's label records after `key`
/// (0 where it records none).
fn burns_error(case: &str, key: &str) -> f64 {
    case.split(key)
        .nth(1)
        .and_then(|e| e.trim_end_matches(')').parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn the_selection_and_loss_kernels_give_the_hosts_answers() {
    for (case, miss, ran) in wgpu().run(KernelsAgainstHost) {
        println!("{case}: kernel ran {ran}, miss {miss}");
        // The flash kernel computes in f16 tiles: f32 keeps Burn's.
        if case.starts_with("attention") && case.contains("F32") {
            assert!(!ran, "{case}: the f16 kernel must decline f32");
            continue;
        }
        assert!(ran, "{case}: the wgpu backend must take the kernel");
        match case.starts_with("select") {
            true => assert_eq!(miss, 0.0, "{case}: positions differ"),
            // Rounded once from f32 registers: within a few of the
            // output dtype's units, and no worse than Burn's ops.
            false if case.starts_with("swiglu") || case.starts_with("rms norm") => {
                let burns = burns_error(&case, "Burn's ops: ");
                assert!(miss <= 8.0, "{case}: {miss}");
                assert!(miss <= burns.max(1.0), "{case}: {miss} past Burn's ops");
            }
            // f16 operands, f32 accumulation: the output's own rounding
            // (f16 keeps 11 bits: 4.9e-4 of the scale).
            // And no further from the f64 answer than Burn's own f16
            // kernels, which it replaces.
            false if case.starts_with("attention") => {
                let burns = burns_error(&case, "Burn's kernels: ");
                assert!(miss < 1e-3, "{case}: relative error {miss}");
                assert!(miss <= burns, "{case}: {miss} past Burn's kernels' error");
            }
            // f32 sums in slabs of at most 313 rows, then over the slabs:
            // rounding only, and no further from f64 than Burn's ops.
            false if case.starts_with("square sums") => {
                let burns = burns_error(&case, "Burn's ops: ");
                assert!(miss < 1e-5, "{case}: relative error {miss}");
                assert!(miss <= burns.max(1e-6), "{case}: {miss} past Burn's ops");
            }
            // The output's own rounding, and no further from f64 than
            // Burn's matmul on the transposed view.
            false if case.starts_with("head product") => {
                let burns = burns_error(&case, "Burn's matmul: ");
                let unit = if case.contains("F16") { 1e-3 } else { 1e-6 };
                assert!(miss < unit, "{case}: relative error {miss}");
                assert!(miss <= 2.0 * burns.max(unit / 10.0), "{case}: {miss}");
            }
            false => assert!(miss < 1e-5, "{case}: relative error {miss}"),
        }
    }
}
