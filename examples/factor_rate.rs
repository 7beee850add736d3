//! How long SparseGPT's host factorisation takes (`prune::linalg`): the
//! Cholesky of `P H P`, the triangular inverse, for one SPD matrix of each
//! size given (default 2048 and 8192, a 1B shape's two input widths), with
//! the threads rayon has.
//!
//!   cargo run --release --example factor_rate -- 2048 8192

use std::time::Instant;

fn main() {
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![2048, 8192]
    } else {
        sizes
    };
    println!("threads: {}", rayon::current_num_threads());
    for n in sizes {
        // Symmetric, diagonally dominant: positive definite; the time does
        // not depend on the values.
        let h: Vec<f32> = (0..n * n)
            .map(|t| {
                let (i, j) = (t / n, t % n);
                1.0 / (1.0 + i.abs_diff(j) as f32) + if i == j { n as f32 } else { 0.0 }
            })
            .collect();
        let mut l = h.clone();
        let t = Instant::now();
        prunemem::prune::linalg::cholesky_lower(&mut l, n).expect("SPD");
        let chol = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let inv = prunemem::prune::linalg::invert_lower(&l, n);
        let tri = t.elapsed().as_secs_f64();
        println!(
            "n {n}: cholesky {chol:.3} s, triangular inverse {tri:.3} s (checksum {:.6e})",
            inv.iter().map(|v| *v as f64).sum::<f64>()
        );
    }
}
