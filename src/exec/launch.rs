//! Joining a distributed run at start-up: whether a launcher (`mpirun`,
//! `srun`) started this process as one of several ranks, and joining its MPI
//! world (or refusing, in a build without MPI). Kept apart from [`super::dist`],
//! which the engines read, so that the MPI binding depends on the rank
//! contract and not the other way round.

use super::ExecError;

/// A launcher's environment variable `key`, as a number.
fn env_number(key: &str) -> Option<usize> {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
}

/// The number of ranks the process launcher started, from its environment
/// (OpenMPI, MPICH/Hydra, PMIx, Slurm's `srun`); `None` when started alone.
pub fn launched_world_size() -> Option<usize> {
    let size = env_number("OMPI_COMM_WORLD_SIZE")
        .or_else(|| env_number("PMI_SIZE"))
        .or_else(|| env_number("PMIX_SIZE"))
        .or_else(|| {
            env_number("SLURM_STEP_NUM_TASKS")
                .filter(|_| std::env::var_os("SLURM_PROCID").is_some())
        });
    size.filter(|n| *n > 1)
}

/// This process's rank on its own node, from the launcher's environment
/// (OpenMPI, MPICH/Hydra, PMIx, Slurm); `None` when started alone.
pub fn local_rank() -> Option<usize> {
    launched_world_size()?;
    env_number("OMPI_COMM_WORLD_LOCAL_RANK")
        .or_else(|| env_number("MPI_LOCALRANKID"))
        .or_else(|| env_number("PMIX_LOCAL_RANK"))
        .or_else(|| env_number("SLURM_LOCALID"))
}

/// The CUDA card `--device cuda` (no index) means for a rank that is
/// `local` on its node, when `visible` is `CUDA_VISIBLE_DEVICES`: one card
/// per rank on a multi-GPU node (rank i takes card i), card 0 when the
/// launcher already gave each rank its own (`--gpus-per-task=1` leaves one
/// visible), wrapping round when there are more ranks than visible cards.
pub fn cuda_index_for(local: Option<usize>, visible: Option<&str>) -> usize {
    let Some(local) = local else { return 0 };
    let cards = visible
        .map(|v| v.split(',').filter(|c| !c.trim().is_empty()).count())
        .filter(|n| *n > 0);
    match cards {
        Some(n) => local % n,
        None => local,
    }
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

#[cfg(test)]
mod tests {
    use super::cuda_index_for;

    #[test]
    fn each_rank_takes_its_own_card() {
        assert_eq!(cuda_index_for(None, None), 0, "one process: card 0");
        assert_eq!(cuda_index_for(Some(3), None), 3, "four ranks, four cards");
        assert_eq!(cuda_index_for(Some(3), Some("0,1,2,3")), 3);
        assert_eq!(
            cuda_index_for(Some(3), Some("2")),
            0,
            "the launcher bound one card"
        );
        assert_eq!(
            cuda_index_for(Some(5), Some("0,1")),
            1,
            "more ranks than cards"
        );
        assert_eq!(
            cuda_index_for(Some(2), Some("")),
            2,
            "an empty list names none"
        );
    }
}
