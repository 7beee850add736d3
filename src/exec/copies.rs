//! Host tensors onto the device and back: the one door the large copies
//! take. Up: a streamed layer's linears, a layer kept in host memory, the
//! head's table, a batch's hidden states. Down: a pruned layer kept in
//! host memory, a pruned weight written by `--save`. Burn's `from_data` and
//! `into_data`, or the backend's staged copies through page-locked memory
//! (`exec::staged`, on CUDA `exec::pinned`), each request counted in
//! `device_kernels` (`pinned_upload`, `pinned_download`) as taken or handed
//! back to Burn's (wgpu has no such copy: every request is handed back).
//!
//! Staged uploads are CUDA's default since an H200 timed them with the
//! stored layout and the head's strategy (`exec::defaults`); staged
//! downloads have not run on a GPU and stay opt-in.
//! `PRUNEMEM_TRANSFERS=burn` takes Burn's copies both ways, `=pinned` the
//! staged ones both ways on any device.
//!
//! The small copies (indices up, a result back) go through Burn's, counted
//! in `transfers` on a device: [`ints_to_device`], [`f32s_to_host`].

use std::borrow::Cow;

use burn::prelude::*;

use super::Compute;
use super::tally::{self, Kernel};

/// `PRUNEMEM_TRANSFERS`: `pinned` or `burn`, `None` when unset.
static ENV: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();

fn env_or(measured: impl FnOnce() -> bool) -> bool {
    super::defaults::env_or(&ENV, "PRUNEMEM_TRANSFERS", &["burn", "pinned"], measured)
}

/// Whether the large uploads go through page-locked staging:
/// `PRUNEMEM_TRANSFERS=pinned` or `burn`, else the device's measured
/// default (`exec::defaults`: staged on CUDA, where an H200 took them).
pub fn pinned() -> bool {
    env_or(super::defaults::cuda)
}

/// Whether the large downloads (a pruned layer kept in host memory, a
/// weight `--save` writes) go through page-locked staging: only where
/// `PRUNEMEM_TRANSFERS=pinned` asks, since no GPU has run them yet (the
/// H200 run that made the uploads CUDA's default downloaded nothing large).
pub fn pinned_downloads() -> bool {
    env_or(|| false)
}

/// The plan's `transfers` setting: `pinned` (both ways), `pinned_uploads`
/// (CUDA's default) or `burn`.
pub fn name() -> &'static str {
    match (pinned(), pinned_downloads()) {
        (true, true) => "pinned",
        (true, false) => "pinned_uploads",
        _ => "burn",
    }
}

/// `data` on `device` in its own dtype: through the backend's staged copy
/// where [`pinned`] asks for it and the backend takes it, else Burn's
/// `from_data` (which needs the values owned: a borrowed `data` is copied
/// only then).
pub fn to_device<B: Compute, const D: usize>(
    data: Cow<'_, TensorData>,
    device: &B::Device,
) -> Tensor<B, D> {
    if B::is_device() && pinned() {
        let staged = B::staged_upload::<D>(&data, device);
        tally::count(Kernel::PinnedUpload, staged.is_ok());
        if let Ok(t) = staged {
            return t;
        }
    }
    let dtype = data.dtype;
    Tensor::from_data(data.into_owned(), (device, dtype))
}

/// `t`'s values on the host, in its dtype: through the backend's staged
/// copy where [`pinned_downloads`] asks for it and the backend takes it (a
/// view whose rows are not at one pitch, such as a transposed one, is not
/// taken), else Burn's `into_data`.
pub fn to_host<B: Compute, const D: usize>(t: Tensor<B, D>) -> TensorData {
    if B::is_device() && pinned_downloads() {
        let staged = B::staged_download(&t);
        tally::count(Kernel::PinnedDownload, staged.is_ok());
        if let Ok(data) = staged {
            return data;
        }
    }
    t.into_data()
}

/// Host integers on `device` in Burn's index type (4 bytes each counted up
/// on a device).
pub fn ints_to_device<B: Compute>(values: Vec<i64>, device: &B::Device) -> Tensor<B, 1, Int> {
    if B::is_device() {
        super::transfer::uploaded(values.len() as u64 * 4);
    }
    let n = values.len();
    Tensor::from_data(TensorData::new(values, [n]), device)
}

/// A small result's values on the host as f32 (counted on a device).
pub fn f32s_to_host<B: Compute, const D: usize>(x: Tensor<B, D>) -> Vec<f32> {
    let data = x.into_data();
    if B::is_device() {
        super::transfer::read_back(data.bytes.len() as u64);
    }
    data.convert_dtype(burn::tensor::DType::F32)
        .into_vec()
        .unwrap_or_default()
}
