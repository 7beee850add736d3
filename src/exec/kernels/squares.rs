//! Wanda's column norms straight from the activations: `Σ_rows x²` per
//! column of a `[rows, cols]` input in the compute dtype, summed in f32
//! registers. With Burn's ops an f16 input was first copied to f32 and
//! then squared (in slabs of rows): at the down projection's input that is
//! a `tokens × intermediate × 4` copy beside the f16 one, which cubecl's
//! pool kept reserved, with the squares' page, for the whole statistics
//! pass (1.3 GiB at a 7B shape with 2048-token windows in batches of 8).
//!
//! A cube of 256 units covers 256 adjacent columns (the units read
//! adjacent addresses of each row) over one slab of rows; the slabs'
//! partial sums (`[slabs, cols]` f32, at most 64 rows of them) are added
//! by a reduction after the launch.

use cubecl::prelude::*;

/// Columns per cube.
pub(super) const UNITS: u32 = 256;
/// Rows a slab walks at least (fewer slabs for short inputs).
const ROWS_PER_SLAB: usize = 256;
/// At most this many slabs: the partial sums stay small.
pub const MAX_SLABS: usize = 64;

/// `partial[slab, c] = Σ x[r, c]²` over the slab's rows `[slab · per_slab,
/// (slab + 1) · per_slab) ∩ [0, rows)`, in f32, for the contiguous
/// `[rows, cols]` `x`.
#[cube(launch_unchecked)]
pub(super) fn column_squares<F: Float>(
    x: &Array<F>,
    partial: &mut Array<f32>,
    rows: u32,
    cols: u32,
    per_slab: u32,
) {
    let col = CUBE_POS_X as usize * UNITS as usize + UNIT_POS as usize;
    let slab = CUBE_POS_Y as usize;
    let c = cols as usize;
    if col < c {
        let mut r = slab * per_slab as usize;
        let mut end = r + per_slab as usize;
        if end > rows as usize {
            end = rows as usize;
        }
        let mut acc = f32::new(0.0);
        while r < end {
            let v = f32::cast_from(x[r * c + col]);
            acc += v * v;
            r += 1;
        }
        partial[slab * c + col] = acc;
    }
}

/// How many slabs of rows [`launch_column_squares`] splits `rows` into
/// (the first dimension of its partial sums).
pub fn slabs(rows: usize) -> usize {
    rows.div_ceil(ROWS_PER_SLAB).clamp(1, MAX_SLABS)
}

/// Launches [`column_squares`] for element type `F` over the contiguous
/// `[rows, cols]` buffer `x` (`rows · cols < u32::MAX`, `rows > 0`), into
/// `partial`, the contiguous f32 buffer of `[slabs(rows), cols]`.
pub fn launch_column_squares<R: Runtime, F: Float + CubeElement>(
    client: &ComputeClient<R>,
    x: cubecl::server::Handle,
    partial: cubecl::server::Handle,
    rows: usize,
    cols: usize,
) {
    let slabs = slabs(rows);
    let per_slab = rows.div_ceil(slabs);
    // SAFETY: unit (column c, slab s) reads `x[r · cols + c]` for rows
    // `r < rows` and writes `partial[s · cols + c]` only, for `c < cols`
    // and `s < slabs`: inside both buffers, and no two units write the
    // same element.
    unsafe {
        column_squares::launch_unchecked::<F, R>(
            client,
            CubeCount::Static(cols.div_ceil(UNITS as usize) as u32, slabs as u32, 1),
            CubeDim::new_1d(UNITS),
            ArrayArg::from_raw_parts(x, rows * cols),
            ArrayArg::from_raw_parts(partial, slabs * cols),
            rows as u32,
            cols as u32,
            per_slab as u32,
        );
    }
}
