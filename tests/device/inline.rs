//! The evaluation inside a device prune (`model::inline_eval`): each
//! pruned layer runs the evaluation's batches as soon as it is pruned and
//! is dropped. It must give the kept evaluation's perplexity to the bit,
//! hold and upload no pruned layer, and be estimated.

use super::*;

#[test]
fn the_evaluation_inside_the_prune_is_the_kept_evaluation_without_the_layers() {
    let (dir, model, text) = wide_fixture();
    let config = prunemem::model::LlamaConfig::from_file(&model.join("config.json")).unwrap();
    let run = |name: &str, extra: &[&str]| -> (serde_json::Value, std::path::PathBuf) {
        let logs = dir.path().join(format!("logs-{name}"));
        let mut args = vec!["--eval-text", s(&text), "--eval-windows", "3", "--json"];
        args.extend(["--log-memory", s(&logs)]);
        args.extend_from_slice(extra);
        let (code, stdout, stderr) = run_prunemem(&wanda_on_wgpu(&model, &text, &args));
        assert_eq!(code, Some(0), "{name}: {stdout}\n{stderr}");
        (support::json_line(&stdout), logs)
    };
    // The default on a device of unknown size: the windows' hidden states
    // are far smaller than the layers.
    let (inline, logs) = run("inline", &[]);
    let (device, _) = run("device", &["--keep-pruned", "device"]);
    let (host, _) = run("host", &["--keep-pruned", "host"]);
    assert_eq!(inline["pruned_layers_kept"], "inline", "{inline}");
    let bits = |j: &serde_json::Value| j["perplexity"].as_f64().map(f64::to_bits);
    println!(
        "perplexity inline {}, kept on the device {}, in host memory {}",
        inline["perplexity"], device["perplexity"], host["perplexity"]
    );
    assert!(inline["perplexity"].as_f64() > Some(1.0), "{inline}");
    assert_eq!(bits(&inline), bits(&device));
    assert_eq!(bits(&inline), bits(&host));
    // The bus: the host-kept evaluation uploads every pruned layer again
    // (and the prune read each back); inline, neither, and the rest of
    // the evaluation's traffic is the same bytes.
    let bytes = |j: &serde_json::Value, phase: &str, way: &str| -> u64 {
        j["transfers"][phase][way].as_u64().unwrap_or(0)
    };
    let layers = config.num_layers as u64 * config.layer_param_count() * 2;
    let up = "host_to_device_bytes";
    assert_eq!(
        bytes(&host, "eval", up) - bytes(&inline, "eval", up),
        layers
    );
    assert_eq!(bytes(&device, "eval", up), bytes(&inline, "eval", up));
    let down = |j: &serde_json::Value| -> u64 {
        let phases = j["transfers"].as_object().unwrap();
        phases
            .keys()
            .map(|p| bytes(j, p, "device_to_host_bytes"))
            .sum()
    };
    println!(
        "transfers inline {}\nhost {}",
        inline["transfers"], host["transfers"]
    );
    assert_eq!(down(&host) - down(&inline), layers);
    // The pool: the layers kept on the device are its largest part; inline
    // holds only the windows' hidden states beside the prune.
    let peak = |j: &serde_json::Value, k: &str| j[k].as_u64().unwrap();
    for k in ["device_peak", "device_reserved_peak"] {
        println!(
            "{k}: inline {}, device {}",
            peak(&inline, k),
            peak(&device, k)
        );
        assert!(peak(&inline, k) < peak(&device, k), "{k}");
    }
    // Estimated: the pool's peak in use and reserved within 5%, the prune
    // phase (which now holds the evaluation's hidden states) and the
    // head's phase each within 5%.
    let (code, stdout, stderr) = run_prunemem(&["estimate", "--against", s(&logs), "--json"]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let cmp: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    for p in [&cmp["peak"], &cmp["reserved"]] {
        println!("inline: {p}");
        assert!(
            p["error_percent"].as_f64().expect("measured").abs() <= 5.0,
            "{p}"
        );
    }
    for phase in cmp["phases"].as_array().unwrap() {
        println!(
            "  {}: predicted {} measured {} ({:+.2}%)",
            phase["phase"], phase["predicted"], phase["measured"], phase["error_percent"]
        );
        if ["prune", "eval"].contains(&phase["phase"].as_str().unwrap()) {
            let error = phase["error_percent"].as_f64().expect("measured");
            assert!(error.abs() <= 5.0, "{phase}");
        }
    }
}
