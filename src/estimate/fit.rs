//! `--fit MEMORY`: the largest run that fits a memory budget. Peaks grow
//! monotonically with sequence length, sample count and batch size, so each
//! limit is a binary search over estimates.

use serde::Serialize;

use super::{Arch, EstimateError, Task, Workload, estimate};

/// The largest sizes that fit, each with the others held at the workload's
/// values; `None` when even 1 does not fit.
#[derive(Debug, Clone, Serialize)]
pub struct FitLimits {
    pub budget: u64,
    pub max_seqlen: Option<u64>,
    pub max_nsamples: Option<u64>,
    pub max_batch_size: Option<u64>,
    pub max_eval_windows: Option<u64>,
}

/// The largest `v` in `1..=hi` with `fits(v)`, assuming monotonicity.
fn search(
    hi: u64,
    fits: impl Fn(u64) -> Result<bool, EstimateError>,
) -> Result<Option<u64>, EstimateError> {
    if !fits(1)? {
        return Ok(None);
    }
    let (mut lo, mut hi) = (1u64, hi.max(1));
    if fits(hi)? {
        return Ok(Some(hi));
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(Some(lo))
}

/// The share of the pool's predicted reserve (1 in this many) that a
/// size must leave free to count as fitting: the pool model's error
/// against cubecl's measured reserve (−0.2% to +0.4% on lavapipe's
/// fixtures, within 0.11% on an H100's logs: docs/gpu.md) must not turn
/// advice into another out-of-memory error. A 256-wide fixture's advised
/// `--seqlen 247` once reserved 8.491 MiB under a cap of 8.485 MiB, its
/// prediction 8.476 MiB.
pub const POOL_MARGIN: u64 = 100;

pub fn limits(arch: &Arch, w: &Workload, budget: u64) -> Result<FitLimits, EstimateError> {
    let peak_with = |f: &dyn Fn(&mut Workload)| -> Result<bool, EstimateError> {
        let mut w2 = w.clone();
        f(&mut w2);
        match estimate(arch, &w2) {
            // On a device the cap is on what the pool reserves
            // (`--device-memory` caps that, as the driver would), with
            // [`POOL_MARGIN`] to spare.
            Ok(e) => {
                let reserved = e.device_pool.as_ref().map_or(0, |p| p.reserved);
                let reserved = reserved + reserved / POOL_MARGIN;
                Ok(e.peak().max(reserved) <= budget)
            }
            // Past 64 PiB: certainly over any budget.
            Err(EstimateError::TooLarge(_)) => Ok(false),
            Err(e) => Err(e),
        }
    };
    let max_seqlen = search(arch.max_positions, |v| {
        peak_with(&|w: &mut Workload| w.seqlen = v)
    })?;
    let calibrated = matches!(
        w.task,
        Task::Wanda | Task::Ria | Task::SparseGpt | Task::GradProbe
    );
    let max_nsamples = if calibrated {
        search(1 << 20, |v| peak_with(&|w: &mut Workload| w.nsamples = v))?
    } else {
        None
    };
    let max_batch_size = search(1 << 16, |v| peak_with(&|w: &mut Workload| w.batch_size = v))?;
    let max_eval_windows = if w.eval_windows > 0 {
        search(1 << 20, |v| {
            peak_with(&|w: &mut Workload| w.eval_windows = v)
        })?
    } else {
        None
    };
    Ok(FitLimits {
        budget,
        max_seqlen,
        max_nsamples,
        max_batch_size,
        max_eval_windows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_finds_the_boundary() {
        assert_eq!(search(1000, |v| Ok(v <= 377)).unwrap(), Some(377));
        assert_eq!(search(1000, |_| Ok(true)).unwrap(), Some(1000));
        assert_eq!(search(1000, |_| Ok(false)).unwrap(), None);
    }
}
