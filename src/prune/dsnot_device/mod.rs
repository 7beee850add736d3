//! DSnoT where the weight is: `prune::dsnot`'s swap loop as device ops, so
//! a `--dsnot` run on wgpu or CUDA no longer brings every linear to the
//! host as f32 and sends it back pruned.
//!
//! The host loop sorts each row's candidates (the regrowing scores; the
//! kept weights by Wanda's metric) and walks two cursors at most
//! `max_cycles` steps into each order. Burn 0.21's CubeCL backends sort on
//! the host, so no order is built here: a cursor's next position is the
//! lexicographic successor of its last `(key, row)` pair among its
//! candidates — one min (or max) over the keys and one over the rows, per
//! column (`cursor`). That is the stable sort's order, one step at a
//! time, and a cursor never looks further than the cycles it makes: so
//! first each cursor's reachable entries are moved into a list of
//! `max_cycles` rows, and the cycles read those lists and gather single
//! entries from the matrix; the mask changes by scatters.
//!
//! The cycles run in one kernel launch where the backend has it
//! (`Compute::dsnot_swaps`, wgpu and CUDA: one GPU thread per column walks
//! the lists built here); elsewhere every column (a PyTorch row) steps at
//! once with Burn's ops, and a column that stops keeps its mask. Per
//! linear, what comes back is a handful of integers: whether any column's
//! own-sign candidates could run out, the report's two counts, and with
//! Burn's ops a flag every 8 cycles (does any column still swap).
//!
//! The masks are the host's (`tests/device/` and the tests below compare
//! them), with one caveat: the first error `Σ_pruned W·x̄` of a row is
//! summed in f32 in the backend's order, where the host sums in f64. A row
//! whose error lands within rounding of 0 or of `update_threshold` may
//! take one swap more or less. The updates after it are the host's f32
//! operations, one at a time.
//!
//! Layout: Burn's `[in, out]`, so a PyTorch row is a column here and its
//! inputs (`row` below) run down dim 0.

use burn::prelude::*;
use burn::tensor::Bool;

mod cursor;
mod unstructured;

use burn::tensor::IndexingUpdateOp;

use super::Pattern;
use super::dsnot::{DsnotOptions, DsnotReport};
use super::on_device;
use crate::exec::swap_loop::{SwapList, SwapLoop, SwapPrune};
use crate::exec::{Compute, reduce};
use cursor::{At, List, by_magnitude, signed_keys, window};
use unstructured::unstructured;

/// One linear's inputs to DSnoT, Burn's layout (`[in, out]`), f32.
pub struct DeviceInputs<B: Backend> {
    pub w: Tensor<B, 2>,
    /// The first mask's metric (non-negative; smaller goes first).
    pub initial: Tensor<B, 2>,
    /// Wanda's metric, the unstructured prune order: `None` where it is
    /// `initial` (Wanda's own DSnoT) or unread (N:M, a skipped linear).
    pub wanda: Option<Tensor<B, 2>>,
    /// Per input (`[in]`): the mean and the per-window variance.
    pub mean: Tensor<B, 1>,
    pub var: Tensor<B, 1>,
}

