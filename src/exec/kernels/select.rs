//! The per-output selection (Wanda's, RIA's `per_outneuron`) in one launch:
//! for every column of a `[rows, cols]` matrix of keys (the metric's f32 bit
//! patterns, `Compute::float_bits`), the `k` smallest, ties taken in row
//! order as the host path's stable sort takes them.
//!
//! Written with Burn's ops the same bisection costs about eight launches
//! per halving, 45 halvings per linear: on an H100 a 1B shape's selection
//! was 40 000 launches and 1.9 s, most of it launch and reduction overhead
//! (cubecl's profile, docs/gpu.md). Here a cube of 32 columns × 8 row lanes
//! runs the whole search for its 32 columns: each halving, every lane
//! counts its rows (adjacent units read adjacent columns, so loads
//! coalesce on `[in, out]`, Burn's layout), the cube adds the 8 lanes'
//! counts in shared memory, and every unit of a column moves its bounds
//! the same way. The halvings are those of `prune::on_device::kth_key` and
//! `first_ties`, so the mask is the Burn-ops path's to the position.

use cubecl::prelude::*;

/// Columns per cube (adjacent units, adjacent addresses).
const COLUMNS: u32 = 32;
/// Row lanes per cube: each counts every 8th row of its column.
const LANES: u32 = 8;

/// How many of this unit's column's keys pass `test` (`0`: `<= bound`,
/// `1`: `< bound`, `2`: `== bound` at a row `<= upto`), summed over the
/// cube's lanes through `partial` (every unit of the column gets the same
/// total). Called in uniform control flow (it synchronises the cube).
#[cube]
#[allow(clippy::too_many_arguments)]
fn column_count(
    keys: &Array<i32>,
    partial: &mut SharedMemory<u32>,
    column: usize,
    live: bool,
    rows: usize,
    row_stride: usize,
    col_stride: usize,
    bound: i32,
    upto: i32,
    #[comptime] test: u32,
) -> u32 {
    let x = UNIT_POS_X as usize;
    let y = UNIT_POS_Y as usize;
    let mut count = 0u32;
    if live {
        let mut i = y;
        while i < rows {
            let key = keys[i * row_stride + column * col_stride];
            let mut hit = false;
            if comptime!(test == 0) {
                hit = key <= bound;
            } else if comptime!(test == 1) {
                hit = key < bound;
            } else {
                hit = key == bound && (i as i32) <= upto;
            }
            if hit {
                count += 1u32;
            }
            i += LANES as usize;
        }
    }
    partial[y * COLUMNS as usize + x] = count;
    sync_cube();
    let mut total = 0u32;
    for lane in 0..LANES as usize {
        total += partial[lane * COLUMNS as usize + x];
    }
    sync_cube();
    total
}

