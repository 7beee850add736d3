//! Which of prunemem's own device kernels ran, and how often one handed its
//! work back to Burn's ops. A plan that says `swiglu: kernel` or names a
//! matmul strategy states a request; a kernel declines what it cannot
//! take (a strided view, a dtype it has no arm for, a size past `u32`)
//! and the engine then runs Burn's ops, slower and with more of the pool.
//! Declines are silent where they happen, so they are counted here and a
//! run's `--json` says what happened (`device_kernels`), beside the plan.
//!
//! Counters are process-wide atomics, counted where the cube backends'
//! wrappers decide (`exec::cube_compute`); only a request is counted (a
//! kernel the run did not ask for, such as the flash attention of an f32
//! run, counts nothing). A run reads them at its start and at its end
//! ([`Tally::since`]), as it does its bus traffic.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// One of prunemem's device kernels (`exec::kernels`), cubek's kernels
/// that prunemem launches by name (the matmul strategy, the flash
/// attention), or its staged copies (not kernels, but requests that
/// hand their work back to Burn's the same way).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Kernel {
    /// A product with a named cubek strategy (`exec::matmul`): a linear's,
    /// the head's (`PRUNEMEM_HEAD_MATMUL`), SparseGPT's exact f32 ones.
    Matmul,
    /// cubek's flash attention (`exec::attention`).
    Attention,
    Swiglu,
    /// Wanda's column norms (`Compute::column_square_sums`).
    Norms,
    RmsNorm,
    /// The evaluation's per-row loss.
    RowNll,
    /// The per-output selection's bisection.
    PerOutput,
    /// N:M's ranks within each group.
    NM,
    /// The per-matrix threshold.
    KthSmallest,
    /// SparseGPT's column sweep.
    ObsSweep,
    /// DSnoT's swap loop.
    Dsnot,
    /// RIA's reallocation: the inputs' summed metric.
    RowSums,
    /// RIA's reallocation: one slot's assignment scores.
    SlotScores,
    /// RIA's reallocation report: the metric N:M keeps, per output.
    KeptSums,
    /// Wanda's α-variant: each output's metric sorted and summed.
    VariantPrefix,
    /// Wanda's α-variant: one α's thresholds and counts.
    VariantRows,
    /// An upload through page-locked staging (`exec::copies`).
    PinnedUpload,
    /// A read back through page-locked staging (`exec::copies`).
    PinnedDownload,
}

const KERNELS: [Kernel; 18] = [
    Kernel::Matmul,
    Kernel::Attention,
    Kernel::Swiglu,
    Kernel::Norms,
    Kernel::RmsNorm,
    Kernel::RowNll,
    Kernel::PerOutput,
    Kernel::NM,
    Kernel::KthSmallest,
    Kernel::ObsSweep,
    Kernel::Dsnot,
    Kernel::RowSums,
    Kernel::SlotScores,
    Kernel::KeptSums,
    Kernel::VariantPrefix,
    Kernel::VariantRows,
    Kernel::PinnedUpload,
    Kernel::PinnedDownload,
];
const N: usize = KERNELS.len();

impl Kernel {
    /// The name in `--json` (the plan's setting where it has one).
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Matmul => "matmul",
            Kernel::Attention => "attention",
            Kernel::Swiglu => "swiglu",
            Kernel::Norms => "norms",
            Kernel::RmsNorm => "rms_norm",
            Kernel::RowNll => "row_nll",
            Kernel::PerOutput => "select_per_output",
            Kernel::NM => "select_n_m",
            Kernel::KthSmallest => "kth_smallest",
            Kernel::ObsSweep => "obs_sweep",
            Kernel::Dsnot => "dsnot_swaps",
            Kernel::RowSums => "ordered_row_sums",
            Kernel::SlotScores => "slot_scores",
            Kernel::KeptSums => "nm_kept_sums",
            Kernel::VariantPrefix => "variant_prefix",
            Kernel::VariantRows => "variant_rows",
            Kernel::PinnedUpload => "pinned_upload",
            Kernel::PinnedDownload => "pinned_download",
        }
    }
}

static RAN: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];
static FELL_BACK: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];

/// `kernel` was asked for and ran (`true`) or handed its work back to
/// Burn's ops (`false`).
pub fn count(kernel: Kernel, ran: bool) {
    let counter = if ran { &RAN } else { &FELL_BACK };
    counter[kernel as usize].fetch_add(1, Ordering::Relaxed);
}

/// `result`, counted for `kernel` (`Ok`: it ran).
pub fn counted<T, E>(kernel: Kernel, result: Result<T, E>) -> Result<T, E> {
    count(kernel, result.is_ok());
    result
}

/// One kernel's counts over a stretch of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Uses {
    pub ran: u64,
    pub fell_back: u64,
}

/// The counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    counts: [Uses; N],
}

impl Tally {
    pub fn now() -> Self {
        let mut counts = [Uses::default(); N];
        for (i, c) in counts.iter_mut().enumerate() {
            c.ran = RAN[i].load(Ordering::Relaxed);
            c.fell_back = FELL_BACK[i].load(Ordering::Relaxed);
        }
        Self { counts }
    }

    /// `kernel`'s counts at this moment.
    pub fn of(&self, kernel: Kernel) -> Uses {
        self.counts[kernel as usize]
    }

    /// What was asked for since `start`, by kernel name; kernels nothing
    /// asked for left out.
    pub fn since(&self, start: &Tally) -> BTreeMap<&'static str, Uses> {
        KERNELS
            .iter()
            .map(|k| {
                let (a, b) = (self.of(*k), start.of(*k));
                let d = Uses {
                    ran: a.ran - b.ran,
                    fell_back: a.fell_back - b.fell_back,
                };
                (k.name(), d)
            })
            .filter(|(_, d)| d.ran + d.fell_back > 0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_counted_by_outcome_and_unasked_kernels_left_out() {
        // Other tests in this process may count too: only differences on
        // this test's kernel are asserted.
        let start = Tally::now();
        assert_eq!(counted(Kernel::ObsSweep, Ok::<u8, u8>(1)), Ok(1));
        assert_eq!(counted(Kernel::ObsSweep, Err::<u8, u8>(2)), Err(2));
        count(Kernel::ObsSweep, true);
        let d = Tally::now().since(&start);
        let sweep = d["obs_sweep"];
        assert!(sweep.ran >= 2 && sweep.fell_back >= 1, "{sweep:?}");
        assert!(d.values().all(|u| u.ran + u.fell_back > 0), "{d:?}");
        let names: std::collections::BTreeSet<_> = KERNELS.iter().map(|k| k.name()).collect();
        assert_eq!(names.len(), N, "names are unique");
    }
}