/// DSnoT's mask (`true`: prune) and what the swaps did: the first mask
/// from `initial` (per column, or per group of `m` inputs for N:M),
/// refined unless `skip`. The host's `refine_unstructured` /
/// `refine_nm`.
pub fn refine<B: Compute>(
    inp: DeviceInputs<B>,
    pattern: Pattern,
    sparsity: f64,
    opts: &DsnotOptions,
    skip: bool,
) -> (Tensor<B, 2, Bool>, DsnotReport) {
    // Each input is dropped once read: the loop holds its own state only.
    let DeviceInputs {
        w,
        initial,
        wanda,
        mean,
        var,
    } = inp;
    let [rows, _] = w.dims();
    match pattern {
        Pattern::Unstructured => {
            let keys = B::float_bits(initial);
            let k = ((rows as f64) * sparsity) as usize;
            if skip || k == 0 || k >= rows {
                return (
                    on_device::smallest_per_output(keys, k),
                    DsnotReport::default(),
                );
            }
            let wanda = match wanda {
                Some(wanda) => B::float_bits(wanda),
                None => keys.clone(),
            };
            let first = on_device::smallest_per_output(keys, k);
            let rg = Regrow::new(w, &mean, &var, &first, opts.pow_of_var, opts.max_cycles);
            unstructured(rg, wanda, first, opts)
        }
        Pattern::NM { n, m } => {
            drop(wanda);
            let first = on_device::nm_mask(B::float_bits(initial.clone()), n, m);
            if skip || m == 0 || !rows.is_multiple_of(m) {
                return (first, DsnotReport::default());
            }
            let rg = Regrow::new(w, &mean, &var, &first, opts.pow_of_var, opts.max_cycles);
            nm(rg, initial, first, m, opts)
        }
    }
}

/// How many of `flags` are set per column (`[1, cols]`).
fn count<B: Backend>(flags: Tensor<B, 2, Bool>) -> Tensor<B, 2, Int> {
    reduce::sum_dim(flags.int(), 0)
}

/// Each entry's input position (`[rows, cols]`).
fn row_index<B: Backend>(rows: usize, cols: usize, device: &B::Device) -> Tensor<B, 2, Int> {
    Tensor::<B, 1, Int>::arange(0..rows as i64, device)
        .reshape([rows, 1])
        .expand([rows, cols])
}

/// What both loops share: the products `W·x̄`, the rows' errors, and the
/// regrowing order's two cursors and the lists they walk.
struct Regrow<B: Backend> {
    index: Tensor<B, 2, Int>,
    d: Tensor<B, 2>,
    err: Tensor<B, 2>,
    lists: [List<B>; 2],
    front: At<B>,
    back: At<B>,
    taken: [Tensor<B, 2, Int>; 2],
    rows: usize,
    /// Whether the lists are windows (else whole columns).
    windows: bool,
}

/// This cycle's regrow candidate per column: the input, whether the
/// cursor the error's sign picks still has one, and both cursors' next
/// pairs.
struct RegrowStep<B: Backend> {
    row: Tensor<B, 2, Int>,
    has: Tensor<B, 2, Bool>,
    from_back: Tensor<B, 2, Bool>,
    front: At<B>,
    back: At<B>,
}

impl<B: Compute> Regrow<B> {
    /// The regrowing scores' keys; each end's list is the `cycles` entries
    /// it can reach where the inputs are more than that.
    fn new(
        w: Tensor<B, 2>,
        mean: &Tensor<B, 1>,
        var: &Tensor<B, 1>,
        first: &Tensor<B, 2, Bool>,
        pow: f64,
        cycles: usize,
    ) -> Self {
        let [rows, cols] = w.dims();
        let device = w.device();
        let d = w * mean.clone().reshape([rows, 1]);
        let pruned = d.clone().mask_fill(first.clone().bool_not(), 0.0);
        let err = reduce::sum_dim(pruned.clone(), 0);
        let score = if pow == 0.0 {
            pruned
        } else if pow == 1.0 {
            pruned / var.clone().reshape([rows, 1])
        } else {
            pruned / var.clone().powf_scalar(pow as f32).reshape([rows, 1])
        };
        let keys = signed_keys::<B>(score);
        let index = row_index::<B>(rows, cols, &device);
        // The front walks the most negative scores first, the back the
        // most positive: windows where every column has `cycles` of each
        // and no NaN (which the back would meet first).
        let nan = keys.clone().equal_elem(i32::MAX as i64);
        let counts = Tensor::cat(
            vec![
                count(keys.clone().lower_elem(0)),
                count(
                    keys.clone()
                        .greater_elem(0)
                        .bool_and(nan.clone().bool_not()),
                ),
                count(nan).neg(),
            ],
            0,
        );
        let least = on_device::read_ints::<B, 2>(reduce::min_dim_int(counts, 1));
        let windows = rows > cycles
            && matches!(least[..], [n, p, nan] if n.min(p) >= cycles as i64 && nan == 0);
        let lists = match windows {
            true => [true, false].map(|negative| {
                window(
                    by_magnitude(&keys, negative),
                    !negative,
                    &keys,
                    &index,
                    cycles,
                )
            }),
            false => {
                let all = List {
                    keys,
                    rows: index.clone(),
                    among: None,
                };
                [all.clone(), all]
            }
        };
        let zero = || Tensor::<B, 2, Int>::zeros([1, cols], &device);
        Self {
            index,
            d,
            err,
            lists,
            front: At::start(cols, rows, true, &device),
            back: At::start(cols, rows, false, &device),
            taken: [zero(), zero()],
            rows,
            windows,
        }
    }

