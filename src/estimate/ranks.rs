//! A distributed run's share per rank (`estimate --ranks N`): each rank
//! holds the memory of a run over its own calibration batches, and every
//! layer's statistics cross the network twice (to rank 0, summed, and back;
//! `exec::dist`).

use serde::Serialize;

use super::{Arch, Task, Workload};

/// What one rank of `ranks` holds and exchanges.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankShare {
    pub ranks: u64,
    /// Calibration windows on the busiest rank.
    pub windows_per_rank: u64,
    /// Bytes of one layer's statistics (f32), summed across ranks.
    pub statistics_per_layer: u64,
    /// Bytes rank 0 sends and receives per layer (the others: twice the
    /// statistics).
    pub rank0_traffic_per_layer: u64,
}

/// The busiest rank's share of `w` over `ranks` ranks: batches of
/// `batch_size` windows dealt out in turn.
pub fn share(a: &Arch, w: &Workload, ranks: u64) -> RankShare {
    let ranks = ranks.max(1);
    let batch = w.batch_size.max(1);
    let batches = w.nsamples.div_ceil(batch);
    let windows_per_rank = (batches.div_ceil(ranks) * batch).min(w.nsamples);
    let (h, q, i) = (a.hidden, a.q_dim(), a.intermediate);
    let columns = 2 * h + q + i;
    let floats = match w.task {
        Task::SparseGpt => 2 * h * h + q * q + i * i,
        Task::Wanda | Task::Ria => columns,
        Task::Magnitude if w.owl || w.dsnot => columns,
        _ => 0,
    } + if w.dsnot { 2 * columns } else { 0 };
    let statistics_per_layer = floats * 4;
    RankShare {
        ranks,
        windows_per_rank,
        statistics_per_layer,
        rank0_traffic_per_layer: 2 * (ranks - 1) * statistics_per_layer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimate::presets;

    #[test]
    fn sparsegpt_exchanges_its_hessians_and_wanda_its_norms() {
        let a = presets::load("llama-7b").unwrap();
        let mut w = Workload::new(Task::SparseGpt);
        (w.nsamples, w.batch_size) = (128, 8);
        let s = share(&a, &w, 8);
        // 16 batches over 8 ranks: two each.
        assert_eq!(s.windows_per_rank, 16);
        // Three 4096² Hessians and one 11008² in f32: 686 MB per layer.
        assert_eq!(
            s.statistics_per_layer,
            (3 * 4096 * 4096 + 11008 * 11008) * 4
        );
        assert_eq!(s.rank0_traffic_per_layer, 14 * s.statistics_per_layer);
        w.task = Task::Wanda;
        assert_eq!(
            share(&a, &w, 8).statistics_per_layer,
            (3 * 4096 + 11008) * 4
        );
        // Uneven: 5 batches over 2 ranks, the busiest holds 3.
        w.nsamples = 40;
        assert_eq!(share(&a, &w, 2).windows_per_rank, 24);
        assert_eq!(share(&a, &w, 1).windows_per_rank, 40);
    }
}
