//! How fast each of cubecl's matmul kernels runs a linear of the model's
//! shapes (`exec::matmul`): for every strategy name, the same f16 linears
//! as prunemem runs them (`Compute::linear`, Burn's `[in, out]` weight),
//! timed over repeated calls after a warm-up, in TFLOP/s. A strategy that
//! cannot take a shape falls back to Burn's matmul and is marked so.
//!
//!   cargo run --release --features cuda --example matmul_rate -- cuda [TOKENS] [NAMES...]
//!
//! Defaults: 4096 tokens (8 windows of 512), a Llama-3.2-1B layer's
//! shapes and its head's, every name in `exec::matmul::NAMES`; then the
//! head as the evaluation multiplies it, its table in the stored
//! `[vocab, hidden]` layout (`PRUNEMEM_HEAD_MATMUL=NAME` runs a name there).
//! Each linear is timed twice: its weight in Burn's `[in, out]` layout, and
//! as the checkpoint stores it, seen transposed
//! (`PRUNEMEM_WEIGHT_LAYOUT=stored`).

use std::time::Instant;

use burn::nn::LinearConfig;
use burn::prelude::*;
use burn::tensor::FloatDType;
use prunemem::exec::{Compute, DeviceSpec, Exec, OnDevice, WgpuSelect};

struct Rates {
    tokens: usize,
    names: Vec<String>,
}

/// Seconds per call of `call` (after two calls to compile and warm up),
/// synchronised by reading one value back.
fn per_call<B: Compute, const D: usize>(call: impl Fn() -> Tensor<B, D>, calls: usize) -> f64 {
    let sync = |y: Tensor<B, D>| {
        let _ = y.flatten::<1>(0, D - 1).slice(0..1).into_data();
    };
    for _ in 0..2 {
        sync(call());
    }
    let t = Instant::now();
    let mut last = None;
    for _ in 0..calls {
        last = Some(call());
    }
    if let Some(y) = last {
        sync(y);
    }
    t.elapsed().as_secs_f64() / calls as f64
}

/// What a rate line says after the shape and the name: whether the
/// strategy took the product, milliseconds, TFLOP/s, the largest
/// difference from the first name's output relative to its scale, and
/// whether it differs.
fn rate_line(own: bool, seconds: f64, flop: f64, relative: f32, differs: bool) -> String {
    format!(
        "{}: {:.3} ms, {:.1} TFLOP/s, max |diff| from the first {:.3e}{}",
        if own {
            ""
        } else {
            " (cannot take it: Burn's matmul ran)"
        },
        seconds * 1e3,
        flop / seconds / 1e12,
        relative,
        if differs { " (DIFFERS)" } else { "" }
    )
}

/// One linear's rate with the strategy in use, against `want`: whether
/// the strategy took it, milliseconds, TFLOP/s, the largest difference.
fn rate<B: Compute>(linear: &burn::nn::Linear<B>, x: &Tensor<B, 3>, want: Tensor<B, 3>) -> String {
    let [_, rows, inp] = x.dims();
    let [_, out] = linear.weight.val().dims();
    let matmul = prunemem::exec::tally::Kernel::Matmul;
    let before = prunemem::exec::tally::Tally::now().of(matmul);
    let y = <B as Compute>::linear(linear, x.clone()).cast(FloatDType::F32);
    let own = prunemem::exec::tally::Tally::now().of(matmul).fell_back == before.fell_back;
    let err: f32 = (y - want.clone()).abs().max().into_scalar().elem();
    let scale: f32 = (want.abs().max() + 1.0).into_scalar().elem();
    let s = per_call(|| <B as Compute>::linear(linear, x.clone()), 10);
    let flop = 2.0 * (rows * inp * out) as f64;
    rate_line(own, s, flop, err / scale, err > 0.1)
}

