//! The decoder's RMS normalisation in one launch: each row of `[rows, d]`
//! activations in the compute dtype becomes `x / sqrt(mean(x²) + eps)`,
//! computed in f32 registers, rounded to the compute dtype, then times the
//! norm's weight (transformers' `LlamaRMSNorm`: the normed value is cast
//! back before the weight multiplies it). With Burn's ops an f16 run made
//! an f32 copy of the batch, its square and a per-token mean: cubecl's
//! pool kept two `tokens × hidden × 4` pages for them in every pass and at
//! the evaluation's head (0.5 GiB at a 7B shape with 2048-token windows in
//! batches of 8).
//!
//! A cube of 256 units takes a row at a time (striding over the rows past
//! the grid): the units read adjacent addresses, and their partial sums of
//! squares meet in shared memory.

use cubecl::prelude::*;

use super::nll::combine;

/// Units per row.
pub(super) const UNITS: u32 = 256;
/// At most this many cubes (CUDA's and Vulkan's grid limit in x).
const MAX_CUBES: usize = 65_535;

/// `out[r, i] = round(x[r, i] · inv_r) · weight[i]`, `inv_r = 1 /
/// sqrt(Σ_i x[r, i]² / d + eps)` in f32, for the contiguous `[rows, d]`
/// `x` and `out`.
#[cube(launch_unchecked)]
pub(super) fn rms_norm<F: Float>(
    x: &Array<F>,
    weight: &Array<F>,
    out: &mut Array<F>,
    rows: u32,
    d: u32,
    eps: f32,
) {
    let mut partial = SharedMemory::<f32>::new(UNITS as usize);
    let width = d as usize;
    let mut row = CUBE_POS_X as usize;
    // The row is the cube's: the loop and `combine` stay uniform.
    while row < rows as usize {
        let base = row * width;
        let mut i = UNIT_POS as usize;
        let mut squares = f32::new(0.0);
        while i < width {
            let v = f32::cast_from(x[base + i]);
            squares += v * v;
            i += UNITS as usize;
        }
        let total = combine(&mut partial, squares, false);
        let inv = f32::new(1.0) / f32::sqrt(total / f32::cast_from(d) + eps);
        i = UNIT_POS as usize;
        while i < width {
            let normed = F::cast_from(f32::cast_from(x[base + i]) * inv);
            out[base + i] = normed * weight[i];
            i += UNITS as usize;
        }
        row += CUBE_COUNT_X as usize;
    }
}

/// Launches [`rms_norm`] for element type `F`: `x` and `out` are the
/// buffers of contiguous `[rows, d]` tensors (`rows · d < u32::MAX`),
/// `weight` of `d` values of the same type.
pub fn launch_rms_norm<R: Runtime, F: Float + CubeElement>(
    client: &ComputeClient<R>,
    x: cubecl::server::Handle,
    weight: cubecl::server::Handle,
    out: cubecl::server::Handle,
    rows: usize,
    d: usize,
    eps: f32,
) {
    let cubes = rows.clamp(1, MAX_CUBES) as u32;
    // SAFETY: the cube of row r reads `x[r · d .. (r + 1) · d]` and
    // `weight[..d]` and writes `out[r · d .. (r + 1) · d]` only, rows
    // below `rows`; the buffers hold `rows · d`, `d` and `rows · d`
    // elements and `out` aliases neither input.
    unsafe {
        rms_norm::launch_unchecked::<F, R>(
            client,
            CubeCount::Static(cubes, 1, 1),
            CubeDim::new_1d(UNITS),
            ArrayArg::from_raw_parts(x, rows * d),
            ArrayArg::from_raw_parts(weight, d),
            ArrayArg::from_raw_parts(out, rows * d),
            rows as u32,
            d as u32,
            eps,
        );
    }
}
