//! prunemem's own device kernels (`exec::kernels`) and the named cubek
//! products against answers made on the host: the selections against a
//! stable sort, the losses, attention, SwiGLU, the norms and the head's
//! product against f64, each no worse than Burn's ops it replaces.

use super::*;

mod dsnot;
mod realloc;
mod selection;
mod variant;

/// How many of `a` and `b` differ in their bits.
pub(super) fn bits_differ(a: &[f32], b: &[f32]) -> usize {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count()
}

/// The selection kernels and the evaluation's loss kernel
/// (`exec::kernels`, one launch each on wgpu) against plain host
/// computations: the `k` smallest of every column and the `n` smallest of
/// every group of `m` rows by a stable sort (keys with many ties, read in
/// both layouts), the per-matrix threshold, and each row's `logsumexp - x[t]`
/// in f64 over a vocabulary wider than cubecl's reductions reach.
struct KernelsAgainstHost;

/// Causal attention in f64 on the host: `[b, h, s, d]` row-major.
fn host_attention(q: &[f32], k: &[f32], v: &[f32], [b, h, s, d]: [usize; 4]) -> Vec<f64> {
    let mut out = vec![0f64; b * h * s * d];
    let scale = 1.0 / (d as f64).sqrt();
    for bh in 0..b * h {
        let at = |t: &[f32], i: usize, c: usize| t[(bh * s + i) * d + c] as f64;
        for i in 0..s {
            let scores: Vec<f64> = (0..=i)
                .map(|j| (0..d).map(|c| at(q, i, c) * at(k, j, c)).sum::<f64>() * scale)
                .collect();
            let max = scores.iter().cloned().fold(f64::MIN, f64::max);
            let weights: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for c in 0..d {
                let mix: f64 = (0..=i).map(|j| weights[j] * at(v, j, c)).sum();
                out[(bh * s + i) * d + c] = mix / total;
            }
        }
    }
    out
}

/// The fused attention against the host's, for shapes a plane does and
/// does not divide, both dtypes, and a query laid out `[b, s, h, d]` and
/// swapped (as a layer makes it): the worst error relative to the largest
/// output.
fn attention_cases<B: Compute>(
    rng: &mut prunemem::model::synthetic::Normal,
    device: &B::Device,
) -> Vec<(String, f64, bool)> {
    use burn::prelude::{Tensor, TensorData};
    use burn::tensor::FloatDType;
    let mut out = Vec::new();
    for (shape, dtype) in [
        ([2, 3, 37, 64], FloatDType::F32),
        ([2, 3, 37, 64], FloatDType::F16),
        ([1, 4, 128, 32], FloatDType::F16),
        ([1, 2, 300, 64], FloatDType::F16),
    ] {
        let [b, h, s, d] = shape;
        let n = b * h * s * d;
        // The query is made as `[b, s, h, d]` and swapped, as a layer's is.
        let q_bshd = rng.vec(n, 1.0);
        let (k, v) = (rng.vec(n, 1.0), rng.vec(n, 1.0));
        let tensor = |x: &[f32], dims: [usize; 4]| {
            Tensor::<B, 4>::from_data(TensorData::new(x.to_vec(), dims), device).cast(dtype)
        };
        let q = tensor(&q_bshd, [b, s, h, d]).swap_dims(1, 2);
        let seen = |t: &Tensor<B, 4>| host_f32(t.clone());
        let (qt, kt, vt) = (q, tensor(&k, shape), tensor(&v, shape));
        let want = host_attention(&seen(&qt), &seen(&kt), &seen(&vt), shape);
        let scale = want.iter().fold(0f64, |a, x| a.max(x.abs())).max(1e-12);
        let error = |got: &Tensor<B, 4>| {
            seen(got)
                .iter()
                .zip(&want)
                .map(|(g, w)| (*g as f64 - w).abs() / scale)
                .fold(0f64, f64::max)
        };
        // Burn's own attention (its separate kernels) on the same inputs,
        // for the record.
        let options = burn::tensor::ops::AttentionModuleOptions {
            scale: None,
            softcap: None,
            is_causal: true,
        };
        let burns = error(&burn::tensor::module::attention(
            qt.clone(),
            kt.clone(),
            vt.clone(),
            None,
            None,
            options,
        ));
        let (worst, ran) = match B::fused_attention(qt, kt, vt) {
            Ok(got) => (error(&got), true),
            Err(_) => (f64::NAN, false),
        };
        out.push((
            format!("attention {shape:?} {dtype:?} (Burn's kernels: {burns:.2e})"),
            worst,
            ran,
        ));
    }
    out
}