impl OnDevice for Rates {
    type Output = ();
    fn run<B: Compute>(self, device: &B::Device) {
        let shapes = [
            (2048, 2048),
            (2048, 512),
            (2048, 8192),
            (8192, 2048),
            (2048, 128_256),
        ];
        for (inp, out) in shapes {
            // The head's shape only at a real token count (it is 137
            // GFLOP a call: minutes on lavapipe).
            if out > 100_000 && self.tokens < 1024 {
                continue;
            }
            let rows = if out > 100_000 { 261 } else { self.tokens };
            let mut linear = LinearConfig::new(inp, out)
                .with_bias(false)
                .init::<B>(device);
            linear.weight = linear.weight.map(|w| w.cast(FloatDType::F16));
            let x =
                Tensor::<B, 3>::random([1, rows, inp], burn::tensor::Distribution::Default, device)
                    .cast(FloatDType::F16);
            // The same weight as the checkpoint stores it (`[out, in]`),
            // seen transposed (`PRUNEMEM_WEIGHT_LAYOUT=stored`).
            let mut stored = linear.clone();
            let out_in = linear.weight.val().transpose().into_data();
            stored.weight = burn::module::Param::from_tensor(
                Tensor::<B, 2>::from_data(out_in, (device, burn::tensor::DType::F16)).transpose(),
            );
            let mut reference = None;
            for name in &self.names {
                if !prunemem::exec::matmul::set(name) {
                    println!("{name}: unknown");
                    continue;
                }
                for (layout, lin) in [("", &linear), (", stored layout", &stored)] {
                    let want = reference.get_or_insert_with(|| {
                        <B as Compute>::linear(lin, x.clone()).cast(FloatDType::F32)
                    });
                    let line = rate(lin, &x, want.clone());
                    println!("{rows}x{inp} · {inp}x{out} {name}{layout}{line}");
                }
            }
        }
        prunemem::exec::matmul::set("auto");
        if self.tokens >= 1024 {
            head_in_stored_layout::<B>(&self.names, device);
        }
    }
}

/// The head's product as the evaluation runs it: a chunk's rows times the
/// `[vocab, hidden]` table read in its stored layout
/// (`Compute::matmul_rows`, `PRUNEMEM_HEAD_MATMUL`), for every name; `auto`
/// is Burn's matmul on the transposed view, the evaluation's default. The
/// evaluation's chunk is 261 rows at this vocabulary
/// (`model::perplexity::device_chunk_rows`); 1 022 and 2 044 rows are two
/// and four 512-token windows' rows in one product, what a wider chunk
/// would be worth.
fn head_in_stored_layout<B: Compute>(names: &[String], device: &B::Device) {
    let (hidden, vocab) = (2048, 128_256);
    let random = |shape: [usize; 2]| {
        Tensor::<B, 2>::random(shape, burn::tensor::Distribution::Default, device)
            .cast(FloatDType::F16)
    };
    let table = random([vocab, hidden]);
    for rows in [261, 1022, 2044] {
        let x = random([rows, hidden]);
        let flop = 2.0 * (rows * hidden * vocab) as f64;
        let product = |name: &str| match B::matmul_rows(x.clone(), table.clone(), name) {
            Ok(y) => (y, true),
            Err((x, t)) => (x.matmul(t.transpose()), name == "auto"),
        };
        let mut reference = None;
        for name in names {
            let (y, own) = product(name);
            let y = y.cast(FloatDType::F32);
            let want = reference.get_or_insert_with(|| y.clone()).clone();
            let err: f32 = (y - want.clone()).abs().max().into_scalar().elem();
            let scale: f32 = want.abs().max().into_scalar().elem();
            let s = per_call(|| product(name).0, 10);
            let line = rate_line(own, s, flop, err / scale.max(1e-30), false);
            println!("head {rows}x{hidden} · ({vocab}x{hidden})ᵀ stored layout {name}{line}");
        }
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let spec = match args.next().as_deref() {
        Some("cuda") => DeviceSpec::Cuda(0),
        _ => DeviceSpec::Wgpu(WgpuSelect::Default),
    };
    let tokens = args.next().and_then(|a| a.parse().ok()).unwrap_or(4096);
    let names: Vec<String> = args.collect();
    let names = if names.is_empty() {
        prunemem::exec::matmul::NAMES
            .iter()
            .map(|n| n.to_string())
            .collect()
    } else {
        names
    };
    match Exec::open(spec, None) {
        Ok(exec) => exec.run(Rates { tokens, names }),
        Err(e) => eprintln!("{e}"),
    }
}
