//! The profiling API on a real Burn workload: stage checkpoints, a scope with
//! its own peak, and the background sampler, written to a log folder.
//!
//! ```text
//! cargo run --release --example profile_checkpoints -- [LOG_DIR]
//! ```

use burn::backend::Flex;
use burn::prelude::*;
use prunemem::events::{HostInfo, RunPlan, RunStatus};
use prunemem::jobs::{Run, RunOptions};

#[global_allocator]
static GLOBAL: prunemem::memory::CountingAllocator = prunemem::memory::CountingAllocator;

fn main() {
    let log_dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "reports/example-profile".into());
    let plan = RunPlan {
        command: "example:profile_checkpoints".into(),
        argv: std::env::args().collect(),
        host: HostInfo::current(),
        ..Default::default()
    };
    let options = RunOptions {
        log_dir: Some(log_dir.clone().into()),
        sinks: vec![Box::new(prunemem::sinks::SummarySink::new(Box::new(
            std::io::stdout(),
        )))],
        ..Default::default()
    };
    let run = match Run::start(plan, options) {
        Ok(run) => run,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
    };
    let p = &run.profiler;
    let device = Default::default();
    p.stage("01_start");

    let n = 2048;
    let a = Tensor::<Flex, 2>::random([n, n], burn::tensor::Distribution::Default, &device);
    let b = Tensor::<Flex, 2>::random([n, n], burn::tensor::Distribution::Default, &device);
    p.stage("02_inputs_allocated");
    {
        let _scope = p.scope("matmuls");
        let mut acc = a.clone().matmul(b.clone());
        for _ in 0..4 {
            acc = acc.matmul(b.clone()).div_scalar(n as f32);
        }
        let total: f32 = acc.sum().into_scalar();
        p.stage("03_after_matmuls");
        println!("checksum {total:.4}");
    }
    drop((a, b));
    p.stage("04_dropped");
    let (_summary, errors) = run.finish(RunStatus::Ok);
    for e in errors {
        eprintln!("warning: {e}");
    }
    println!("logs written to {log_dir}/ (memory_log.csv, events.jsonl, summary.txt)");
}
