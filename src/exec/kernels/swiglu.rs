//! The MLP's gate in one launch: `silu(gate) · up`, element by element,
//! in f32 registers, written in the compute dtype. With Burn's ops an f16
//! run took the sigmoid through an f32 copy of `gate`: cubecl's pool kept
//! a `tokens × intermediate × 4` page for it in every pass without a
//! statistic over the down projection's input (the output pass, the
//! evaluation, magnitude), 110 KiB of the 96-wide fixture's 793 KiB
//! reserve and 0.7 GB at a 7B shape with 2048-token windows in batches of
//! 8. On lavapipe it is also closer to the exact value than Burn's ops
//! (`tests/device/`: 4.7 against 11.8 f32 units, 0.5 against 1.4 f16
//! units). Where the gate's buffer is the gate's alone (the gate
//! projection's fresh output), the product is written over it
//! ([`launch_swiglu_in_place`]): the pool then holds two
//! `tokens × intermediate` pages at the MLP instead of three.

use cubecl::prelude::*;

/// Units per cube.
pub(super) const UNITS: u32 = 256;
/// At most this many cubes; each unit then strides over the rest.
const MAX_CUBES: u32 = 4096;

/// `g / (1 + exp(-g)) · u` in f32 registers, rounded once into `F` (the
/// CPU kernel's formula, `model::cpu_ops::swiglu_in_place`).
#[cube]
fn silu_times<F: Float>(g: F, u: F) -> F {
    let g = f32::cast_from(g);
    let e = f32::exp(f32::new(0.0) - g);
    F::cast_from(g / (f32::new(1.0) + e) * f32::cast_from(u))
}

/// `out[i] = silu(gate[i]) · up[i]` for `i < n`.
#[cube(launch_unchecked)]
pub(super) fn swiglu<F: Float>(gate: &Array<F>, up: &Array<F>, out: &mut Array<F>, n: u32) {
    let stride = CUBE_COUNT_X as usize * UNITS as usize;
    let mut i = CUBE_POS_X as usize * UNITS as usize + UNIT_POS as usize;
    while i < n as usize {
        out[i] = silu_times::<F>(gate[i], up[i]);
        i += stride;
    }
}

/// `gate[i] = silu(gate[i]) · up[i]`: [`swiglu`] written over its gate
/// (each unit reads its element before it writes it).
#[cube(launch_unchecked)]
pub(super) fn swiglu_in_place<F: Float>(gate: &mut Array<F>, up: &Array<F>, n: u32) {
    let stride = CUBE_COUNT_X as usize * UNITS as usize;
    let mut i = CUBE_POS_X as usize * UNITS as usize + UNIT_POS as usize;
    while i < n as usize {
        gate[i] = silu_times::<F>(gate[i], up[i]);
        i += stride;
    }
}

fn cubes(n: usize) -> CubeCount {
    CubeCount::Static(
        (n.div_ceil(UNITS as usize) as u32).clamp(1, MAX_CUBES),
        1,
        1,
    )
}

/// Launches [`swiglu_in_place`] for element type `F`: `gate` (written
/// over, held by no other tensor) and `up` are the buffers of contiguous
/// tensors of `n` elements (`n < u32::MAX`).
pub fn launch_swiglu_in_place<R: Runtime, F: Float + CubeElement>(
    client: &ComputeClient<R>,
    gate: cubecl::server::Handle,
    up: cubecl::server::Handle,
    n: usize,
) {
    // SAFETY: unit `p` of the grid touches only indices `p, p + stride,
    // ...` below `n`, reading each before writing it; both buffers hold
    // `n` elements and are distinct tensors' (the caller's check that the
    // gate's handle is unshared).
    unsafe {
        swiglu_in_place::launch_unchecked::<F, R>(
            client,
            cubes(n),
            CubeDim::new_1d(UNITS),
            ArrayArg::from_raw_parts(gate, n),
            ArrayArg::from_raw_parts(up, n),
            n as u32,
        );
    }
}

/// Launches [`swiglu`] for element type `F`: `gate`, `up` and `out` are
/// the buffers of contiguous tensors of `n` elements (`n < u32::MAX`).
pub fn launch_swiglu<R: Runtime, F: Float + CubeElement>(
    client: &ComputeClient<R>,
    gate: cubecl::server::Handle,
    up: cubecl::server::Handle,
    out: cubecl::server::Handle,
    n: usize,
) {
    // SAFETY: unit `p` of the grid touches only indices `p, p + stride,
    // ...` below `n`; the three buffers hold `n` elements each and `out`
    // aliases neither input.
    unsafe {
        swiglu::launch_unchecked::<F, R>(
            client,
            cubes(n),
            CubeDim::new_1d(UNITS),
            ArrayArg::from_raw_parts(gate, n),
            ArrayArg::from_raw_parts(up, n),
            ArrayArg::from_raw_parts(out, n),
            n as u32,
        );
    }
}
