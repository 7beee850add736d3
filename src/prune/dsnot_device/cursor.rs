//! The cursors of DSnoT's device loop: a position in one column's stable
//! order, the list a cursor walks, and the step to the next position.
//!
//! A host cursor walks a sorted list. Here the next position is the
//! lexicographic successor (or predecessor) of the last `(key, input)`
//! pair among the list's entries: one min (or max) over the keys and one
//! over the inputs, per column. Where a cursor can reach only its first
//! `c` entries in `c` cycles, those entries are first moved into a
//! `[c, out]` list ([`window`]), so each step reads `c` rows instead of
//! the matrix's: the same successors. The selection that picks them takes
//! non-negative keys, so a window holds one sign of a signed order
//! ([`by_magnitude`]); where a column has fewer than `c` of that sign (or
//! NaN scores, first off the back), the cursor walks the whole column.

use burn::prelude::*;
use burn::tensor::{Bool, IndexingUpdateOp};

use crate::exec::swap_loop::SwapList;
use crate::exec::{Compute, reduce};
use crate::prune::on_device;

/// Per column, a position in an order of `(key, input)` pairs.
#[derive(Clone)]
pub(super) struct At<B: Backend> {
    pub key: Tensor<B, 2, Int>,
    pub row: Tensor<B, 2, Int>,
}

impl<B: Backend> At<B> {
    /// Before the first pair (ascending, `up`) or after the last.
    pub fn start(cols: usize, rows: usize, up: bool, device: &B::Device) -> Self {
        let (key, row) = match up {
            true => (i32::MIN as i64, -1),
            false => (i32::MAX as i64, rows as i64),
        };
        Self {
            key: Tensor::full([1, cols], key, device),
            row: Tensor::full([1, cols], row, device),
        }
    }

    /// `next` in the columns `take` sets, `self` in the others.
    pub fn advance(self, take: &Tensor<B, 2, Bool>, next: At<B>) -> Self {
        Self {
            key: self.key.mask_where(take.clone(), next.key),
            row: self.row.mask_where(take.clone(), next.row),
        }
    }
}

/// What a cursor walks: keys and their inputs (`[n, out]`), and which
/// entries count (`None`: all).
#[derive(Clone)]
pub(super) struct List<B: Backend> {
    pub keys: Tensor<B, 2, Int>,
    pub rows: Tensor<B, 2, Int>,
    pub among: Option<Tensor<B, 2, Bool>>,
}

impl<B: Backend> List<B> {
    /// Per column, the pair after `at` in ascending (`up`) or descending
    /// `(key, input)` order: the stable sort's next position. Where there
    /// is none the pair is a sentinel (the callers count their takes
    /// instead of testing it).
    pub fn next(&self, at: &At<B>, up: bool) -> At<B> {
        let (keys, rows) = (&self.keys, &self.rows);
        let shape = keys.dims();
        let (pk, pr) = (at.key.clone().expand(shape), at.row.clone().expand(shape));
        let same = keys.clone().equal(pk.clone());
        let beyond = match up {
            true => keys
                .clone()
                .greater(pk)
                .bool_or(same.bool_and(rows.clone().greater(pr))),
            false => keys
                .clone()
                .lower(pk)
                .bool_or(same.bool_and(rows.clone().lower(pr))),
        };
        let beyond = match &self.among {
            Some(a) => beyond.bool_and(a.clone()),
            None => beyond,
        };
        let outside = beyond.clone().bool_not();
        let key = match up {
            true => reduce::min_dim_int(keys.clone().mask_fill(outside, i32::MAX as i64), 0),
            false => reduce::max_dim_int(keys.clone().mask_fill(outside, i32::MIN as i64), 0),
        };
        let not_there = beyond
            .bool_and(keys.clone().equal(key.clone().expand(shape)))
            .bool_not();
        let row = match up {
            true => reduce::min_dim_int(rows.clone().mask_fill(not_there, i32::MAX as i64), 0),
            false => reduce::max_dim_int(rows.clone().mask_fill(not_there, -1), 0),
        };
        At { key, row }
    }

    /// The list as the one-launch loop takes it (`exec::swap_loop`):
    /// inputs implicit where it is a `whole` column, flags as integers.
    pub fn to_swap(&self, whole: bool) -> SwapList<B> {
        SwapList {
            keys: self.keys.clone(),
            rows: (!whole).then(|| self.rows.clone()),
            among: self.among.clone().map(|a| a.int()),
        }
    }
}

/// The `c` entries of each column a cursor reaches first, moved into a
/// `[c, out]` list of `keys` and `rows` in input order. They are the `c`
/// smallest of `select` (non-negative: the selection kernels' keys), ties
/// to the lower input, or to the higher where `ties_high` (the back of a
/// stable sort); a prefix sum numbers them, a scatter moves them.
pub(super) fn window<B: Compute>(
    select: Tensor<B, 2, Int>,
    ties_high: bool,
    keys: &Tensor<B, 2, Int>,
    rows: &Tensor<B, 2, Int>,
    c: usize,
) -> List<B> {
    let [_, cols] = keys.dims();
    let chosen = match ties_high {
        false => on_device::smallest_per_output(select, c),
        true => on_device::smallest_per_output(select.flip([0]), c).flip([0]),
    };
    let slot = inclusive_prefix(chosen.clone().int())
        .sub_scalar(1)
        .mask_fill(chosen.clone().bool_not(), c as i64);
    let device = keys.device();
    let moved = |v: Tensor<B, 2, Int>| {
        Tensor::<B, 2, Int>::zeros([c + 1, cols], &device)
            .scatter(
                0,
                slot.clone(),
                v.mask_fill(chosen.clone().bool_not(), 0),
                IndexingUpdateOp::Add,
            )
            .narrow(0, 0, c)
    };
    List {
        keys: moved(keys.clone()),
        rows: moved(rows.clone()),
        among: None,
    }
}

