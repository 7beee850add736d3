//! The execution context: which Burn backend computes, on which device, and
//! the memory probe that belongs to that device. Chosen once by a job
//! (`--device`) and passed down, so that no engine picks a backend on its
//! own and Burn's CPU backend is named in one place ([`backends`]). The
//! process's rank in a distributed run is process-wide, as MPI's world is
//! ([`dist`]).
//!
//! Engines are generic over `B: Backend`; a job hands its device-specific
//! part to [`Exec::run`] as an [`OnDevice`] value, whose generic method is
//! instantiated once per compiled backend.

pub mod attention;
pub mod backends;
mod compute;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub mod cube;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[macro_use]
mod cube_float;
pub mod copies;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[macro_use]
mod cube_dsnot;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[macro_use]
mod cube_realloc;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[macro_use]
mod cube_select;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
#[macro_use]
mod cube_variant;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod cube_compute;
pub mod defaults;
pub mod dist;
pub mod kernel_cache;
#[cfg(any(feature = "wgpu", feature = "cuda"))]
mod kernels;
pub mod launch;
pub mod matmul;
#[cfg(feature = "mpi")]
mod mpi;
mod named;
#[cfg(feature = "cuda")]
mod pinned;
pub mod reduce;
mod spec;
pub mod staged;
pub mod swap_loop;
pub mod tally;
pub mod transfer;
pub mod variant;
pub mod watch;

use thiserror::Error;

use crate::memory::{DeviceProbe, HostHeapProbe};
pub use backends::{Cpu, CpuAutodiff};
pub use compute::Compute;
pub use spec::{DeviceSpec, WgpuSelect};

/// Where a device run keeps its compiled kernels between runs
/// (`cube::cache_place`); `Off` where nothing is kept, or where the build
/// has no device backend.
pub fn kernel_cache_place() -> kernel_cache::Place {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    return cube::cache_place();
    #[cfg(not(any(feature = "wgpu", feature = "cuda")))]
    kernel_cache::Place::Off
}

/// Why a device cannot be used.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum ExecError {
    #[error(
        "--device {device}: this build has no {feature} support; rebuild with `cargo build --release --features {feature}`"
    )]
    NotBuilt {
        device: String,
        feature: &'static str,
    },
    #[error("--device {device}: {reason}")]
    Unavailable { device: String, reason: String },
    #[error("--device {device}: {what} is not supported on this device ({hint})")]
    Unsupported {
        device: String,
        what: String,
        hint: String,
    },
    /// The device's runtime failed during the job (a panic inside cubecl,
    /// wgpu or the driver, caught on the computing thread).
    #[error("{}", failed_line(.device, .message, *.out_of_memory))]
    Failed {
        device: String,
        message: String,
        /// The driver refused an allocation.
        out_of_memory: bool,
    },
    /// A distributed launch that cannot go on (`mpirun` without the `mpi`
    /// feature, fewer windows than ranks...).
    #[error("{0}")]
    Distributed(String),
}

fn failed_line(device: &str, message: &str, out_of_memory: bool) -> String {
    match out_of_memory {
        true => format!(
            "out of device memory on {device}: the driver refused an allocation ({message})"
        ),
        false => format!("--device {device}: the device failed: {message}"),
    }
}

impl ExecError {
    /// A failure from the device's runtime, its first line kept.
    pub fn failed(device: &str, message: &str) -> Self {
        // cubecl's `BufferTooBig`: one tensor passes the device's largest
        // buffer (lavapipe: 128 MiB), whatever memory is free.
        if let Some(size) = message
            .strip_prefix("called `Result::unwrap()` on an `Err` value: ")
            .unwrap_or(message)
            .strip_prefix("can't allocate buffer of size: ")
            .and_then(|n| n.trim().parse::<u64>().ok())
        {
            return ExecError::Failed {
                device: device.to_string(),
                message: format!(
                    "one tensor of {} passes the device's largest buffer; a smaller --dtype (f16) or a device with larger buffers is needed",
                    crate::units::format_bytes(size)
                ),
                out_of_memory: false,
            };
        }
        let lower = message.to_lowercase();
        let out_of_memory = [
            "out of memory",
            "out-of-memory",
            "outofmemory",
            "failed to allocate",
        ]
        .iter()
        .any(|k| lower.contains(k));
        ExecError::Failed {
            device: device.to_string(),
            message: message.to_string(),
            out_of_memory,
        }
    }

