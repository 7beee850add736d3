//! RIA's channel reallocation on a device, run from the command line:
//! what crosses the bus, the kernels that ran, the report against the CPU
//! backend's, and the estimate of the pool.

use super::*;

/// `--reallocation` (and `--lsa`) on a device (`prune::reallocation_device`):
/// a layer reads back each linear's summed metric (`in` f32) and, with
/// the assignment rounds, one slot's scores a round (`(in / m)²` f32) for
/// the host's solver, never a weight, where every linear came back in f32
/// and went up pruned; the metric kept agrees with the CPU backend's; and
/// the estimate of the pool (in use and reserved) holds within 5%.
#[test]
fn ria_reallocation_on_a_device_reads_back_sums_and_scores() {
    let (dir, model, text) = wide_fixture();
    let config = prunemem::model::LlamaConfig::from_file(&model.join("config.json")).unwrap();
    let (h, i) = (config.hidden_size, config.intermediate_size);
    let layers = config.num_layers as u64;
    let m = 4;
    for lsa in [false, true] {
        let logs = dir.path().join(format!("logs-lsa-{lsa}"));
        let run = |device: &str| -> serde_json::Value {
            let mut extra = vec!["--sparsity-type", "2:4", "--reallocation", "--json"];
            if lsa {
                extra.push("--lsa");
            }
            if device == "wgpu" {
                extra.extend(["--log-memory", s(&logs)]);
            }
            method_json_on("ria", device, &model, &text, &extra)
        };
        let (cpu, gpu) = (run("cpu"), run("wgpu"));
        let t = &gpu["transfers"];
        println!(
            "RIA 2:4 reallocation lsa {lsa}: cpu {} / wgpu {}; transfers {t}; kernels {}",
            cpu["reallocation"], gpu["reallocation"], gpu["device_kernels"]
        );
        // The scores of every assignment round, per layer: six linears
        // read the hidden size, one the intermediate.
        let scores = match lsa {
            true => [h, h, h, h, h, h, i]
                .iter()
                .map(|n| (m * (n / m).pow(2) * 4) as u64)
                .sum(),
            false => 0,
        };
        let per_layer = t["prune"]["device_to_host_bytes"].as_u64().unwrap_or(0) / layers;
        assert!(
            per_layer <= (64 << 10) + scores,
            "lsa {lsa}: {per_layer} bytes back per layer: {t}"
        );
        // Up: the order, and its inverse to map the mask back, once a
        // linear, and the order before each assignment round; nothing
        // weight-sized.
        let inputs = (6 * h + i) as u64;
        let orders = 2 + if lsa { m as u64 } else { 0 };
        let up = t["prune"]["host_to_device_bytes"].as_u64().unwrap_or(0);
        assert_eq!(up, layers * inputs * 4 * orders, "lsa {lsa}: {t}");
        assert_eq!(gpu["layer_sparsity"], cpu["layer_sparsity"], "lsa {lsa}");
        // The statistics sum in another order on each backend, so the kept
        // metric agrees closely, not to the bit (the kernels' own
        // comparison is `kernels::realloc`).
        for key in ["kept_before", "kept_after"] {
            let of = |j: &serde_json::Value| j["reallocation"][key].as_f64().unwrap();
            let (a, b) = (of(&cpu), of(&gpu));
            assert!((a - b).abs() <= 1e-3 * a, "lsa {lsa} {key}: {a} / {b}");
        }
        let of = |j: &serde_json::Value, k: &str| j["reallocation"][k].as_f64().unwrap();
        assert!(
            of(&gpu, "kept_after") > of(&gpu, "kept_before"),
            "{}",
            gpu["reallocation"]
        );
        let kernels = &gpu["device_kernels"];
        let ran = |name: &str| {
            (
                kernels[name]["ran"].as_u64(),
                kernels[name]["fell_back"].as_u64(),
            )
        };
        assert_eq!(
            ran("ordered_row_sums"),
            (Some(7 * layers), Some(0)),
            "{kernels}"
        );
        // The report's kept metric, before and after, one launch a linear.
        assert_eq!(
            ran("nm_kept_sums"),
            (Some(2 * 7 * layers), Some(0)),
            "{kernels}"
        );
        match lsa {
            true => assert_eq!(ran("slot_scores"), (Some(7 * layers * m as u64), Some(0))),
            false => assert_eq!(ran("slot_scores").0, None, "{kernels}"),
        }
        let cmp = support::against_json(s(&logs));
        for p in [&cmp["peak"], &cmp["reserved"]] {
            println!("RIA reallocation lsa {lsa}: {p}");
            let error = p["error_percent"].as_f64().expect("measured");
            assert!(error.abs() <= 5.0, "lsa {lsa}: {p}");
        }
    }
}
