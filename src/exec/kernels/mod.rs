//! prunemem's own cubecl kernels, for the device backends (the CPU's own
//! kernels are `model::host`'s). Each replaces a sequence of Burn ops whose
//! launches, not arithmetic, dominated an H100's time (cubecl's per-kernel
//! profile in docs/gpu.md): SparseGPT's sweep, the per-output selection's
//! bisection and the per-matrix threshold's (both now radix selects), the
//! evaluation's log-softmax over the vocabulary; and the N:M selection,
//! whose ops kept 27–43 bytes per weight reserved; and the MLP's
//! `silu(gate) · up`, whose ops kept an f32 copy of the gate; and Wanda's
//! column norms, whose ops kept an f32 copy of the input and its square;
//! and the RMS norm, whose ops kept an f32 copy of the batch and its
//! square; and DSnoT's swap loop, whose ops took about a hundred launches
//! a cycle; and RIA's channel reallocation's input sums and assignment
//! scores, summed in the host's order.

// cubecl's language declares a branch's variable before assigning it in
// every arm; rustc sees the first value unread.
#![allow(unused_assignments)]

#[cfg(all(test, feature = "wgpu"))]
mod cuda_source;
mod dsnot;
mod dsnot_launch;
mod group;
mod nll;
mod obs_sweep;
mod realloc;
mod rms_norm;
mod select;
mod squares;
mod swiglu;
mod variant;

/// Cubes along x before a launch adds rows of cubes along y (wgpu allows
/// 65 535 per dimension).
const MAX_X: u32 = 65_535;

/// The cube count of a launch of `units` units, `per_cube` to a cube:
/// along x up to [`MAX_X`], then rows of them along y (a kernel's unit
/// is `(CUBE_POS_Y · CUBE_COUNT_X + CUBE_POS_X) · per_cube + UNIT_POS`).
fn grid(units: usize, per_cube: u32) -> cubecl::prelude::CubeCount {
    let cubes = units.div_ceil(per_cube as usize) as u32;
    cubecl::prelude::CubeCount::Static(cubes.min(MAX_X), cubes.div_ceil(MAX_X), 1)
}

pub use dsnot_launch::{Buf, SwapBuffers, SwapShape, launch_dsnot_nm, launch_dsnot_unstructured};
pub use group::launch_smallest_per_group;
pub use nll::launch_row_nll;
pub use obs_sweep::launch_obs_sweep;
pub use realloc::{
    MAX_M as REALLOC_MAX_M, launch_nm_kept_sums, launch_ordered_row_sums, launch_slot_scores,
};
pub use rms_norm::launch_rms_norm;
pub use select::{launch_kth_smallest, launch_smallest_per_column, takes_selection_cubes};
pub use squares::{launch_column_squares, slabs as square_slabs};
pub use swiglu::{launch_swiglu, launch_swiglu_in_place};
pub use variant::{PrefixBuffers, launch_variant_prefix, launch_variant_rows};
