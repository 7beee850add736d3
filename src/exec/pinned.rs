//! CUDA uploads and reads through two page-locked staging buffers on a
//! stream of prunemem's own (`exec::staged` is the plan and the loops;
//! this is its [`Link`] on the driver). cubecl 0.10 has no entry point
//! that takes page-locked memory, so an upload's tensor is allocated in
//! cubecl's pool as an empty tensor of the right shape, and its bytes are
//! written to (or, for a read, taken from) the buffer's address with the
//! driver's copies.
//!
//! Ordering with cubecl's own stream: the buffer may be memory a freed
//! tensor held, which kernels already queued on cubecl's stream may still
//! read, and a tensor being read may still be being written, so the
//! computing thread waits for that stream first (Burn's `sync`); the
//! copies are complete before the tensor or the values are handed back,
//! so every kernel queued after sees an upload's values. cubecl's own
//! pageable copies wait for the stream too (the driver's rule for
//! pageable memory).
//!
//! One link per computing thread, made on its first upload: the device's
//! primary context (cubecl's own), a non-blocking stream, two buffers of
//! [`CHUNK`] bytes, and an event per buffer. It lives as long as the
//! process and is never torn down: a thread-local destructor would call
//! the driver while the process exits, after cubecl may have released the
//! context (the operating system frees page-locked memory at exit).

use std::cell::RefCell;

use burn::backend::cuda::CudaDevice;
use burn::prelude::*;
use burn::tensor::TensorPrimitive;
use cudarc::driver::{result, sys};

use super::backends::Cuda;
use super::staged::{self, Link, Piece};

/// Bytes of each staging buffer: two of them are the page-locked host
/// memory a run adds (64 MiB).
pub const CHUNK: usize = 32 << 20;

struct CudaLink {
    ordinal: usize,
    stream: sys::CUstream,
    buffers: [*mut u8; 2],
    events: [sys::CUevent; 2],
    queued: [bool; 2],
    /// The device address of the tensor being written or read.
    device: sys::CUdeviceptr,
}

fn err(what: &str, e: result::DriverError) -> String {
    format!("{what}: {e:?}")
}

impl CudaLink {
    fn open(ordinal: usize) -> Result<Self, String> {
        // SAFETY: the device comes from `device::get`; the primary context
        // is the one cubecl retained for it, made current on this thread.
        unsafe {
            result::init().map_err(|e| err("cuInit", e))?;
            let dev = result::device::get(ordinal as i32).map_err(|e| err("cuDeviceGet", e))?;
            let ctx =
                result::primary_ctx::retain(dev).map_err(|e| err("retaining the context", e))?;
            result::ctx::set_current(ctx).map_err(|e| err("cuCtxSetCurrent", e))?;
            let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
                .map_err(|e| err("cuStreamCreate", e))?;
            let mut buffers = [std::ptr::null_mut(); 2];
            for b in &mut buffers {
                *b =
                    result::malloc_host(CHUNK, 0).map_err(|e| err("cuMemHostAlloc", e))? as *mut u8;
            }
            let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING;
            let events = [
                result::event::create(flags).map_err(|e| err("cuEventCreate", e))?,
                result::event::create(flags).map_err(|e| err("cuEventCreate", e))?,
            ];
            Ok(Self {
                ordinal,
                stream,
                buffers,
                events,
                queued: [false; 2],
                device: 0,
            })
        }
    }

    /// Queues the copy of piece `p` between staging buffer `k` and the
    /// tensor: to the device (`up`) or from it. Rows at the device's pitch
    /// take a 2D copy.
    ///
    /// # Safety
    /// Staging buffer `k` and the piece's range of the tensor's buffer
    /// stay valid and untouched until the copy is done.
    unsafe fn copy(&self, k: usize, p: &Piece, up: bool) -> Result<(), result::DriverError> {
        use sys::CUmemorytype::{CU_MEMORYTYPE_DEVICE as DEVICE, CU_MEMORYTYPE_HOST as HOST};
        let host = self.buffers[k] as *mut std::ffi::c_void;
        let device = self.device + p.device as u64;
        unsafe {
            if p.height == 1 {
                return match up {
                    true => sys::cuMemcpyHtoDAsync_v2(device, host, p.width, self.stream),
                    false => sys::cuMemcpyDtoHAsync_v2(host, device, p.width, self.stream),
                }
                .result();
            }
            let mut copy = sys::CUDA_MEMCPY2D {
                srcXInBytes: 0,
                srcY: 0,
                srcMemoryType: HOST,
                srcHost: std::ptr::null(),
                srcDevice: 0,
                srcArray: std::ptr::null_mut(),
                srcPitch: 0,
                dstXInBytes: 0,
                dstY: 0,
                dstMemoryType: HOST,
                dstHost: std::ptr::null_mut(),
                dstDevice: 0,
                dstArray: std::ptr::null_mut(),
                dstPitch: 0,
                WidthInBytes: p.width,
                Height: p.height,
            };
            if up {
                (copy.srcHost, copy.srcPitch) = (host, p.width);
                (copy.dstMemoryType, copy.dstDevice, copy.dstPitch) =
                    (DEVICE, device, p.device_pitch);
            } else {
                (copy.srcMemoryType, copy.srcDevice, copy.srcPitch) =
                    (DEVICE, device, p.device_pitch);
                (copy.dstHost, copy.dstPitch) = (host, p.width);
            }
            sys::cuMemcpy2DAsync_v2(&copy, self.stream).result()
        }
    }

