//! Measures what heap attribution by category (`memory::tag`) costs: the
//! same prune job (Wanda with evaluation, streamed, on a synthetic model
//! written once) timed with attribution off and on, interleaved, several
//! rounds, medians compared; then the cost of one large allocation and free
//! each way.
//!
//! ```text
//! cargo run --release --example tag_overhead -- [ROUNDS]
//! ```

use std::time::Instant;

use prunemem::data::LineRange;
use prunemem::jobs::config::{PruneJob, TextSource};
use prunemem::jobs::{self, RunOptions};
use prunemem::memory::tag;
use prunemem::model::synthetic::{SyntheticSpec, write_checkpoint};
use prunemem::profiler::ProfilerConfig;
use prunemem::prune::Method;

#[global_allocator]
static GLOBAL: prunemem::memory::CountingAllocator = prunemem::memory::CountingAllocator;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn job(dir: &std::path::Path, text: &std::path::Path) -> PruneJob {
    let mut j = PruneJob::new(dir.join("model").display().to_string(), Method::Wanda);
    j.nsamples = 16;
    j.seqlen = Some(256);
    let src = TextSource {
        path: text.to_path_buf(),
        lines: LineRange::All,
    };
    j.calib = Some(src.clone());
    j.eval = Some(src);
    j.eval_windows = Some(8);
    j.force = true;
    j
}

fn run_once(j: &PruneJob) -> f64 {
    let options = RunOptions {
        profiler: ProfilerConfig {
            sampler_hz: None,
            ..Default::default()
        },
        handle_signals: false,
        ..RunOptions::default()
    };
    let t = Instant::now();
    jobs::prune::run(j, options).expect("the benchmark job runs");
    t.elapsed().as_secs_f64()
}

/// Nanoseconds for one allocation of `bytes` and its free (uninitialised:
/// the allocator's own cost, not the page faults).
fn alloc_ns(bytes: usize, reps: usize) -> f64 {
    let t = Instant::now();
    for _ in 0..reps {
        std::hint::black_box(Vec::<u8>::with_capacity(bytes));
    }
    t.elapsed().as_secs_f64() * 1e9 / reps as f64
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let dir = tempfile::tempdir().expect("a temporary folder");
    let spec = SyntheticSpec {
        hidden: 512,
        intermediate: 1408,
        layers: 4,
        heads: 8,
        kv_heads: 4,
        vocab: 4096,
        max_positions: 1024,
        ..Default::default()
    };
    write_checkpoint(&dir.path().join("model"), &spec).expect("a synthetic model");
    let text = dir.path().join("text.txt");
    std::fs::write(&text, prunemem::model::tiny::corpus(40_000, 5)).expect("text");
    let j = job(dir.path(), &text);
    run_once(&j); // warm up thread pools, page cache
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        tag::set_enabled(false);
        off.push(run_once(&j));
        tag::set_enabled(true);
        on.push(run_once(&j));
    }
    let (m_off, m_on) = (median(off.clone()), median(on.clone()));
    let mut per_alloc = Vec::new();
    for (name, bytes) in [("64KiB", 64 << 10), ("1MiB", 1 << 20), ("16MiB", 16 << 20)] {
        tag::set_enabled(false);
        let off = alloc_ns(bytes, 200_000);
        tag::set_enabled(true);
        let on = alloc_ns(bytes, 200_000);
        per_alloc.push(format!("\"alloc_free_{name}_ns\":[{off:.0},{on:.0}]"));
    }
    println!(
        "{{\"rounds\":{rounds},\"off_s\":{off:?},\"on_s\":{on:?},\"median_off_s\":{m_off:.4},\"median_on_s\":{m_on:.4},\"overhead_percent\":{:.2},{}}}",
        100.0 * (m_on - m_off) / m_off,
        per_alloc.join(",")
    );
}
