//! A distributed run's ranks side by side. Rank 0 logs into the run's log
//! folder and every other rank into `rank-R/` inside it (each its own
//! `events.jsonl`, CSV and summary), so no rank waits on another to log and
//! a rank that dies leaves its own log complete up to that point. This
//! module folds them: each rank's peaks and traffic, and per layer the
//! slowest rank (the others wait for it in the layer's reduction).

use std::path::Path;

use super::fold::RunFold;
use super::logdir::{self, LogError};

/// The folder rank `rank` (> 0) logs into, inside the run's log folder.
pub fn folder(rank: usize) -> String {
    format!("rank-{rank}")
}

/// One rank's figures, from its own log.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RankRun {
    pub rank: usize,
    /// `None` when the rank's log has no summary (it died first).
    pub status: Option<String>,
    pub rss_peak: Option<u64>,
    pub device_peak: Option<u64>,
    pub wall_s: Option<f64>,
    /// Per layer: seconds, seconds in its reductions, bytes moved in them.
    pub layer_seconds: Vec<f64>,
    pub layer_reduction_seconds: Vec<f64>,
    pub layer_reduced_bytes: Vec<u64>,
}

/// One layer across ranks.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LayerSpread {
    pub layer: usize,
    /// The rank that computed longest (its layer time less its time in
    /// reductions), and that time; the fastest rank's.
    pub slowest_rank: usize,
    pub slowest_s: f64,
    pub fastest_s: f64,
    /// The longest any rank spent in the layer's reductions.
    pub max_wait_s: f64,
    /// Bytes rank 0 moved in them (it gathers from and sends to every rank).
    pub bytes: u64,
}

fn results_f64(fold: &RunFold, key: &str) -> Vec<f64> {
    let values = fold.summary.as_ref().and_then(|s| s.results.get(key));
    values
        .and_then(|v| v.as_array())
        .map(|a| a.iter().filter_map(|x| x.as_f64()).collect())
        .unwrap_or_default()
}

fn rank_run(rank: usize, fold: &RunFold) -> RankRun {
    let s = fold.summary.as_ref();
    RankRun {
        rank,
        status: s.map(|s| s.status.name().to_string()),
        rss_peak: fold.peak_rss(),
        // On the CPU backend the summary's device peak is the heap's.
        device_peak: s.and_then(|s| s.device_peak).filter(|_| fold.on_device()),
        wall_s: s.map(|s| s.wall_s),
        layer_seconds: results_f64(fold, "layer_seconds"),
        layer_reduction_seconds: results_f64(fold, "layer_reduction_seconds"),
        layer_reduced_bytes: results_f64(fold, "layer_reduced_bytes")
            .into_iter()
            .map(|b| b as u64)
            .collect(),
    }
}

/// Every rank of the run logged in `dir`, in rank order; `None` when the
/// run was not distributed (its plan names no ranks). A rank whose folder
/// holds no log is listed with no figures.
pub fn read(path: &Path) -> Result<Option<Vec<RankRun>>, LogError> {
    // The folder, also when given rank 0's events file.
    let dir = match path.is_file() {
        true => path.parent().unwrap_or(path),
        false => path,
    };
    let zero = RunFold::of(&logdir::read_events(dir)?.events);
    let world = zero
        .plan
        .as_ref()
        .and_then(|p| p.settings.get("ranks"))
        .and_then(|v| v.as_u64())
        .unwrap_or(1) as usize;
    if world < 2 {
        return Ok(None);
    }
    let mut runs = vec![rank_run(0, &zero)];
    for rank in 1..world {
        let events = logdir::read_events(&dir.join(folder(rank)))
            .map(|l| l.events)
            .unwrap_or_default();
        runs.push(rank_run(rank, &RunFold::of(&events)));
    }
    Ok(Some(runs))
}

/// Per layer, the slowest rank and how long the others waited for it.
pub fn layers(runs: &[RankRun]) -> Vec<LayerSpread> {
    let n = runs
        .iter()
        .map(|r| r.layer_seconds.len())
        .min()
        .unwrap_or(0);
    (0..n)
        .map(|l| {
            let compute = |r: &RankRun| {
                r.layer_seconds[l] - r.layer_reduction_seconds.get(l).copied().unwrap_or(0.0)
            };
            let slowest = runs
                .iter()
                .max_by(|a, b| compute(a).total_cmp(&compute(b)))
                .expect("two ranks or more");
            LayerSpread {
                layer: l,
                slowest_rank: slowest.rank,
                slowest_s: compute(slowest),
                fastest_s: runs.iter().map(compute).fold(f64::INFINITY, f64::min),
                max_wait_s: runs
                    .iter()
                    .filter_map(|r| r.layer_reduction_seconds.get(l))
                    .fold(0.0, |a, b| a.max(*b)),
                bytes: runs[0].layer_reduced_bytes.get(l).copied().unwrap_or(0),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(rank: usize, seconds: &[f64], waits: &[f64]) -> RankRun {
        RankRun {
            rank,
            status: Some("ok".into()),
            rss_peak: Some(1),
            device_peak: None,
            wall_s: Some(1.0),
            layer_seconds: seconds.to_vec(),
            layer_reduction_seconds: waits.to_vec(),
            layer_reduced_bytes: vec![100; seconds.len()],
        }
    }

    #[test]
    fn the_slowest_rank_is_the_one_that_computed_longest_not_waited() {
        // Layer 0: rank 1 computed 3 s, rank 0 computed 1 s and waited 2.
        // Layer 1: rank 0 is the slow one.
        let runs = [
            rank(0, &[3.0, 5.0], &[2.0, 0.1]),
            rank(1, &[3.1, 5.0], &[0.1, 3.0]),
        ];
        let l = layers(&runs);
        assert_eq!(l.len(), 2);
        assert_eq!((l[0].slowest_rank, l[1].slowest_rank), (1, 0));
        assert!((l[0].slowest_s - 3.0).abs() < 1e-9 && (l[0].fastest_s - 1.0).abs() < 1e-9);
        assert!((l[1].max_wait_s - 3.0).abs() < 1e-9);
        assert_eq!(l[0].bytes, 100);
    }

    #[test]
    fn a_rank_without_layers_leaves_no_layer_rows() {
        let runs = [rank(0, &[1.0], &[0.0]), rank(1, &[], &[])];
        assert!(layers(&runs).is_empty());
    }
}