impl OnDevice for KernelsAgainstHost {
    /// (case, positions that differ or worst relative error, kernel ran).
    type Output = Vec<(String, f64, bool)>;
    fn run<B: Compute>(self, device: &B::Device) -> Self::Output {
        use burn::prelude::{Int, Tensor, TensorData};
        use burn::tensor::FloatDType;
        let mut out = Vec::new();
        let mut rng = prunemem::model::synthetic::Normal::new(11);
        out.extend(selection::cases::<B>(&mut rng, device));
        let (rows, vocab, skip) = (37usize, 70_000usize, 5usize);
        let logits: Vec<f32> = rng.vec(rows * vocab, 3.0);
        let targets: Vec<i64> = (0..rows).map(|r| ((r * 7919) % vocab) as i64).collect();
        for dtype in [FloatDType::F32, FloatDType::F16] {
            let x =
                Tensor::<B, 2>::from_data(TensorData::new(logits.clone(), [rows, vocab]), device)
                    .cast(dtype);
            let seen: Vec<f32> = x
                .clone()
                .cast(FloatDType::F32)
                .into_data()
                .iter::<f32>()
                .collect();
            let t =
                Tensor::<B, 1, Int>::from_data(TensorData::new(targets.clone(), [rows]), device);
            let (worst, ran) = match B::row_nll(x, t, skip) {
                Ok(nll) => {
                    let got: Vec<f32> = nll.into_data().iter::<f32>().collect();
                    let worst = (0..rows)
                        .map(|r| {
                            let row = &seen[r * vocab..(r + 1) * vocab];
                            let max = row.iter().fold(f64::MIN, |a, v| a.max(*v as f64));
                            let lse = max
                                + row
                                    .iter()
                                    .map(|v| (*v as f64 - max).exp())
                                    .sum::<f64>()
                                    .ln();
                            let want = if r < skip {
                                0.0
                            } else {
                                lse - row[targets[r] as usize] as f64
                            };
                            (got[r] as f64 - want).abs() / want.abs().max(1.0)
                        })
                        .fold(0f64, f64::max);
                    (worst, true)
                }
                Err(_) => (f64::NAN, false),
            };
            out.push((format!("nll {dtype:?}"), worst, ran));
        }
        out.extend(attention_cases::<B>(&mut rng, device));
        out.extend(swiglu_cases::<B>(&mut rng, device));
        out.extend(square_sum_cases::<B>(&mut rng, device));
        out.extend(rms_norm_cases::<B>(&mut rng, device));
        out.extend(head_cases::<B>(&mut rng, device));
        out
    }
}

