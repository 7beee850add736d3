//! The N:M selection in one launch: in every group of `m` consecutive rows
//! of a column of keys (the metric's f32 bit patterns), the `n` smallest,
//! ties to the lower row, as `prune::on_device::nm_mask` ranks them with
//! Burn's ops.
//!
//! Those ops compare each row of a group with every other through
//! tensors of the group's shape, each a new buffer of its own size: on
//! lavapipe a 2:4 selection kept 27 bytes per weight of the largest
//! linear reserved and a 4:8 one 43 (docs/gpu.md), against 10 for the
//! per-output kernel. Here one unit ranks one group of one column in
//! registers and writes its `m` flags; adjacent units take adjacent
//! columns, so loads coalesce on `[in, out]`, Burn's layout.

use cubecl::prelude::*;

/// Units per cube.
pub(super) const UNITS: u32 = 256;

/// `flags[r * cols + c]` (contiguous `[groups · m, cols]`) is 1 where key
/// `(r, c)` ranks below `n` in its group of `m` rows: the number of the
/// group's keys smaller than it plus the equal ones in rows before it.
/// `keys` is read at `r * row_stride + c * col_stride`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(super) fn smallest_per_group(
    keys: &Array<i32>,
    flags: &mut Array<i32>,
    groups: u32,
    cols: u32,
    row_stride: u32,
    col_stride: u32,
    n: u32,
    m: u32,
) {
    let cube = CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X;
    let id = (cube * UNITS + UNIT_POS) as usize;
    let c = cols as usize;
    if id < groups as usize * c {
        let column = id % c;
        let first = (id / c) * m as usize;
        let (rs, cs) = (row_stride as usize, col_stride as usize);
        for j in 0..m as usize {
            let kj = keys[(first + j) * rs + column * cs];
            let mut rank = 0u32;
            for i in 0..m as usize {
                let ki = keys[(first + i) * rs + column * cs];
                if ki < kj || (ki == kj && i < j) {
                    rank += 1u32;
                }
            }
            let mut flag = 0i32;
            if rank < n {
                flag = 1i32;
            }
            flags[(first + j) * c + column] = flag;
        }
    }
}

/// Launches [`smallest_per_group`]: `keys` is the buffer of an i32 tensor
/// of `keys_len` elements read at `(row_stride, col_stride)`, `flags` that
/// of a contiguous `[rows, cols]` i32 tensor; `rows` is a multiple of `m`
/// and `1 <= n < m`.
#[allow(clippy::too_many_arguments)]
pub fn launch_smallest_per_group<R: Runtime>(
    client: &ComputeClient<R>,
    keys: (cubecl::server::Handle, usize),
    flags: cubecl::server::Handle,
    rows: usize,
    cols: usize,
    strides: (usize, usize),
    (n, m): (usize, usize),
) {
    let groups = rows / m;
    // SAFETY: a unit works only for `id < groups · cols`, so every row it
    // forms is below `groups · m = rows` and every column below `cols`:
    // keys at `r * row_stride + c * col_stride` (the caller's tensor of that
    // shape and those strides), flags at `r * cols + c`; `flags` aliases
    // nothing else.
    unsafe {
        smallest_per_group::launch_unchecked(
            client,
            super::grid(groups * cols, UNITS),
            CubeDim::new_1d(UNITS),
            ArrayArg::from_raw_parts(keys.0, keys.1),
            ArrayArg::from_raw_parts(flags, rows * cols),
            groups as u32,
            cols as u32,
            strides.0 as u32,
            strides.1 as u32,
            n as u32,
            m as u32,
        );
    }
}
