//! What crossed the bus and how many kernels ran, by phase of a run: the
//! answer to "why is my GPU idle?" in bytes and launches rather than a
//! guess. Bytes are counted where prunemem moves a tensor between host and
//! device (a layer's upload, a statistic or a count read back, the
//! evaluation's per-window losses), kernel launches where cubecl reports
//! them (the cube module routes cubecl's launch log here), and the kernels
//! a run compiled (cubecl logs each compile, and each kernel it loads from
//! the kernel cache instead): a first run's seconds go to compiling, which
//! a later run of the same build reads back from the cache.
//!
//! Counters are process-wide atomics keyed by the phase open at the moment
//! ([`crate::timing::current_phase`]); a run reads them at its start and at
//! its end ([`Traffic::since`]), as it does its timings. On the CPU backend
//! nothing crosses a bus and nothing is counted.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::timing::{self, PHASE_COUNT};

/// Slots: one per phase, then "other" (outside every phase span).
const SLOTS: usize = PHASE_COUNT + 1;

static TO_DEVICE: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
static TO_HOST: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
static KERNELS: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
static COMPILED: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];
static CACHE_LOADS: [AtomicU64; SLOTS] = [const { AtomicU64::new(0) }; SLOTS];

fn slot() -> usize {
    timing::current_phase().map_or(PHASE_COUNT, |p| p as usize)
}

/// `bytes` went from the host to the device.
pub fn uploaded(bytes: u64) {
    TO_DEVICE[slot()].fetch_add(bytes, Ordering::Relaxed);
}

/// `bytes` came back from the device to the host.
pub fn read_back(bytes: u64) {
    TO_HOST[slot()].fetch_add(bytes, Ordering::Relaxed);
}

static COUNTING: AtomicBool = AtomicBool::new(false);

/// One kernel was launched.
pub fn launched() {
    KERNELS[slot()].fetch_add(1, Ordering::Relaxed);
}

/// One kernel was compiled (not found in the kernel cache).
pub fn compiled() {
    COMPILED[slot()].fetch_add(1, Ordering::Relaxed);
}

/// One compiled kernel was loaded from the kernel cache.
pub fn loaded_from_cache() {
    CACHE_LOADS[slot()].fetch_add(1, Ordering::Relaxed);
}

/// Says that kernel launches are being counted (cubecl's launch log reaches
/// [`launched`]); until then every phase's `kernels` is unknown.
pub fn counting_kernels() {
    COUNTING.store(true, Ordering::Relaxed);
}

/// One phase's traffic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PhaseTraffic {
    pub host_to_device_bytes: u64,
    pub device_to_host_bytes: u64,
    /// Kernel launches; `None` where they were not counted (a build
    /// without a device backend, or another `log` logger installed first).
    pub kernels: Option<u64>,
    /// Kernels compiled, and kernels loaded from the kernel cache instead
    /// (`exec::cube::kernel_cache`); `None` where launches were not
    /// counted (the same log carries both), absent in older logs.
    #[serde(default)]
    pub compiled: Option<u64>,
    #[serde(default)]
    pub from_cache: Option<u64>,
}

impl PhaseTraffic {
    fn is_zero(&self) -> bool {
        self.host_to_device_bytes == 0
            && self.device_to_host_bytes == 0
            && self.kernels.unwrap_or(0) == 0
            && self.compiled.unwrap_or(0) == 0
            && self.from_cache.unwrap_or(0) == 0
    }
}

/// The counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Traffic {
    /// Per slot: bytes up, bytes down, launches, compiles, cache loads.
    slots: [[u64; 5]; SLOTS],
}

impl Traffic {
    pub fn now() -> Self {
        let mut slots = [[0u64; 5]; SLOTS];
        for (i, s) in slots.iter_mut().enumerate() {
            s[0] = TO_DEVICE[i].load(Ordering::Relaxed);
            s[1] = TO_HOST[i].load(Ordering::Relaxed);
            s[2] = KERNELS[i].load(Ordering::Relaxed);
            s[3] = COMPILED[i].load(Ordering::Relaxed);
            s[4] = CACHE_LOADS[i].load(Ordering::Relaxed);
        }
        Self { slots }
    }