/// The head's product with its `[vocab, hidden]` table in the stored
/// layout (`Compute::matmul_rows`, what `PRUNEMEM_HEAD_MATMUL` names) with
/// cubek's unit kernel, the strategy lavapipe runs, against f64 on the
/// host: a chunk's 261 rows by a vocabulary no multiple of a tile, worst
/// error relative to the largest logit.
fn head_cases<B: Compute>(
    rng: &mut prunemem::model::synthetic::Normal,
    device: &B::Device,
) -> Vec<(String, f64, bool)> {
    use burn::prelude::{Tensor, TensorData};
    use burn::tensor::FloatDType;
    let (n, k, m) = (261usize, 96usize, 1000usize);
    let (a, b) = (rng.vec(n * k, 1.0), rng.vec(m * k, 1.0));
    let mut out = Vec::new();
    for dtype in [FloatDType::F32, FloatDType::F16] {
        let h = Tensor::<B, 2>::from_data(TensorData::new(a.clone(), [n, k]), device).cast(dtype);
        let table =
            Tensor::<B, 2>::from_data(TensorData::new(b.clone(), [m, k]), device).cast(dtype);
        let (sa, sb) = (host_f32(h.clone()), host_f32(table.clone()));
        let want: Vec<f64> = (0..n * m)
            .map(|i| {
                let (r, c) = (i / m, i % m);
                (0..k)
                    .map(|j| sa[r * k + j] as f64 * sb[c * k + j] as f64)
                    .sum()
            })
            .collect();
        let scale = want.iter().fold(0f64, |x, v| x.max(v.abs()));
        let error = |got: Tensor<B, 2>| {
            assert_eq!(got.dims(), [n, m]);
            let got = host_f32(got);
            got.iter()
                .zip(&want)
                .map(|(g, w)| (*g as f64 - w).abs())
                .fold(0f64, f64::max)
                / scale
        };
        let burns = error(h.clone().matmul(table.clone().transpose()));
        let (worst, ran) = match B::matmul_rows(h, table, "simple_unit") {
            Ok(product) => (error(product), true),
            Err(_) => (f64::NAN, false),
        };
        out.push((
            format!("head product {dtype:?} (Burn's matmul: {burns:.2e})"),
            worst,
            ran,
        ));
    }
    out
}

/// The RMS norm's kernel against f64 on the host (`x / sqrt(mean(x²) +
/// eps) · weight`), in output ulps: a row wider than a cube, not a
/// multiple of it, and more rows than one grid (the cubes stride).
fn rms_norm_cases<B: Compute>(
    rng: &mut prunemem::model::synthetic::Normal,
    device: &B::Device,
) -> Vec<(String, f64, bool)> {
    use burn::prelude::{Tensor, TensorData};
    use burn::tensor::FloatDType;
    let eps = 1e-5;
    let mut out = Vec::new();
    for (rows, d) in [(100usize, 1000usize), (70_000, 8)] {
        let (x, wt) = (rng.vec(rows * d, 2.0), rng.vec(d, 1.0));
        for dtype in [FloatDType::F32, FloatDType::F16] {
            let xt = Tensor::<B, 2>::from_data(TensorData::new(x.clone(), [rows, d]), device)
                .cast(dtype);
            let wt =
                Tensor::<B, 1>::from_data(TensorData::new(wt.clone(), [d]), device).cast(dtype);
            let (xs, ws) = (host_f32(xt.clone()), host_f32(wt.clone()));
            let ulp = unit_of(dtype);
            let error = |got: Tensor<B, 2>| {
                let got = host_f32(got);
                (0..rows)
                    .map(|r| {
                        let row = &xs[r * d..(r + 1) * d];
                        let ms = row.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / d as f64;
                        let inv = 1.0 / (ms + eps).sqrt();
                        (0..d)
                            .map(|i| {
                                let want = row[i] as f64 * inv * ws[i] as f64;
                                (got[r * d + i] as f64 - want).abs() / (want.abs().max(1e-3) * ulp)
                            })
                            .fold(0f64, f64::max)
                    })
                    .fold(0f64, f64::max)
            };
            // Burn's ops, as `LlamaRmsNorm` ran them before the kernel.
            let xf = xt.clone().cast(FloatDType::F32);
            let variance = xf.clone().square().mean_dim(1);
            let normed = (xf * variance.add_scalar(eps).sqrt().recip()).cast(dtype);
            let burns = error(normed * wt.clone().unsqueeze::<2>());
            let (worst, ran) = match B::rms_norm(xt, &wt, eps) {
                Ok(got) => (error(got), true),
                Err(_) => (f64::NAN, false),
            };
            out.push((
                format!("rms norm {rows}x{d} {dtype:?} (worst error in output ulps; Burn's ops: {burns:.2})"),
                worst,
                ran,
            ));
        }
    }
    out
}

