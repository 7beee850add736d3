//! RIA's reallocation kernels (`exec::kernels::realloc`, through
//! `prune::reallocation_device`) against the host's
//! (`prune::reallocation`): the inputs' sums and each slot's assignment
//! scores bit for bit, and the masks to the position, with and without
//! the assignment rounds, 2:4 and 4:8, on metrics with ties (values on a
//! grid) and without; the report's kept metric per output against the
//! host's f64 sums, in both layouts.

use super::*;
use burn::prelude::{Tensor, TensorData};
use prunemem::exec::tally::Tally;
use prunemem::prune::reallocation::{column_sums, reallocated_nm_mask, slot_scores};
use prunemem::prune::reallocation_device::nm_mask_reallocated;

/// A non-negative metric `[out, inp]` with inputs of different scales,
/// on a grid of `step` where `step > 0`.
fn metric(out: usize, inp: usize, seed: u64, step: f32) -> Vec<f32> {
    let mut rng = prunemem::model::synthetic::Normal::new(seed);
    let scale: Vec<f32> = (0..inp).map(|_| 0.2 + rng.sample().abs() * 3.0).collect();
    (0..out * inp)
        .map(|t| {
            let v = rng.sample().abs() * scale[t % inp];
            match step > 0.0 {
                true => (v / step).round() * step,
                false => v,
            }
        })
        .collect()
}

/// What N:M (`n` of every `m` pruned) keeps of each output of the host's
/// `[out, inp]` metric, summed in f64.
fn host_kept(host: &[f32], inp: usize, n: usize, m: usize) -> Vec<f64> {
    host.chunks(inp)
        .map(|row| {
            row.chunks(m)
                .map(|g| {
                    let mut g = g.to_vec();
                    g.sort_by(f32::total_cmp);
                    g[n..].iter().map(|v| *v as f64).sum::<f64>()
                })
                .sum()
        })
        .collect()
}

/// The largest relative difference between the kernel's per-output kept
/// sums of `dev` (Burn's `[inp, out]`, in the layout given) and the host's.
fn kept_differs<B: Compute>(dev: Tensor<B, 2>, host: &[f32], n: usize, m: usize) -> f64 {
    let [inp, _] = dev.dims();
    let got = B::nm_kept_sums(dev, n, m).unwrap_or_else(|_| panic!("the kept kernel declined"));
    let got: Vec<f32> = got.into_data().iter::<f32>().collect();
    let want = host_kept(host, inp, n, m);
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(&want)
        .map(|(g, w)| (*g as f64 / w - 1.0).abs())
        .fold(0.0, f64::max)
}

/// One case: (case, sums' bits that differ, scores' bits that differ,
/// mask positions that differ, kept metric's relative difference).
type Outcome = (String, usize, usize, usize, f64);

struct ReallocAgainstHost;

impl OnDevice for ReallocAgainstHost {
    type Output = Vec<Outcome>;
    fn run<B: Compute>(self, device: &B::Device) -> Self::Output {
        let mut out = Vec::new();
        for (i, (rows, inp)) in [(24, 64), (70, 96), (33, 512)].into_iter().enumerate() {
            for step in [0.0, 0.25] {
                let host = metric(rows, inp, 3 + i as u64, step);
                // Burn's layout, `[in, out]`, contiguous as a linear's metric is.
                let mut t = vec![0f32; host.len()];
                for r in 0..rows {
                    for c in 0..inp {
                        t[c * rows + r] = host[r * inp + c];
                    }
                }
                let dev = Tensor::<B, 2>::from_data(TensorData::new(t, [inp, rows]), device);
                let sums = B::ordered_row_sums(dev.clone())
                    .unwrap_or_else(|_| panic!("the sums' kernel declined"));
                let sums: Vec<f32> = sums.into_data().iter::<f32>().collect();
                let sums_differ = bits_differ(&sums, &column_sums(&host, inp));
                // The report's kept sums, on Burn's layout and on the
                // transpose of the host's (`[inp, out]` read column-major).
                let stored =
                    Tensor::<B, 2>::from_data(TensorData::new(host.clone(), [rows, inp]), device);
                for (n, m) in [(2, 4), (4, 8), (1, 4), (8, 16)] {
                    let d = kept_differs(dev.clone(), &host, n, m).max(kept_differs(
                        stored.clone().transpose(),
                        &host,
                        n,
                        m,
                    ));
                    let what = format!("{rows}×{inp} step {step} kept {n}:{m}");
                    out.push((what, 0, 0, 0, d));
                }
                for (n, m) in [(2, 4), (4, 8)] {
                    let mut scores_differ = 0;
                    for c in 0..m {
                        let p = Tensor::<B, 2>::from_data(
                            TensorData::new(host.clone(), [rows, inp]),
                            device,
                        );
                        let got = B::slot_scores(p, n, m, c)
                            .unwrap_or_else(|_| panic!("the scores' kernel declined"));
                        let got: Vec<f32> = got.into_data().iter::<f32>().collect();
                        scores_differ += bits_differ(&got, &slot_scores(&host, inp, n, m, c));
                    }
                    for lsa in [false, true] {
                        let (want, wr) = reallocated_nm_mask(&host, inp, n, m, lsa);
                        let (got, gr) = nm_mask_reallocated(dev.clone(), n, m, lsa);
                        let got: Vec<bool> = got.transpose().into_data().iter::<bool>().collect();
                        let differ = want.iter().zip(&got).filter(|(a, b)| a != b).count();
                        let kept = (gr.kept_after / wr.kept_after - 1.0)
                            .abs()
                            .max((gr.kept_before / wr.kept_before - 1.0).abs());
                        let what = format!("{rows}×{inp} step {step} {n}:{m} lsa {lsa}");
                        out.push((what, sums_differ, scores_differ, differ, kept));
                    }
                }
            }
        }
        out
    }
}

#[test]
fn the_reallocation_kernels_add_as_the_host() {
    let start = Tally::now();
    let results = device_under_test().run(ReallocAgainstHost);
    let used = Tally::now().since(&start);
    for (case, sums, scores, differ, kept) in &results {
        println!(
            "{case}: sums {sums} bits differ, scores {scores}, mask {differ} positions, kept {kept:.2e}"
        );
        assert_eq!(*sums, 0, "{case}: the sums differ from the host's");
        assert_eq!(*scores, 0, "{case}: the scores differ from the host's");
        assert_eq!(*differ, 0, "{case}: mask positions differ from the host's");
        assert!(*kept < 1e-5, "{case}: kept metric {kept}");
    }
    // Every sum, score and kept metric took its kernel.
    for name in ["ordered_row_sums", "slot_scores", "nm_kept_sums"] {
        let k = used.get(name).copied().unwrap_or_default();
        println!("{name}: {k:?}");
        assert!(k.ran >= results.len() as u64 / 2, "{name}: {k:?}");
        assert_eq!(k.fell_back, 0, "{name}: {k:?}");
    }
}
