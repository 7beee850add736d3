//! prunemem's masks against the Wanda authors' code (lib/prune.py and
//! SparseGPT's sparsegpt.py), run on tests/fixtures/tiny-llama with the same
//! calibration windows by tests/fixtures/make_reference_masks.py.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use burn::backend::Flex;
use prunemem::events::Emitter;
use prunemem::model::llama::LAYER_LINEARS;
use prunemem::model::{Checkpoint, ComputeDtype};
use prunemem::profiler::{Profiler, ProfilerConfig};
use prunemem::prune::dsnot::{DsnotOptions, DsnotSkip};
use prunemem::prune::engine::{self, PruneConfig, PruneOutcome, Source, weight_out_in};
use prunemem::prune::owl::{OwlConfig, layer_sparsities, outlier_pass};
use prunemem::prune::{Method, Pattern};

type B = Flex;

struct Reference {
    calibration: Vec<Vec<u32>>,
    tensors: HashMap<String, (Vec<u8>, safetensors::Dtype)>,
}

fn reference() -> Reference {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let bytes = std::fs::read(dir.join("reference-masks.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors = HashMap::new();
    for (name, view) in st.tensors() {
        tensors.insert(name, (view.data().to_vec(), view.dtype()));
    }
    let (cal, _) = &tensors["calibration"];
    let ids: Vec<u32> = cal
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
        .collect();
    Reference {
        calibration: ids.chunks(24).map(|w| w.to_vec()).collect(),
        tensors,
    }
}

/// Prunes tiny-llama in memory and returns each linear's weights `[out, in]`.
fn prune(
    method: Method,
    pattern: Pattern,
    variant: bool,
    calibration: &[Vec<u32>],
) -> HashMap<String, Vec<f32>> {
    let setup = Setup {
        variant,
        ..Setup::new(method, pattern)
    };
    prune_full(&setup, calibration).0
}

/// One pruning of tiny-llama.
struct Setup {
    method: Method,
    pattern: Pattern,
    variant: bool,
    per_outneuron: bool,
    owl: Option<OwlConfig>,
    dsnot: Option<DsnotOptions>,
    reallocation: Option<bool>,
}

impl Setup {
    fn new(method: Method, pattern: Pattern) -> Self {
        Self {
            method,
            pattern,
            variant: false,
            per_outneuron: false,
            owl: None,
            dsnot: None,
            reallocation: None,
        }
    }
}

/// Prunes tiny-llama at 50% (or, with OWL, at `0.7` on average with OWL's
/// per-layer sparsities); also returns those sparsities and the engine's
/// outcome.
fn prune_full(
    setup: &Setup,
    calibration: &[Vec<u32>],
) -> (HashMap<String, Vec<f32>>, Option<Vec<f64>>, PruneOutcome) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama");
    let ckpt = Checkpoint::open(&dir).unwrap();
    let device = Default::default();
    let mut model = ckpt.load_model::<B>(ComputeDtype::F32, &device).unwrap();
    let profiler = Profiler::new(
        Arc::new(Emitter::new()),
        ProfilerConfig {
            sampler_hz: None,
            gpu_index: None,
            ..Default::default()
        },
    );
    let Setup {
        method,
        pattern,
        variant,
        per_outneuron,
        owl,
        dsnot,
        reallocation,
    } = *setup;
    let mut config = PruneConfig {
        method: method.try_into().unwrap(),
        sparsity: if owl.is_some() { 0.7 } else { 0.5 },
        pattern,
        use_variant: variant,
        seqlen: 24,
        batch_size: 5,
        dtype: ComputeDtype::F32,
        percdamp: 0.01,
        blocksize: 128,
        ria_a: 0.5,
        per_outneuron,
        layer_sparsity: None,
        dsnot,
        reallocation,
        offload_activations: false,
    };
    if let Some(owl) = owl {
        let source = Source::Resident(&mut model);
        let ratios = outlier_pass(
            &ckpt,
            &source,
            &config,
            calibration,
            owl,
            &device,
            &profiler,
        )
        .unwrap();
        config.layer_sparsity = Some(layer_sparsities(&ratios, config.sparsity, owl.lambda).0);
    }
    let outcome = engine::prune::<B>(
        &ckpt,
        Source::Resident(&mut model),
        &config,
        calibration,
        None,
        None,
        &device,
        &profiler,
    )
    .unwrap();
    assert_eq!(outcome.layers.len(), 2);
    let mut out = HashMap::new();
    for (i, layer) in model.model.layers.iter().enumerate() {
        for name in LAYER_LINEARS {
            out.insert(
                format!("model.layers.{i}.{name}"),
                weight_out_in(layer, name).0,
            );
        }
    }
    (out, config.layer_sparsity, outcome)
}

/// Fraction of weights whose pruned/kept status equals the reference's.
fn mask_agreement(config: &str, got: &HashMap<String, Vec<f32>>, r: &Reference) -> f64 {
    let (mut same, mut total) = (0usize, 0usize);
    for (name, w) in got {
        let (mask, _) = &r.tensors[&format!("{config}/{name}")];
        assert_eq!(mask.len(), w.len(), "{name}");
        for (m, v) in mask.iter().zip(w) {
            same += ((*m == 1) == (*v == 0.0)) as usize;
            total += 1;
        }
    }
    same as f64 / total as f64
}

/// The masks agree with the reference's `config`, but for near-ties:
/// statistics are summed in a different order than the reference's running
/// mean, so only exact near-ties may flip.
fn assert_agrees(config: &str, got: &HashMap<String, Vec<f32>>, r: &Reference) {
    let agree = mask_agreement(config, got, r);
    println!("{config}: mask agreement {agree}");
    assert!(agree >= 0.9995, "{config}: {agree}");
}

#[test]
fn magnitude_matches_reference_exactly() {
    let r = reference();
    for (config, pattern) in [
        ("magnitude_0.5", Pattern::Unstructured),
        ("magnitude_2:4", Pattern::NM { n: 2, m: 4 }),
    ] {
        let got = prune(Method::Magnitude, pattern, false, &r.calibration);
        assert_eq!(mask_agreement(config, &got, &r), 1.0, "{config}");
    }
}

#[test]
fn wanda_matches_reference() {
    let r = reference();
    for (config, pattern, variant) in [
        ("wanda_0.5", Pattern::Unstructured, false),
        ("wanda_2:4", Pattern::NM { n: 2, m: 4 }, false),
        ("wanda_4:8", Pattern::NM { n: 4, m: 8 }, false),
        ("wanda_variant_0.5", Pattern::Unstructured, true),
    ] {
        let got = prune(Method::Wanda, pattern, variant, &r.calibration);
        assert_agrees(config, &got, &r);
    }
}

#[test]
fn ria_matches_reference() {
    let r = reference();
    let two_four = Pattern::NM { n: 2, m: 4 };
    for (config, pattern, per_outneuron, reallocation) in [
        ("ria_0.5", Pattern::Unstructured, false, None),
        ("ria_outneuron_0.5", Pattern::Unstructured, true, None),
        ("ria_2:4", two_four, false, None),
        ("ria_realloc_2:4", two_four, false, Some(false)),
        ("ria_lsa_2:4", two_four, false, Some(true)),
    ] {
        let setup = Setup {
            per_outneuron,
            reallocation,
            ..Setup::new(Method::Ria, pattern)
        };
        let pruned = prune_full(&setup, &r.calibration);
        assert_agrees(config, &pruned.0, &r);
    }
}

#[test]
fn owl_matches_reference() {
    let r = reference();
    let owl = OwlConfig {
        lambda: 0.08,
        m: 3.0,
    };
    let setup = Setup {
        owl: Some(owl),
        ..Setup::new(Method::Wanda, Pattern::Unstructured)
    };
    let (got, s, _) = prune_full(&setup, &r.calibration);
    // The authors' run printed "after adjustment [0.38 0.22]": densities.
    let s = s.unwrap();
    assert!(
        (s[0] - 0.62).abs() < 1e-9 && (s[1] - 0.78).abs() < 1e-9,
        "{s:?}"
    );
    assert_agrees("owl_wanda_0.7", &got, &r);
}

#[test]
fn dsnot_matches_reference() {
    let r = reference();
    let two_four = Pattern::NM { n: 2, m: 4 };
    for (config, method, pattern, threshold, skip) in [
        (
            "dsnot_wanda_0.5",
            Method::Wanda,
            Pattern::Unstructured,
            0.001,
            DsnotSkip::None,
        ),
        (
            "dsnot_magnitude_0.5",
            Method::Magnitude,
            Pattern::Unstructured,
            0.001,
            DsnotSkip::None,
        ),
        (
            "dsnot_wanda_2:4",
            Method::Wanda,
            two_four,
            0.001,
            DsnotSkip::None,
        ),
        (
            "dsnot_sparsegpt_0.5",
            Method::SparseGpt,
            Pattern::Unstructured,
            0.001,
            DsnotSkip::None,
        ),
        (
            "dsnot_wanda_mlpskip_0.5",
            Method::Wanda,
            Pattern::Unstructured,
            0.01,
            DsnotSkip::Mlp,
        ),
    ] {
        let dsnot = DsnotOptions {
            max_cycles: 8,
            update_threshold: threshold,
            pow_of_var: 1.0,
            skip,
        };
        let setup = Setup {
            dsnot: Some(dsnot),
            ..Setup::new(method, pattern)
        };
        let (got, _, outcome) = prune_full(&setup, &r.calibration);
        let swapped: u64 = outcome
            .layers
            .iter()
            .flat_map(|l| &l.linears)
            .filter_map(|l| l.dsnot.map(|d| d.changed))
            .sum();
        println!("{config}: {swapped} weights changed state by DSnoT's swaps");
        // The refinement did something to compare (not just the first mask).
        assert!(swapped > 100, "{config}: {swapped}");
        assert_agrees(config, &got, &r);
    }
}

#[test]
fn sparsegpt_matches_reference() {
    let r = reference();
    let got = prune(
        Method::SparseGpt,
        Pattern::Unstructured,
        false,
        &r.calibration,
    );
    let agree = mask_agreement("sparsegpt_0.5", &got, &r);
    let mut worst = 0f32;
    let mut scale = 0f32;
    for (name, w) in &got {
        let (bytes, _) = &r.tensors[&format!("sparsegpt_0.5/{name}.weight")];
        let want: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        for (a, b) in w.iter().zip(&want) {
            worst = worst.max((a - b).abs());
            scale = scale.max(b.abs());
        }
    }
    println!("sparsegpt_0.5: mask agreement {agree}, max |Δw| {worst} (max |w| {scale})");
    assert!(agree >= 0.999, "mask agreement {agree}");
    assert!(worst <= 1e-3 * scale.max(1.0), "max |Δw| {worst}");
    let got = prune(
        Method::SparseGpt,
        Pattern::NM { n: 2, m: 4 },
        false,
        &r.calibration,
    );
    let agree = mask_agreement("sparsegpt_2:4", &got, &r);
    println!("sparsegpt_2:4: mask agreement {agree}");
    assert!(agree >= 0.999, "2:4 mask agreement {agree}");
}
