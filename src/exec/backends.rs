//! The Burn backends prunemem is compiled for, named here and nowhere else:
//! Burn's CPU backend (flex, with prunemem's CPU kernels) always; wgpu
//! (Vulkan, Metal, DX12 through cubecl) with the `wgpu` feature; CUDA
//! through cubecl with the `cuda` feature. (`exec::cube_compute` gives the
//! two cubecl backends their `Compute` and names their runtimes.)
//!
//! Opening a device is where a missing driver shows. wgpu and cudarc panic
//! when no adapter or no `libcuda` is found; opening checks first (CUDA: the
//! library loads) and turns what is left into an [`ExecError`], so a user
//! sees one line, never a panic.

use super::{DeviceSpec, ExecError, OnDevice};
use crate::memory::DeviceProbe;

/// Burn's CPU backend.
pub type Cpu = burn::backend::Flex;
/// Burn's CPU backend with autodiff (GradProbe's gradients, `train`).
pub type CpuAutodiff = burn::backend::Autodiff<Cpu>;
/// Burn's wgpu backend (no fusion): f32 floats, dtype chosen per tensor.
#[cfg(feature = "wgpu")]
pub type Wgpu = burn::backend::Wgpu;
/// Burn's CUDA backend.
#[cfg(feature = "cuda")]
pub type Cuda = burn::backend::Cuda;

/// A device that was opened, with what its backend needs.
#[derive(Clone)]
pub(super) enum Opened {
    Cpu,
    #[cfg(feature = "wgpu")]
    Wgpu {
        device: burn::backend::wgpu::WgpuDevice,
        name: String,
    },
    #[cfg(feature = "cuda")]
    Cuda {
        device: burn::backend::cuda::CudaDevice,
    },
}

impl Opened {
    pub(super) fn adapter_name(&self) -> String {
        match self {
            Opened::Cpu => "cpu".to_string(),
            #[cfg(feature = "wgpu")]
            Opened::Wgpu { name, .. } => name.clone(),
            #[cfg(feature = "cuda")]
            Opened::Cuda { device } => crate::memory::gpu::read(device.index as u32)
                .and_then(|g| g.name)
                .unwrap_or_else(|| format!("CUDA device {}", device.index)),
        }
    }

    /// Whether the device has the Tensor Memory Accelerator (CUDA, sm_90
    /// and later); never on the CPU or wgpu.
    pub(super) fn has_tma(&self) -> bool {
        match self {
            #[cfg(feature = "cuda")]
            Opened::Cuda { device } => {
                use burn::cubecl::Runtime;
                let client = burn::cubecl::cuda::CudaRuntime::client(device);
                !client.properties().features.tma.is_empty()
            }
            _ => false,
        }
    }

    pub(super) fn run<J: OnDevice>(&self, job: J) -> J::Output {
        match self {
            Opened::Cpu => job.run::<Cpu>(&Default::default()),
            #[cfg(feature = "wgpu")]
            Opened::Wgpu { device, .. } => job.run::<Wgpu>(device),
            #[cfg(feature = "cuda")]
            Opened::Cuda { device } => job.run::<Cuda>(device),
        }
    }

    /// The device's pool probe; `None` on the CPU (the heap probe).
    pub(super) fn probe(
        &self,
        spec: &DeviceSpec,
        cap: Option<u64>,
    ) -> Option<Box<dyn DeviceProbe>> {
        let _ = (spec, cap);
        match self {
            Opened::Cpu => None,
            #[cfg(feature = "wgpu")]
            Opened::Wgpu { device, .. } => Some(Box::new(crate::memory::device::CubeProbe::<
                burn::backend::wgpu::WgpuRuntime,
            >::new(
                device.clone(), spec.to_string(), cap
            ))),
            #[cfg(feature = "cuda")]
            Opened::Cuda { device } => Some(Box::new(crate::memory::device::CubeProbe::<
                burn::cubecl::cuda::CudaRuntime,
            >::new(
                device.clone(), spec.to_string(), cap
            ))),
        }
    }
}

/// Opens `spec`.
pub(super) fn open(spec: &DeviceSpec) -> Result<Opened, ExecError> {
    match spec {
        DeviceSpec::Cpu => Ok(Opened::Cpu),
        #[cfg(feature = "wgpu")]
        DeviceSpec::Wgpu(select) => wgpu::open(*select, spec),
        #[cfg(not(feature = "wgpu"))]
        DeviceSpec::Wgpu(_) => Err(ExecError::NotBuilt {
            device: spec.to_string(),
            feature: "wgpu",
        }),
        #[cfg(feature = "cuda")]
        DeviceSpec::Cuda(index) => cuda::open(*index, spec),
        #[cfg(not(feature = "cuda"))]
        DeviceSpec::Cuda(_) => Err(ExecError::NotBuilt {
            device: spec.to_string(),
            feature: "cuda",
        }),
    }
}

