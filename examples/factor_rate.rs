//! How long SparseGPT's factorisation takes: on the host (`prune::linalg`:
//! the Cholesky of `P H P`, the triangular inverse, with the threads rayon
//! has) and, given a device, where the Hessian is (`prune::factor_device`,
//! blocks of 128), for one SPD matrix of each size given (default 2048 and
//! 8192, a 1B shape's two input widths; 14336 is an 8B shape's down
//! projection). On a device it also prints how far Burn's f32 matmul and
//! the exact one (`Compute::matmul_f32`) are from an f64 product: on a
//! CUDA card with TF32, Burn's rounds its inputs to 10 bits.
//!
//!   cargo run --release --example factor_rate -- 2048 8192
//!   cargo run --release --features cuda --example factor_rate -- cuda 8192 14336
//!   cargo run --release --features wgpu --example factor_rate -- wgpu 512

use std::time::Instant;

use burn::prelude::*;
use prunemem::exec::{Compute, DeviceSpec, Exec, OnDevice, WgpuSelect};
use prunemem::prune::{factor_device, linalg};

/// Symmetric, diagonally dominant: positive definite, with off-diagonal
/// values that are not exact in TF32. The time does not depend on them.
fn spd(n: usize) -> Vec<f32> {
    (0..n * n)
        .map(|t| {
            let (i, j) = (t / n, t % n);
            1.0 / (1.0 + i.abs_diff(j) as f32 * 1.37) + if i == j { n as f32 } else { 0.0 }
        })
        .collect()
}

/// The host's factorisation of `h`: (`Hinv`, seconds).
fn on_host(h: &[f32], n: usize) -> (Vec<f32>, f64) {
    let t = Instant::now();
    let hinv = linalg::inverse_upper_cholesky(h, n).expect("SPD");
    (hinv, t.elapsed().as_secs_f64())
}

struct Rates {
    sizes: Vec<usize>,
}

impl OnDevice for Rates {
    type Output = ();
    fn run<B: Compute>(self, device: &B::Device) {
        for &n in &self.sizes {
            let h = spd(n);
            let (host, host_s) = on_host(&h, n);
            let upload = || Tensor::<B, 2>::from_data(TensorData::new(h.clone(), [n, n]), device);
            // The first call compiles the kernels; the second is timed.
            let mut secs = Vec::new();
            let mut got = Vec::new();
            for _ in 0..2 {
                let t = upload();
                let _ = t.clone().slice([0..1, 0..1]).into_data();
                let start = Instant::now();
                let f = factor_device::factor(t, 0.0, 128).expect("SPD");
                got = f.hinv.into_data().into_vec::<f32>().unwrap();
                secs.push(start.elapsed().as_secs_f64());
            }
            let scale = host.iter().fold(0f32, |m, v| m.max(v.abs()));
            let worst = host
                .iter()
                .zip(&got)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            println!(
                "n {n}: host {host_s:.3} s; device {:.3} s (first call, compiling: {:.3} s), \
                 max |diff| {:.2e} of max |Hinv| {:.2e}",
                secs[1], secs[0], worst, scale
            );
            products::<B>(&h, n, device);
        }
    }
}

/// `H[:, :128]ᵀ · H` by Burn's matmul and by `matmul_f32`, their first
/// four rows against f64 on the host: the largest error relative to the
/// largest value.
fn products<B: Compute>(h: &[f32], n: usize, device: &B::Device) {
    let k = n.min(128);
    let a: Vec<f32> = (0..k)
        .flat_map(|r| (0..n).map(move |c| h[c * n + r]))
        .collect();
    // Four rows in f64 on one host core (an 8B width's full product would
    // take minutes).
    let exact: Vec<f64> = (0..4.min(k))
        .flat_map(|r| {
            let a = &a;
            (0..n).map(move |c| {
                (0..n)
                    .map(|t| a[r * n + t] as f64 * h[t * n + c] as f64)
                    .sum()
            })
        })
        .collect();
    let scale = exact.iter().fold(0f64, |m, v| m.max(v.abs()));
    let lhs = Tensor::<B, 2>::from_data(TensorData::new(a, [k, n]), device);
    let rhs = Tensor::<B, 2>::from_data(TensorData::new(h.to_vec(), [n, n]), device);
    let error = |t: Tensor<B, 2>| {
        let v: Vec<f32> = t.into_data().into_vec().unwrap();
        v.iter()
            .zip(&exact)
            .map(|(a, b)| (*a as f64 - b).abs())
            .fold(0f64, f64::max)
            / scale
    };
    let burn = error(lhs.clone().matmul(rhs.clone()));
    let exact_f32 = error(B::matmul_f32(lhs, rhs));
    println!(
        "  {k}x{n} · {n}x{n}: Burn's matmul within {burn:.2e}, matmul_f32 within {exact_f32:.2e} \
         (relative to the largest value; f32 rounding is about 1e-7, TF32's 1e-3)"
    );
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let spec = match args.first().map(String::as_str) {
        Some("cuda") => Some(DeviceSpec::Cuda(0)),
        Some("wgpu") => Some(DeviceSpec::Wgpu(WgpuSelect::Default)),
        _ => None,
    };
    if spec.is_some() {
        args.remove(0);
    }
    let sizes: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let sizes = if sizes.is_empty() {
        vec![2048, 8192]
    } else {
        sizes
    };
    println!("threads: {}", rayon::current_num_threads());
    match spec {
        None => {
            for n in sizes {
                let (hinv, s) = on_host(&spd(n), n);
                println!(
                    "n {n}: host {s:.3} s (checksum {:.6e})",
                    hinv.iter().map(|v| *v as f64).sum::<f64>()
                );
            }
        }
        Some(spec) => match Exec::open(spec, None) {
            Ok(exec) => exec.run(Rates { sizes }),
            Err(e) => eprintln!("{e}"),
        },
    }
}