    /// The regrowing lists as the one-launch loop takes them.
    fn swap_lists(&self) -> [SwapList<B>; 2] {
        self.lists.clone().map(|l| l.to_swap(!self.windows))
    }

    /// Positive errors regrow from the back (the largest score first),
    /// the others from the front.
    fn step(&self) -> RegrowStep<B> {
        let from_back = self.err.clone().greater_elem(0.0);
        let front = self.lists[0].next(&self.front, true);
        let back = self.lists[1].next(&self.back, false);
        let row = front
            .row
            .clone()
            .mask_where(from_back.clone(), back.row.clone());
        let [f, b] = &self.taken;
        let taken = f.clone().mask_where(from_back.clone(), b.clone());
        RegrowStep {
            row: row.clamp(0, self.rows as i64 - 1),
            has: taken.lower_elem(self.rows as i64),
            from_back,
            front,
            back,
        }
    }

    fn advance(&mut self, s: RegrowStep<B>, take: &Tensor<B, 2, Bool>) {
        let at_front = take.clone().bool_and(s.from_back.clone().bool_not());
        let at_back = take.clone().bool_and(s.from_back);
        self.front = self.front.clone().advance(&at_front, s.front);
        self.back = self.back.clone().advance(&at_back, s.back);
        let [f, b] = &self.taken;
        self.taken = [f.clone() + at_front.int(), b.clone() + at_back.int()];
    }

    /// `mask[row]` and `d[row]` of each column.
    fn at(
        &self,
        mask: &Tensor<B, 2, Int>,
        row: &Tensor<B, 2, Int>,
    ) -> (Tensor<B, 2, Int>, Tensor<B, 2>) {
        (
            mask.clone().gather(0, row.clone()),
            self.d.clone().gather(0, row.clone()),
        )
    }
}

/// The loop's mask (0/1), its cycles, and per column whether it still
/// swaps and how many swaps it made.
struct Swaps<B: Backend> {
    mask: Tensor<B, 2, Int>,
    active: Tensor<B, 2, Bool>,
    count: Tensor<B, 2, Int>,
    cycle: usize,
    cycles: usize,
}

impl<B: Compute> Swaps<B> {
    fn new(first: &Tensor<B, 2, Bool>, cycles: usize) -> Self {
        let [_, cols] = first.dims();
        let device = first.device();
        Self {
            mask: first.clone().int(),
            active: Tensor::<B, 2, Int>::ones([1, cols], &device).equal_elem(1),
            count: Tensor::zeros([1, cols], &device),
            cycle: 0,
            cycles,
        }
    }

    /// The next cycle, if one is left and some column may still swap:
    /// every 8 cycles one flag comes back to tell.
    fn next_cycle(&mut self) -> Option<usize> {
        let cycle = self.cycle;
        if cycle >= self.cycles {
            return None;
        }
        if cycle > 0 && cycle.is_multiple_of(8) && !on_device::read_flag(self.active.clone().any())
        {
            return None;
        }
        self.cycle += 1;
        Some(cycle)
    }