    /// Marks staging buffer `k` busy until the copy just queued is done.
    fn record(&mut self, k: usize) -> Result<(), String> {
        // SAFETY: this link's event and stream.
        unsafe { result::event::record(self.events[k], self.stream) }
            .map_err(|e| err("cuEventRecord", e))?;
        self.queued[k] = true;
        Ok(())
    }
}

impl Link for CudaLink {
    fn chunk(&self) -> usize {
        CHUNK
    }

    fn wait(&mut self, k: usize) -> Result<(), String> {
        if std::mem::take(&mut self.queued[k]) {
            // SAFETY: the event was created by this link and recorded on
            // its stream.
            unsafe { result::event::synchronize(self.events[k]) }
                .map_err(|e| err("cuEventSynchronize", e))?;
        }
        Ok(())
    }

    fn staging(&mut self, k: usize) -> &mut [u8] {
        // SAFETY: `CHUNK` bytes of page-locked memory this link allocated;
        // `wait(k)` came first, so no copy reads or writes them.
        unsafe { std::slice::from_raw_parts_mut(self.buffers[k], CHUNK) }
    }

    fn send(&mut self, k: usize, p: &Piece) -> Result<(), String> {
        // SAFETY: staging buffer `k` holds the piece's bytes
        // (`staged::send` filled them), the device range lies in the
        // tensor's buffer (its rows at their pitch), and both outlive the
        // copy: the buffer is not refilled before its event, the tensor
        // not handed back before `finish`.
        unsafe { self.copy(k, p, true) }.map_err(|e| err("copying to the device", e))?;
        self.record(k)
    }

    fn fetch(&mut self, k: usize, p: &Piece) -> Result<(), String> {
        // SAFETY: as `send`, the other way: staging buffer `k` is not read
        // before its event, the tensor is alive until `finish`.
        unsafe { self.copy(k, p, false) }.map_err(|e| err("copying from the device", e))?;
        self.record(k)
    }

    fn finish(&mut self) -> Result<(), String> {
        self.queued = [false; 2];
        // SAFETY: this link's stream.
        unsafe { result::stream::synchronize(self.stream) }
            .map_err(|e| err("cuStreamSynchronize", e))
    }
}

thread_local! {
    static LINK: RefCell<Option<CudaLink>> = const { RefCell::new(None) };
}

/// Runs `transfer` with this thread's link aimed at `prim`'s buffer (its
/// rows and their pitch), after cubecl's stream has finished what it had
/// queued: the kernels that wrote the tensor, or that still read the
/// memory's last tenant.
fn with_link(
    prim: &burn::tensor::ops::FloatTensor<Cuda>,
    transfer: impl FnOnce(staged::Rows, &mut CudaLink) -> Result<(), String>,
) -> Result<(), String> {
    let layout = staged::Rows::of(prim.meta.shape(), prim.meta.strides(), prim.dtype.size())
        .ok_or_else(|| format!("a layout of strides {:?}", &prim.meta.strides()[..]))?;
    let resource = prim
        .client
        .get_resource(prim.handle.clone())
        .map_err(|e| format!("the buffer's address: {e:?}"))?;
    <Cuda as burn::tensor::backend::Backend>::sync(&prim.device)
        .map_err(|e| format!("waiting for cubecl's stream: {e:?}"))?;
    let done = LINK.with_borrow_mut(|slot| {
        if slot.as_ref().is_none_or(|l| l.ordinal != prim.device.index) {
            *slot = Some(CudaLink::open(prim.device.index)?);
        }
        let link = slot.as_mut().expect("opened above");
        link.device = resource.resource().ptr;
        transfer(layout, link)
    });
    drop(resource);
    done
}

/// `data` (a float tensor's values) as a tensor on `device`, its bytes
/// sent through this thread's link: `Err` says why not, and nothing is
/// left allocated (the caller takes Burn's `from_data` instead).
pub fn upload<const D: usize>(
    data: &TensorData,
    device: &CudaDevice,
) -> Result<Tensor<Cuda, D>, String> {
    if !data.dtype.is_float() || data.shape.len() != D {
        return Err(format!("{:?} of rank {}", data.dtype, data.shape.len()));
    }
    let t = Tensor::<Cuda, D>::empty(data.shape.clone(), (device, data.dtype));
    let prim = t.into_primitive().tensor();
    with_link(&prim, |layout, link| {
        staged::send(&data.bytes, layout, link)
    })?;
    Ok(Tensor::from_primitive(TensorPrimitive::Float(prim)))
}

/// `t`'s values on the host, received through this thread's link: `Err`
/// says why not (a view that is not rows at one pitch, such as a
/// transposed one), and the caller reads it with Burn's `into_data`.
pub fn download<const D: usize>(t: &Tensor<Cuda, D>) -> Result<TensorData, String> {
    let prim = t.clone().into_primitive().tensor();
    let shape = prim.meta.shape().to_vec();
    let n: usize = shape.iter().product();
    macro_rules! receive {
        ($elem:ty) => {{
            let mut values = bytemuck::allocation::zeroed_vec::<$elem>(n);
            let bytes = bytemuck::cast_slice_mut(&mut values);
            with_link(&prim, |layout, link| staged::receive(bytes, layout, link))?;
            TensorData::new(values, shape)
        }};
    }
    Ok(match prim.dtype {
        burn::tensor::DType::F32 => receive!(f32),
        burn::tensor::DType::F16 => receive!(half::f16),
        burn::tensor::DType::BF16 => receive!(half::bf16),
        other => return Err(format!("{other:?} values")),
    })
}
