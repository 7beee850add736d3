//! Host tensors onto the device: the one door the large uploads take (a
//! streamed layer's linears, a layer kept in host memory, the head's
//! table, a batch's hidden states). Burn's `from_data` by default; with
//! `PRUNEMEM_UPLOAD=pinned`, the backend's staged copy through page-locked
//! memory (`exec::staged`, on CUDA `exec::pinned`), each request counted
//! in `device_kernels.pinned_upload` as taken or handed back to
//! `from_data` (wgpu has no such copy: every request is handed back).
//!
//! Burn's path stays the default until a GPU has timed both
//! (`examples/upload_rate.rs`).

use std::borrow::Cow;

use burn::prelude::*;

use super::Compute;
use super::tally::{self, Kernel};

/// Whether uploads go through page-locked staging
/// (`PRUNEMEM_UPLOAD=pinned`).
pub fn pinned() -> bool {
    static PINNED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PINNED.get_or_init(|| std::env::var("PRUNEMEM_UPLOAD").is_ok_and(|v| v == "pinned"))
}

/// The plan's `upload` setting.
pub fn name() -> &'static str {
    if pinned() { "pinned" } else { "burn" }
}

/// `data` on `device` in its own dtype: through the backend's staged copy
/// where [`pinned`] asks for it and the backend takes it, else Burn's
/// `from_data` (which needs the values owned: a borrowed `data` is copied
/// only then).
pub fn tensor<B: Compute, const D: usize>(
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
