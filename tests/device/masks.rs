//! The device's answers against the CPU backend's on tiny-llama: masks
//! (every method and pattern), perplexity, GradProbe's decisions, two
//! AdamW steps, SparseGPT's sweep kernel against the host's weights, and
//! the linears' weights kept as stored against Burn's layout.

use super::*;

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
    /// `--dsnot --dsnot-skip none` (the authors' other defaults).
    dsnot: bool,
    /// Wanda's `--use-variant`.
    variant: bool,
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
            use_variant: self.variant,
            seqlen: 24,
            batch_size: 4,
            dtype: ComputeDtype::F32,
            percdamp: 0.01,
            blocksize: 128,
            ria_a: 0.5,
            per_outneuron: false,
            layer_sparsity: None,
            dsnot: self.dsnot.then(|| prunemem::prune::dsnot::DsnotOptions {
                skip: prunemem::prune::dsnot::DsnotSkip::None,
                ..Default::default()
            }),
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

#[test]
fn device_masks_and_perplexity_match_the_cpu_backend() {
    let (cpu, gpu) = (Exec::cpu(), device_under_test());
    println!("device: {}", gpu.adapter());
    for (method, pattern, variant) in [
        (Method::Magnitude, Pattern::Unstructured, false),
        (Method::Wanda, Pattern::Unstructured, false),
        (Method::Wanda, Pattern::Unstructured, true),
        (Method::Wanda, Pattern::NM { n: 2, m: 4 }, false),
        (Method::SparseGpt, Pattern::Unstructured, false),
        (Method::Ria, Pattern::Unstructured, false),
    ] {
        let on_cpu = cpu.run(PruneTiny {
            method,
            pattern,
            offload: false,
            dsnot: false,
            variant,
        });
        let on_gpu = gpu.run(PruneTiny {
            method,
            pattern,
            offload: false,
            dsnot: false,
            variant,
        });
        // Activations kept in host memory between layers: the same bits.
        let offloaded = gpu.run(PruneTiny {
            method,
            pattern,
            offload: true,
            dsnot: false,
            variant,
        });
        assert_eq!(
            offloaded.weights, on_gpu.weights,
            "{method} {pattern} offloaded"
        );
        assert_eq!(offloaded.perplexity, on_gpu.perplexity);
        let (agree, differ) = agreement(&on_cpu.weights, &on_gpu.weights);
        let dppl = (on_gpu.perplexity / on_cpu.perplexity - 1.0).abs();
        println!(
            "{method} {pattern} variant {variant}: mask agreement {agree:.6} ({differ} positions differ), perplexity cpu {:.6} wgpu {:.6} ({:.4}%)",
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

/// DSnoT's swap loop on the device (`prune::dsnot_device`) against the
/// host's (the CPU backend runs `prune::dsnot`): the same masks but for
/// the statistics' rounding (the pass sums in another order on each
/// backend), the same perplexity, every linear refined.
#[test]
fn device_dsnot_matches_the_cpu_backend() {
    let (cpu, gpu) = (Exec::cpu(), device_under_test());
    for (method, pattern) in [
        (Method::Wanda, Pattern::Unstructured),
        (Method::Magnitude, Pattern::NM { n: 2, m: 4 }),
        (Method::Ria, Pattern::Unstructured),
        // SparseGPT's saliency as the first mask (`diag(Hinv)` from the
        // device's factorisation), no weight update.
        (Method::SparseGpt, Pattern::Unstructured),
        (Method::SparseGpt, Pattern::NM { n: 2, m: 4 }),
    ] {
        let tiny = || PruneTiny {
            method,
            pattern,
            offload: false,
            dsnot: true,
            variant: false,
        };
        let (on_cpu, on_gpu) = (cpu.run(tiny()), gpu.run(tiny()));
        let plain = gpu.run(PruneTiny {
            dsnot: false,
            ..tiny()
        });
        let (agree, differ) = agreement(&on_cpu.weights, &on_gpu.weights);
        let (_, swapped) = agreement(&plain.weights, &on_gpu.weights);
        let dppl = (on_gpu.perplexity / on_cpu.perplexity - 1.0).abs();
        println!(
            "DSnoT {method} {pattern}: {differ} positions differ from the CPU's ({agree:.6}), {swapped} from the plain mask, perplexity cpu {:.6} wgpu {:.6}",
            on_cpu.perplexity, on_gpu.perplexity
        );
        assert!(
            swapped > 0,
            "{method} {pattern}: the device loop swapped nothing"
        );
        assert!(agree >= 0.999, "{method} {pattern}: {agree}");
        assert!(
            dppl < 1e-3,
            "{method} {pattern}: perplexity differs by {dppl}"
        );
    }
}

/// GradProbe's step (both gradient passes) on `model` with `config`, its
/// `windows` in batches of 2: the weights it prunes and the two losses.
pub(crate) struct Probe<'a> {
    pub model: &'a Path,
    pub config: prunemem::prune::gradprobe::GradProbeConfig,
    pub windows: Vec<Vec<u32>>,
}

impl OnDevice for Probe<'_> {
    type Output = (prunemem::prune::gradprobe::Masks, f64, f64);
    fn run<B: Compute>(self, device: &B::Device) -> Self::Output {
        use prunemem::prune::gradprobe::{GradProbe, Masks};
        let ckpt = Checkpoint::open(self.model).unwrap();
        let profiler = quiet_profiler();
        let mut probe = GradProbe::<B>::new(
            &ckpt,
            self.config,
            &self.windows,
            2,
            &profiler,
            device.clone(),
        )
        .unwrap();
        let step = probe.step(&Masks::new()).unwrap();
        (step.pruned, step.loss_original, step.loss_modified)
    }
}

/// [`Probe`] on tiny-llama: Wanda strategy, embeddings probed.
fn probe_tiny(model: &Path) -> Probe<'_> {
    use prunemem::prune::gradprobe::{GradPrecision, GradProbeConfig, Strategy};
    Probe {
        model,
        config: GradProbeConfig {
            strategy: Strategy::Wanda,
            sparsity: 0.5,
            reduction_factor: 0.1,
            gradient_threshold: 1.0,
            include_embeddings: true,
            precision: GradPrecision::F32,
        },
        windows: windows(4, 25, vocab(model), 3),
    }
}

