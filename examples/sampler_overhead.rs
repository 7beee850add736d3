//! Measures what the background sampler costs a Burn matmul workload:
//! the same work timed with the sampler off and at 10 Hz, interleaved,
//! several rounds, medians compared.
//!
//! ```text
//! cargo run --release --example sampler_overhead -- [ROUNDS] [HZ]
//! ```

use std::sync::Arc;
use std::time::Instant;

use burn::backend::Flex;
use burn::prelude::*;
use prunemem::events::Emitter;
use prunemem::profiler::{Profiler, ProfilerConfig};

#[global_allocator]
static GLOBAL: prunemem::memory::CountingAllocator = prunemem::memory::CountingAllocator;

fn workload(device: &burn::backend::flex::FlexDevice) -> f32 {
    let n = 1024;
    let a = Tensor::<Flex, 2>::random([n, n], burn::tensor::Distribution::Default, device);
    let mut acc = a.clone();
    for _ in 0..120 {
        acc = acc.matmul(a.clone()).div_scalar(n as f32);
    }
    acc.sum().into_scalar()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    let hz: f64 = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10.0);
    let device = Default::default();
    workload(&device); // warm up thread pools and caches
    let (mut off, mut on) = (Vec::new(), Vec::new());
    let mut samples = 0usize;
    for _ in 0..rounds {
        let t = Instant::now();
        workload(&device);
        off.push(t.elapsed().as_secs_f64());

        let emitter = Arc::new(Emitter::new());
        let profiler = Profiler::new(
            emitter.clone(),
            ProfilerConfig {
                sampler_hz: Some(hz),
                ..Default::default()
            },
        );
        let t = Instant::now();
        profiler.start_sampler();
        workload(&device);
        profiler.stop_sampler();
        on.push(t.elapsed().as_secs_f64());
        samples += (on.last().copied().unwrap_or(0.0) * hz) as usize;
    }
    let (m_off, m_on) = (median(off), median(on));
    // The cost of one sample, measured directly: noise-free, and an upper
    // bound on the sampler's share of one core (hz x cost).
    let profiler = Profiler::new(Arc::new(Emitter::new()), ProfilerConfig::default());
    let reps = 500;
    let t = Instant::now();
    for _ in 0..reps {
        std::hint::black_box(profiler.snapshot("sample"));
    }
    let per_sample_us = t.elapsed().as_secs_f64() * 1e6 / reps as f64;
    println!(
        "{{\"rounds\":{rounds},\"hz\":{hz},\"median_off_s\":{m_off:.4},\"median_on_s\":{m_on:.4},\"overhead_percent\":{:.2},\"approx_samples\":{samples},\"per_sample_us\":{per_sample_us:.1},\"one_core_share_percent\":{:.4}}}",
        100.0 * (m_on - m_off) / m_off,
        per_sample_us * hz / 1e4
    );
}
