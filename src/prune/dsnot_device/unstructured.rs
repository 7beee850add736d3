//! Unstructured DSnoT's loop on the device: the prune order's two ends
//! (each sign's kept weights by Wanda's metric, the authors' zeros, the
//! other sign) and the swap cycles that walk them with the regrowing
//! order's (`Regrow`).

use burn::prelude::*;
use burn::tensor::Bool;

use super::cursor::{At, List, window};
use super::{Regrow, Swaps, count, in_one_launch};
use crate::exec::swap_loop::{SwapLoop, SwapPrune};
use crate::exec::{Compute, reduce};
use crate::prune::dsnot::{DsnotOptions, DsnotReport};
use crate::prune::on_device::read_ints;

/// One end of the unstructured prune order (`return_reorder_indice`):
/// the kept weights of its own sign by ascending Wanda metric, then the
/// smallest kept weight once for each kept weight with no contribution
/// (the authors' zeros), then the other sign's by descending metric.
/// Where every column's own sign outlasts the cycles, only the own list
/// is kept, as a window.
struct PruneEnd<B: Backend> {
    own: List<B>,
    other: Option<List<B>>,
    own_at: At<B>,
    other_at: At<B>,
    taken: Tensor<B, 2, Int>,
    own_n: Tensor<B, 2, Int>,
    zeros_end: Tensor<B, 2, Int>,
    end: Tensor<B, 2, Int>,
}

/// This cycle's candidate of one end.
struct PruneStep<B: Backend> {
    row: Tensor<B, 2, Int>,
    has: Tensor<B, 2, Bool>,
    in_own: Tensor<B, 2, Bool>,
    own: At<B>,
    other: Option<(Tensor<B, 2, Bool>, At<B>)>,
}

/// One sign's kept weights, the other's, and how many kept weights have
/// no contribution, per column.
struct Classes<B: Backend> {
    own: Tensor<B, 2, Bool>,
    other: Tensor<B, 2, Bool>,
    zeros: Tensor<B, 2, Int>,
}

impl<B: Compute> PruneEnd<B> {
    /// `window`: `Some(cycles)` where every column's own sign outlasts
    /// them (only the own list is walked, moved into a window).
    fn new(
        wanda: &Tensor<B, 2, Int>,
        index: &Tensor<B, 2, Int>,
        c: Classes<B>,
        window_of: Option<usize>,
    ) -> Self {
        let [rows, cols] = wanda.dims();
        let device = wanda.device();
        let own_n = count(c.own.clone());
        let zeros_end = own_n.clone() + c.zeros;
        let end = zeros_end.clone() + count(c.other.clone());
        let full = |among: Tensor<B, 2, Bool>| List {
            keys: wanda.clone(),
            rows: index.clone(),
            among: Some(among),
        };
        let (own, other) = match window_of {
            Some(cycles) => {
                let select = wanda.clone().mask_fill(c.own.bool_not(), i32::MAX as i64);
                (window(select, false, wanda, index, cycles), None)
            }
            None => (full(c.own), Some(full(c.other))),
        };
        Self {
            own,
            other,
            own_at: At::start(cols, rows, true, &device),
            other_at: At::start(cols, rows, false, &device),
            taken: Tensor::zeros([1, cols], &device),
            own_n,
            zeros_end,
            end,
        }
    }

    fn step(&self, kept0: &Tensor<B, 2, Int>, rows: usize) -> PruneStep<B> {
        let own = self.own.next(&self.own_at, true);
        let in_own = self.taken.clone().lower(self.own_n.clone());
        let Some(list) = &self.other else {
            return PruneStep {
                row: own.row.clone(),
                has: in_own.clone(),
                in_own,
                own,
                other: None,
            };
        };
        let other = list.next(&self.other_at, false);
        let in_zeros = self.taken.clone().lower(self.zeros_end.clone());
        let has = self.taken.clone().lower(self.end.clone());
        let row = other
            .row
            .clone()
            .mask_where(in_zeros.clone(), kept0.clone())
            .mask_where(in_own.clone(), own.row.clone());
        let in_other = in_zeros.bool_not().bool_and(has.clone());
        PruneStep {
            row: row.clamp(0, rows as i64 - 1),
            has,
            in_own,
            own,
            other: Some((in_other, other)),
        }
    }

    fn advance(&mut self, s: PruneStep<B>, take: &Tensor<B, 2, Bool>) {
        let own = take.clone().bool_and(s.in_own);
        self.own_at = self.own_at.clone().advance(&own, s.own);
        if let Some((in_other, other)) = s.other {
            let other_take = take.clone().bool_and(in_other);
            self.other_at = self.other_at.clone().advance(&other_take, other);
        }
        self.taken = self.taken.clone() + take.clone().int();
    }
}

