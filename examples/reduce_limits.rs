//! Where cubecl's reductions stop short (`exec::reduce`): on a device,
//! `sum_dim` over long axes against the truth, a full `sum()`, and the
//! piecewise sums prunemem uses instead. On lavapipe (2026-11-26) a
//! `[73 728, 1]` column summed to 65 532 and a row of 331 776 ones to
//! 262 128; the full sum and the pieces were right.
//!
//!   cargo run --release --features wgpu --example reduce_limits [wgpu|cuda]

use burn::prelude::*;
use prunemem::exec::{Compute, DeviceSpec, Exec, OnDevice, WgpuSelect, reduce};

struct Sums;

impl OnDevice for Sums {
    type Output = ();
    fn run<B: Compute>(self, device: &B::Device) {
        for n in [24_576usize, 73_728, 331_776] {
            let column = Tensor::<B, 2>::ones([n, 1], device);
            let row = Tensor::<B, 2>::ones([1, n], device);
            let first = |t: Tensor<B, 2>| t.into_data().iter::<f32>().next().unwrap_or(f32::NAN);
            println!(
                "{} n {n}: column sum_dim(0) {} · row sum_dim(1) {} · sum() {} · in pieces {} / {}",
                B::name(device),
                first(column.clone().sum_dim(0)),
                first(row.clone().sum_dim(1)),
                first(column.clone().sum().reshape([1, 1])),
                first(reduce::sum_dim(column, 0)),
                first(reduce::sum_dim(row, 1)),
            );
        }
    }
}

fn main() {
    let spec = match std::env::args().nth(1).as_deref() {
        Some("cuda") => DeviceSpec::Cuda(0),
        _ => DeviceSpec::Wgpu(WgpuSelect::Default),
    };
    match Exec::open(spec, None) {
        Ok(exec) => exec.run(Sums),
        Err(e) => eprintln!("{e}"),
    }
}