/// Runs `f`; a panic on this thread becomes its message's first line, and
/// is not printed. A panic inside the device's runtime on another thread
/// (cubecl's server, wgpu's callbacks) while `f` runs fails it the same
/// way: the job's results are not to be trusted after one (a refused
/// allocation there leaves the tensor empty and the job going). Other
/// threads' panics print as usual.
pub(super) fn caught_on_this_thread<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    use std::sync::{Arc, Mutex};
    let me = std::thread::current().id();
    type Hook = Box<dyn Fn(&std::panic::PanicHookInfo<'_>) + Send + Sync>;
    let previous: Arc<Hook> = Arc::new(std::panic::take_hook());
    let forward = Arc::clone(&previous);
    let elsewhere: Arc<Mutex<Option<String>>> = Arc::default();
    let seen = Arc::clone(&elsewhere);
    std::panic::set_hook(Box::new(move |info| {
        if std::thread::current().id() == me {
            return;
        }
        let in_runtime = info.location().is_some_and(|l| {
            ["cubecl", "wgpu", "burn-", "cudarc"]
                .iter()
                .any(|k| l.file().contains(k))
        });
        if !in_runtime {
            return forward(info);
        }
        if let Ok(mut first) = seen.lock() {
            first.get_or_insert_with(|| panic_line(info.payload()));
        }
    }));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    // Our hook (and its clone of the previous one) goes; the previous returns.
    drop(std::panic::take_hook());
    match Arc::try_unwrap(previous) {
        Ok(hook) => std::panic::set_hook(hook),
        Err(shared) => std::panic::set_hook(Box::new(move |info| shared(info))),
    }
    let out = result.map_err(|p| panic_line(p.as_ref()))?;
    match elsewhere.lock().ok().and_then(|mut m| m.take()) {
        Some(message) => Err(message),
        None => Ok(out),
    }
}

/// The first line of a panic's message.
fn panic_line(p: &(dyn std::any::Any + Send)) -> String {
    let message = p
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| p.downcast_ref::<&str>().copied())
        .unwrap_or("the device's runtime panicked");
    message.lines().next().unwrap_or(message).to_string()
}

#[cfg(feature = "wgpu")]
mod wgpu {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};

    use burn::backend::wgpu::{RuntimeOptions, WgpuDevice, graphics::AutoGraphicsApi, init_setup};

    use super::{Opened, caught_on_this_thread};
    use crate::exec::{DeviceSpec, ExecError, WgpuSelect};

    /// cubecl registers one client per device per process: each selection
    /// is set up once and its adapter name (or failure) remembered.
    static OPENED: OnceLock<Mutex<HashMap<String, Result<String, String>>>> = OnceLock::new();

    pub(super) fn open(select: WgpuSelect, spec: &DeviceSpec) -> Result<Opened, ExecError> {
        let device = match select {
            WgpuSelect::Default => WgpuDevice::DefaultDevice,
            WgpuSelect::Discrete(i) => WgpuDevice::DiscreteGpu(i),
            WgpuSelect::Software => WgpuDevice::Cpu,
        };
        crate::exec::cube::configure();
        let cache = OPENED.get_or_init(Default::default);
        let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
        let entry = cache.entry(spec.to_string()).or_insert_with(|| {
            caught_on_this_thread(|| {
                let setup = init_setup::<AutoGraphicsApi>(&device, RuntimeOptions::default());
                let info = setup.adapter.get_info();
                format!("{} ({:?}, {:?})", info.name, info.backend, info.device_type)
            })
            .map_err(|e| format!("no usable wgpu adapter: {e}"))
        });
        match entry {
            Ok(name) => Ok(Opened::Wgpu {
                device,
                name: name.clone(),
            }),
            Err(reason) => Err(ExecError::Unavailable {
                device: spec.to_string(),
                reason: format!(
                    "{reason} (install a Vulkan driver; without a GPU, Mesa's lavapipe: apt-get install mesa-vulkan-drivers libvulkan1)"
                ),
            }),
        }
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use burn::backend::cuda::CudaDevice;

    use super::{Opened, caught_on_this_thread};
    use crate::exec::{DeviceSpec, ExecError};

    /// True when the CUDA driver library can be loaded (cudarc panics when it
    /// cannot, so this is asked first).
    fn driver_loads() -> bool {
        ["libcuda.so.1", "libcuda.so"].iter().any(|name| {
            let Ok(c) = std::ffi::CString::new(*name) else {
                return false;
            };
            // SAFETY: dlopen with a valid C string; the handle is released.
            unsafe {
                let h = libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
                if h.is_null() {
                    return false;
                }
                libc::dlclose(h);
                true
            }
        })
    }

    pub(super) fn open(index: usize, spec: &DeviceSpec) -> Result<Opened, ExecError> {
        if !driver_loads() {
            return Err(ExecError::Unavailable {
                device: spec.to_string(),
                reason: "no NVIDIA driver (libcuda.so.1 cannot be loaded)".into(),
            });
        }
        let device = CudaDevice::new(index);
        crate::exec::cube::configure();
        caught_on_this_thread(|| {
            use burn::cubecl::Runtime;
            let _ = burn::cubecl::cuda::CudaRuntime::client(&device);
        })
        .map_err(|reason| ExecError::Unavailable {
            device: spec.to_string(),
            reason,
        })?;
        Ok(Opened::Cuda { device })
    }
}