#[test]
fn gradprobe_decides_the_same_on_the_device() {
    let tiny = tiny_llama();
    let (cpu, gpu) = (
        Exec::cpu().run(probe_tiny(&tiny)),
        device_under_test().run(probe_tiny(&tiny)),
    );
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
        let gpu = device_under_test().run(TrainTiny { checkpointing });
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
    for (pattern, differ, zeros, worst) in device_under_test().run(SweepAgainstHost) {
        println!("{pattern}: {differ} positions differ, {zeros} zeros, weights within {worst}");
        assert_eq!(differ, 0, "{pattern}");
        assert!(worst < 1e-4, "{pattern}: {worst}");
        assert!(zeros >= 96 * 300 / 2, "{pattern}: {zeros}");
    }
}

/// With `PRUNEMEM_WEIGHT_LAYOUT=stored` the reader leaves the linears'
/// weights as stored (`[out, in]`, no transposition on the host) and the
/// device takes each as a transposed view: Wanda and SparseGPT on the
/// fixture save the same pruned weights to the bit as Burn's layout, with
/// the same perplexity, the same bytes up, and no kernel handing its work
/// back to Burn's ops.
#[test]
fn the_stored_weight_layout_prunes_as_burns() {
    let (dir, model, text) = cli_fixture();
    for method in ["wanda", "sparsegpt"] {
        let run = |layout: &str| {
            let save = dir.path().join(format!("{method}-{layout}"));
            let logs = dir.path().join(format!("{method}-{layout}-logs"));
            let extra = ["--json", "--eval-text", s(&text), "--eval-windows", "2"];
            let mut argv = wanda_on_wgpu(&model, &text, &extra);
            argv[4] = method;
            argv.extend(["--save", s(&save), "--log-memory", s(&logs)]);
            let env = [("PRUNEMEM_WEIGHT_LAYOUT", layout)];
            let (code, stdout, stderr) = support::run_prunemem_with(&argv, &env);
            assert_eq!(code, Some(0), "{stdout}\n{stderr}");
            let Some(Event::RunStarted { plan }) = events(&logs).into_iter().next() else {
                panic!("no plan")
            };
            // The plan says which layout the run took.
            assert_eq!(
                plan.settings["weight_layout"], layout,
                "{:?}",
                plan.settings
            );
            let weights = std::fs::read(save.join("model.safetensors")).unwrap();
            (support::json_line(&stdout), weights)
        };
        let ((burns, burns_weights), (stored, stored_weights)) = (run("burn"), run("stored"));
        println!(
            "{method}: perplexity {} (Burn's layout) and {} (stored)",
            burns["perplexity"], stored["perplexity"]
        );
        assert!(burns["perplexity"].as_f64() > Some(1.0), "{burns}");
        assert_eq!(burns["perplexity"], stored["perplexity"], "{method}");
        assert!(
            burns_weights == stored_weights,
            "{method}: saved weights differ"
        );
        let up = |j: &serde_json::Value| {
            let phases = j["transfers"].as_object().unwrap().values();
            phases
                .map(|p| p["host_to_device_bytes"].as_u64().unwrap())
                .sum::<u64>()
        };
        assert!(up(&burns) > 0, "{}", burns["transfers"]);
        for peak in ["device_peak", "device_reserved_peak"] {
            println!("{method}: {peak} {} and {}", burns[peak], stored[peak]);
            assert_eq!(burns[peak], stored[peak], "{method}: {peak}");
        }
        assert_eq!(up(&burns), up(&stored), "{method}: {}", stored["transfers"]);
        for (name, uses) in stored["device_kernels"].as_object().unwrap() {
            assert_eq!(
                uses["fell_back"], 0,
                "{method}, {name}: {}",
                stored["device_kernels"]
            );
        }
    }
}

