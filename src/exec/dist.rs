//! Data-parallel calibration across processes: this process's rank, how
//! the calibration and evaluation windows are shared out, and how the
//! ranks' statistics are combined.
//!
//! Layer-wise pruning parallelises over windows with one exchange per layer:
//! every rank forwards its share of the windows through the layer, the
//! statistics (Wanda's and RIA's column norms, SparseGPT's Hessians, DSnoT's
//! moments, OWL's norms) are sums and are summed across ranks, and every
//! rank then derives the same masks from the same numbers and moves on with
//! its own windows. The world is process-wide (MPI's is), so the reducer is
//! too: installed once at start-up ([`install`]), read by the engines
//! ([`reducer`]); a process started alone is rank 0 of 1 and reduces
//! nothing.

use std::sync::OnceLock;

use super::ExecError;

/// The rank of this process in a distributed run, and how its statistics
/// are combined with the other ranks'. Every rank calls the same reductions
/// in the same order; each returns the same bits on every rank.
pub trait Reducer: Send + Sync {
    /// `(rank, world size)`.
    fn world(&self) -> (usize, usize);
    /// Element-wise sum across ranks, in place, added in rank order
    /// (0, 1, 2…), so the result does not depend on timing.
    fn sum_f32(&self, values: &mut [f32]);
    /// Element-wise sum across ranks in f64, in rank order.
    fn sum_f64(&self, values: &mut [f64]);
    /// Element-wise maximum across ranks, in place.
    fn max_f32(&self, values: &mut [f32]);
    /// Every rank's `value`, in rank order (on every rank).
    fn gather_f64(&self, value: f64) -> Vec<f64>;
    /// Bytes this rank sent and received in reductions so far, and the
    /// seconds it spent in them (waiting for the slowest rank included).
    fn traffic(&self) -> (u64, f64) {
        (0, 0.0)
    }
}

/// One process: nothing to reduce.
#[derive(Debug, Default, Clone, Copy)]
pub struct SingleProcess;

impl Reducer for SingleProcess {
    fn world(&self) -> (usize, usize) {
        (0, 1)
    }
    fn sum_f32(&self, _: &mut [f32]) {}
    fn sum_f64(&self, _: &mut [f64]) {}
    fn max_f32(&self, _: &mut [f32]) {}
    fn gather_f64(&self, value: f64) -> Vec<f64> {
        vec![value]
    }
}

static REDUCER: OnceLock<Box<dyn Reducer>> = OnceLock::new();

/// Installs this process's reducer; the first call wins.
pub fn install(r: Box<dyn Reducer>) {
    let _ = REDUCER.set(r);
}

/// This process's reducer ([`SingleProcess`] unless one was installed).
pub fn reducer() -> &'static dyn Reducer {
    REDUCER.get_or_init(|| Box::new(SingleProcess)).as_ref()
}

/// `(rank, world size)` of this process.
pub fn world() -> (usize, usize) {
    reducer().world()
}

/// The sum of every rank's `local` count (windows, tokens).
pub fn global_count(local: usize) -> usize {
    let mut n = [local as f64];
    reducer().sum_f64(&mut n);
    n[0] as usize
}

/// True on the rank that writes the model and the logs (rank 0).
pub fn is_writer() -> bool {
    world().0 == 0
}

/// This rank's share of `items`: every `world`-th one from `rank`, so that
/// the ranks' shares are disjoint and their union is `items`.
pub fn share<T: Clone>(items: &[T]) -> Vec<T> {
    let (rank, world) = world();
    share_of(items, rank, world)
}

/// [`share`], borrowed where there is one process (every item is its).
pub fn share_cow<T: Clone>(items: &[T]) -> std::borrow::Cow<'_, [T]> {
    match world().1 > 1 {
        true => std::borrow::Cow::Owned(share(items)),
        false => std::borrow::Cow::Borrowed(items),
    }
}

/// This rank's share of `items` taken in batches of `batch`: batch `k`
/// goes to rank `k mod world`. Each rank then forms exactly the batches a
/// single process would, so when every rank holds one batch the ranks'
/// statistics add up, in rank order, to the single process's bits.
pub fn share_batches<T: Clone>(items: &[T], batch: usize) -> Vec<T> {
    let (rank, world) = world();
    share_batches_of(items, batch, rank, world)
}

/// Rank `rank`'s batches of `items` among `world` ranks.
pub fn share_batches_of<T: Clone>(items: &[T], batch: usize, rank: usize, world: usize) -> Vec<T> {
    items
        .chunks(batch.max(1))
        .skip(rank)
        .step_by(world.max(1))
        .flatten()
        .cloned()
        .collect()
}

/// Rank `rank`'s share of `items` among `world` ranks.
pub fn share_of<T: Clone>(items: &[T], rank: usize, world: usize) -> Vec<T> {
    items
        .iter()
        .skip(rank)
        .step_by(world.max(1))
        .cloned()
        .collect()
}

/// Fails unless every rank gets at least one of `count` `what` (a rank
/// with none would skip the reductions the others wait in); `flags` are
/// the options that set the count.
pub fn check_share(what: &str, count: usize, flags: &str) -> Result<(), ExecError> {
    let (_, world) = world();
    if count < world {
        return Err(ExecError::Distributed(format!(
            "{count} {what} cannot be shared across {world} ranks: give at least one per rank ({flags})"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_process_is_rank_zero_of_one_and_reduces_nothing() {
        let r = SingleProcess;
        let mut v = vec![1.0, -2.0];
        r.sum_f32(&mut v);
        r.max_f32(&mut v);
        assert_eq!(r.world(), (0, 1));
        assert_eq!(v, vec![1.0, -2.0]);
        assert_eq!(r.gather_f64(3.5), vec![3.5]);
    }

    #[test]
    fn shares_are_disjoint_and_cover_every_window() {
        // Rank r of w takes r, r + w, r + 2w…
        let items: Vec<usize> = (0..11).collect();
        let shares: Vec<Vec<usize>> = (0..3).map(|rank| share_of(&items, rank, 3)).collect();
        let mut all: Vec<usize> = shares.concat();
        all.sort();
        assert_eq!(all, items);
        assert_eq!(shares[1], vec![1, 4, 7, 10]);
        // Alone, the share is everything.
        assert_eq!(share(&items), items);
        // In batches of 2: batches 0, 2, 4 to rank 0; 1, 3 to rank 1.
        assert_eq!(share_batches_of(&items, 2, 0, 2), vec![0, 1, 4, 5, 8, 9]);
        assert_eq!(share_batches_of(&items, 2, 1, 2), vec![2, 3, 6, 7, 10]);
        assert_eq!(share_batches(&items, 2), items);
    }
}
