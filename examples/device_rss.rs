//! Where a device run's resident memory goes, step by step: uploads,
//! kernels and read-backs of layer-sized tensors on `--device` (default
//! wgpu), printing RSS and the device pool after each. A diagnostic for the
//! RSS growth per streamed layer seen on lavapipe (docs/gpu.md).
//!
//! cargo run --release --features wgpu --example device_rss -- [upload|kernel|readback|all|pool] [DEVICE]

use burn::prelude::*;
use prunemem::exec::{Compute, DeviceSpec, Exec, OnDevice};
use prunemem::memory::process::rss_now;

struct Steps {
    mode: String,
    probe: Box<dyn prunemem::memory::DeviceProbe>,
}

impl OnDevice for Steps {
    type Output = ();
    fn run<B: Compute>(self, device: &B::Device) {
        let n = 3_538_944; // one SmolLM2-135M decoder layer's weights
        let mib = |b: Option<u64>| b.map_or(f64::NAN, |b| b as f64 / (1 << 20) as f64);
        let start = mib(rss_now());
        if self.mode == "pool" {
            // The pool's bytes in use around an upload, a kernel and a
            // read-back of one offloaded calibration batch (2 × 128 × 576 f16).
            let pool = || self.probe.read().allocated.unwrap_or(0);
            let shape = [2, 128, 576];
            let data = TensorData::new(vec![half::f16::ONE; 2 * 128 * 576], shape);
            println!("batch bytes {}", 2 * 128 * 576 * 2);
            println!("empty           {:>9}", pool());
            let x = Tensor::<B, 3>::from_data(data.clone(), device);
            println!("uploaded        {:>9}", pool());
            let y = x.clone() * 2.0;
            println!("y = 2x          {:>9}", pool());
            let back = y.clone().into_data();
            println!("y read back     {:>9} ({} bytes)", pool(), back.bytes.len());
            drop((x, y));
            println!("dropped         {:>9}", pool());
            let z = Tensor::<B, 3>::from_data(data, device) + 1.0;
            println!("upload + 1      {:>9}", pool());
            drop(z);
            println!("dropped         {:>9}", pool());
            return;
        }
        if let Some(which) = self.mode.strip_prefix("layer") {
            // Load a SmolLM2 layer (the same one, or the next each time) and
            // run a batch through it, as the streamed engines do.
            let ckpt = prunemem::model::Checkpoint::open("models/smollm2-135m".as_ref()).unwrap();
            let dtype = prunemem::model::ComputeDtype::F32;
            let rope = prunemem::model::Rope::<B>::new(&ckpt.config, 256, dtype.burn(), device);
            let x = Tensor::<B, 3>::ones([4, 256, ckpt.config.hidden_size], device);
            let kept = ckpt.load_layer::<B>(0, dtype, device).unwrap();
            for i in 0..20 {
                let index = if which == "-next" { i } else { 0 };
                let fresh;
                let layer = match which {
                    "-forward" => &kept,
                    _ => {
                        fresh = ckpt.load_layer::<B>(index, dtype, device).unwrap();
                        &fresh
                    }
                };
                if which != "-load" {
                    let y = layer.forward(x.clone(), &rope);
                    let _ = y.slice([0..1, 0..1, 0..1]).into_data();
                } else {
                    let _ = layer
                        .mlp
                        .down_proj
                        .weight
                        .val()
                        .slice([0..1, 0..1])
                        .into_data();
                }
                println!(
                    "{} {i:2}: RSS {:8.1} MiB (+{:.1})",
                    self.mode,
                    mib(rss_now()),
                    mib(rss_now()) - start
                );
            }
            return;
        }
        for i in 0..20 {
            let t = Tensor::<B, 1>::from_data(TensorData::new(vec![1.0f32; n], [n]), device);
            let t = match self.mode.as_str() {
                "upload" => t,
                _ => t.mul_scalar(2.0).add_scalar(1.0),
            };
            if matches!(self.mode.as_str(), "readback" | "all") {
                let v: Vec<f32> = t.clone().into_data().into_vec().unwrap();
                assert_eq!(v.len(), n);
            } else {
                let _ = t.clone().slice(0..1).into_data();
            }
            drop(t);
            println!(
                "{} {i:2}: RSS {:8.1} MiB (+{:.1})",
                self.mode,
                mib(rss_now()),
                mib(rss_now()) - start
            );
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = args.get(1).cloned().unwrap_or_else(|| "all".into());
    let spec: DeviceSpec = args
        .get(2)
        .map_or("wgpu", |s| s.as_str())
        .parse()
        .expect("a device");
    let exec = Exec::open(spec, None).expect("the device opens");
    println!("{} ({})", spec, exec.adapter());
    let probe = exec.probe();
    exec.run(Steps { mode, probe });
}