    /// The stops both loops share, for regrowing `r`'s candidate and
    /// pruning `prune`: no regrow candidate left, the error within the
    /// threshold, the regrow candidate kept or the prune candidate pruned
    /// already. With both candidates' products `W·x̄`.
    fn stops(
        &self,
        rg: &Regrow<B>,
        r: &RegrowStep<B>,
        prune: &Tensor<B, 2, Int>,
        threshold: f32,
    ) -> (Tensor<B, 2, Bool>, Tensor<B, 2>, Tensor<B, 2>) {
        let (m_r, d_r) = rg.at(&self.mask, &r.row);
        let (m_p, d_p) = rg.at(&self.mask, prune);
        if self.cycle == 1 {
            // The loop at its widest: its lists and one step's flags.
            crate::exec::watch::after_op();
        }
        let stop = r
            .has
            .clone()
            .bool_not()
            .bool_or(rg.err.clone().abs().lower_equal_elem(threshold))
            .bool_or(m_r.equal_elem(0))
            .bool_or(m_p.equal_elem(1));
        (stop, d_p, d_r)
    }

    /// The columns still swapping that do not `stop` prune `prune` and
    /// keep `regrow` (one entry a column each way); returns them.
    fn swap(
        &mut self,
        stop: Tensor<B, 2, Bool>,
        prune: &Tensor<B, 2, Int>,
        regrow: &Tensor<B, 2, Int>,
    ) -> Tensor<B, 2, Bool> {
        let take = self.active.clone().bool_and(stop.bool_not());
        let one = take.clone().int();
        self.mask = (self.mask.clone())
            .scatter(0, prune.clone(), one.clone(), IndexingUpdateOp::Add)
            .scatter(0, regrow.clone(), one.clone().neg(), IndexingUpdateOp::Add);
        self.count = self.count.clone() + one;
        self.active = take.clone();
        take
    }

    fn finish(self, first: Tensor<B, 2, Bool>) -> (Tensor<B, 2, Bool>, DsnotReport) {
        report(first, self.mask, self.count)
    }
}

/// The refined mask (`mask`, 1 pruned) and the report: the most swaps a
/// column made (`count`, `[1, cols]`), and the weights whose state differs
/// from the `first` mask (one read).
fn report<B: Compute>(
    first: Tensor<B, 2, Bool>,
    mask: Tensor<B, 2, Int>,
    count: Tensor<B, 2, Int>,
) -> (Tensor<B, 2, Bool>, DsnotReport) {
    let mask = mask.equal_elem(1);
    let changed = reduce::sum_all(first.not_equal(mask.clone()).int());
    let cycles = reduce::max_dim_int(count, 1);
    let counts = on_device::read_ints::<B, 2>(Tensor::cat(vec![cycles, changed], 1));
    let report = DsnotReport {
        cycles: counts.first().copied().unwrap_or(0).max(0) as usize,
        changed: counts.get(1).copied().unwrap_or(0).max(0) as u64,
    };
    (mask, report)
}

/// The loop in one launch where the backend has the kernel
/// (`Compute::dsnot_swaps`) and `PRUNEMEM_DSNOT` does not say `ops`: the
/// mask and the report, else `None` and the caller steps the loop with
/// Burn's ops. The request is built (its integer copies made) only when
/// it is sent.
fn in_one_launch<B: Compute>(
    job: impl FnOnce() -> SwapLoop<B>,
    first: &Tensor<B, 2, Bool>,
) -> Option<(Tensor<B, 2, Bool>, DsnotReport)> {
    if !crate::exec::swap_loop::one_launch() {
        return None;
    }
    let done = B::dsnot_swaps(job()).ok()?;
    Some(report(first.clone(), done.mask, done.swaps))
}

