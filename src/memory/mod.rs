//! Memory readings: one [`MemorySnapshot`] type carrying everything prunemem
//! can measure about a run, each reading an `Option` because a reading that
//! is unavailable is unknown, not zero.
//!
//! The sources live in submodules: the counting heap allocator, the process
//! and host (sysinfo and `/proc`), the compute backend's allocator, and the
//! GPU driver (NVML). Bytes are `u64` everywhere; formatting happens in
//! [`crate::units`] at the edge.

pub mod alloc;
pub mod device;
pub mod gpu;
pub mod held;
pub mod mapping;
pub mod process;
pub mod tag;

use serde::{Deserialize, Serialize};

pub use alloc::CountingAllocator;
pub use device::{DeviceOom, DeviceProbe, DeviceReading, HostHeapProbe};

/// Everything measured at one instant, with the stage it belongs to.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemorySnapshot {
    /// Checkpoint name (`02_model_loaded`), or `sample` for sampler readings.
    pub label: String,
    /// Wall-clock time, milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// Seconds since the run started.
    pub elapsed_s: f64,
    /// Process resident set size.
    pub rss: Option<u64>,
    /// Highest resident set size of the run so far.
    pub rss_peak: Option<u64>,
    /// Live heap bytes (counting allocator).
    pub heap_allocated: Option<u64>,
    /// Highest live heap bytes of the run so far.
    pub heap_peak: Option<u64>,
    /// Backend allocator: allocated bytes (CPU backend: the heap).
    pub device_allocated: Option<u64>,
    /// Backend allocator: reserved bytes (CPU backend: malloc-held bytes).
    pub device_reserved: Option<u64>,
    /// Backend allocator: highest allocated bytes of the run so far.
    pub device_peak: Option<u64>,
    /// GPU memory used by all processes (NVML).
    pub gpu_used: Option<u64>,
    pub gpu_free: Option<u64>,
    pub gpu_total: Option<u64>,
    pub gpu_util_percent: Option<f32>,
    /// Process CPU share in percent of one core (can exceed 100).
    pub cpu_percent: Option<f32>,
    /// Host memory total and used.
    pub system_total: Option<u64>,
    pub system_used: Option<u64>,
    /// Live heap bytes by category ([`tag`]), summing to `heap_allocated`;
    /// empty when the counting allocator is not installed.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub categories: std::collections::BTreeMap<String, u64>,
    /// On stage snapshots: what the heap was made of at its highest since
    /// the previous stage ([`tag::take_window`]), summing to that height.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub window_peak_categories: std::collections::BTreeMap<String, u64>,
    /// On stage snapshots: the highest RSS since the previous stage, exact
    /// (the kernel's high-water mark, restarted at every stage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_rss_peak: Option<u64>,
    /// On stage snapshots: the highest live heap since the previous stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_heap_peak: Option<u64>,
    /// On stage snapshots of a device run: the highest device bytes in use
    /// since the previous stage, from every reading the profiler took
    /// (inside passes too, `Profiler::watch_device`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_device_peak: Option<u64>,
    /// Device runs: what the pool's bytes in use are made of by category
    /// ([`held`]), summing to `device_allocated`.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub device_categories: std::collections::BTreeMap<String, u64>,
    /// On stage snapshots of a device run: what the pool was made of at
    /// `window_device_peak`, summing to it.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub window_device_peak_categories: std::collections::BTreeMap<String, u64>,
    /// Device runs: what crossed the bus and how many kernels ran since the
    /// run started, and the phase open at the reading; `None` on the CPU
    /// backend (nothing crosses a bus) and in logs older than 2026-11-28.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bus: Option<BusReading>,
}

/// A device run's bus traffic and kernel launches so far, counted where
/// prunemem copies and where cubecl logs a launch (`exec::transfer`): the
/// live form of a run's `transfers`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BusReading {
    pub host_to_device_bytes: u64,
    pub device_to_host_bytes: u64,
    /// Kernel launches; `None` where they are not counted.
    pub kernels: Option<u64>,
    /// The phase open at the reading (`load_layer`, `prune`, `eval`…);
    /// `None` between phases.
    pub phase: Option<String>,
    /// Kernels compiled so far (not found in the kernel cache); `None`
    /// where launches are not counted, and in older logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compiled: Option<u64>,
}

impl MemorySnapshot {
    /// Wall-clock time as ISO-8601 UTC with milliseconds.
    pub fn timestamp_iso(&self) -> String {
        iso8601_utc(self.unix_ms)
    }
}

/// Milliseconds since the epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn iso8601_utc(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let ms = unix_ms % 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Milliseconds since the Unix epoch, now.
pub fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_timestamps() {
        assert_eq!(iso8601_utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601_utc(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
        assert_eq!(iso8601_utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }
}