/// `flags[r * cols + c]` (contiguous `[rows, cols]`) is 1 where key
/// `(r, c)` is among the `k` smallest of column `c` (`1 <= k < rows`),
/// else 0. `keys` is read at `r * row_stride + c * col_stride`;
/// `tie_steps` halvings cover `0 .. rows`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
fn smallest_per_column(
    keys: &Array<i32>,
    flags: &mut Array<i32>,
    rows: u32,
    cols: u32,
    row_stride: u32,
    col_stride: u32,
    k: u32,
    tie_steps: u32,
) {
    let column = (CUBE_POS_X * COLUMNS + UNIT_POS_X) as usize;
    let live = column < cols as usize;
    let n = rows as usize;
    let (rs, cs) = (row_stride as usize, col_stride as usize);
    let mut partial = SharedMemory::<u32>::new((COLUMNS * LANES) as usize);
    // The smallest key t with at least k keys <= t: 31 halvings of
    // [0, i32::MAX] (the keys of non-negative floats are non-negative).
    let mut lo = 0i32;
    let mut hi = 2147483647i32;
    for _ in 0..31u32 {
        let mid = lo + (hi - lo) / 2;
        let at_or_below =
            column_count(keys, &mut partial, column, live, n, rs, cs, mid, 0i32, 0u32);
        if at_or_below >= k {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let t = lo;
    let below = column_count(keys, &mut partial, column, live, n, rs, cs, t, 0i32, 1u32);
    // The ties the column still needs: the first `need` in row order, up
    // to the smallest row at which `need` of them have been seen.
    let need = k - below;
    let mut first = 0i32;
    let mut last = rows as i32 - 1;
    for _ in 0..tie_steps {
        let mid = first + (last - first) / 2;
        let seen = column_count(keys, &mut partial, column, live, n, rs, cs, t, mid, 2u32);
        if seen >= need {
            last = mid;
        } else {
            first = mid + 1;
        }
    }
    let mut cut = first;
    if need == 0u32 {
        cut = -1i32;
    }
    if live {
        let mut i = UNIT_POS_Y as usize;
        while i < n {
            let key = keys[i * rs + column * cs];
            let mut flag = 0i32;
            if key < t || (key == t && (i as i32) <= cut) {
                flag = 1i32;
            }
            flags[i * cols as usize + column] = flag;
            i += LANES as usize;
        }
    }
}

/// Launches [`smallest_per_column`]: `keys` is the buffer of an i32 tensor
/// of `keys_len` elements read at `(row_stride, col_stride)`, `flags` that
/// of a contiguous `[rows, cols]` i32 tensor.
#[allow(clippy::too_many_arguments)]
pub fn launch_smallest_per_column<R: Runtime>(
    client: &ComputeClient<R>,
    keys: (cubecl::server::Handle, usize),
    flags: cubecl::server::Handle,
    rows: usize,
    cols: usize,
    strides: (usize, usize),
    k: usize,
) {
    let tie_steps = usize::BITS - (rows.max(2) - 1).leading_zeros();
    let cubes = cols.div_ceil(COLUMNS as usize) as u32;
    // SAFETY: every index the kernel forms is below the buffers' lengths:
    // keys at `r * row_stride + c * col_stride` for `r < rows`, `c < cols`
    // (the caller's tensor of that shape and those strides), flags at
    // `r * cols + c`; units past `cols` read and write nothing; `flags`
    // aliases nothing else.
    unsafe {
        smallest_per_column::launch_unchecked(
            client,
            CubeCount::Static(cubes, 1, 1),
            CubeDim::new_2d(COLUMNS, LANES),
            ArrayArg::from_raw_parts(keys.0, keys.1),
            ArrayArg::from_raw_parts(flags, rows * cols),
            rows as u32,
            cols as u32,
            strides.0 as u32,
            strides.1 as u32,
            k as u32,
            tie_steps,
        );
    }
}

/// How many keys at `first`, `first + stride`, … below `len` are `<= mid`,
/// summed over the cube's units through `partial` (a power-of-two cube):
/// every unit gets the cube's total. Called in uniform control flow (it
/// synchronises the cube).
#[cube]
fn cube_count(
    keys: &Array<i32>,
    partial: &mut SharedMemory<u32>,
    first: usize,
    stride: usize,
    len: usize,
    mid: i32,
) -> u32 {
    let u = UNIT_POS as usize;
    let mut count = 0u32;
    let mut i = first;
    while i < len {
        if keys[i] <= mid {
            count += 1u32;
        }
        i += stride;
    }
    partial[u] = count;
    sync_cube();
    let mut half = CUBE_DIM as usize / 2;
    while half > 0 {
        if u < half {
            partial[u] = partial[u] + partial[u + half];
        }
        sync_cube();
        half /= 2;
    }
    let total = partial[0];
    sync_cube();
    total
}

/// The smallest key `t` of the whole buffer with at least `k` keys `<= t`
/// (`1 <= k <= len`), written to `out[0]`: the per-matrix threshold
/// (magnitude, RIA, SparseGPT's block mask) as `prune::on_device::kth_key`
/// finds it, 31 halvings in one cube instead of 31 launches of Burn's
/// compare-and-reduce. The order of the keys in the buffer does not
/// matter, so any layout of a whole buffer will do.
#[cube(launch_unchecked)]
fn kth_smallest(keys: &Array<i32>, out: &mut Array<i32>, len: u32, k: u32) {
    let u = UNIT_POS as usize;
    let units = CUBE_DIM as usize;
    let n = len as usize;
    let mut partial = SharedMemory::<u32>::new(1024usize);
    let mut lo = 0i32;
    let mut hi = 2147483647i32;
    for _ in 0..31u32 {
        let mid = lo + (hi - lo) / 2;
        let total = cube_count(keys, &mut partial, u, units, n, mid);
        if total >= k {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    if u == 0 {
        out[0] = lo;
    }
}

/// The middle [`kth_smallest`] tries after `steps` halvings whose totals at
/// or below each middle are `counts[0..steps]`: every cube replays them and
/// so agrees on it without a launch of its own. After all 31 the range is
/// one key wide, and its middle is the threshold.
#[cube]
fn replayed_middle(counts: &Array<Atomic<u32>>, k: u32, steps: u32) -> i32 {
    let mut lo = 0i32;
    let mut hi = 2147483647i32;
    for s in 0..steps {
        let mid = lo + (hi - lo) / 2;
        if counts[s as usize].load() >= k {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    lo + (hi - lo) / 2
}

/// Halving `step` of [`kth_smallest`] spread over the whole device: each
/// cube counts its stride of the keys at or below the middle, adds its
/// units' counts in shared memory and its total to `counts[step]` (one
/// atomic per cube). 31 launches and one [`kth_settled`] read each key 31
/// times, as the one-cube kernel does, but on every multiprocessor.
#[cube(launch_unchecked)]
fn kth_halving(keys: &Array<i32>, counts: &Array<Atomic<u32>>, len: u32, k: u32, step: u32) {
    let u = UNIT_POS as usize;
    let units = CUBE_DIM as usize;
    let mid = replayed_middle(counts, k, step);
    let mut partial = SharedMemory::<u32>::new(1024usize);
    let first = CUBE_POS_X as usize * units + u;
    let stride = CUBE_COUNT_X as usize * units;
    let total = cube_count(keys, &mut partial, first, stride, len as usize, mid);
    if u == 0 {
        counts[step as usize].fetch_add(total);
    }
}

/// The threshold after the 31 halvings of [`kth_halving`], to `out[0]`.
#[cube(launch_unchecked)]
fn kth_settled(counts: &Array<Atomic<u32>>, out: &mut Array<i32>, k: u32) {
    if UNIT_POS == 0 {
        out[0] = replayed_middle(counts, k, 31u32);
    }
}

/// Keys per unit below which one cube runs the whole search
/// ([`kth_smallest`]): under it the many-cube halvings would only add
/// launches.
pub const KEYS_PER_UNIT: usize = 64;

/// Launches [`kth_smallest`] in one cube of as many units as the device
/// allows (a power of two, at most 1024): `keys` is a whole buffer of
/// `len` i32, `out` one i32.
pub fn launch_kth_smallest<R: Runtime>(
    client: &ComputeClient<R>,
    keys: cubecl::server::Handle,
    out: cubecl::server::Handle,
    len: usize,
    k: usize,
) {
    let most = client
        .properties()
        .hardware
        .max_units_per_cube
        .clamp(1, 1024);
    let units = 1u32 << (u32::BITS - 1 - most.leading_zeros());
    let cubes = len.div_ceil(units as usize * KEYS_PER_UNIT).min(4096) as u32;
    if cubes > 1 {
        return launch_kth_halvings(client, (keys, out), len, k, (cubes, units));
    }
    // SAFETY: the units read `keys[0..len]` (the caller's whole buffer of
    // `len` elements) and unit 0 writes `out[0]` (a buffer of one i32 that
    // aliases nothing else).
    unsafe {
        kth_smallest::launch_unchecked(
            client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_1d(units),
            ArrayArg::from_raw_parts(keys, len),
            ArrayArg::from_raw_parts(out, 1),
            len as u32,
            k as u32,
        );
    }
}

/// [`kth_smallest`]'s search as 31 launches of `cubes` cubes of `units`
/// ([`kth_halving`]) and one that writes the threshold ([`kth_settled`]).
fn launch_kth_halvings<R: Runtime>(
    client: &ComputeClient<R>,
    (keys, out): (cubecl::server::Handle, cubecl::server::Handle),
    len: usize,
    k: usize,
    (cubes, units): (u32, u32),
) {
    let counts = client.create_from_slice(u32::as_bytes(&[0u32; 31]));
    for step in 0..31u32 {
        // SAFETY: the cubes read `keys[0..len]` (the caller's whole buffer
        // of `len` i32; the grid stride stops at `len`), read
        // `counts[0..step]` and add to `counts[step]` (31 u32, made here).
        unsafe {
            kth_halving::launch_unchecked(
                client,
                CubeCount::Static(cubes, 1, 1),
                CubeDim::new_1d(units),
                ArrayArg::from_raw_parts(keys.clone(), len),
                ArrayArg::from_raw_parts(counts.clone(), 31),
                len as u32,
                k as u32,
                step,
            );
        }
    }
    // SAFETY: one unit reads `counts[0..31]` and writes `out[0]` (one i32
    // that aliases nothing else).
    unsafe {
        kth_settled::launch_unchecked(
            client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_1d(1),
            ArrayArg::from_raw_parts(counts, 31),
            ArrayArg::from_raw_parts(out, 1),
            k as u32,
        );
    }
}