    /// True when the driver refused an allocation.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(
            self,
            ExecError::Failed {
                out_of_memory: true,
                ..
            }
        )
    }
}

/// Gives every free buffer of the calling thread's device pool back to the
/// driver (cubecl's explicit cleanup; nothing on the CPU backend). The
/// engine calls it where a layer or a phase ends, so that what is reserved
/// follows what is in use (`exec::cube`).
pub fn release_free<B: burn::tensor::backend::Backend>(device: &B::Device) {
    B::memory_cleanup(device);
}

/// What a layer, a phase or an evaluation freed goes back: the host heap's
/// cached blocks (`memory::alloc::trim`) and the device pool's free buffers
/// ([`release_free`]). Where a step ends and the next would otherwise find
/// the process's resident set (or `nvidia-smi`'s figure) at the last one's
/// peak.
pub fn give_back<B: burn::tensor::backend::Backend>(device: &B::Device) {
    crate::memory::alloc::trim();
    release_free::<B>(device);
}

/// Watches the batches of one pass and gives the pool's free buffers back
/// when the batch shape changes (the shorter last batch, and the first
/// full one after it): cubecl's persistent pool reuses a freed buffer
/// only for a tensor of its own size, so otherwise the last batch's
/// buffers would be reserved beside the full batches' (`exec::cube`).
#[derive(Default)]
pub struct BatchShapes {
    last: Option<Vec<usize>>,
}

thread_local! {
    /// The last batch shape any pass on this thread (the computing one)
    /// ran, for a pass that follows another without an emptied pool.
    static LAST_SHAPE: std::cell::RefCell<Option<Vec<usize>>> =
        const { std::cell::RefCell::new(None) };
}

impl BatchShapes {
    /// A watch that starts from the shape the pass before it on this
    /// thread left its buffers for: the evaluation run inside the prune
    /// (`model::inline_eval`) follows a layer's output pass, whose
    /// batches may have another shape.
    pub fn after_last_pass() -> Self {
        Self {
            last: LAST_SHAPE.with_borrow(Clone::clone),
        }
    }

    /// Called before each batch with its dims.
    pub fn next<B: burn::tensor::backend::Backend>(&mut self, dims: &[usize], device: &B::Device) {
        if self.last.as_deref() == Some(dims) {
            return;
        }
        if self.last.is_some() {
            release_free::<B>(device);
        }
        self.last = Some(dims.to_vec());
        LAST_SHAPE.with_borrow_mut(|l| *l = Some(dims.to_vec()));
    }
}

/// A job's device-specific part, run on whichever backend the context
/// holds. `run` is instantiated once per compiled backend.
pub trait OnDevice {
    type Output;
    fn run<B: Compute>(self, device: &B::Device) -> Self::Output;
}

/// An opened device: its spec, its probe and a human-readable name (the
/// adapter's). Cheap to clone.
#[derive(Clone)]
pub struct Exec {
    spec: DeviceSpec,
    adapter: String,
    memory_cap: Option<u64>,
    opened: backends::Opened,
}

impl Exec {
    /// Opens `spec` on the calling thread, which must be the thread that
    /// computes (cubecl's memory pools are per thread). `memory_cap` is
    /// `--device-memory`: the device bytes a run may hold.
    pub fn open(spec: DeviceSpec, memory_cap: Option<u64>) -> Result<Self, ExecError> {
        let opened = backends::open(&spec)?;
        defaults::opened(matches!(spec, DeviceSpec::Cuda(_)), opened.has_tma());
        Ok(Self {
            adapter: opened.adapter_name(),
            spec,
            memory_cap,
            opened,
        })
    }

    /// Burn's CPU backend, the default.
    pub fn cpu() -> Self {
        Self::open(DeviceSpec::Cpu, None).expect("the CPU backend is always there")
    }

    pub fn spec(&self) -> &DeviceSpec {
        &self.spec
    }

    /// Device bytes the run may hold (`--device-memory`, or a CUDA card's
    /// memory); `None`: unknown.
    pub fn memory_cap(&self) -> Option<u64> {
        self.memory_cap
    }

    /// The adapter or driver's name for the device (`llvmpipe (LLVM 15…)`).
    pub fn adapter(&self) -> &str {
        &self.adapter
    }

    /// True for a GPU-style device (its own memory pool), false on the CPU.
    pub fn is_device(&self) -> bool {
        self.spec.is_device()
    }

