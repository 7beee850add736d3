//! GPU memory as the driver sees it, through NVML.
//!
//! NVML is what `nvidia-smi` reads: memory used by every process on the card,
//! the card's total, and its utilisation. It is initialised once, lazily; on a
//! machine without an NVIDIA driver (or a build without the `nvml` feature)
//! every reading is `None` and [`status`] says why, once, as a warning.

/// One reading of one GPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuReading {
    pub name: Option<String>,
    pub used: Option<u64>,
    pub free: Option<u64>,
    pub total: Option<u64>,
    pub utilization_percent: Option<f32>,
}

/// GPU memory held by one process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuProcessUsage {
    pub pid: u32,
    pub used: Option<u64>,
}

#[cfg(feature = "nvml")]
mod imp {
    use super::{GpuProcessUsage, GpuReading};
    use nvml_wrapper::Nvml;
    use nvml_wrapper::enums::device::UsedGpuMemory;
    use std::sync::OnceLock;

    static NVML: OnceLock<Result<Nvml, String>> = OnceLock::new();

    fn nvml() -> Result<&'static Nvml, &'static str> {
        NVML.get_or_init(|| {
            Nvml::init().map_err(|e| format!("NVML unavailable ({e}): GPU readings are n/a"))
        })
        .as_ref()
        .map_err(|e| e.as_str())
    }

    pub fn status() -> Result<(), String> {
        nvml().map(|_| ()).map_err(str::to_string)
    }

    pub fn device_count() -> Option<u32> {
        nvml().ok()?.device_count().ok()
    }

    pub fn read(index: u32) -> Option<GpuReading> {
        let device = nvml().ok()?.device_by_index(index).ok()?;
        let memory = device.memory_info().ok();
        Some(GpuReading {
            name: device.name().ok(),
            used: memory.as_ref().map(|m| m.used),
            free: memory.as_ref().map(|m| m.free),
            total: memory.as_ref().map(|m| m.total),
            utilization_percent: device.utilization_rates().ok().map(|u| u.gpu as f32),
        })
    }

    pub fn processes(index: u32) -> Vec<GpuProcessUsage> {
        let Ok(nvml) = nvml() else { return Vec::new() };
        let Ok(device) = nvml.device_by_index(index) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for list in [
            device.running_compute_processes(),
            device.running_graphics_processes(),
        ] {
            for p in list.unwrap_or_default() {
                let used = match p.used_gpu_memory {
                    UsedGpuMemory::Used(bytes) => Some(bytes),
                    UsedGpuMemory::Unavailable => None,
                };
                out.push(GpuProcessUsage { pid: p.pid, used });
            }
        }
        out
    }
}

#[cfg(not(feature = "nvml"))]
mod imp {
    use super::{GpuProcessUsage, GpuReading};

    pub fn status() -> Result<(), String> {
        Err("built without the `nvml` feature: GPU readings are n/a".to_string())
    }
    pub fn device_count() -> Option<u32> {
        None
    }
    pub fn read(_index: u32) -> Option<GpuReading> {
        None
    }
    pub fn processes(_index: u32) -> Vec<GpuProcessUsage> {
        Vec::new()
    }
}

/// `Ok` when NVML answered; otherwise the one-line reason readings are n/a.
pub fn status() -> Result<(), String> {
    imp::status()
}

/// Number of GPUs NVML sees, `None` without NVML.
pub fn device_count() -> Option<u32> {
    imp::device_count()
}

/// Reads GPU `index`; `None` without NVML or without that GPU.
pub fn read(index: u32) -> Option<GpuReading> {
    imp::read(index)
}

/// Per-process GPU memory on GPU `index` (empty without NVML).
pub fn processes(index: u32) -> Vec<GpuProcessUsage> {
    imp::processes(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without an NVIDIA driver NVML must fail cleanly: no panic,
    /// no error, every reading `None`, and a reason to show the user.
    #[test]
    fn absent_driver_reads_none() {
        if status().is_ok() {
            // A driver is present; the contract under test is the absent case.
            assert!(read(0).is_some() || device_count() == Some(0));
            return;
        }
        let reason = status().unwrap_err();
        assert!(reason.contains("n/a"), "{reason}");
        assert_eq!(read(0), None);
        assert_eq!(device_count(), None);
        assert!(processes(0).is_empty());
    }
}
