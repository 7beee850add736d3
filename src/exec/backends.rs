//! The Burn backends prunemem is compiled for, named here and nowhere else:
//! Burn's CPU backend (flex, with prunemem's CPU kernels) always; wgpu
//! (Vulkan, Metal, DX12 through cubecl) with the `wgpu` feature; CUDA
//! through cubecl with the `cuda` feature.
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

/// A device backend's linear: Burn's op, then a look at the pool while the
/// input and the output are both alive (the pass's high-water mark,
/// [`super::watch`]).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn watched_linear<B: burn::tensor::backend::Backend>(
    linear: &burn::nn::Linear<B>,
    x: burn::tensor::Tensor<B, 3>,
) -> burn::tensor::Tensor<B, 3> {
    let y = linear.forward(x.clone());
    super::watch::after_op();
    drop(x);
    y
}

/// A device linear with the matmul strategy `exec::matmul` names (Burn's
/// own when none is named, or when the named kernel cannot take these
/// shapes), then a look at the pool while input and output are alive.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
macro_rules! cube_linear {
    ($runtime:ty, $cuda:expr, $linear:expr, $x:expr) => {{
        use burn::cubecl::Runtime;
        use burn::tensor::{Tensor, TensorPrimitive};
        let (linear, x) = ($linear, $x);
        let tma = $cuda
            && !<$runtime>::client(&x.device())
                .properties()
                .features
                .tma
                .is_empty();
        let default = crate::exec::matmul::measured_default(tma);
        let Some(strategy) = crate::exec::matmul::chosen(default) else {
            return watched_linear(linear, x);
        };
        let [b, s, i] = x.dims();
        let w = linear.weight.val();
        let [_, o] = w.dims();
        let out = Tensor::<Self, 2>::empty([b * s, o], (&x.device(), x.dtype()));
        let xp = x.clone().reshape([b * s, i]).into_primitive().tensor();
        let wp = w.into_primitive().tensor();
        let op = out.into_primitive().tensor();
        let launched = crate::exec::matmul::launch(
            &strategy,
            &op.client,
            (xp.clone().binding(), xp.dtype.into()),
            (wp.clone().binding(), wp.dtype.into()),
            (op.clone().binding(), op.dtype.into()),
        );
        if launched.is_err() {
            return watched_linear(linear, x);
        }
        let y = Tensor::<Self, 2>::from_primitive(TensorPrimitive::Float(op)).reshape([b, s, o]);
        let y = match &linear.bias {
            Some(bias) => y + bias.val().unsqueeze::<3>(),
            None => y,
        };
        super::watch::after_op();
        drop(x);
        y
    }};
}

/// The largest allocation cubecl's pool takes on `device` (wgpu: the
/// adapter's storage-binding limit; CUDA: a quarter of the card).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn cube_max_buffer<R: burn::cubecl::Runtime>(device: &R::Device) -> Option<u64> {
    Some(R::client(device).properties().memory.max_page_size)
}

/// A cube tensor's f32 bits as an i32 tensor of the same shape: the
/// buffer is shared, only the dtype it is read as changes (the Int element
/// of Burn's wgpu and CUDA backends is i32).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
macro_rules! cube_float_bits {
    ($t:expr) => {{
        use burn::tensor::{DType, FloatDType};
        let t = $t;
        let t = match t.dtype() {
            DType::F32 => t,
            _ => t.cast(FloatDType::F32),
        };
        let mut prim = t.into_primitive().tensor();
        prim.dtype = DType::I32;
        burn::tensor::Tensor::from_primitive(prim)
    }};
}

