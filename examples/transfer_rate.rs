//! How fast the large copies cross the bus (`exec::copies`): Burn's
//! `from_data` and `into_data` (cubecl's paths: a copy into a fresh
//! pageable vector, then the driver's pageable copy; reads above 100 MB
//! into a zero-filled pageable vector) against prunemem's staged copies
//! through page-locked memory (`Compute::staged_upload`,
//! `Compute::staged_download`, CUDA only), at the sizes a run moves, in
//! GB/s, each timed over repeated copies with the device synchronised
//! after each, and the two results compared to the bit.
//!
//!   cargo run --release --features cuda --example transfer_rate -- cuda [MIB...]
//!
//! Defaults: 8 MiB (a 1B layer's q_proj in f16), 32 (its gate_proj), 112
//! (an 8B layer's down_proj) and 501 (the 1B head's table), each an f16
//! `[rows, 2048]` matrix. `wgpu` instead of `cuda` runs Burn's paths alone
//! (wgpu has no staged copies) and says why.

use std::time::Instant;

use burn::prelude::*;
use prunemem::exec::{Compute, DeviceSpec, Exec, OnDevice, WgpuSelect};

struct Rates {
    mib: Vec<f64>,
}

const CALLS: usize = 5;

/// Seconds per call of `copy` (one warm-up, then `CALLS`), each followed
/// by the device's synchronisation; the last result.
fn per_call<B: Compute, T>(
    device: &B::Device,
    mut copy: impl FnMut() -> Result<T, String>,
) -> Result<(f64, T), String> {
    let mut last = copy()?;
    let _ = B::sync(device);
    let t = Instant::now();
    for _ in 0..CALLS {
        last = copy()?;
        let _ = B::sync(device);
    }
    Ok((t.elapsed().as_secs_f64() / CALLS as f64, last))
}

/// One direction's line: Burn's time and rate, the staged copy's (or why
/// it was not taken), and whether the two agree.
fn line<T>(
    bytes: f64,
    burn: Result<(f64, T), String>,
    staged: Result<(f64, T), String>,
    same: impl Fn(&T, &T) -> bool,
) -> String {
    let rate = |s: f64| format!("{:.2} ms ({:.2} GB/s)", s * 1e3, bytes / s / 1e9);
    match (burn, staged) {
        (Ok((b, bt)), Ok((s, st))) => format!(
            "Burn's {}, staged {}, {:.1}x; {}",
            rate(b),
            rate(s),
            b / s,
            if same(&bt, &st) {
                "the same values"
            } else {
                "VALUES DIFFER"
            }
        ),
        (Ok((b, _)), Err(why)) => format!("Burn's {}; staged: not taken ({why})", rate(b)),
        (Err(why), _) => format!("Burn's failed ({why})"),
    }
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
            // What cubecl's `create_tensor` does on the host before the
            // bus sees the values: one copy into a fresh vector.
            let t = Instant::now();
            for _ in 0..CALLS {
                std::hint::black_box(data.bytes.to_vec());
            }
            let copy = t.elapsed().as_secs_f64() / CALLS as f64;
            println!(
                "{:.1} MiB [{rows}, {cols}] f16: a host copy into fresh memory {:.2} ms ({:.2} GB/s)",
                bytes / (1u64 << 20) as f64,
                copy * 1e3,
                bytes / copy / 1e9
            );
            // Owned copies made before the clock starts: a run's uploads
            // hand their values over.
            let mut owned: Vec<TensorData> = (0..=CALLS).map(|_| data.clone()).collect();
            let up_burn = per_call::<B, _>(device, || {
                let d = owned.pop().ok_or("out of copies")?;
                Ok(Tensor::<B, 2>::from_data(
                    d,
                    (device, burn::tensor::DType::F16),
                ))
            });
            let up_staged = per_call::<B, _>(device, || B::staged_upload::<2>(&data, device));
            let same = |a: &Tensor<B, 2>, b: &Tensor<B, 2>| -> bool {
                a.clone().equal(b.clone()).all().into_scalar().elem()
            };
            println!("  up:   {}", line(bytes, up_burn, up_staged, same));
            let t = Tensor::<B, 2>::from_data(data.clone(), (device, burn::tensor::DType::F16));
            let down_burn = per_call::<B, _>(device, || Ok(t.clone().into_data()));
            let down_staged = per_call::<B, _>(device, || B::staged_download(&t));
            let same = |a: &TensorData, b: &TensorData| a.bytes[..] == b.bytes[..];
            println!("  down: {}", line(bytes, down_burn, down_staged, same));
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
