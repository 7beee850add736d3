//! The pre-flight check: before a run allocates anything large, the
//! estimator's prediction for its plan is set against the memory this
//! machine has available; a run that will not fit is refused with the
//! estimate and the largest settings that do fit, unless forced.
//!
//! The estimate is the one `prunemem estimate` prints for the same plan
//! (prunemem's engine, measured within 5% on the validation grid). Where
//! the estimator cannot place a plan, nothing is refused.

use thiserror::Error;

use crate::estimate::{self, against, fit};
use crate::events::RunPlan;
use crate::units::format_bytes;

/// A run the estimator says will not fit.
#[derive(Debug, Error)]
#[error(
    "this run needs about {} (estimated peak) but {} is available{}",
    format_bytes(*needed),
    format_bytes(*available),
    fits.as_deref().map(|f| format!("; largest that fit, each with the rest as asked: {f}")).unwrap_or_default()
)]
pub struct WontFit {
    pub needed: u64,
    pub available: u64,
    /// The largest settings that fit, in words.
    pub fits: Option<String>,
}

/// What the plan's text will add that the plan does not say: the bytes of
/// text tokenised at once, and the evaluation windows.
#[derive(Debug, Clone, Copy, Default)]
pub struct Extra {
    pub text_bytes: u64,
    pub eval_windows: u64,
}

/// Refuses `plan` when its estimated peak exceeds `available` bytes.
pub fn check(plan: &RunPlan, extra: Extra, available: Option<u64>) -> Result<(), WontFit> {
    let (Some(available), Ok((arch, mut w))) = (available, against::workload_of(plan)) else {
        return Ok(());
    };
    w.text_bytes = extra.text_bytes;
    w.eval_windows = extra.eval_windows;
    let Ok(e) = estimate::estimate(&arch, &w) else {
        return Ok(());
    };
    if e.peak() <= available {
        return Ok(());
    }
    let fits = fit::limits(&arch, &w, available).ok().and_then(|l| {
        let parts: Vec<String> = [
            ("nsamples", l.max_nsamples),
            ("seqlen", l.max_seqlen),
            ("batch_size", l.max_batch_size),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k} {v}")))
        .collect();
        (!parts.is_empty()).then(|| parts.join(", "))
    });
    Err(WontFit {
        needed: e.peak(),
        available,
        fits,
    })
}