    /// The memory probe of this device, for the profiler. On a device it
    /// reads the pool on the thread that called [`Exec::open`].
    pub fn probe(&self) -> Box<dyn DeviceProbe> {
        match self.opened.probe(&self.spec, self.memory_cap) {
            Some(p) => p,
            None => Box::new(HostHeapProbe),
        }
    }

    /// Runs `job` on this context's backend.
    pub fn run<J: OnDevice>(&self, job: J) -> J::Output {
        self.opened.run(job)
    }

    /// Runs `job` like [`Exec::run`]; on a device, a panic inside the
    /// device's runtime (an allocation the driver refused, a kernel that
    /// failed) ends the job as [`ExecError::Failed`] instead of unwinding
    /// through it, so the run can still end with its logs complete.
    pub fn run_caught<T, E, J>(&self, job: J) -> Result<T, E>
    where
        E: From<ExecError>,
        J: OnDevice<Output = Result<T, E>>,
    {
        if !self.is_device() {
            return self.run(job);
        }
        match backends::caught_on_this_thread(|| self.run(job)) {
            Ok(out) => out,
            Err(message) => Err(ExecError::failed(&self.spec.to_string(), &message).into()),
        }
    }

    /// Checks that a compute dtype (Burn's) is supported here (Vulkan has
    /// no bf16).
    pub fn check_dtype(&self, dtype: burn::tensor::DType) -> Result<(), ExecError> {
        if matches!(self.spec, DeviceSpec::Wgpu(_)) && dtype == burn::tensor::DType::BF16 {
            return Err(ExecError::Unsupported {
                device: self.spec.to_string(),
                what: "--dtype bf16".into(),
                hint: "wgpu's Vulkan path has no bf16: use --dtype f16 or f32".into(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_allocation_is_out_of_memory_and_other_failures_are_not() {
        let oom = ExecError::failed("wgpu", "An out-of-memory error happened during launch");
        assert!(oom.is_out_of_memory());
        assert!(
            oom.to_string().starts_with("out of device memory on wgpu"),
            "{oom}"
        );
        let cuda = ExecError::failed(
            "cuda:0",
            "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")",
        );
        assert!(cuda.is_out_of_memory());
        let big = ExecError::failed(
            "wgpu",
            "called `Result::unwrap()` on an `Err` value: can't allocate buffer of size: 150994944",
        );
        assert!(!big.is_out_of_memory());
        assert!(
            big.to_string()
                .contains("one tensor of 144.0 MiB passes the device's largest buffer"),
            "{big}"
        );
        let other = ExecError::failed("wgpu", "Validation Error: buffer size exceeds the limit");
        assert!(!other.is_out_of_memory());
        assert_eq!(
            other.to_string(),
            "--device wgpu: the device failed: Validation Error: buffer size exceeds the limit"
        );
    }

    #[test]
    fn a_panic_on_the_computing_thread_becomes_its_first_line() {
        let r: Result<(), String> =
            backends::caught_on_this_thread(|| panic!("first line\nsecond"));
        assert_eq!(r, Err("first line".to_string()));
        assert_eq!(backends::caught_on_this_thread(|| 7), Ok(7));
        // The previous hook is back: a later panic elsewhere still unwinds
        // and is caught by its own thread's join.
        assert!(std::thread::spawn(|| panic!("other")).join().is_err());
        // Outside the device's runtime, another thread's panic is its own.
        let r = backends::caught_on_this_thread(|| {
            std::thread::spawn(|| panic!("sink")).join().is_err()
        });
        assert_eq!(r, Ok(true));
    }

    #[test]
    fn cpu_context_uses_the_host_heap_probe() {
        let exec = Exec::cpu();
        assert!(!exec.is_device());
        assert!(exec.probe().is_host_heap());
        assert_eq!(exec.probe().name(), "cpu");
    }

    #[test]
    fn a_device_not_built_in_is_an_error_not_a_panic() {
        #[cfg(not(feature = "cuda"))]
        {
            let e = Exec::open(DeviceSpec::Cuda(0), None)
                .err()
                .expect("no cuda here");
            assert!(e.to_string().contains("--features cuda"), "{e}");
        }
        #[cfg(not(feature = "wgpu"))]
        {
            let e = Exec::open(DeviceSpec::Wgpu(WgpuSelect::Default), None)
                .err()
                .expect("no wgpu here");
            assert!(e.to_string().contains("--features wgpu"), "{e}");
        }
    }
}