/// [`super::Compute::obs_sweep`] on a cube backend: the kernel of
/// `exec::kernels` on the tensors' own buffers, when every one is
/// contiguous f32.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
macro_rules! cube_obs_sweep {
    ($w:expr, $row0:expr, $hinv1:expr, $prune:expr, $nm:expr) => {{
        use burn::tensor::{DType, Tensor, TensorPrimitive};
        let (w, row0, hinv1, prune, nm) = ($w, $row0, $hinv1, $prune, $nm);
        let [rows, out] = w.dims();
        let [count, _] = hinv1.dims();
        let device = w.device();
        let mask = match prune {
            Some(p) => p.clone().float(),
            None => Tensor::zeros([1, 1], &device),
        };
        let err = Tensor::<Self, 2>::empty([count, out], &device);
        let f32s = [&w, hinv1, &mask, &err]
            .iter()
            .all(|t| t.dtype() == DType::F32);
        let wp = w.into_primitive().tensor();
        let hp = hinv1.clone().into_primitive().tensor();
        let mp = mask.into_primitive().tensor();
        let ep = err.into_primitive().tensor();
        let contiguous = [&wp, &hp, &mp, &ep].iter().all(|t| t.is_contiguous());
        if !f32s || !contiguous || row0 + count > rows {
            return Err(Tensor::from_primitive(TensorPrimitive::Float(wp)));
        }
        let mask_len = mp.meta.num_elements();
        crate::exec::kernels::launch_obs_sweep(
            &wp.client,
            (wp.handle.clone(), rows * out),
            (hp.handle.clone(), count * count),
            (mp.handle.clone(), mask_len),
            (ep.handle.clone(), count * out),
            row0,
            out,
            count,
            nm,
        );
        Ok((
            Tensor::from_primitive(TensorPrimitive::Float(wp)),
            Tensor::from_primitive(TensorPrimitive::Float(ep)),
        ))
    }};
}

/// [`super::Compute::smallest_per_column`] on a cube backend: the kernel
/// of `exec::kernels` on the keys' own buffer (read in its layout, `[in,
/// out]` or its transpose), the flags into a new contiguous i32 tensor.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
macro_rules! cube_smallest_per_column {
    ($keys:expr, $k:expr) => {{
        use burn::tensor::{DType, Int, Tensor};
        let (keys, k) = ($keys, $k);
        let [rows, cols] = keys.dims();
        let device = keys.device();
        let prim = keys.into_primitive();
        let strides = {
            let s = prim.meta.strides();
            (s[0], s[1])
        };
        let laid_out = strides == (cols, 1) || strides == (1, rows);
        let fits = rows < i32::MAX as usize && rows * cols < u32::MAX as usize;
        if prim.dtype != DType::I32
            || !laid_out
            || !prim.is_contiguous_buffer()
            || !fits
            || k == 0
            || k >= rows
        {
            return Err(Tensor::from_primitive(prim));
        }
        let flags = Tensor::<Self, 2, Int>::empty([rows, cols], &device);
        let fp = flags.into_primitive();
        if fp.dtype != DType::I32 || !fp.is_contiguous() {
            return Err(Tensor::from_primitive(prim));
        }
        crate::exec::kernels::launch_smallest_per_column(
            &prim.client,
            (prim.handle.clone(), rows * cols),
            fp.handle.clone(),
            rows,
            cols,
            strides,
            k,
        );
        Ok(Tensor::<Self, 2, Int>::from_primitive(fp).equal_elem(1))
    }};
}

/// [`super::Compute::kth_smallest`] on a cube backend: the kernel of
/// `exec::kernels` over the keys' whole buffer (any layout).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
macro_rules! cube_kth_smallest {
    ($keys:expr, $k:expr) => {{
        use burn::tensor::{DType, Int, Tensor};
        let (keys, k) = ($keys, $k);
        let [rows, cols] = keys.dims();
        let len = rows * cols;
        let prim = keys.clone().into_primitive();
        if prim.dtype != DType::I32
            || !prim.is_contiguous_buffer()
            || k == 0
            || k > len
            || len >= u32::MAX as usize
        {
            return None;
        }
        let out = Tensor::<Self, 2, Int>::empty([1, 1], &keys.device());
        let op = out.into_primitive();
        if op.dtype != DType::I32 {
            return None;
        }
        crate::exec::kernels::launch_kth_smallest(
            &prim.client,
            prim.handle.clone(),
            op.handle.clone(),
            len,
            k,
        );
        Some(Tensor::<Self, 2, Int>::from_primitive(op))
    }};
}