/// GradProbe with CUDA's defaults (`exec::defaults`: the linears' weights
/// as stored, the large copies staged) takes its layers as the transposed
/// views the stored layout gives, scatters and zeroes them where they are,
/// and decides the same: the same sparsity per layer and perplexity as in
/// Burn's layout, its layers streamed or kept on the device between the
/// passes (`--device-memory`), and no kernel handing its work back.
#[test]
fn gradprobe_in_the_stored_layout_decides_as_in_burns() {
    let (_dir, model, text) = cli_fixture();
    let run = |layout: &str, extra: &[&str]| -> serde_json::Value {
        let mut common = vec!["--sparsity", "0.1", "--num-batches", "2", "--json"];
        common.extend(["--eval-text", s(&text), "--eval-windows", "2"]);
        common.extend_from_slice(extra);
        let argv = gradprobe_on_wgpu(&model, &text, &common);
        let transfers = if layout == "stored" { "pinned" } else { "burn" };
        let env = [
            ("PRUNEMEM_WEIGHT_LAYOUT", layout),
            ("PRUNEMEM_TRANSFERS", transfers),
        ];
        let (code, stdout, stderr) = support::run_prunemem_with(&argv, &env);
        assert_eq!(code, Some(0), "{layout} {extra:?}: {stdout}\n{stderr}");
        support::json_line(&stdout)
    };
    for extra in [&[][..], &["--device-memory", "1GiB"][..]] {
        let (burns, stored) = (run("burn", extra), run("stored", extra));
        let kept = if extra.is_empty() {
            "streamed"
        } else {
            "device"
        };
        println!(
            "gradprobe {kept}: perplexity {} (Burn's layout) and {} (stored)",
            burns["perplexity"], stored["perplexity"]
        );
        assert_eq!(stored["gradprobe_layers"], kept, "{stored}");
        assert!(burns["perplexity"].as_f64() > Some(1.0), "{burns}");
        for key in ["perplexity", "layer_sparsity", "sparsity"] {
            assert_eq!(burns[key], stored[key], "{kept}: {key}");
        }
        // (wgpu has no staged copies: their requests are handed back.)
        let kernels = stored["device_kernels"].as_object().unwrap();
        for (name, uses) in kernels.iter().filter(|(n, _)| !n.starts_with("pinned")) {
            assert_eq!(uses["fell_back"], 0, "{kept}, {name}: {stored}");
        }
    }
}
