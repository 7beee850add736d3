//! A device run's bus traffic as its readings tell it: the totals so far,
//! how fast bytes and launches are going now, and the phase that is open.
//! The live view's answer to "is the GPU waiting on copies?", from the
//! same counters as a run's `transfers` (`memory::BusReading`).

use std::collections::VecDeque;

use crate::memory::BusReading;

/// Rates are taken over about this many seconds of readings.
const WINDOW_S: f64 = 1.0;

/// The latest bus reading and the rates over the last second of them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BusNow {
    /// The totals since the run started, and the phase open.
    pub latest: BusReading,
    /// Readings of the last [`WINDOW_S`] seconds, and the one before them.
    recent: VecDeque<(f64, BusReading)>,
}

/// Bytes (or launches) a second between two readings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BusRates {
    pub host_to_device: f64,
    pub device_to_host: f64,
    /// `None` where launches are not counted.
    pub kernels: Option<f64>,
}

impl BusNow {
    /// Takes the reading taken `t` seconds into the run. A reading older
    /// than the latest (a log replayed out of order) is ignored.
    pub fn observe(&mut self, t: f64, reading: &BusReading) {
        if self.recent.back().is_some_and(|(last, _)| t < *last) {
            return;
        }
        self.latest = reading.clone();
        self.recent.push_back((t, reading.clone()));
        // Keep one reading at or before the window's start as its baseline.
        while self.recent.len() > 2 && self.recent[1].0 <= t - WINDOW_S {
            self.recent.pop_front();
        }
    }

    /// The rates over the last second or so of readings; `None` until two
    /// readings are apart in time.
    pub fn rates(&self) -> Option<BusRates> {
        let ((t0, a), (t1, b)) = (self.recent.front()?, self.recent.back()?);
        let dt = t1 - t0;
        if dt <= 0.0 {
            return None;
        }
        let per_s = |x: u64, y: u64| y.saturating_sub(x) as f64 / dt;
        Some(BusRates {
            host_to_device: per_s(a.host_to_device_bytes, b.host_to_device_bytes),
            device_to_host: per_s(a.device_to_host_bytes, b.device_to_host_bytes),
            kernels: match (a.kernels, b.kernels) {
                (Some(x), Some(y)) => Some(per_s(x, y)),
                _ => None,
            },
        })
    }
}

/// The kernels a run compiled and those it loaded from the kernel cache,
/// summed over the phases of its `transfers` (a finished run's results)
/// that counted them; `None` where none did (launches not counted, older
/// logs).
pub fn compiles(transfers: &serde_json::Map<String, serde_json::Value>) -> Option<(u64, u64)> {
    let sum = |k: &str| -> Option<u64> {
        let known: Vec<u64> = transfers.values().filter_map(|p| p[k].as_u64()).collect();
        (!known.is_empty()).then(|| known.iter().sum())
    };
    Some((sum("compiled")?, sum("from_cache")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(up: u64, down: u64, kernels: Option<u64>, phase: &str) -> BusReading {
        BusReading {
            host_to_device_bytes: up,
            device_to_host_bytes: down,
            kernels,
            phase: Some(phase.into()),
            compiled: None,
        }
    }

    #[test]
    fn rates_are_over_the_last_second_of_readings() {
        let mut bus = BusNow::default();
        assert_eq!(bus.rates(), None);
        bus.observe(0.0, &reading(0, 0, Some(0), "load_layer"));
        assert_eq!(bus.rates(), None, "one reading has no rate");
        // A burst of uploads in the first second, then kernels only.
        bus.observe(0.5, &reading(1_000_000, 0, Some(10), "load_layer"));
        bus.observe(1.0, &reading(2_000_000, 100, Some(20), "prune"));
        let r = bus.rates().unwrap();
        assert_eq!(r.host_to_device, 2_000_000.0);
        assert_eq!(r.device_to_host, 100.0);
        assert_eq!(r.kernels, Some(20.0));
        bus.observe(2.0, &reading(2_000_000, 100, Some(520), "prune"));
        bus.observe(2.5, &reading(2_000_000, 100, Some(1020), "prune"));
        let r = bus.rates().unwrap();
        // The window holds 1.0 (its baseline) to 2.5: no bytes moved there.
        assert_eq!(r.host_to_device, 0.0, "{bus:?}");
        assert_eq!(r.kernels, Some(1000.0 / 1.5), "{bus:?}");
        assert_eq!(bus.latest.phase.as_deref(), Some("prune"));
        assert_eq!(bus.latest.kernels, Some(1020));
    }

    #[test]
    fn uncounted_launches_have_no_rate_and_old_readings_are_ignored() {
        let mut bus = BusNow::default();
        bus.observe(1.0, &reading(10, 0, None, "eval"));
        bus.observe(2.0, &reading(20, 0, None, "eval"));
        assert_eq!(bus.rates().unwrap().kernels, None);
        bus.observe(1.5, &reading(99, 0, None, "eval"));
        assert_eq!(bus.latest.host_to_device_bytes, 20);
    }
}
