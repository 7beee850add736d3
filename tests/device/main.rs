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
//! By subject: `masks` (the device's answers against the CPU backend's),
//! `runs` (whole runs through the CLI: logs, pool, OOM), `bus` (what
//! crosses it), `eval` (the device evaluation), `gradprobe_pool`
//! (GradProbe's pool against its estimate), `kernels` (prunemem's own
//! kernels against the host's answers), `ties` (GradProbe's candidates where
//! a bf16 threshold repeats); the fixtures they share are here.
//!
//! Built only with `--features wgpu`; with the feature, a missing Vulkan
//! driver fails these tests (they never skip).
#![cfg(feature = "wgpu")]

#[path = "../support/mod.rs"]
mod support;

mod bus;
mod compiles;
mod dsnot_bus;
mod eval;
mod gradprobe_pool;
mod inline;
mod kernels;
mod masks;
mod realloc_bus;
mod runs;
mod ties;
mod variant_bus;

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

/// The vocabulary size of the model at `model`.
fn vocab(model: &Path) -> usize {
    prunemem::model::LlamaConfig::from_file(&model.join("config.json"))
        .unwrap()
        .vocab_size
}

/// The device the in-process tests run on: Burn's wgpu backend (in CI,
/// lavapipe), or the one `PRUNEMEM_TEST_DEVICE` names (`cuda` in a binary
/// built with `--features wgpu,cuda`: a lent GPU runs the kernel and mask
/// tests on CUDA, `scripts/bench/gpu_prepare.sh`'s `DEVICE_TESTS=1`). It
/// must open: these tests never skip.
fn device_under_test() -> Exec {
    let spec = match std::env::var("PRUNEMEM_TEST_DEVICE") {
        Ok(name) => name
            .parse()
            .unwrap_or_else(|e| panic!("PRUNEMEM_TEST_DEVICE={name}: {e}")),
        Err(_) => WGPU,
    };
    Exec::open(spec, None).unwrap_or_else(|e| {
        panic!("the device under test must open (CI installs lavapipe for wgpu): {e}")
    })
}

/// A folder with a synthetic model of `spec` (`model/`) and `lines` lines
/// of sample text (`text.txt`), for the command-line runs.
fn fixture_of(
    spec: &prunemem::model::synthetic::SyntheticSpec,
    lines: usize,
) -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    prunemem::model::synthetic::write_checkpoint(&model, spec).unwrap();
    let text = dir.path().join("text.txt");
    std::fs::write(&text, support::sample_text(lines)).unwrap();
    (dir, model, text)
}

/// The default synthetic model (64 wide) and text for the command-line runs.
fn cli_fixture() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    fixture_of(&Default::default(), 6000)
}

/// `prune --method gradprobe` on the fixture on `--device wgpu` (the
/// Wanda run's other arguments), then `extra`.
fn gradprobe_on_wgpu<'a>(model: &'a Path, text: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut argv = wanda_on_wgpu(model, text, extra);
    if let Some(at) = argv.iter().position(|a| *a == "wanda") {
        argv[at] = "gradprobe";
    }
    argv
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

/// [`wanda_on_wgpu`]'s prune with `extra` on `device` (`cpu` or `wgpu`),
/// which must succeed: its `--json` line.
fn prune_json_on(device: &str, model: &Path, text: &Path, extra: &[&str]) -> serde_json::Value {
    method_json_on("wanda", device, model, text, extra)
}

/// [`prune_json_on`] with `--method method`.
fn method_json_on(
    method: &str,
    device: &str,
    model: &Path,
    text: &Path,
    extra: &[&str],
) -> serde_json::Value {
    let mut argv = wanda_on_wgpu(model, text, extra);
    for (from, to) in [("wanda", method), ("wgpu", device)] {
        let at = argv.iter().position(|a| *a == from).unwrap();
        argv[at] = to;
    }
    let (code, stdout, stderr) = run_prunemem(&argv);
    assert_eq!(code, Some(0), "{device} {method}: {stdout}\n{stderr}");
    support::json_line(&stdout)
}

fn events(dir: &Path) -> Vec<Event> {
    let text = std::fs::read_to_string(dir.join("events.jsonl")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// `prunemem report LOGS --out OUT`, and the report's markdown.
fn prunemem_report(logs: &Path, out: &Path) -> String {
    let (code, stdout, stderr) = run_prunemem(&["report", s(logs), "--out", s(out)]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    std::fs::read_to_string(out.join("report.md")).unwrap()
}

/// A model wide enough that the pool's per-buffer padding is small beside
/// its tensors (the 64-wide fixture's many tiny buffers are not).
fn wide_fixture() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let spec = prunemem::model::synthetic::SyntheticSpec {
        hidden: 256,
        intermediate: 704,
        vocab: 2048,
        ..Default::default()
    };
    fixture_of(&spec, 6000)
}
