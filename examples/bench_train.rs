//! The training benchmark: SmolLM2-135M in f32, seqlen 256, batch 4 ×
//! accumulation 4, AdamW, 3 steps — without and with activation
//! checkpointing, one run at a time — and prints peak memory, the measured
//! components of a step and the step time side by side.
//!
//! ```text
//! cargo build --release && cargo run --release --example bench_train -- [MODEL] [TEXT] [STEPS]
//! ```
//! Defaults: models/smollm2-135m, data/wikitext-2-raw/wiki.test.raw
//! (its second half), 3 steps. PRUNEMEM_BIN overrides the binary.

use std::process::Command;

use serde_json::Value;

fn main() {
    let mut args = std::env::args().skip(1);
    let model = args.next().unwrap_or_else(|| "models/smollm2-135m".into());
    let text = args
        .next()
        .unwrap_or_else(|| "data/wikitext-2-raw/wiki.test.raw".into());
    let steps = args.next().unwrap_or_else(|| "3".into());
    let bin = std::env::var("PRUNEMEM_BIN").unwrap_or_else(|_| "target/release/prunemem".into());
    let mib = |v: &Value| {
        v.as_f64()
            .map_or("n/a".into(), |b| format!("{:.1}", b / 1048576.0))
    };
    println!(
        "| run | peak RSS MiB | heap peak MiB | one-step peak MiB | activations MiB | gradients MiB | optimizer MiB | s/step (after the first) | loss first → last |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for (name, extra) in [
        ("full graph", None),
        ("--checkpointing", Some("--checkpointing")),
    ] {
        let mut cmd = Command::new(&bin);
        cmd.args([
            "train",
            "--model",
            &model,
            "--text",
            &text,
            "--lines",
            "second-half",
        ]);
        cmd.args([
            "--seqlen",
            "256",
            "--batch-size",
            "4",
            "--grad-accum",
            "4",
            "--optimizer",
            "adamw",
        ]);
        cmd.args(["--steps", &steps, "--ui", "none", "--json"]);
        cmd.args(extra);
        let out = cmd.output().expect("the prunemem binary runs");
        if !out.status.success() {
            eprintln!("{name}: {}", String::from_utf8_lossy(&out.stderr).trim());
            continue;
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let j: Value = stdout
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str(l).ok())
            .expect("a JSON line");
        let steps = j["steps"].as_array().cloned().unwrap_or_default();
        let later: Vec<f64> = steps
            .iter()
            .skip(1)
            .filter_map(|s| s["seconds"].as_f64())
            .collect();
        let mean = later.iter().sum::<f64>() / later.len().max(1) as f64;
        let loss = |s: Option<&Value>| s.and_then(|s| s["loss"].as_f64()).unwrap_or(f64::NAN);
        let g = &j["gap"]["single_step"];
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} | {mean:.1} | {:.4} → {:.4} |",
            mib(&j["rss_peak"]),
            mib(&j["heap_peak"]),
            mib(&g["peak"]["heap"]),
            mib(&g["activations"]),
            mib(&g["gradients"]),
            mib(&g["optimizer_state"]),
            loss(steps.first()),
            loss(steps.last()),
        );
    }
}
