//! How fast the device's selections run at a model's linear shapes: the
//! per-output selection (Wanda's, `Compute::smallest_per_column`) and the
//! per-matrix threshold (magnitude's, RIA's, SparseGPT's block masks and
//! GradProbe's, `Compute::kth_smallest`), each timed over repeated calls
//! after a warm-up and checked against the host (a stable sort per column,
//! `select_nth_unstable` over the matrix).
//!
//!   cargo run --release --features wgpu --example select_rate -- wgpu [1b|smol]
//!   cargo run --release --features cuda --example select_rate -- cuda [1b|8b]
//!
//! The keys are the bit patterns of `|w|` for normal weights rounded to
//! bf16 (a checkpoint's precision: ties in every column), in Burn's
//! `[in, out]` layout and transposed (the stored layout seen as
//! `[in, out]`).

use std::time::Instant;

use burn::prelude::*;
use prunemem::exec::{Compute, DeviceSpec, Exec, OnDevice, WgpuSelect};

struct Rates {
    shapes: Vec<(usize, usize)>,
}

/// Seconds per call of `call` after one call to compile and warm up, each
/// call synchronised by reading its result back (`sync`).
fn per_call<T>(call: impl Fn() -> T, sync: impl Fn(T), calls: usize) -> f64 {
    sync(call());
    let t = Instant::now();
    for _ in 0..calls {
        sync(call());
    }
    t.elapsed().as_secs_f64() / calls as f64
}

/// `rows × cols` keys: `|w|` of normal weights rounded to bf16, as f32
/// bit patterns (non-negative, ordered as the values).
fn keys(rows: usize, cols: usize, seed: u64) -> Vec<i32> {
    prunemem::model::synthetic::Normal::new(seed)
        .vec(rows * cols, 0.02)
        .iter()
        .map(|v| (v.abs().to_bits() & 0xFFFF_0000) as i32)
        .collect()
}

/// Whether `mask` (`[rows, cols]`, row-major) takes, in every column, the
/// `k` smallest keys with ties in row order (the host path's stable sort).
fn per_column_as_host(keys: &[i32], mask: &[bool], (rows, cols): (usize, usize), k: usize) -> bool {
    (0..cols).all(|c| {
        let mut order: Vec<usize> = (0..rows).collect();
        order.sort_by_key(|&r| keys[r * cols + c]);
        let mut want = vec![false; rows];
        for &r in &order[..k] {
            want[r] = true;
        }
        (0..rows).all(|r| mask[r * cols + c] == want[r])
    })
}

impl OnDevice for Rates {
    /// Whether every answer was the host's.
    type Output = bool;
    fn run<B: Compute>(self, device: &B::Device) -> bool {
        let mut all_same = true;
        use burn::tensor::TensorData;
        let tally = prunemem::exec::tally::Tally::now;
        for (i, (rows, cols)) in self.shapes.into_iter().enumerate() {
            let host = keys(rows, cols, 7 + i as u64);
            let t =
                Tensor::<B, 2, Int>::from_data(TensorData::new(host.clone(), [rows, cols]), device);
            let k = rows / 2;
            // Per output: Burn's layout, then the checkpoint's seen transposed.
            let stored = Tensor::<B, 2, Int>::from_data(t.clone().transpose().into_data(), device)
                .transpose();
            for (layout, keys) in [("[in, out]", &t), ("stored", &stored)] {
                let before = tally().of(prunemem::exec::tally::Kernel::PerOutput);
                let mask = B::smallest_per_column(keys.clone(), k).ok();
                let after = tally().of(prunemem::exec::tally::Kernel::PerOutput);
                let Some(mask) = mask else {
                    println!("per output {rows}x{cols} {layout}: no kernel on this backend");
                    continue;
                };
                let flags: Vec<bool> = mask.into_data().iter::<bool>().collect();
                let same = per_column_as_host(&host, &flags, (rows, cols), k);
                all_same &= same;
                let s = per_call(
                    || B::smallest_per_column(keys.clone(), k).ok(),
                    |m| {
                        if let Some(m) = m {
                            let _ = m.slice([0..1, 0..1]).into_data();
                        }
                    },
                    3,
                );
                println!(
                    "per output {rows}x{cols} {layout}, k {k}: {:.3} ms, {:.1} Mkeys/s, as the host's: {}{}",
                    s * 1e3,
                    (rows * cols) as f64 / s / 1e6,
                    if same { "yes" } else { "NO" },
                    if after.fell_back > before.fell_back {
                        " (fell back)"
                    } else {
                        ""
                    }
                );
            }
            // Per matrix: the threshold at half the matrix.
            let k = rows * cols / 2;
            let mut sorted = host.clone();
            let (_, want, _) = sorted.select_nth_unstable(k - 1);
            let want = *want as i64;
            let Some(got) = B::kth_smallest(&t, k) else {
                println!("per matrix {rows}x{cols}: no kernel on this backend");
                continue;
            };
            let got = got.into_data().iter::<i64>().next().unwrap_or(-1);
            all_same &= got == want;
            let s = per_call(
                || B::kth_smallest(&t, k),
                |v| {
                    if let Some(v) = v {
                        let _ = v.into_data();
                    }
                },
                3,
            );
            println!(
                "per matrix {rows}x{cols}, k {k}: {:.3} ms, {:.1} Mkeys/s, as the host's: {}",
                s * 1e3,
                (rows * cols) as f64 / s / 1e6,
                if got == want { "yes" } else { "NO" },
            );
        }
        all_same
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let spec = match args.next().as_deref() {
        Some("cuda") => DeviceSpec::Cuda(0),
        _ => DeviceSpec::Wgpu(WgpuSelect::Default),
    };
    // `[in, out]` of a layer's linears: q/o, k/v, gate/up, down.
    let shapes = match args.next().as_deref() {
        Some("smol") => vec![(576, 576), (576, 192), (576, 1536), (1536, 576)],
        Some("8b") => vec![(4096, 4096), (4096, 1024), (4096, 14_336), (14_336, 4096)],
        _ => vec![(2048, 2048), (2048, 512), (2048, 8192), (8192, 2048)],
    };
    match Exec::open(spec, None) {
        Ok(exec) if exec.run(Rates { shapes }) => {}
        Ok(_) => {
            eprintln!("a selection differs from the host's");
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    }
}