/// Selection keys of one sign of a signed order's `keys`
/// ([`signed_keys`]; `negative` or positive), largest magnitude first:
/// `bits(+inf) - bits(|x|)`, the other entries (and NaN) last.
pub(super) fn by_magnitude<B: Backend>(
    keys: &Tensor<B, 2, Int>,
    negative: bool,
) -> Tensor<B, 2, Int> {
    let inf = f32::INFINITY.to_bits() as i64;
    let (of_sign, select) = match negative {
        // A negative key is `-bits - 1`.
        true => (keys.clone().lower_elem(0), keys.clone().add_scalar(inf + 1)),
        false => (
            keys.clone()
                .greater_elem(0)
                .bool_and(keys.clone().lower_equal_elem(inf)),
            keys.clone().neg().add_scalar(inf),
        ),
    };
    select.mask_fill(of_sign.bool_not(), i32::MAX as i64)
}

/// Rows per block of [`inclusive_prefix`].
const BLOCK: usize = 64;

/// The running sum down each column. In blocks of [`BLOCK`] rows: cubecl's
/// `cumsum` sums each output's whole prefix (quadratic in the rows), so it
/// runs within blocks and over the blocks' totals.
fn inclusive_prefix<B: Backend>(x: Tensor<B, 2, Int>) -> Tensor<B, 2, Int> {
    let [n, cols] = x.dims();
    let blocks = n.div_ceil(BLOCK);
    let pad = blocks * BLOCK - n;
    let x = match pad {
        0 => x,
        _ => {
            let zeros = Tensor::<B, 2, Int>::zeros([pad, cols], &x.device());
            Tensor::cat(vec![x, zeros], 0)
        }
    };
    let within = x.clone().reshape([blocks, BLOCK, cols]).cumsum(1);
    // A window's pick at its widest: its flags as integers and their sums.
    crate::exec::watch::after_op();
    drop(x);
    let totals = within.clone().narrow(1, BLOCK - 1, 1);
    let before = totals.clone().cumsum(0) - totals;
    (within + before.expand([blocks, BLOCK, cols]))
        .reshape([blocks * BLOCK, cols])
        .narrow(0, 0, n)
}

/// Sortable integer keys of signed floats (`-0` as `0`, NaN last as the
/// host's `argsort` puts it).
pub(super) fn signed_keys<B: Compute>(x: Tensor<B, 2>) -> Tensor<B, 2, Int> {
    let nan = x.clone().is_nan();
    let x = x.clone().mask_fill(x.equal_elem(0.0), 0.0);
    let negative = x.clone().lower_elem(0.0);
    let bits = B::float_bits(x.abs());
    let keys = bits.clone().mask_where(negative, bits.neg().sub_scalar(1));
    keys.mask_fill(nan, i32::MAX as i64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::Cpu;

    /// A window walked `c` steps gives the first `c` positions of the
    /// stable order, from the front and from the back, on keys that tie
    /// everywhere (five values in 130 rows, so every window's edge ties).
    #[test]
    fn a_window_walks_the_stable_orders_first_entries() {
        let (n, cols, c) = (130, 3, 12);
        let v: Vec<i64> = (0..n * cols)
            .map(|i| ((i * 7 + i / 5) % 5) as i64)
            .collect();
        let device = Default::default();
        let keys = Tensor::<Cpu, 2, Int>::from_data(TensorData::new(v.clone(), [n, cols]), &device);
        let rows = Tensor::<Cpu, 1, Int>::arange(0..n as i64, &device)
            .reshape([n, 1])
            .expand([n, cols]);
        for up in [true, false] {
            // The back's keys, reversed, select the back's entries.
            let select = match up {
                true => keys.clone(),
                false => keys.clone().neg().add_scalar(4),
            };
            let list = window(select, !up, &keys, &rows, c);
            let mut at = At::start(cols, n, up, &device);
            let mut walked = vec![Vec::new(); cols];
            for _ in 0..c {
                at = list.next(&at, up);
                for (col, r) in at.row.clone().into_data().iter::<i64>().enumerate() {
                    walked[col].push(r as usize);
                }
            }
            for (col, walk) in walked.iter().enumerate() {
                let mut order: Vec<usize> = (0..n).collect();
                order.sort_by_key(|r| v[r * cols + col]);
                if !up {
                    order.reverse();
                }
                assert_eq!(walk[..], order[..c], "column {col}, up {up}");
            }
        }
    }

    #[test]
    fn the_blocked_prefix_is_the_running_sum() {
        let n = 150;
        let v: Vec<i64> = (0..n * 3).map(|i| ((i * 7) % 5) as i64 - 1).collect();
        let t = Tensor::<Cpu, 2, Int>::from_data(
            TensorData::new(v.clone(), [n, 3]),
            &Default::default(),
        );
        let got: Vec<i64> = inclusive_prefix(t).into_data().iter::<i64>().collect();
        for c in 0..3 {
            let mut acc = 0;
            for r in 0..n {
                acc += v[r * 3 + c];
                assert_eq!(got[r * 3 + c], acc, "row {r} column {c}");
            }
        }
    }
}
