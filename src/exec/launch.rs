//! Joining a distributed run at start-up: whether a launcher (`mpirun`,
//! `srun`) started this process as one of several ranks, and joining its MPI
//! world (or refusing, in a build without MPI). Kept apart from [`super::dist`],
//! which the engines read, so that the MPI binding depends on the rank
//! contract and not the other way round.

use super::ExecError;

/// The number of ranks the process launcher started, from its environment
/// (OpenMPI, MPICH/Hydra, PMIx, Slurm's `srun`); `None` when started alone.
pub fn launched_world_size() -> Option<usize> {
    let var = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<usize>().ok());
    let size = var("OMPI_COMM_WORLD_SIZE")
        .or_else(|| var("PMI_SIZE"))
        .or_else(|| var("PMIX_SIZE"))
        .or_else(|| {
            var("SLURM_STEP_NUM_TASKS").filter(|_| std::env::var_os("SLURM_PROCID").is_some())
        });
    size.filter(|n| *n > 1)
}

/// Keeps MPI initialised while alive; finalises it when dropped (at the end
/// of `main`).
pub struct DistGuard {
    #[cfg(feature = "mpi")]
    _universe: Option<mpi::environment::Universe>,
}

impl DistGuard {
    /// Ends every rank of the world with `code` (MPI_Abort): a failed rank
    /// must not leave the others waiting in a reduction.
    pub fn abort(self, code: i32) -> ! {
        #[cfg(feature = "mpi")]
        if self._universe.is_some() {
            use mpi::traits::Communicator;
            mpi::topology::SimpleCommunicator::world().abort(code);
        }
        std::process::exit(code)
    }
}

/// Joins the launcher's world when the process was started by `mpirun` or
/// `srun` with more than one rank, and installs its reducer. A build without
/// the `mpi` feature refuses such a launch in one line rather than running
/// N independent copies.
pub fn init() -> Result<DistGuard, ExecError> {
    let Some(launched) = launched_world_size() else {
        return Ok(DistGuard {
            #[cfg(feature = "mpi")]
            _universe: None,
        });
    };
    #[cfg(feature = "mpi")]
    {
        let universe = super::mpi::join(launched)?;
        Ok(DistGuard {
            _universe: Some(universe),
        })
    }
    #[cfg(not(feature = "mpi"))]
    Err(ExecError::Distributed(format!(
        "started as one of {launched} MPI ranks, but this build has no MPI support; rebuild with `cargo build --release --features mpi`"
    )))
}
