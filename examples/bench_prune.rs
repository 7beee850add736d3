//! One pruning benchmark configuration under the benchmark protocol, printed
//! as one JSON line: method, type, sparsity reached, pruning seconds, peak
//! RSS, perplexity.
//!
//! Protocol (DEVELOPERS.md): SmolLM2-135M in f32; calibration = 32 windows of
//! 512 tokens drawn with seed 0 from the second half of wiki.test.raw's
//! lines; evaluation = the first 40 non-overlapping 512-token windows of its
//! first half.
//!
//! ```text
//! cargo run --release --example bench_prune -- wanda unstructured [--resident]
//! cargo run --release --example bench_prune -- sparsegpt 2:4
//! cargo run --release --example bench_prune -- gradprobe - [--include-embeddings]
//! ```
//! GradProbe runs its own profiling configuration instead (seqlen 128, batch
//! 1, 2 batches, sparsity 0.1, threshold 2.0, magnitude strategy), evaluated
//! on 40 windows of 128 tokens.
//! Environment: PRUNEMEM_MODEL (default models/smollm2-135m), PRUNEMEM_TEXT
//! (default data/wikitext-2-raw/wiki.test.raw).

#[global_allocator]
static GLOBAL: prunemem::memory::CountingAllocator = prunemem::memory::CountingAllocator;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let method = args.get(1).cloned().unwrap_or_else(|| "wanda".into());
    let pattern = args
        .get(2)
        .cloned()
        .unwrap_or_else(|| "unstructured".into());
    let extra: Vec<String> = args.iter().skip(3).cloned().collect();
    let model = std::env::var("PRUNEMEM_MODEL").unwrap_or_else(|_| "models/smollm2-135m".into());
    let text = std::env::var("PRUNEMEM_TEXT")
        .unwrap_or_else(|_| "data/wikitext-2-raw/wiki.test.raw".into());
    for (what, path) in [("model", &model), ("text", &text)] {
        if !std::path::Path::new(path).exists() {
            eprintln!(
                "bench_prune: {what} {path} is missing (scripts/fetch-smollm2.sh fetches the model)"
            );
            std::process::exit(2);
        }
    }
    // GradProbe's benchmark is its own profiling example's configuration:
    // seqlen 128, batch 1, 2 batches, 10%, threshold 2.0, magnitude.
    let gradprobe = method == "gradprobe";
    let settings: &[&str] = if gradprobe {
        &[
            "--sparsity",
            "0.1",
            "--seqlen",
            "128",
            "--num-batches",
            "2",
            "--gradient-threshold",
            "2.0",
            "--strategy",
            "magnitude",
        ]
    } else {
        &[
            "--sparsity",
            "0.5",
            "--sparsity-type",
            &pattern,
            "--nsamples",
            "32",
            "--seqlen",
            "512",
            "--seed",
            "0",
        ]
    };
    let mut argv: Vec<String> = ["prunemem", "prune", "--model", &model, "--method", &method]
        .iter()
        .chain(settings)
        .chain(&[
            "--calib-text",
            &text,
            "--calib-lines",
            "second-half",
            "--eval-text",
            &text,
            "--eval-lines",
            "first-half",
            "--eval-windows",
            "40",
            "--ui",
            "none",
            "--json",
        ])
        .map(|s| s.to_string())
        .collect();
    argv.extend(extra);
    std::process::exit(prunemem::cli::run_from(argv));
}