/// A tensor's values on the host, in f32 (what a kernel's test compares).
fn host_f32<B: Compute, const D: usize>(t: burn::prelude::Tensor<B, D>) -> Vec<f32> {
    t.cast(burn::tensor::FloatDType::F32)
        .into_data()
        .iter::<f32>()
        .collect()
}

/// One unit in the last place of an f32 or f16 value of magnitude 1.
fn unit_of(dtype: burn::tensor::FloatDType) -> f64 {
    if dtype == burn::tensor::FloatDType::F32 {
        1.2e-7
    } else {
        9.8e-4
    }
}

/// Wanda's column norms (`Σ_rows x²` per column) straight from the input,
/// against f64 on the host: one slab of rows and 64 of them, a width that
/// is no multiple of a cube's 256 columns, in f32 and f16.
fn square_sum_cases<B: Compute>(
    rng: &mut prunemem::model::synthetic::Normal,
    device: &B::Device,
) -> Vec<(String, f64, bool)> {
    use burn::prelude::{Tensor, TensorData};
    use burn::tensor::FloatDType;
    let mut out = Vec::new();
    for (rows, cols) in [(100usize, 601usize), (20_000, 601)] {
        let x = rng.vec(rows * cols, 2.0);
        for dtype in [FloatDType::F32, FloatDType::F16] {
            let t = Tensor::<B, 2>::from_data(TensorData::new(x.clone(), [rows, cols]), device)
                .cast(dtype);
            let seen = host_f32(t.clone());
            let want: Vec<f64> = (0..cols)
                .map(|c| (0..rows).map(|r| (seen[r * cols + c] as f64).powi(2)).sum())
                .collect();
            let error = |got: Tensor<B, 1>| {
                let got = host_f32(got);
                (0..cols)
                    .map(|c| (got[c] as f64 - want[c]).abs() / want[c].max(1e-30))
                    .fold(0f64, f64::max)
            };
            // Burn's ops on the same input: an f32 copy, squared and summed.
            let burns = error(
                t.clone()
                    .cast(FloatDType::F32)
                    .square()
                    .sum_dim(0)
                    .reshape([cols]),
            );
            let (worst, ran) = match B::column_square_sums(t) {
                Ok(sums) => (error(sums), true),
                Err(_) => (f64::NAN, false),
            };
            out.push((
                format!("square sums {rows}x{cols} {dtype:?} (Burn's ops: {burns:.2e})"),
                worst,
                ran,
            ));
        }
    }
    out
}

/// The MLP's `silu(gate) · up` kernel against f64 on the host, in each
/// dtype, over more elements than one grid's pass (the units stride).
fn swiglu_cases<B: Compute>(
    rng: &mut prunemem::model::synthetic::Normal,
    device: &B::Device,
) -> Vec<(String, f64, bool)> {
    use burn::prelude::{Tensor, TensorData};
    use burn::tensor::FloatDType;
    let dims = [3, 700, 601];
    let n = dims.iter().product::<usize>();
    let (g, u) = (rng.vec(n, 3.0), rng.vec(n, 1.0));
    let mut out = Vec::new();
    for dtype in [FloatDType::F32, FloatDType::F16] {
        let t = |x: &[f32]| {
            Tensor::<B, 3>::from_data(TensorData::new(x.to_vec(), dims), device).cast(dtype)
        };
        let (gt, ut) = (t(&g), t(&u));
        let (gs, us) = (host_f32(gt.clone()), host_f32(ut.clone()));
        // Each output's own rounding: f32 or f16.
        let ulp = unit_of(dtype);
        let error = |h: Tensor<B, 3>| {
            let h = host_f32(h);
            (0..n)
                .map(|i| {
                    let (g, u) = (gs[i] as f64, us[i] as f64);
                    let want = g / (1.0 + (-g).exp()) * u;
                    (h[i] as f64 - want).abs() / (want.abs().max(1e-3) * ulp)
                })
                .fold(0f64, f64::max)
        };
        // Burn's ops on the same inputs, for the record.
        let burns = error(burn::tensor::activation::silu(gt.clone()) * ut.clone());
        // A gate another tensor holds gets a new output, and keeps its
        // values; an unshared one is written over.
        let held = gt.clone();
        let (worst, ran) = match B::swiglu(gt, ut.clone()) {
            Ok(h) => (error(h), true),
            Err(_) => (f64::NAN, false),
        };
        let kept = host_f32(held.clone()) == gs;
        out.push((
            format!("swiglu {dtype:?} beside a held gate (worst error in output ulps; Burn's ops: {burns:.2})"),
            if kept { worst } else { f64::INFINITY },
            ran,
        ));
        let (worst, ran) = match B::swiglu(held, ut) {
            Ok(h) => (error(h), true),
            Err(_) => (f64::NAN, false),
        };
        out.push((
            format!("swiglu {dtype:?} over its gate (worst error in output ulps; Burn's ops: {burns:.2})"),
            worst,
            ran,
        ));
    }
    out
}

