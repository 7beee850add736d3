//! The compute backend's own allocator: what "allocated" and "reserved" mean
//! for the device the model runs on.
//!
//! On the CPU backend (Burn's flex) there is no pool: allocated is the
//! process heap counted by [`super::alloc`], reserved is what malloc holds
//! from the OS. On wgpu and CUDA (features `wgpu`, `cuda`), cubecl's memory pool
//! reports bytes in use and bytes reserved; peaks are tracked by the profiler because cubecl
//! keeps none.

use super::alloc;

/// One reading of the backend allocator.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DeviceReading {
    pub allocated: Option<u64>,
    pub reserved: Option<u64>,
    /// What `allocated` is made of ([`super::held`]); device pools only.
    pub parts: Option<super::held::Parts>,
}

/// A device run that passed its memory cap (`--device-memory`): where, how
/// much it held, and the cap. Checked at every reading on the computing
/// thread (each layer's passes, each evaluation batch), not at every
/// allocation: a run can pass the cap by at most what one pass allocates.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "out of device memory on {device} at {at}: the pool holds {} (reserved), past --device-memory {}",
    crate::units::format_bytes(*in_use),
    crate::units::format_bytes(*cap)
)]
pub struct DeviceOom {
    pub device: String,
    /// The stage or pass (`layer 3 statistics pass`).
    pub at: String,
    /// What the pool held: the larger of its bytes in use and reserved
    /// (reserved is what the driver refuses).
    pub in_use: u64,
    pub cap: u64,
}

/// Reads the memory of the device a run computes on.
pub trait DeviceProbe: Send + Sync {
    /// Short name of the device, such as `cpu` or `cuda:0`.
    fn name(&self) -> String;
    /// Current allocated / reserved bytes.
    fn read(&self) -> DeviceReading;
    /// True when allocated bytes are the counting allocator's heap, whose
    /// peak is exact; otherwise the profiler tracks peaks from readings.
    fn is_host_heap(&self) -> bool {
        false
    }
    /// Device bytes the run may hold (`--device-memory`); `None`: no cap.
    fn cap(&self) -> Option<u64> {
        None
    }
}

/// The CPU backend: heap allocated and malloc-reserved bytes.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostHeapProbe;

impl DeviceProbe for HostHeapProbe {
    fn name(&self) -> String {
        "cpu".to_string()
    }
    fn read(&self) -> DeviceReading {
        DeviceReading {
            allocated: alloc::heap_allocated(),
            reserved: alloc::malloc_reserved(),
            parts: None,
        }
    }
    fn is_host_heap(&self) -> bool {
        true
    }
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub use cube::CubeProbe;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod cube {
    use std::sync::Mutex;
    use std::thread::ThreadId;

    use super::{DeviceProbe, DeviceReading};
    use burn::cubecl::Runtime;

    /// cubecl's memory pool on one device (wgpu or CUDA).
    ///
    /// cubecl keeps one pool per stream and one stream per thread, so the
    /// pool is read on the thread that created the probe (the one that
    /// computes); a reading from any other thread (the sampler) returns the
    /// compute thread's latest reading instead of an empty pool.
    pub struct CubeProbe<R: Runtime> {
        device: R::Device,
        name: String,
        owner: ThreadId,
        latest: Mutex<DeviceReading>,
        cap: Option<u64>,
    }

    impl<R: Runtime> CubeProbe<R> {
        /// A probe for `device`, read on the calling thread.
        pub fn new(device: R::Device, name: String, cap: Option<u64>) -> Self {
            Self {
                device,
                name,
                owner: std::thread::current().id(),
                latest: Mutex::new(DeviceReading::default()),
                cap,
            }
        }
    }

    impl<R: Runtime> DeviceProbe for CubeProbe<R> {
        fn name(&self) -> String {
            self.name.clone()
        }
        fn read(&self) -> DeviceReading {
            let mut latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
            if std::thread::current().id() == self.owner
                && let Ok(usage) = R::client(&self.device).memory_usage()
            {
                *latest = DeviceReading {
                    allocated: Some(usage.bytes_in_use),
                    reserved: Some(usage.bytes_reserved),
                    parts: Some(crate::memory::held::composition(usage.bytes_in_use)),
                };
            }
            *latest
        }
        fn cap(&self) -> Option<u64> {
            self.cap
        }
    }
}
