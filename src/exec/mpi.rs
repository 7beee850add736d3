//! The MPI world (OpenMPI, MPICH; launched by `mpirun` or `srun`) through
//! rsmpi: joining it, and the reducer whose sums are added in rank order on
//! rank 0 and broadcast, so every rank holds the same bits whatever the
//! timing or the library's reduction algorithm.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use mpi::collective::SystemOperation;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

use super::ExecError;
use super::dist::{Reducer, install};

/// Initialises MPI (calls from any thread, one at a time), checks that the
/// world is the one the launcher announced, and installs the reducer.
pub fn join(launched: usize) -> Result<mpi::environment::Universe, ExecError> {
    let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Serialized)
        .ok_or_else(|| ExecError::Distributed("MPI was already initialised".into()))?;
    let world = universe.world();
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    if size != launched {
        return Err(ExecError::Distributed(format!(
            "the launcher announced {launched} ranks but MPI's world has {size}: is this binary linked against the MPI that `mpirun` belongs to?"
        )));
    }
    install(Box::new(MpiReducer {
        rank,
        size,
        bytes: AtomicU64::new(0),
        nanos: AtomicU64::new(0),
    }));
    Ok(universe)
}

/// This rank's reducer: its place in the world and its traffic so far.
struct MpiReducer {
    rank: usize,
    size: usize,
    /// Bytes sent and received by this rank in reductions.
    bytes: AtomicU64,
    /// Nanoseconds spent in reductions.
    nanos: AtomicU64,
}

impl MpiReducer {
    /// Runs one reduction of `len` elements of `width` bytes, counting its
    /// traffic and time.
    fn counted<R>(&self, len: usize, width: usize, f: impl FnOnce() -> R) -> R {
        let t = Instant::now();
        let out = f();
        let moved = match self.rank {
            // Rank 0 receives every other rank's values and sends the sum.
            0 => 2 * (self.size - 1) * len * width,
            _ => 2 * len * width,
        };
        self.bytes.fetch_add(moved as u64, Ordering::Relaxed);
        self.nanos
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        out
    }
}

/// MPI's world communicator, asked for at each call (the handle is a
/// constant; holding one would tie the reducer to a thread).
fn world() -> SimpleCommunicator {
    SimpleCommunicator::world()
}

/// Sums `values` across ranks on rank 0 in rank order, then gives every
/// rank rank 0's result.
fn ordered_sum<T>(values: &mut [T], rank: usize, size: usize)
where
    T: Equivalence + Copy + std::ops::AddAssign + Default,
{
    let comm = world();
    if rank == 0 {
        let mut incoming = vec![T::default(); values.len()];
        for r in 1..size {
            comm.process_at_rank(r as i32)
                .receive_into(&mut incoming[..]);
            for (v, x) in values.iter_mut().zip(&incoming) {
                *v += *x;
            }
        }
    } else {
        comm.process_at_rank(0).send(&values[..]);
    }
    comm.process_at_rank(0).broadcast_into(values);
}

impl Reducer for MpiReducer {
    fn world(&self) -> (usize, usize) {
        (self.rank, self.size)
    }
    fn sum_f32(&self, values: &mut [f32]) {
        self.counted(values.len(), 4, || {
            ordered_sum(values, self.rank, self.size)
        });
    }
    fn sum_f64(&self, values: &mut [f64]) {
        self.counted(values.len(), 8, || {
            ordered_sum(values, self.rank, self.size)
        });
    }
    fn max_f32(&self, values: &mut [f32]) {
        // A maximum does not depend on the order.
        let local = values.to_vec();
        self.counted(values.len(), 4, || {
            world().all_reduce_into(&local[..], values, SystemOperation::max())
        });
    }
    fn gather_f64(&self, value: f64) -> Vec<f64> {
        let mut all = vec![0f64; self.size];
        world().all_gather_into(&value, &mut all[..]);
        all
    }
    fn traffic(&self) -> (u64, f64) {
        (
            self.bytes.load(Ordering::Relaxed),
            self.nanos.load(Ordering::Relaxed) as f64 / 1e9,
        )
    }
}