    /// What moved since `start`, by phase name (`other` outside phases),
    /// phases where nothing moved left out.
    pub fn since(&self, start: &Traffic) -> BTreeMap<&'static str, PhaseTraffic> {
        let mut out = BTreeMap::new();
        for (i, (a, b)) in self.slots.iter().zip(&start.slots).enumerate() {
            let d = delta(a, b);
            if !d.is_zero() {
                let name = timing::PHASES.get(i).map_or("other", |p| p.name());
                out.insert(name, d);
            }
        }
        out
    }

    /// What moved since `start`, every phase and outside them together
    /// (`kernels` known as soon as launches are counted, zero included).
    pub fn total_since(&self, start: &Traffic) -> PhaseTraffic {
        let d = |k: usize| -> u64 {
            self.slots
                .iter()
                .zip(&start.slots)
                .map(|(a, b)| a[k] - b[k])
                .sum()
        };
        delta(&[d(0), d(1), d(2), d(3), d(4)], &[0; 5])
    }
}

/// The traffic between two slots' readings (the counts known only where
/// launches are counted).
fn delta(a: &[u64; 5], b: &[u64; 5]) -> PhaseTraffic {
    let counted = |k: usize| COUNTING.load(Ordering::Relaxed).then(|| a[k] - b[k]);
    PhaseTraffic {
        host_to_device_bytes: a[0] - b[0],
        device_to_host_bytes: a[1] - b[1],
        kernels: counted(2),
        compiled: counted(3),
        from_cache: counted(4),
    }
}

/// The sum over phases.
pub fn total<'a>(phases: impl IntoIterator<Item = &'a PhaseTraffic>) -> PhaseTraffic {
    phases
        .into_iter()
        .fold(PhaseTraffic::default(), |a, p| PhaseTraffic {
            host_to_device_bytes: a.host_to_device_bytes + p.host_to_device_bytes,
            device_to_host_bytes: a.device_to_host_bytes + p.device_to_host_bytes,
            kernels: add(a.kernels, p.kernels),
            compiled: add(a.compiled, p.compiled),
            from_cache: add(a.from_cache, p.from_cache),
        })
}

/// Two counts added; one alone where the other is unknown.
fn add(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x + y),
        (x, y) => x.or(y),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timing::Phase;

    #[test]
    fn traffic_is_charged_to_the_open_phase() {
        // Other tests in this process may count too: only this test's
        // phase (eval, nested in prune) is asserted, by difference.
        let start = Traffic::now();
        {
            let _p = timing::phase(Phase::Prune);
            {
                let _e = timing::phase(Phase::Eval);
                uploaded(100);
                read_back(7);
                launched();
                compiled();
                loaded_from_cache();
            }
            // Back in the enclosing phase.
            assert_eq!(timing::current_phase(), Some(Phase::Prune));
        }
        let d = Traffic::now().since(&start);
        let eval = d.get("eval").copied().unwrap_or_default();
        assert!(eval.host_to_device_bytes >= 100, "{eval:?}");
        assert!(eval.device_to_host_bytes >= 7, "{eval:?}");
        counting_kernels();
        let d2 = Traffic::now().since(&start);
        assert!(d2["eval"].kernels >= Some(1), "{d2:?}");
        assert!(d2["eval"].compiled >= Some(1), "{d2:?}");
        assert!(d2["eval"].from_cache >= Some(1), "{d2:?}");
        let t = total(d.values());
        assert!(t.host_to_device_bytes >= eval.host_to_device_bytes);
        // Every phase and outside them together, zero launches known.
        let all = Traffic::now().total_since(&start);
        assert!(all.host_to_device_bytes >= t.host_to_device_bytes);
        assert!(all.device_to_host_bytes >= 7);
        let now = Traffic::now();
        assert_eq!(now.total_since(&now).kernels, Some(0));
    }
}
