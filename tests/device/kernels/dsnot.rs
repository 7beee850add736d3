//! DSnoT's one-launch swap loop (`exec::kernels::dsnot`, through
//! `prune::dsnot_device::refine`) against the host's loop
//! (`prune::dsnot`): the same masks and reports, on shapes whose lists are
//! windows and whole columns (a sign short of the cycles, the authors'
//! zeros), on values with ties everywhere, unstructured and N:M, with
//! Wanda's order as the first metric and beside another one.

use super::*;
use prunemem::exec::tally::Tally;
use prunemem::prune::dsnot::{DsnotInputs, DsnotOptions, DsnotReport};
use prunemem::prune::dsnot::{refine_nm, refine_unstructured};
use prunemem::prune::dsnot_device::{DeviceInputs, refine};
use prunemem::prune::methods::wanda_metric;

/// One linear's host inputs, `[out, in]`.
struct Case {
    w: Vec<f32>,
    initial: Vec<f32>,
    wanda: Vec<f32>,
    mean: Vec<f32>,
    var: Vec<f32>,
    out: usize,
    inp: usize,
}

/// Values on a grid of `step` (ties in every order), or not (`0`); the
/// first metric is Wanda's, or `|W|` where `magnitude`.
fn case(out: usize, inp: usize, seed: u64, step: f32, magnitude: bool) -> Case {
    let mut rng = prunemem::model::synthetic::Normal::new(seed);
    let mut q = |scale: f32| {
        let v = rng.sample() * scale;
        match step > 0.0 {
            true => (v / step).round() * step,
            false => v,
        }
    };
    let w: Vec<f32> = (0..out * inp).map(|_| q(1.0)).collect();
    let mean: Vec<f32> = (0..inp).map(|_| q(2.0)).collect();
    let var: Vec<f32> = (0..inp).map(|_| 0.5 + q(1.0).abs()).collect();
    let scaler: Vec<f32> = (0..inp).map(|_| 1.0 + q(1.0).abs()).collect();
    let wanda = wanda_metric(&w, inp, &scaler);
    let initial = match magnitude {
        true => w.iter().map(|v| v.abs()).collect(),
        false => wanda.clone(),
    };
    Case {
        w,
        initial,
        wanda,
        mean,
        var,
        out,
        inp,
    }
}

fn host(c: &Case, pattern: Pattern, opts: &DsnotOptions) -> (Vec<bool>, DsnotReport) {
    let inp = DsnotInputs {
        w: &c.w,
        cols: c.inp,
        initial: &c.initial,
        wanda: &c.wanda,
        mean: &c.mean,
        var: &c.var,
    };
    match pattern {
        Pattern::Unstructured => refine_unstructured(&inp, 0.5, opts, false),
        Pattern::NM { n, m } => refine_nm(&inp, n, m, opts, false),
    }
}

fn on_device<B: Compute>(
    c: &Case,
    pattern: Pattern,
    opts: &DsnotOptions,
    device: &B::Device,
) -> (Vec<bool>, DsnotReport) {
    use burn::prelude::{Tensor, TensorData};
    let matrix = |v: &[f32]| {
        Tensor::<B, 2>::from_data(TensorData::new(v.to_vec(), [c.out, c.inp]), device).transpose()
    };
    let vector = |v: &[f32]| Tensor::<B, 1>::from_floats(v, device);
    let inputs = DeviceInputs {
        w: matrix(&c.w),
        initial: matrix(&c.initial),
        wanda: (c.initial != c.wanda).then(|| matrix(&c.wanda)),
        mean: vector(&c.mean),
        var: vector(&c.var),
    };
    let (mask, report) = refine(inputs, pattern, 0.5, opts, false);
    let mask = mask.transpose().into_data().iter::<bool>().collect();
    (mask, report)
}

/// Every case: (case, positions that differ, whether the reports agree).
struct DsnotAgainstHost;

impl OnDevice for DsnotAgainstHost {
    type Output = Vec<(String, usize, bool, DsnotReport)>;
    fn run<B: Compute>(self, device: &B::Device) -> Self::Output {
        let zero_threshold = DsnotOptions {
            update_threshold: 0.0,
            ..DsnotOptions::default()
        };
        let no_var = DsnotOptions {
            pow_of_var: 0.0,
            max_cycles: 20,
            ..DsnotOptions::default()
        };
        let mut out = Vec::new();
        // 8 inputs: whole columns, the cursors run out; 96 and 64: the
        // regrowing lists windows, the prune lists whole at 50 cycles;
        // 400 and 512: every list a window.
        let shapes = [(6, 8), (12, 96), (5, 64), (3, 400), (40, 512)];
        for (i, (rows, inp)) in shapes.into_iter().enumerate() {
            for step in [0.0, 0.25, 1.0] {
                let c = case(rows, inp, 11 + inp as u64, step, i % 2 == 1);
                for pattern in [Pattern::Unstructured, Pattern::NM { n: 2, m: 4 }] {
                    for opts in [DsnotOptions::default(), zero_threshold, no_var] {
                        let (hm, hr) = host(&c, pattern, &opts);
                        let (dm, dr) = on_device::<B>(&c, pattern, &opts, device);
                        let differ = hm.iter().zip(&dm).filter(|(a, b)| a != b).count();
                        let same = (hr.cycles, hr.changed) == (dr.cycles, dr.changed);
                        let what = format!("{rows}×{inp} {pattern:?} step {step} {opts:?}");
                        out.push((what, differ, same, dr));
                    }
                }
            }
        }
        out
    }
}

#[test]
fn the_dsnot_kernel_swaps_as_the_host_loop() {
    let start = Tally::now();
    let results = device_under_test().run(DsnotAgainstHost);
    let used = Tally::now().since(&start);
    let mut swapped = 0;
    for (case, differ, same, report) in &results {
        println!("{case}: {differ} positions differ, {report:?}");
        assert_eq!(*differ, 0, "{case}: positions differ from the host's");
        assert!(same, "{case}: the report differs from the host's");
        swapped += usize::from(report.changed > 0);
    }
    // The loop did swap, and every refinement took the kernel.
    assert!(
        swapped * 2 > results.len(),
        "{swapped} of {}",
        results.len()
    );
    let kernel = used.get("dsnot_swaps").copied().unwrap_or_default();
    println!("dsnot_swaps: {kernel:?}");
    assert!(kernel.ran >= results.len() as u64, "{kernel:?}");
    assert_eq!(kernel.fell_back, 0, "{kernel:?}");
}
