//! How busy the GPU was while the run went, from NVML's utilisation in
//! every reading: over the run, in each phase a device run was in when the
//! reading was taken, and in each stage window. A mean over the run says
//! *that* the GPU idled ("why is my GPU at 4%?"); the phases and the
//! windows say *where*: a load that leaves it idle while the host reads,
//! a pass that keeps it busy. A watched script has no phases, so its
//! stage windows (its `Memory Checkpoint:` headers) answer instead.
//!
//! A run without NVML has no readings: every mean is `None`, never 0.

use std::collections::BTreeMap;

/// The phase a device reading was taken outside every phase in.
pub const NO_PHASE: &str = "other";

/// The phase a reading counts under: the one its bus reading names
/// ([`NO_PHASE`] between phases); `None` without a bus reading (the CPU
/// backend, a watched process).
pub fn phase_of(bus: Option<&crate::memory::BusReading>) -> Option<&str> {
    bus.map(|b| b.phase.as_deref().unwrap_or(NO_PHASE))
}

/// A mean of utilisation readings (percent).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Mean {
    pub sum: f64,
    pub samples: u64,
}

impl Mean {
    pub fn add(&mut self, percent: f64) {
        self.sum += percent;
        self.samples += 1;
    }

    /// The mean, `None` without a reading.
    pub fn percent(&self) -> Option<f64> {
        (self.samples > 0).then(|| self.sum / self.samples as f64)
    }
}

/// NVML's utilisation as the readings so far tell it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuBusy {
    /// The latest reading.
    pub now: Option<f32>,
    /// Every reading of the run.
    pub run: Mean,
    /// A device run's readings by the phase open when each was taken
    /// ([`NO_PHASE`] between phases); empty where no reading named one.
    pub by_phase: BTreeMap<String, Mean>,
    /// Readings since the last stage.
    window: Mean,
}

impl GpuBusy {
    /// Takes one reading's utilisation; `phase` is the phase it was taken
    /// in where the reading says (a device run's bus reading), `None`
    /// where it cannot (the CPU backend, a watched process).
    pub fn observe(&mut self, percent: Option<f32>, phase: Option<&str>) {
        let Some(u) = percent else { return };
        self.now = Some(u);
        self.run.add(u as f64);
        self.window.add(u as f64);
        if let Some(p) = phase {
            self.by_phase
                .entry(p.to_string())
                .or_default()
                .add(u as f64);
        }
    }

    /// Ends a stage window (the stage's own reading taken already): the
    /// mean over it, and a new window begins.
    pub fn end_window(&mut self) -> Option<f64> {
        std::mem::take(&mut self.window).percent()
    }

    /// The mean of the phase `phase`, where it had readings.
    pub fn in_phase(&self, phase: &str) -> Option<f64> {
        self.by_phase.get(phase).and_then(Mean::percent)
    }
}

/// The phase that left the GPU idle longest: `(phase, seconds, busy %,
/// idle seconds)` from each phase's seconds and its mean utilisation;
/// `None` where no phase has both.
pub fn idlest(
    busy: &BTreeMap<String, Mean>,
    seconds: impl Fn(&str) -> Option<f64>,
) -> Option<(&str, f64, f64, f64)> {
    busy.iter()
        .filter_map(|(phase, m)| {
            let s = seconds(phase)?;
            let u = m.percent()?;
            Some((phase.as_str(), s, u, s * (1.0 - u / 100.0).max(0.0)))
        })
        .max_by(|a, b| a.3.total_cmp(&b.3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_fall_into_the_run_their_phase_and_their_window() {
        let mut b = GpuBusy::default();
        b.observe(Some(10.0), Some("load_layer"));
        b.observe(Some(30.0), Some("load_layer"));
        b.observe(None, Some("prune"));
        assert_eq!(b.end_window(), Some(20.0));
        b.observe(Some(90.0), Some("prune"));
        b.observe(Some(50.0), None);
        assert_eq!(b.now, Some(50.0));
        assert_eq!(b.run.percent(), Some(45.0));
        assert_eq!(b.in_phase("load_layer"), Some(20.0));
        assert_eq!(b.in_phase("prune"), Some(90.0));
        assert_eq!(b.in_phase("eval"), None);
        assert_eq!(b.end_window(), Some(70.0));
        // A window without a reading is unknown, not 0.
        assert_eq!(b.end_window(), None);
    }

    #[test]
    fn no_reading_is_no_mean() {
        let mut b = GpuBusy::default();
        b.observe(None, Some("prune"));
        assert_eq!(b.run.percent(), None);
        assert!(b.by_phase.is_empty());
        assert_eq!(b.now, None);
    }

    #[test]
    fn the_idlest_phase_is_the_one_with_most_idle_seconds() {
        let mut by = BTreeMap::new();
        let mean = |u: f64, n: u64| Mean {
            sum: u * n as f64,
            samples: n,
        };
        by.insert("load_layer".to_string(), mean(5.0, 10));
        by.insert("prune".to_string(), mean(40.0, 30));
        by.insert("eval".to_string(), mean(90.0, 8));
        let secs = |p: &str| match p {
            "load_layer" => Some(1.0),
            "prune" => Some(3.0),
            _ => None,
        };
        let (phase, s, u, idle) = idlest(&by, secs).unwrap();
        assert_eq!(phase, "prune");
        assert_eq!((s, u), (3.0, 40.0));
        assert!((idle - 1.8).abs() < 1e-12);
        assert!(idlest(&by, |_| None).is_none());
    }
}
