//! Whole device runs through the CLI on the synthetic fixture: device
//! bytes at every stage and in every log, the pool split by category and
//! steady from layer to layer, `--device-memory`'s OOM contract, one-line
//! refusals, and a training run's analysis of the device pool.

use super::*;

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
    let spec = prunemem::model::synthetic::SyntheticSpec {
        layers: 12,
        ..Default::default()
    };
    let (dir, model, text) = fixture_of(&spec, 6000);
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