/// The one-launch loop's request (`exec::swap_loop`): the regrowing
/// lists, both prune ends' own lists (whole columns where the ends also
/// walk the other sign) and their counts, the smallest kept weight.
fn swap_job<B: Compute>(
    rg: &Regrow<B>,
    ends: &[PruneEnd<B>; 2],
    kept0: Tensor<B, 2, Int>,
    first: &Tensor<B, 2, Bool>,
    opts: &DsnotOptions,
) -> SwapLoop<B> {
    let whole = ends[0].other.is_some();
    let counts = ends
        .iter()
        .flat_map(|e| [e.own_n.clone(), e.zeros_end.clone(), e.end.clone()]);
    SwapLoop {
        d: rg.d.clone(),
        mask: first.clone().int(),
        err: rg.err.clone(),
        regrow: rg.swap_lists(),
        prune: SwapPrune::Ends {
            own: [ends[0].own.to_swap(whole), ends[1].own.to_swap(whole)],
            whole,
            ends: Tensor::cat(counts.chain([kept0]).collect(), 0),
        },
        cycles: opts.max_cycles,
        threshold: opts.update_threshold as f32,
    }
}

/// Unstructured DSnoT: each swap regrows the regrowing order's next
/// pruned weight and prunes the prune order's next kept one.
pub(super) fn unstructured<B: Compute>(
    mut rg: Regrow<B>,
    wanda: Tensor<B, 2, Int>,
    first: Tensor<B, 2, Bool>,
    opts: &DsnotOptions,
) -> (Tensor<B, 2, Bool>, DsnotReport) {
    let [rows, cols] = wanda.dims();
    let device = wanda.device();
    let mut ends = {
        let kept = first.clone().bool_not();
        let neg = kept.clone().bool_and(rg.d.clone().lower_elem(0.0));
        let pos = kept.clone().bool_and(rg.d.clone().greater_elem(0.0));
        let zeros = count(kept.bool_and(rg.d.clone().equal_elem(0.0)));
        // Whether some column's own sign has fewer kept weights than cycles.
        let fewest = count(neg.clone()).min_pair(count(pos.clone()));
        let fewest = read_ints::<B, 2>(reduce::min_dim_int(fewest, 1));
        let short = fewest
            .first()
            .is_none_or(|f| (*f as usize) < opts.max_cycles);
        let window_of = (!short).then_some(opts.max_cycles);
        let classes = |own: &Tensor<B, 2, Bool>, other: &Tensor<B, 2, Bool>| Classes {
            own: own.clone(),
            other: other.clone(),
            zeros: zeros.clone(),
        };
        [
            PruneEnd::new(&wanda, &rg.index, classes(&neg, &pos), window_of),
            PruneEnd::new(&wanda, &rg.index, classes(&pos, &neg), window_of),
        ]
    };
    // The authors' zeros point at the smallest kept weight (only whole
    // lists reach them).
    let kept0 = match ends[0].other.is_some() {
        true => {
            let keys = wanda.mask_fill(first.clone(), i32::MAX as i64);
            let least = reduce::min_dim_int(keys.clone(), 0).expand([rows, cols]);
            let elsewhere = keys.equal(least).bool_not();
            reduce::min_dim_int(rg.index.clone().mask_fill(elsewhere, i32::MAX as i64), 0)
        }
        false => {
            // Windows only: Wanda's keys are in them.
            drop(wanda);
            Tensor::zeros([1, cols], &device)
        }
    };
    let threshold = opts.update_threshold as f32;
    let job = || swap_job(&rg, &ends, kept0.clone(), &first, opts);
    if let Some(done) = in_one_launch(job, &first) {
        return done;
    }
    let mut sw = Swaps::new(&first, opts.max_cycles);
    while sw.next_cycle().is_some() {
        let r = rg.step();
        // Negative errors prune from the back (positive contributions).
        let p_back = rg.err.clone().lower_elem(0.0);
        let [f, b] = [0, 1].map(|e| ends[e].step(&kept0, rows));
        let p_row = f.row.clone().mask_where(p_back.clone(), b.row.clone());
        let p_has = f.has.clone().mask_where(p_back.clone(), b.has.clone());
        let (stop, d_p, d_r) = sw.stops(&rg, &r, &p_row, threshold);
        let take = sw.swap(stop.bool_or(p_has.bool_not()), &p_row, &r.row);
        let moved = (rg.err.clone() + d_p) - d_r;
        rg.err = rg.err.clone().mask_where(take.clone(), moved);
        rg.advance(r, &take);
        let front = take.clone().bool_and(p_back.clone().bool_not());
        let back = take.clone().bool_and(p_back);
        ends[0].advance(f, &front);
        ends[1].advance(b, &back);
    }
    sw.finish(first)
}
