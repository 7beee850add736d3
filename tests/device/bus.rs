//! What crosses the bus: a device prune moves no weight-sized tensor back
//! to the host, and its uploads are what the engine says they are.

use super::*;

/// What a layer's factorisations read back at block size 128
/// (`prune::factor_device`): each input's diagonal and its diagonal
/// blocks, `in × 129 × 4` bytes (q/k/v, o, gate/up, down).
pub(crate) fn factor_bytes(config: &prunemem::model::LlamaConfig) -> u64 {
    let (h, i) = (config.hidden_size, config.intermediate_size);
    [h, h, h, i]
        .iter()
        .map(|n| (n * n.min(&128) + n) as u64 * 4)
        .sum()
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
        // RIA's layers are kept on the device (the evaluation inside the
        // prune, the default, is `tests/device/inline.rs`'s).
        if let Some(cap) = cap {
            extra.extend(["--device-memory", cap, "--keep-pruned", "device"]);
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
            "sparsegpt" => factor_bytes(&config),
            _ => 0,
        };
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
            if cap.is_some() { "device" } else { "inline" },
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

/// `PRUNEMEM_TRANSFERS=pinned` sends every large copy to the backend's
/// staged copies (`exec::copies`): up, a streamed layer's linears, a layer
/// kept in host memory, the head's table, a batch's hidden states; down, a
/// pruned layer kept in host memory and a weight `--save` writes. wgpu has
/// none: each request is handed back to Burn's `from_data` or `into_data`
/// and counted, and the run is the same run, bit for bit, its saved model
/// included. (The staged copies themselves run on CUDA only:
/// `examples/transfer_rate.rs`; their plan and loop are unit tested in
/// `exec::staged`.)
#[test]
fn pinned_transfer_requests_are_counted_and_change_nothing_on_wgpu() {
    let (dir, model, text) = cli_fixture();
    let config = prunemem::model::LlamaConfig::from_file(&model.join("config.json")).unwrap();
    let run = |transfers: &str| {
        let logs = dir.path().join(format!("logs-{transfers}"));
        let save = dir.path().join(format!("model-{transfers}"));
        let extra = [
            "--json",
            "--eval-text",
            s(&text),
            "--eval-windows",
            "2",
            "--keep-pruned",
            "host",
            "--save",
            s(&save),
            "--log-memory",
            s(&logs),
        ];
        let argv = wanda_on_wgpu(&model, &text, &extra);
        let env = [("PRUNEMEM_TRANSFERS", transfers)];
        let (code, stdout, stderr) = support::run_prunemem_with(&argv, &env);
        assert_eq!(code, Some(0), "{transfers}: {stdout}\n{stderr}");
        let Some(Event::RunStarted { plan }) = events(&logs).into_iter().next() else {
            panic!("no plan")
        };
        assert_eq!(plan.settings["transfers"], transfers, "{:?}", plan.settings);
        let weights = std::fs::read(save.join("model.safetensors")).unwrap();
        (support::json_line(&stdout), weights)
    };
    let ((burn, burn_weights), (pinned, pinned_weights)) = (run("burn"), run("pinned"));
    assert!(burn["perplexity"].as_f64() > Some(1.0), "{burn}");
    for key in ["perplexity", "device_peak", "device_reserved_peak"] {
        assert_eq!(burn[key], pinned[key], "{key}");
    }
    // The same bytes in every phase, and the same launches in all. A
    // launch is counted when cubecl's device thread logs it, in the phase
    // open then, so a few can land on either side of a phase's end
    // (2026-11-28: 14 of 247 between the prune and the evaluation).
    let phases = |j: &serde_json::Value| j["transfers"].as_object().unwrap().clone();
    let (a, b) = (phases(&burn), phases(&pinned));
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (phase, x) in &a {
        for key in ["host_to_device_bytes", "device_to_host_bytes"] {
            assert_eq!(x[key], b[phase][key], "{phase} {key}");
        }
    }
    let launches = |m: &serde_json::Map<String, serde_json::Value>| -> u64 {
        m.values().map(|p| p["kernels"].as_u64().unwrap_or(0)).sum()
    };
    assert_eq!(launches(&a), launches(&b), "kernel launches");
    assert!(burn_weights == pinned_weights, "saved weights differ");
    assert_eq!(pinned["pruned_layers_kept"], "host");
    // Each layer's seven linears went up twice (streamed in for the
    // prune, then again for the evaluation) and came down at least once
    // (written by --save): each a request handed back.
    let linears = 7 * config.num_layers as u64;
    for (way, times) in [("pinned_upload", 2), ("pinned_download", 1)] {
        let linears = times * linears;
        let uses = &pinned["device_kernels"][way];
        println!("{way} on wgpu: {uses}");
        assert_eq!(uses["ran"].as_u64(), Some(0), "{uses}");
        assert!(uses["fell_back"].as_u64() >= Some(linears), "{way}: {uses}");
        // Nothing asked for it in Burn's run.
        assert!(
            burn["device_kernels"].get(way).is_none(),
            "{}",
            burn["device_kernels"]
        );
    }
}

/// GradProbe on a device changes its weights where they are (the earlier
/// zeros and the modified pass's reduction, by scatter) and folds each
/// batch's weight gradient into the candidates' maxima there (by gather):
/// what comes back is each probed weight once, in the original pass, for
/// the host to choose its candidates, then one maximum per candidate per
/// pass, and the head's logits. The code it replaced read every linear
/// back three times a step and each batch's gradient of every linear
/// twice, and counted neither the gradients nor its layers' uploads. Its
/// pruned layers go to the evaluation as step 6 zeroes them, as a streamed
/// prune's do, instead of to a scratch checkpoint or host memory. Its device pool is estimated
/// (`estimate::prunemem_device::gradprobe`).
#[test]
fn gradprobe_on_a_device_reads_back_candidates_not_gradients() {
    let (dir, model, text) = wide_fixture();
    let config = prunemem::model::LlamaConfig::from_file(&model.join("config.json")).unwrap();
    let (sparsity, batches, seqlen) = (0.1, 2u64, 32u64);
    let logs = dir.path().join("logs-gradprobe");
    let common = [
        "--sparsity",
        "0.1",
        "--num-batches",
        "2",
        "--eval-text",
        s(&text),
        "--eval-windows",
        "2",
        "--json",
    ];
    // The run, and the run with `extra`: its --json line.
    let run = |extra: &[&str]| -> serde_json::Value {
        let mut argv = gradprobe_on_wgpu(&model, &text, &common);
        argv.extend_from_slice(extra);
        let (code, stdout, stderr) = run_prunemem(&argv);
        assert_eq!(code, Some(0), "{extra:?}: {stdout}\n{stderr}");
        serde_json::from_str(stdout.lines().last().unwrap()).unwrap()
    };
    let json = run(&["--log-memory", s(&logs)]);
    let t = &json["transfers"];
    println!("gradprobe: transfers {t}");
    let phases = t.as_object().unwrap();
    let (layers, h) = (config.num_layers as u64, config.hidden_size as u64);
    let linears = config.layer_param_count() - 2 * h;
    let candidates = (linears as f64 * sparsity) as u64 + 7;
    // The original pass chooses each linear's candidates on the device: one
    // bit per weight comes back (32 to a word, a word's padding at most per
    // linear) and one tie flag, where the weight came back in f32 before
    // (2 949 120 bytes a layer here). Each pass, the maxima: 4 bytes per
    // candidate.
    let selection = linears / 8 + 7 * 4 + 7 * 4;
    // The head's loss and backward run on the device: no logits come back,
    // one f32 loss per token a pass (a [tokens, vocab] block of logits twice
    // a batch, 2 097 152 bytes here, before).
    let losses = 2 * batches * seqlen * 4;
    // Then step 6 zeroes each layer where it is and hands it to the
    // evaluation, which runs it at once (below): one zero count per linear
    // comes back. Kept in host memory instead (`--keep-pruned host`), each
    // pruned layer comes back once more, in f32.
    let counts = layers * 7 * 4;
    let kept = layers * config.layer_param_count() * 4;
    let allowed =
        |kept: u64| layers * (selection + 2 * candidates * 4) + losses + counts + kept + 4096;
    // Bytes across the bus one way (`key`) outside the evaluation.
    let outside_eval = |j: &serde_json::Value, key: &str| -> u64 {
        let phases = j["transfers"].as_object().unwrap();
        phases
            .iter()
            .filter(|(phase, _)| *phase != "eval")
            .map(|(_, p)| p[key].as_u64().unwrap_or(0))
            .sum()
    };
    let back_outside_eval = |j: &serde_json::Value| outside_eval(j, "device_to_host_bytes");
    let back = back_outside_eval(&json);
    println!(
        "gradprobe: {back} bytes back outside the evaluation, at most {}; the linears in f32: {} per layer",
        allowed(0),
        linears * 4
    );
    assert!(back <= allowed(0), "{back} > {}: {t}", allowed(0));
    // Every layer load is counted, in its own phase: two passes, each
    // loading every layer forward and again backward, and step 6 once more,
    // in f32. The rest of the probe is in its pass's forward, head and
    // backward, each with its launches and seconds, and nothing outside a
    // phase (a GradProbe run was all `other` before).
    let layer = config.layer_param_count() * 4;
    assert_eq!(
        t["load_layer"]["host_to_device_bytes"].as_u64(),
        Some(5 * layers * layer),
        "{t}"
    );
    for phase in ["probe_forward", "probe_head", "probe_backward", "prune"] {
        assert!(t[phase]["kernels"].as_u64() > Some(0), "{phase}: {t}");
        assert!(
            json["seconds_by_phase"][phase].as_f64() > Some(0.0),
            "{phase}: {}",
            json["seconds_by_phase"]
        );
    }
    assert!(t.get("other").is_none(), "outside every phase: {t}");
    // The backward uploads each linear's candidates' indices once a pass
    // (4 bytes each): the original pass's maxima, and the modified pass's
    // reduction, whose indices its maxima gather at (they went up twice).
    let backward_up = t["probe_backward"]["host_to_device_bytes"]
        .as_u64()
        .unwrap();
    assert!(
        backward_up <= 2 * layers * candidates * 4 + 4096,
        "{backward_up} bytes up in the backward: {t}"
    );
    // The live readings count the same bytes and launches: the run's last
    // reading (after its evaluation) carries the totals of `transfers`.
    let last = events(&logs)
        .into_iter()
        .rev()
        .find_map(|e| match e {
            Event::Stage { snapshot } | Event::Sample { snapshot } => snapshot.bus,
            _ => None,
        })
        .expect("a device run's readings carry the bus");
    let all = |key: &str| -> u64 { phases.values().map(|p| p[key].as_u64().unwrap_or(0)).sum() };
    assert_eq!(
        last.host_to_device_bytes,
        all("host_to_device_bytes"),
        "{last:?}: {t}"
    );
    assert_eq!(
        last.device_to_host_bytes,
        all("device_to_host_bytes"),
        "{last:?}: {t}"
    );
    assert_eq!(last.kernels, Some(all("kernels")), "{last:?}: {t}");
    // The head's table goes up once a pass (f32, tied here), in the head.
    let table = (config.vocab_size * config.hidden_size * 4) as u64;
    assert!(
        t["probe_head"]["host_to_device_bytes"].as_u64() >= Some(2 * table),
        "{t}"
    );
    assert!(
        json["perplexity"].as_f64().is_some_and(f64::is_finite),
        "{json}"
    );
    // Nothing saved: the pruned layers went to the evaluation as step 6
    // zeroed them, not to a scratch checkpoint nor to host memory, and the
    // evaluation is the scratch checkpoint's and the kept layers' to the
    // bit. Where the device's memory is known and holds them, the layers
    // stay there between the passes and are handed to the evaluation: read
    // once instead of four times a step and once more in step 6 (below),
    // the same decisions and perplexity.
    assert_eq!(json["pruned_layers_kept"], "inline", "{json}");
    assert_eq!(json["gradprobe_layers"], "streamed", "{json}");
    let disk = run(&["--keep-pruned", "disk"]);
    assert_eq!(disk["pruned_layers_kept"], "disk", "{disk}");
    let host = run(&["--keep-pruned", "host"]);
    assert_eq!(host["pruned_layers_kept"], "host", "{host}");
    let host_back = back_outside_eval(&host);
    println!(
        "gradprobe: {host_back} bytes back outside the evaluation with the layers kept in host memory"
    );
    assert!(host_back >= back + kept, "{host_back} < {back} + {kept}");
    assert!(
        host_back <= allowed(kept),
        "{host_back} > {}",
        allowed(kept)
    );
    let resident = run(&["--device-memory", "1GiB"]);
    assert_eq!(resident["gradprobe_layers"], "device", "{resident}");
    assert_eq!(resident["pruned_layers_kept"], "inline", "{resident}");
    // Kept on the device, each layer is read once.
    assert_eq!(
        resident["transfers"]["load_layer"]["host_to_device_bytes"].as_u64(),
        Some(layers * layer),
        "{}",
        resident["transfers"]
    );
    for other in [&disk, &host, &resident] {
        for key in ["perplexity", "layer_sparsity", "sparsity"] {
            assert!(!json[key].is_null(), "{key}: {json}");
            assert_eq!(json[key], other[key], "{key}");
        }
    }
    let up_outside_eval = |j: &serde_json::Value| outside_eval(j, "host_to_device_bytes");
    // And the head's table (tied here) once a step instead of twice.
    let saved = 4 * layers * layer + table;
    assert_eq!(
        up_outside_eval(&resident) + saved,
        up_outside_eval(&json),
        "{} vs {}",
        resident["transfers"],
        json["transfers"]
    );
    // `--iterative` evaluates each step's model the same way, the layers
    // kept on the device shared with the evaluation and left for the next
    // step: every step's figures are the scratch checkpoints'.
    let iterate = [
        "--iterative",
        "--initial-sparsity",
        "0.1",
        "--sparsity-step",
        "0.4",
        "--max-ppl-increase",
        "1e300",
        "--device-memory",
        "1GiB",
    ];
    // Each step's decisions and figures, from the run's log (its seconds
    // differ).
    let steps_of = |name: &str, extra: &[&str]| -> (serde_json::Value, Vec<serde_json::Value>) {
        let logs = dir.path().join(name);
        let json = run(&[&iterate[..], extra, &["--log-memory", s(&logs)]].concat());
        let summary = events(&logs).into_iter().rev().find_map(|e| match e {
            Event::RunFinished { summary } => Some(summary),
            _ => None,
        });
        let mut steps = summary.expect("a summary").results["iterations"]
            .as_array()
            .expect("the iterations")
            .clone();
        for step in &mut steps {
            step.as_object_mut().unwrap().remove("seconds");
        }
        (json, steps)
    };
    let (inline_json, inline_steps) = steps_of("logs-iterate", &[]);
    let (disk_json, disk_steps) = steps_of("logs-iterate-disk", &["--keep-pruned", "disk"]);
    println!("gradprobe --iterative: {inline_steps:?}");
    assert_eq!(inline_json["pruned_layers_kept"], "inline", "{inline_json}");
    assert_eq!(inline_json["gradprobe_layers"], "device", "{inline_json}");
    assert_eq!(disk_json["pruned_layers_kept"], "disk", "{disk_json}");
    assert!(inline_steps.len() >= 2, "{inline_steps:?}");
    assert_eq!(inline_steps, disk_steps);
    for key in ["perplexity", "layer_sparsity", "sparsity"] {
        assert_eq!(inline_json[key], disk_json[key], "{key}");
    }
    // Its device pool is estimated from its buffers, streamed and with its
    // layers kept on the device: each phase's bytes in use and the pool's
    // reserved peak within 5% of what the runs measured.
    let resident_logs = dir.path().join("logs-gradprobe-resident");
    run(&["--device-memory", "1GiB", "--log-memory", s(&resident_logs)]);
    for logs in [&logs, &resident_logs] {
        super::gradprobe_pool::within_the_estimate(logs);
    }
}

/// OWL's outlier pass on a device computes each layer's Wanda metrics where
/// the weights are: what comes back is a sum per output and a count per
/// linear, where every weight came back in f32 before; its layers stream
/// through the prune's reader and their uploads are counted; and its
/// ratios, layer sparsities and masks are the CPU backend's.
#[test]
fn owl_on_a_device_reads_back_sums_not_weights() {
    let spec = prunemem::model::synthetic::SyntheticSpec {
        layers: 4,
        ..Default::default()
    };
    let (dir, model, text) = fixture_of(&spec, 6000);
    let config = prunemem::model::LlamaConfig::from_file(&model.join("config.json")).unwrap();
    let logs = dir.path().join("logs-owl");
    let run = |device: &str| -> serde_json::Value {
        let mut extra = vec![
            "--owl",
            "--sparsity",
            "0.6",
            "--owl-lambda",
            "0.1",
            "--dtype",
            "f32",
            "--json",
        ];
        if device == "wgpu" {
            extra.extend(["--log-memory", s(&logs)]);
        }
        prune_json_on(device, &model, &text, &extra)
    };
    let (cpu, gpu) = (run("cpu"), run("wgpu"));
    let floats = |j: &serde_json::Value, key: &str| -> Vec<f64> {
        let v = j[key].as_array().unwrap_or_else(|| panic!("{key}: {j}"));
        v.iter().map(|x| x.as_f64().unwrap()).collect()
    };
    let (a, b) = (
        floats(&cpu, "owl_outlier_ratios"),
        floats(&gpu, "owl_outlier_ratios"),
    );
    println!("OWL outlier ratios: cpu {a:?}, wgpu {b:?}");
    assert_eq!(a.len(), config.num_layers);
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-6 * x.abs().max(1e-3), "{a:?} {b:?}");
    }
    let (a, b) = (
        floats(&cpu, "owl_layer_sparsity"),
        floats(&gpu, "owl_layer_sparsity"),
    );
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-9, "{a:?} {b:?}");
    }
    assert_eq!(cpu["layer_sparsity"], gpu["layer_sparsity"]);
    let t = &gpu["transfers"];
    println!(
        "OWL on wgpu: transfers {t}, reserved peak {} in {}",
        gpu["device_reserved_peak"], gpu["device_reserved_peak_phase"]
    );
    let (h, i) = (config.hidden_size, config.intermediate_size);
    let kv = config.num_kv_heads * config.head_dim;
    let outputs = (h + kv + kv + h + i + i + h) as u64;
    let layers = config.num_layers as u64;
    let back = t["owl_outliers"]["device_to_host_bytes"].as_u64().unwrap();
    assert!(back > 0, "{t}");
    assert!(
        back <= layers * (outputs * 4 + 7 * 8),
        "{back} bytes back: {t}"
    );
    // Every layer went up twice, in f32: for the outlier pass, then for
    // the prune.
    let layer_bytes = config.layer_param_count() * 4;
    assert_eq!(
        t["load_layer"]["host_to_device_bytes"].as_u64(),
        Some(2 * layers * layer_bytes),
        "{t}"
    );
    let (code, stdout, stderr) = run_prunemem(&["estimate", "--against", s(&logs), "--json"]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let cmp: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    println!("OWL on wgpu against its estimate: {cmp}");
    // The pass is estimated (`estimate::prunemem_device`'s OWL phase): the
    // pool's peak in use and reserved within 5%.
    for p in [&cmp["peak"], &cmp["reserved"]] {
        let error = p["error_percent"].as_f64().expect("measured");
        assert!(error.abs() <= 5.0, "OWL: {p}");
    }
    let owl = cmp["phases"].as_array().unwrap();
    assert!(owl.iter().any(|p| p["phase"] == "owl pass"), "{cmp}");
}
