//! Wanda's α-variant on a device, run from the command line: what crosses
//! the bus, the kernels that ran, the α and sparsity against the CPU
//! backend's, and the estimate of the pool.

use super::*;

/// `--use-variant` on a device (`prune::variant_device`): a layer reads
/// back one count per α tried, never a weight, where every linear came
/// back in f32 and went up pruned; nothing goes up; every linear's tables
/// and α steps took their kernels; the α found and the sparsity agree
/// with the CPU backend's; and the estimate of the pool (in use and
/// reserved) holds within 5%.
#[test]
fn wanda_variant_on_a_device_reads_back_counts_not_weights() {
    let (dir, model, text) = wide_fixture();
    let config = prunemem::model::LlamaConfig::from_file(&model.join("config.json")).unwrap();
    let layers = config.num_layers as u64;
    let logs = dir.path().join("logs-variant");
    let run = |device: &str| -> serde_json::Value {
        let mut extra = vec!["--use-variant", "--json"];
        if device == "wgpu" {
            extra.extend(["--log-memory", s(&logs)]);
        }
        prune_json_on(device, &model, &text, &extra)
    };
    let (cpu, gpu) = (run("cpu"), run("wgpu"));
    let t = &gpu["transfers"];
    println!(
        "Wanda variant: transfers {t}; kernels {}; cpu α {} / wgpu α {}",
        gpu["device_kernels"], cpu["alpha"], gpu["alpha"]
    );
    let per_layer = t["prune"]["device_to_host_bytes"].as_u64().unwrap_or(0) / layers;
    assert!(
        per_layer <= 64 << 10,
        "{per_layer} bytes back per layer: {t}"
    );
    // About ten α a linear, one i32 count each, and the zeros' count.
    assert!(
        per_layer <= 7 * (16 + 1) * 8,
        "{per_layer} bytes back per layer: {t}"
    );
    assert_eq!(t["prune"]["host_to_device_bytes"].as_u64(), Some(0), "{t}");
    let kernels = &gpu["device_kernels"];
    let uses = |name: &str| {
        (
            kernels[name]["ran"].as_u64().unwrap_or(0),
            kernels[name]["fell_back"].as_u64(),
        )
    };
    assert_eq!(uses("variant_prefix"), (7 * layers, Some(0)), "{kernels}");
    let (rows, fell_back) = uses("variant_rows");
    assert!(rows >= 7 * layers && fell_back == Some(0), "{kernels}");
    // The statistics sum in another order on each backend, so the α and
    // the sparsity agree closely, not to the bit (the kernels' own
    // comparison is `kernels::variant`).
    let alphas = |j: &serde_json::Value| -> Vec<f64> {
        j["alpha"].as_array().map_or(Vec::new(), |a| {
            a.iter().filter_map(|v| v.as_f64()).collect()
        })
    };
    let (a_cpu, a_gpu) = (alphas(&cpu), alphas(&gpu));
    assert_eq!(a_gpu.len(), 7 * layers as usize, "{}", gpu["alpha"]);
    // One bisection step apart at most (the search's steps halve from 0.4).
    for (a, b) in a_cpu.iter().zip(&a_gpu) {
        assert!((a - b).abs() <= 0.0125, "α: cpu {a_cpu:?} / wgpu {a_gpu:?}");
    }
    let of = |j: &serde_json::Value| j["sparsity"].as_f64().unwrap_or(f64::NAN);
    assert!(
        (of(&cpu) - of(&gpu)).abs() <= 0.001,
        "{} / {}",
        cpu["sparsity"],
        gpu["sparsity"]
    );
    assert!((of(&gpu) - 0.5).abs() <= 0.002, "{}", gpu["sparsity"]);
    let cmp = support::against_json(s(&logs));
    for p in [&cmp["peak"], &cmp["reserved"]] {
        println!("Wanda variant: {p}");
        let error = p["error_percent"].as_f64().expect("measured");
        assert!(error.abs() <= 5.0, "{p}");
    }
}
