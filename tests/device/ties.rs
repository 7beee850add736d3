//! GradProbe's candidates where the threshold repeats: a bf16 checkpoint
//! (a bf16 weight takes one of 65 536 values, so the `k`-th smallest `|W|`
//! of a linear is shared by many weights, as in every real bf16 or
//! quantized checkpoint). The device takes exactly the host's ties (the
//! first in PyTorch's flat order), through the threshold kernel: two of
//! its searches a linear, not a bisection over positions in Burn's ops.

use super::*;
use masks::Probe;

/// The 256-wide fixture stored in bf16.
fn bf16_fixture() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let spec = prunemem::model::synthetic::SyntheticSpec {
        hidden: 256,
        intermediate: 704,
        vocab: 2048,
        dtype: safetensors::Dtype::BF16,
        ..Default::default()
    };
    fixture_of(&spec, 6000)
}

/// [`Probe`] on `model`: magnitude candidates, 10%, GradProbe's defaults.
fn probe(model: &Path) -> Probe<'_> {
    use prunemem::prune::gradprobe::{GradPrecision, GradProbeConfig, Strategy};
    Probe {
        model,
        config: GradProbeConfig {
            strategy: Strategy::Magnitude,
            sparsity: 0.1,
            reduction_factor: 0.1,
            gradient_threshold: 2.0,
            include_embeddings: false,
            precision: GradPrecision::F32,
        },
        windows: windows(2, 33, vocab(model), 5),
    }
}

#[test]
fn gradprobe_breaks_bf16_ties_as_the_host_does() {
    let (_dir, model, _) = bf16_fixture();
    let (cpu, gpu) = (
        Exec::cpu().run(probe(&model)).0,
        device_under_test().run(probe(&model)).0,
    );
    let (mut same, mut total) = (0usize, 0usize);
    for (name, want) in &cpu {
        let got: std::collections::BTreeSet<u32> = gpu[name].iter().copied().collect();
        same += want.iter().filter(|p| got.contains(p)).count();
        total += want.len().max(got.len());
    }
    let agree = same as f64 / total.max(1) as f64;
    println!("bf16 gradprobe: cpu prunes {total}, agreement {agree:.6}");
    assert!(total > 0, "the step must prune something");
    // A tie taken from the wrong end would move about half of a linear's
    // tied candidates; the gradients alone differ in their last bits.
    assert!(agree >= 0.999, "decisions agree {agree}");
}

/// The launches: each linear's threshold and, where it repeats past `k`,
/// its first ties, are two runs of the threshold kernel; the backward's
/// launches per layer and batch stay near the autodiff's own.
#[test]
fn gradprobe_finds_its_ties_with_the_threshold_kernel() {
    let (_dir, model, text) = bf16_fixture();
    let config = prunemem::model::LlamaConfig::from_file(&model.join("config.json")).unwrap();
    let extra = [
        "--sparsity",
        "0.1",
        "--num-batches",
        "2",
        "--strategy",
        "magnitude",
        "--json",
    ];
    let argv = gradprobe_on_wgpu(&model, &text, &extra);
    let (code, stdout, stderr) = run_prunemem(&argv);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let json: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let kth = &json["device_kernels"]["kth_smallest"];
    let linears = config.num_layers as u64 * LAYER_LINEARS.len() as u64;
    let backward = json["transfers"]["probe_backward"]["kernels"]
        .as_u64()
        .unwrap();
    println!(
        "bf16 gradprobe: kth_smallest {kth}, {linears} linears; {backward} launches in the backward"
    );
    assert_eq!(kth["fell_back"].as_u64(), Some(0), "{kth}");
    // Once a linear for its threshold, once more where ties straddle `k`:
    // in bf16 that is nearly every linear.
    let ran = kth["ran"].as_u64().unwrap();
    assert!(
        ran > linears + linears / 2 && ran <= 2 * linears,
        "{ran} threshold searches for {linears} linears"
    );
    // Two passes over two batches of every layer. The bisection over
    // positions this replaced took about 13 launches a halving and 15 to 18
    // halvings a linear: 676 launches a layer and batch here (314 with the
    // threshold kernel's bisection, 287 with its radix select).
    let per_layer_batch = backward / (2 * 2 * config.num_layers as u64);
    assert!(
        per_layer_batch < 450,
        "{per_layer_batch} backward launches a layer and batch"
    );
}