/// N:M DSnoT: each swap regrows the regrowing order's next pruned weight
/// and prunes the least important kept weight of its group (gathered:
/// `m` entries a column), while the row's error keeps its first sign.
fn nm<B: Compute>(
    mut rg: Regrow<B>,
    initial: Tensor<B, 2>,
    first: Tensor<B, 2, Bool>,
    m: usize,
    opts: &DsnotOptions,
) -> (Tensor<B, 2, Bool>, DsnotReport) {
    let [_, cols] = initial.dims();
    let device = initial.device();
    let sign0 = rg.err.clone().sign();
    let pruned_metric = initial.mask_fill(first.clone(), f32::INFINITY);
    let max_value = B::float_bits(reduce::max_dim(pruned_metric.clone(), 0).add_scalar(1.0));
    let mut metric = B::float_bits(pruned_metric);
    let offsets = Tensor::<B, 1, Int>::arange(0..m as i64, &device)
        .reshape([m, 1])
        .expand([m, cols]);
    let threshold = opts.update_threshold as f32;
    let job = || SwapLoop {
        d: rg.d.clone(),
        mask: first.clone().int(),
        err: rg.err.clone(),
        regrow: rg.swap_lists(),
        prune: SwapPrune::Groups {
            metric: metric.clone(),
            max_value: max_value.clone(),
            m,
        },
        cycles: opts.max_cycles,
        threshold,
    };
    if let Some(done) = in_one_launch(job, &first) {
        return done;
    }
    let mut sw = Swaps::new(&first, opts.max_cycles);
    while sw.next_cycle().is_some() {
        let r = rg.step();
        // The first smallest of the regrown weight's group.
        let start = r.row.clone().div_scalar(m as i64).mul_scalar(m as i64);
        let group = start.expand([m, cols]) + offsets.clone();
        let keys = metric.clone().gather(0, group.clone());
        let least = reduce::min_dim_int(keys.clone(), 0).expand([m, cols]);
        let elsewhere = keys.equal(least).bool_not();
        let p_row = reduce::min_dim_int(group.mask_fill(elsewhere, i32::MAX as i64), 0);
        let (stop, d_p, d_r) = sw.stops(&rg, &r, &p_row, threshold);
        let after = (rg.err.clone() + d_p) - d_r;
        let stop = stop.bool_or(after.clone().sign().not_equal(sign0.clone()));
        let take = sw.swap(stop, &p_row, &r.row);
        // The pruned weight's metric becomes the row's maximum plus one.
        let raise = (max_value.clone() - metric.clone().gather(0, p_row.clone()))
            .mask_fill(take.clone().bool_not(), 0);
        metric = metric.scatter(0, p_row, raise, IndexingUpdateOp::Add);
        rg.err = rg.err.clone().mask_where(take.clone(), after);
        rg.advance(r, &take);
    }
    sw.finish(first)
}

#[cfg(test)]
mod tests {
    //! The device loop against the host's on Burn's CPU backend (the ops a
    //! device runs); `tests/device/` repeats it on wgpu.
    use super::*;
    use crate::exec::Cpu;
    use crate::model::synthetic::Normal;
    use crate::prune::dsnot::{DsnotInputs, refine_nm, refine_unstructured};
    use crate::prune::methods::wanda_metric;

    /// `[out, in]` host values as a Burn `[in, out]` tensor.
    fn burn(v: &[f32], out: usize, inp: usize) -> Tensor<Cpu, 2> {
        Tensor::<Cpu, 2>::from_data(TensorData::new(v.to_vec(), [out, inp]), &Default::default())
            .transpose()
    }

    fn vec1(v: &[f32]) -> Tensor<Cpu, 1> {
        Tensor::from_floats(v, &Default::default())
    }

    struct Case {
        w: Vec<f32>,
        wanda: Vec<f32>,
        mean: Vec<f32>,
        var: Vec<f32>,
        out: usize,
        inp: usize,
    }