/// The error of Burn's own path that a case's label records after `key`
/// (0 where it records none).
fn burns_error(case: &str, key: &str) -> f64 {
    case.split(key)
        .nth(1)
        .and_then(|e| e.trim_end_matches(')').parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn the_selection_and_loss_kernels_give_the_hosts_answers() {
    for (case, miss, ran) in device_under_test().run(KernelsAgainstHost) {
        println!("{case}: kernel ran {ran}, miss {miss}");
        // The flash kernel computes in f16 tiles: f32 keeps Burn's.
        if case.starts_with("attention") && case.contains("F32") {
            assert!(!ran, "{case}: the f16 kernel must decline f32");
            continue;
        }
        assert!(ran, "{case}: the wgpu backend must take the kernel");
        match case.starts_with("select") {
            true => assert_eq!(miss, 0.0, "{case}: positions differ"),
            // Rounded once from f32 registers: within a few of the
            // output dtype's units, and no worse than Burn's ops.
            false if case.starts_with("swiglu") || case.starts_with("rms norm") => {
                let burns = burns_error(&case, "Burn's ops: ");
                assert!(miss <= 8.0, "{case}: {miss}");
                assert!(miss <= burns.max(1.0), "{case}: {miss} past Burn's ops");
            }
            // f16 operands, f32 accumulation: the output's own rounding
            // (f16 keeps 11 bits: 4.9e-4 of the scale).
            // And no further from the f64 answer than Burn's own f16
            // kernels, which it replaces.
            false if case.starts_with("attention") => {
                let burns = burns_error(&case, "Burn's kernels: ");
                assert!(miss < 1e-3, "{case}: relative error {miss}");
                assert!(miss <= burns, "{case}: {miss} past Burn's kernels' error");
            }
            // f32 sums in slabs of at most 313 rows, then over the slabs:
            // rounding only, and no further from f64 than Burn's ops.
            false if case.starts_with("square sums") => {
                let burns = burns_error(&case, "Burn's ops: ");
                assert!(miss < 1e-5, "{case}: relative error {miss}");
                assert!(miss <= burns.max(1e-6), "{case}: {miss} past Burn's ops");
            }
            // The output's own rounding, and no further from f64 than
            // Burn's matmul on the transposed view.
            false if case.starts_with("head product") => {
                let burns = burns_error(&case, "Burn's matmul: ");
                let unit = if case.contains("F16") { 1e-3 } else { 1e-6 };
                assert!(miss < unit, "{case}: relative error {miss}");
                assert!(miss <= 2.0 * burns.max(unit / 10.0), "{case}: {miss}");
            }
            false => assert!(miss < 1e-5, "{case}: relative error {miss}"),
        }
    }
}
