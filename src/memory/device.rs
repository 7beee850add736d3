//! The compute backend's own allocator: what "allocated" and "reserved" mean
//! for the device the model runs on.
//!
//! On the CPU backend (Burn's flex) there is no pool: allocated is the
//! process heap counted by [`super::alloc`], reserved is what malloc holds
//! from the OS. With the `cuda` feature, cubecl's memory pool reports bytes in
//! use and bytes reserved; peaks are tracked by the profiler because cubecl
//! keeps none.

use super::alloc;

/// One reading of the backend allocator.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DeviceReading {
    pub allocated: Option<u64>,
    pub reserved: Option<u64>,
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
        }
    }
    fn is_host_heap(&self) -> bool {
        true
    }
}

#[cfg(feature = "cuda")]
pub use cuda::CudaProbe;

#[cfg(feature = "cuda")]
mod cuda {
    use super::{DeviceProbe, DeviceReading};
    use burn::backend::cuda::CudaDevice;
    use cubecl::Runtime;
    use cubecl::cuda::CudaRuntime;

    /// cubecl's memory pool on one CUDA device.
    pub struct CudaProbe {
        device: CudaDevice,
    }

    impl CudaProbe {
        pub fn new(device: CudaDevice) -> Self {
            Self { device }
        }
    }

    impl DeviceProbe for CudaProbe {
        fn name(&self) -> String {
            format!("cuda:{}", self.device.index)
        }
        fn read(&self) -> DeviceReading {
            let usage = CudaRuntime::client(&self.device).memory_usage();
            DeviceReading {
                allocated: Some(usage.bytes_in_use),
                reserved: Some(usage.bytes_reserved),
            }
        }
    }
}
