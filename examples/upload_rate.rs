//! How fast a host tensor reaches the device (`exec::upload`): Burn's
//! `from_data` (cubecl's path: a copy into a fresh pageable vector, then
//! the driver's pageable copy) against prunemem's staged copy through
//! page-locked memory (`Compute::staged_upload`, CUDA only), at the sizes
//! a run uploads, in GB/s, each timed over repeated uploads with the
//! device synchronised after each, and the two results compared on the
//! device to the bit.
//!
//!   cargo run --release --features cuda --example upload_rate -- cuda [MIB...]
//!
//! Defaults: 8 MiB (a 1B layer's q_proj in f16), 32 (its gate_proj), 112
//! (an 8B layer's down_proj) and 501 (the 1B head's table), each an f16
//! `[rows, 2048]` matrix. `wgpu` instead of `cuda` runs Burn's path alone
//! (wgpu has no staged copy) and says why.

use std::time::Instant;

use burn::prelude::*;
use prunemem::exec::{Compute, DeviceSpec, Exec, OnDevice, WgpuSelect};

struct Rates {
    mib: Vec<f64>,
}

const CALLS: usize = 5;

/// Seconds per upload of `upload` (one warm-up, then `CALLS`), each
/// followed by the device's synchronisation; the last tensor.
fn per_upload<B: Compute>(
    device: &B::Device,
    mut upload: impl FnMut() -> Result<Tensor<B, 2>, String>,
) -> Result<(f64, Tensor<B, 2>), String> {
    let mut last = upload()?;
    let _ = B::sync(device);
    let t = Instant::now();
    for _ in 0..CALLS {
        last = upload()?;
        let _ = B::sync(device);
    }
    Ok((t.elapsed().as_secs_f64() / CALLS as f64, last))
}

impl OnDevice for Rates {
    type Output = ();
    fn run<B: Compute>(self, device: &B::Device) {
        let cols = 2048;
        for mib in self.mib {
            let rows = ((mib * (1 << 20) as f64) / (2 * cols) as f64)
                .round()
                .max(1.0) as usize;
            let values: Vec<half::f16> = (0..rows * cols)
                .map(|i| half::f16::from_f32((i % 2003) as f32 * 1e-3 - 1.0))
                .collect();
            let data = TensorData::new(values, [rows, cols]);
            let bytes = data.bytes.len() as f64;
            let gbs = |s: f64| bytes / s / 1e9;
            // Owned copies made before the clock starts: a run's uploads
            // hand their values over.
            let mut copies: Vec<TensorData> = (0..=CALLS).map(|_| data.clone()).collect();
            let burn = per_upload::<B>(device, || {
                let d = copies.pop().ok_or("out of copies")?;
                Ok(Tensor::from_data(d, (device, burn::tensor::DType::F16)))
            });
            let staged = per_upload::<B>(device, || B::staged_upload::<2>(&data, device));
            // What cubecl's `create_tensor` does on the host before the
            // bus sees the values: one copy into a fresh vector.
            let t = Instant::now();
            for _ in 0..CALLS {
                std::hint::black_box(data.bytes.to_vec());
            }
            let copy = t.elapsed().as_secs_f64() / CALLS as f64;
            let head = format!(
                "{:.1} MiB [{rows}, {cols}] f16 (a host copy into fresh memory {:.2} ms, {:.2} GB/s)",
                bytes / (1u64 << 20) as f64,
                copy * 1e3,
                gbs(copy)
            );
            match (burn, staged) {
                (Ok((b, bt)), Ok((s, st))) => {
                    let same: bool = bt.equal(st).all().into_scalar().elem();
                    println!(
                        "{head}: from_data {:.2} ms ({:.2} GB/s), staged {:.2} ms ({:.2} GB/s), {:.1}x; {}",
                        b * 1e3,
                        gbs(b),
                        s * 1e3,
                        gbs(s),
                        b / s,
                        if same {
                            "the same values"
                        } else {
                            "VALUES DIFFER"
                        }
                    );
                }
                (Ok((b, _)), Err(why)) => println!(
                    "{head}: from_data {:.2} ms ({:.2} GB/s); staged: not taken ({why})",
                    b * 1e3,
                    gbs(b)
                ),
                (Err(why), _) => println!("{head}: from_data failed ({why})"),
            }
        }
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let spec = match args.next().as_deref() {
        Some("cuda") => DeviceSpec::Cuda(0),
        _ => DeviceSpec::Wgpu(WgpuSelect::Default),
    };
    let mib: Vec<f64> = args.filter_map(|a| a.parse().ok()).collect();
    let mib = if mib.is_empty() {
        vec![8.0, 32.0, 112.0, 501.0]
    } else {
        mib
    };
    match Exec::open(spec, None) {
        Ok(exec) => exec.run(Rates { mib }),
        Err(e) => eprintln!("{e}"),
    }
}
