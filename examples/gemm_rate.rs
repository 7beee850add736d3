//! GFLOP/s of the forward's matrix product (`prunemem::model::matmul::sgemm`)
//! on SmolLM2-135M's linear shapes for 8 windows of 512 tokens and its LM
//! head, as one product over all rows (4096 unless given):
//!
//! ```text
//! cargo run --release --example gemm_rate [ROWS]
//! ```

use prunemem::model::matmul::{MatRef, sgemm};
use std::time::Instant;

fn main() {
    let shapes = [
        ("q/o_proj", 4096, 576, 576),
        ("k/v_proj", 4096, 576, 192),
        ("gate/up_proj", 4096, 576, 1536),
        ("down_proj", 4096, 1536, 576),
        ("lm_head", 4096, 576, 49152),
    ];
    let rows: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(4096);
    for (name, _, k, n) in shapes {
        let m = rows;
        let a: Vec<f32> = (0..m * k).map(|i| (i % 97) as f32 / 97.0 - 0.5).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i % 89) as f32 / 89.0 - 0.5).collect();
        let run = || sgemm(MatRef::row_major(&a, m, k), MatRef::row_major(&b, k, n));
        std::hint::black_box(run());
        let reps = 5;
        let t = Instant::now();
        for _ in 0..reps {
            std::hint::black_box(run());
        }
        let s = t.elapsed().as_secs_f64() / reps as f64;
        let gflops = 2.0 * (m * k * n) as f64 / s / 1e9;
        println!("{{\"shape\":\"{name}\",\"m\":{m},\"k\":{k},\"n\":{n},\"gflops\":{gflops:.1}}}");
    }
}