/// [`super::Compute::row_nll`] on a cube backend: the kernel of
/// `exec::kernels` for the logits' dtype (f32, f16, bf16), on contiguous
/// buffers, one cube per row.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
macro_rules! cube_row_nll {
    ($runtime:ty, $logits:expr, $targets:expr, $skip:expr) => {{
        use burn::tensor::{DType, Tensor, TensorPrimitive};
        let (logits, targets, skip) = ($logits, $targets, $skip);
        let [rows, vocab] = logits.dims();
        let device = logits.device();
        let nll = Tensor::<Self, 1>::empty([rows], &device);
        let lp = logits.into_primitive().tensor();
        let tp = targets.into_primitive();
        let np = nll.into_primitive().tensor();
        let ok = lp.is_contiguous()
            && tp.is_contiguous()
            && np.is_contiguous()
            && tp.dtype == DType::I32
            && np.dtype == DType::F32
            && rows <= 65_535
            && rows * vocab < u32::MAX as usize;
        let give_back = |lp, tp| {
            Err((
                Tensor::from_primitive(TensorPrimitive::Float(lp)),
                Tensor::from_primitive(tp),
            ))
        };
        if !ok {
            return give_back(lp, tp);
        }
        let launch = match lp.dtype {
            DType::F32 => crate::exec::kernels::launch_row_nll::<$runtime, f32>,
            DType::F16 => crate::exec::kernels::launch_row_nll::<$runtime, half::f16>,
            DType::BF16 => crate::exec::kernels::launch_row_nll::<$runtime, half::bf16>,
            _ => return give_back(lp, tp),
        };
        launch(
            &lp.client,
            lp.handle.clone(),
            tp.handle.clone(),
            np.handle.clone(),
            rows,
            vocab,
            skip,
        );
        Ok(Tensor::from_primitive(TensorPrimitive::Float(np)))
    }};
}

/// The `Compute` of a cubecl backend: wgpu and CUDA share one body (the
/// device kernels of `exec::kernels`, the in-place bit view, the watched
/// linear), differing only in their runtime.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
macro_rules! cube_compute {
    ($backend:ty, $runtime:ty, $cuda:expr) => {
        impl super::Compute for $backend {
            fn obs_sweep(
                w: burn::tensor::Tensor<Self, 2>,
                row0: usize,
                hinv1: &burn::tensor::Tensor<Self, 2>,
                prune: Option<&burn::tensor::Tensor<Self, 2, burn::tensor::Bool>>,
                nm: Option<(usize, usize)>,
            ) -> Result<
                (burn::tensor::Tensor<Self, 2>, burn::tensor::Tensor<Self, 2>),
                burn::tensor::Tensor<Self, 2>,
            > {
                cube_obs_sweep!(w, row0, hinv1, prune, nm)
            }

            fn smallest_per_column(
                keys: burn::tensor::Tensor<Self, 2, burn::tensor::Int>,
                k: usize,
            ) -> Result<
                burn::tensor::Tensor<Self, 2, burn::tensor::Bool>,
                burn::tensor::Tensor<Self, 2, burn::tensor::Int>,
            > {
                cube_smallest_per_column!(keys, k)
            }

            fn kth_smallest(
                keys: &burn::tensor::Tensor<Self, 2, burn::tensor::Int>,
                k: usize,
            ) -> Option<burn::tensor::Tensor<Self, 2, burn::tensor::Int>> {
                cube_kth_smallest!(keys, k)
            }

            fn row_nll(
                logits: burn::tensor::Tensor<Self, 2>,
                targets: burn::tensor::Tensor<Self, 1, burn::tensor::Int>,
                skip: usize,
            ) -> Result<
                burn::tensor::Tensor<Self, 1>,
                (
                    burn::tensor::Tensor<Self, 2>,
                    burn::tensor::Tensor<Self, 1, burn::tensor::Int>,
                ),
            > {
                cube_row_nll!($runtime, logits, targets, skip)
            }

            fn is_device() -> bool {
                true
            }

            fn float_bits<const D: usize>(
                t: burn::tensor::Tensor<Self, D>,
            ) -> burn::tensor::Tensor<Self, D, burn::tensor::Int> {
                cube_float_bits!(t)
            }

            fn max_buffer(device: &Self::Device) -> Option<u64> {
                cube_max_buffer::<$runtime>(device)
            }

            fn linear(
                linear: &burn::nn::Linear<Self>,
                x: burn::tensor::Tensor<Self, 3>,
            ) -> burn::tensor::Tensor<Self, 3> {
                cube_linear!($runtime, $cuda, linear, x)
            }
        }
    };
}

#[cfg(feature = "wgpu")]
cube_compute!(Wgpu, burn::backend::wgpu::WgpuRuntime, false);
#[cfg(feature = "cuda")]
cube_compute!(Cuda, burn::cubecl::cuda::CudaRuntime, true);

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
    let previous: Arc<Box<dyn Fn(&std::panic::PanicHookInfo<'_>) + Send + Sync>> =
        Arc::new(std::panic::take_hook());
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