    /// Values on a grid of `step` (sums exact in any order, ties in every
    /// order, and at whole steps at every window's edge), or not (`0`).
    fn case(out: usize, inp: usize, seed: u64, step: f32) -> Case {
        let mut rng = Normal::new(seed);
        let mut q = |scale: f32| {
            let v = rng.sample() * scale;
            if step > 0.0 {
                (v / step).round() * step
            } else {
                v
            }
        };
        let w: Vec<f32> = (0..out * inp).map(|_| q(1.0)).collect();
        let mean: Vec<f32> = (0..inp).map(|_| q(2.0)).collect();
        let var: Vec<f32> = (0..inp).map(|_| 0.5 + q(1.0).abs()).collect();
        let scaler: Vec<f32> = (0..inp).map(|_| 1.0 + q(1.0).abs()).collect();
        let wanda = wanda_metric(&w, inp, &scaler);
        Case {
            w,
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
            initial: &c.wanda,
            wanda: &c.wanda,
            mean: &c.mean,
            var: &c.var,
        };
        match pattern {
            Pattern::Unstructured => refine_unstructured(&inp, 0.5, opts, false),
            Pattern::NM { n, m } => refine_nm(&inp, n, m, opts, false),
        }
    }

    fn device(c: &Case, pattern: Pattern, opts: &DsnotOptions) -> (Vec<bool>, DsnotReport) {
        let inputs = DeviceInputs {
            w: burn(&c.w, c.out, c.inp),
            initial: burn(&c.wanda, c.out, c.inp),
            wanda: None,
            mean: vec1(&c.mean),
            var: vec1(&c.var),
        };
        let (mask, report) = refine(inputs, pattern, 0.5, opts, false);
        (
            mask.transpose().into_data().iter::<bool>().collect(),
            report,
        )
    }

    #[test]
    fn masks_and_reports_equal_the_hosts() {
        let zero_threshold = DsnotOptions {
            update_threshold: 0.0,
            ..DsnotOptions::default()
        };
        let no_var = DsnotOptions {
            pow_of_var: 0.0,
            max_cycles: 20,
            ..DsnotOptions::default()
        };
        // 8 inputs: every list is the whole column and the cursors run out
        // (the zeros, the other sign); 96 and 64: the regrowing lists are
        // windows, the prune lists whole (a sign has fewer kept weights
        // than 50 cycles, not than 20); 400: every list a window.
        for (out, inp) in [(6, 8), (12, 96), (5, 64), (3, 400)] {
            for step in [0.0, 0.25, 1.0] {
                let c = case(out, inp, 11 + inp as u64, step);
                for pattern in [Pattern::Unstructured, Pattern::NM { n: 2, m: 4 }] {
                    for opts in [DsnotOptions::default(), zero_threshold, no_var] {
                        let (hm, hr) = host(&c, pattern, &opts);
                        let (dm, dr) = device(&c, pattern, &opts);
                        let differ = hm.iter().zip(&dm).filter(|(a, b)| a != b).count();
                        let what = format!("{out}×{inp} {pattern:?} step {step} {opts:?}");
                        assert_eq!(differ, 0, "{what}");
                        assert_eq!((hr.cycles, hr.changed), (dr.cycles, dr.changed), "{what}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_loop_swaps_and_keeps_the_counts() {
        let c = case(16, 128, 3, 0.0);
        let (mask, report) = device(&c, Pattern::Unstructured, &DsnotOptions::default());
        assert!(report.changed > 0 && report.cycles > 0, "{report:?}");
        for row in mask.chunks(c.inp) {
            assert_eq!(row.iter().filter(|p| **p).count(), c.inp / 2);
        }
        let (mask, report) = device(&c, Pattern::NM { n: 2, m: 4 }, &DsnotOptions::default());
        assert!(report.changed > 0, "{report:?}");
        for g in mask.chunks(4) {
            assert_eq!(g.iter().filter(|p| **p).count(), 2);
        }
    }
}
