//! Wanda's α-variant kernels (`exec::kernels::variant`, through
//! `prune::variant_device`) against the host's (`prune::variant`): each
//! output's sorted metric, its running sums and its total bit for bit,
//! each α's thresholds and counts, and the mask to the position with the
//! same α, on metrics with ties (values on a grid, zeros) and without,
//! with input widths a power of two and not, read in both layouts.

use super::*;
use burn::prelude::{Tensor, TensorData};
use prunemem::exec::tally::Tally;
use prunemem::prune::Pattern;
use prunemem::prune::methods::wanda_mask;
use prunemem::prune::variant::{tables, thresholds};
use prunemem::prune::variant_device::{rows, wanda_variant_mask};

/// A non-negative metric `[out, inp]`, on a grid of `step` where `step >
/// 0` (ties, and zeros near a fifth of it).
fn metric(out: usize, inp: usize, seed: u64, step: f32) -> Vec<f32> {
    let mut rng = prunemem::model::synthetic::Normal::new(seed);
    (0..out * inp)
        .map(|_| {
            let v = rng.sample().abs() * 2.0;
            match step > 0.0 {
                true => (v / step).round() * step,
                false => v,
            }
        })
        .collect()
}

/// One case: its name, the tables' bits that differ (sorted, running
/// sums, totals), the α steps' thresholds and counts that differ, the
/// mask's positions that differ, and the two α.
struct Outcome {
    case: String,
    tables: [usize; 3],
    steps: usize,
    mask: usize,
    alpha: (f64, f64),
}

struct VariantAgainstHost;

impl OnDevice for VariantAgainstHost {
    type Output = Vec<Outcome>;
    fn run<B: Compute>(self, device: &B::Device) -> Self::Output {
        let mut out = Vec::new();
        // Rows of up to 1 024 sort in one cube; 1 500 and 4 100 inputs (2 048
        // and 8 192 padded) take the steps between cubes too.
        let shapes = [
            (24, 64),
            (70, 96),
            (33, 512),
            (9, 300),
            (3, 1),
            (5, 1500),
            (2, 4100),
        ];
        for (i, (rows_n, inp)) in shapes.into_iter().enumerate() {
            for step in [0.0, 0.25] {
                let host = metric(rows_n, inp, 11 + i as u64, step);
                let want = tables(&host, inp);
                for transposed in [false, true] {
                    // Burn's layout `[in, out]`: contiguous as a linear's
                    // metric, or a transposed view of `[out, in]`.
                    let dev = match transposed {
                        false => {
                            let mut t = vec![0f32; host.len()];
                            for r in 0..rows_n {
                                for c in 0..inp {
                                    t[c * rows_n + r] = host[r * inp + c];
                                }
                            }
                            Tensor::<B, 2>::from_data(TensorData::new(t, [inp, rows_n]), device)
                        }
                        true => Tensor::<B, 2>::from_data(
                            TensorData::new(host.clone(), [rows_n, inp]),
                            device,
                        )
                        .transpose(),
                    };
                    let got = B::variant_tables(dev.clone())
                        .unwrap_or_else(|_| panic!("the tables' kernel declined"));
                    let sorted: Vec<f32> = got
                        .sorted
                        .clone()
                        .narrow(1, 0, inp)
                        .into_data()
                        .iter::<f32>()
                        .collect();
                    let cum: Vec<f32> = got.cum.clone().into_data().iter::<f32>().collect();
                    let totals: Vec<f32> = got.totals.clone().into_data().iter::<f32>().collect();
                    let differ = [
                        bits_differ(&sorted, &want.sorted),
                        bits_differ(&cum, &want.cum),
                        bits_differ(&totals, &want.totals),
                    ];
                    let mut steps = 0;
                    for alpha in [0.0, 0.1, 0.3, 0.4, 0.55, 1.0] {
                        let host_t = thresholds(&want, inp, alpha);
                        let (t, p) = rows(&got, alpha as f32);
                        let t: Vec<f32> = t.into_data().iter::<f32>().collect();
                        let p: Vec<i64> = p.into_data().iter::<i64>().collect();
                        for (o, h) in host_t.iter().enumerate() {
                            let h = h.unwrap_or(f32::NEG_INFINITY);
                            let row = &host[o * inp..(o + 1) * inp];
                            let below = row.iter().filter(|v| **v <= h).count() as i64;
                            steps += (t[o].to_bits() != h.to_bits()) as usize;
                            steps += (p[o] != below) as usize;
                        }
                    }
                    let (want_mask, want_alpha) =
                        wanda_mask(&host, inp, 0.5, Pattern::Unstructured, true);
                    let (mask, alpha) = wanda_variant_mask(dev, 0.5);
                    let mask: Vec<bool> = mask.transpose().into_data().iter::<bool>().collect();
                    let mask = want_mask.iter().zip(&mask).filter(|(a, b)| a != b).count();
                    out.push(Outcome {
                        case: format!("{rows_n}×{inp} step {step} transposed {transposed}"),
                        tables: differ,
                        steps,
                        mask,
                        alpha: (alpha, want_alpha.unwrap_or(f64::NAN)),
                    });
                }
            }
        }
        out
    }
}

#[test]
fn the_variant_kernels_sort_and_add_as_the_host() {
    let start = Tally::now();
    let results = device_under_test().run(VariantAgainstHost);
    let used = Tally::now().since(&start);
    for r in &results {
        println!(
            "{}: tables {:?} bits differ, α steps {}, mask {} positions, α {:?}",
            r.case, r.tables, r.steps, r.mask, r.alpha
        );
        assert_eq!(
            r.tables,
            [0, 0, 0],
            "{}: the tables differ from the host's",
            r.case
        );
        assert_eq!(r.steps, 0, "{}: thresholds or counts differ", r.case);
        assert_eq!(
            r.mask, 0,
            "{}: mask positions differ from the host's",
            r.case
        );
        assert_eq!(r.alpha.0, r.alpha.1, "{}: another α", r.case);
    }
    // Every table and every α took its kernel.
    for name in ["variant_prefix", "variant_rows"] {
        let k = used.get(name).copied().unwrap_or_default();
        println!("{name}: {k:?}");
        assert!(k.ran >= results.len() as u64, "{name}: {k:?}");
        assert_eq!(k.fell_back, 0, "{name}: {k:?}");
    }
}
