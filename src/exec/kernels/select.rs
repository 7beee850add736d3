//! The device's selections as radix selects over the metric's f32 bit
//! patterns (`Compute::float_bits`: non-negative floats order as their
//! bits): the per-output selection (Wanda's, RIA's `per_outneuron`) and
//! the per-matrix threshold (magnitude, RIA, SparseGPT's block masks,
//! GradProbe's candidates and their ties).
//!
//! A key's 31 bits are taken four at a time from the top, 8 passes: each
//! pass counts, among the keys whose higher bits equal those chosen so
//! far, how many have each of the 16 values of the next 4 bits, and the
//! `k`-th smallest lies in the first bin where the running count reaches
//! `k`. Each key is read 8 times, 10 by the per-output kernel (its ties
//! and its flags). The bisection kernels these replace read it 31 times
//! (the threshold) and 33 + ⌈log₂ rows⌉ times (per output: 31 halvings of
//! the key range, the count below, the halvings over row positions for
//! the ties, the flags; 44 to 47 at Llama shapes), and the many-cube
//! threshold took 32 launches where it now takes 9. The answers are the bisections' to the
//! key: the smallest `t` with at least `k` keys at or below it, a negative
//! key counting as 0 (the bisections searched `[0, i32::MAX]`).
//!
//! Each unit keeps its 16 counts in shared memory (`counts[bin · units +
//! unit]`: adjacent units, adjacent banks), so no atomics are needed
//! inside a cube; a pass of the many-cube threshold adds each cube's 16
//! totals to the device's with one atomic each, and every cube replays the
//! passes before it from those totals.

use cubecl::prelude::*;

/// Columns per cube of the per-output selection (adjacent units, adjacent
/// addresses: loads coalesce on `[in, out]`, Burn's layout).
pub(super) const COLUMNS: u32 = 32;
/// Row lanes per cube: each walks a contiguous run of its column's rows,
/// so its ties come in row order.
pub(super) const LANES: u32 = 8;
/// Units per cube of the per-matrix threshold (a power of two).
pub(super) const UNITS: u32 = 256;
/// Bins of a digit (4 bits).
const BINS: u32 = 16;
/// Passes: 4-bit digits from bit 28 down cover a non-negative i32.
const PASSES: u32 = 8;

/// The bits of a pass's digit start at `28 − 4 · pass`.
#[cube]
fn shift_of(pass: u32) -> u32 {
    28u32 - 4u32 * pass
}

/// The bits the passes before `pass` have fixed: those above its digit
/// (none for the first).
#[cube]
fn above_of(pass: u32) -> u32 {
    0xFFFF_FFFFu32 ^ (0xFFFF_FFFFu32 >> (4u32 * pass))
}

/// The bin of `totals` (a digit's 16 counts) where their running sum
/// reaches `remaining`; `BINS` where it never does (a column past the
/// matrix, whose counts are all 0).
#[cube]
fn bin_reaching(totals: &Array<u32>, remaining: u32) -> u32 {
    let mut acc = 0u32;
    let mut chosen = 16u32; // BINS, as a runtime value
    for d in 0..BINS {
        let next = acc + totals[d as usize];
        if chosen == BINS && next >= remaining {
            chosen = d;
        }
        acc = next;
    }
    chosen
}

/// The counts of `totals` in the bins before `bin`.
#[cube]
fn below_bin(totals: &Array<u32>, bin: u32) -> u32 {
    let mut acc = 0u32;
    for d in 0..BINS {
        if d < bin {
            acc += totals[d as usize];
        }
    }
    acc
}

/// Counts `key` in this unit's bin of its digit in `pass`, where its bits
/// above the digit are `prefix`'s (the earlier passes' digits). A negative
/// key counts as 0.
#[cube]
fn bin_key(
    counts: &mut SharedMemory<u32>,
    unit: usize,
    units: usize,
    key: i32,
    prefix: u32,
    pass: u32,
) {
    let mut v = 0u32;
    if key > 0i32 {
        v = u32::cast_from(key);
    }
    if (v & above_of(pass)) == prefix {
        let d = ((v >> shift_of(pass)) & 15u32) as usize;
        let at = d * units + unit;
        counts[at] = counts[at] + 1u32;
    }
}

/// `flags[r * cols + c]` (contiguous `[rows, cols]`) is 1 where key
/// `(r, c)` is among the `k` smallest of column `c` (`1 <= k < rows`),
/// ties taken in row order, else 0. `keys` is read at `r * row_stride + c
/// * col_stride`. A cube of 32 columns × 8 lanes: the 8 passes find each
/// column's threshold `t`, one more counts the keys below it and each
/// lane's ties, and the last writes the flags, a lane taking its ties
/// while the ties of the lanes before it and its own fall short of what
/// the column needs.
#[cube(launch_unchecked)]
// `usize::div_ceil` is not in cubecl's language.
#[allow(clippy::too_many_arguments, clippy::manual_div_ceil)]
pub(super) fn smallest_per_column(
    keys: &Array<i32>,
    flags: &mut Array<i32>,
    rows: u32,
    cols: u32,
    row_stride: u32,
    col_stride: u32,
    k: u32,
) {
    let x = UNIT_POS_X as usize;
    let y = UNIT_POS_Y as usize;
    let units = (COLUMNS * LANES) as usize;
    let unit = y * COLUMNS as usize + x;
    let column = (CUBE_POS_X * COLUMNS + UNIT_POS_X) as usize;
    let live = column < cols as usize;
    let n = rows as usize;
    let chunk = (n + LANES as usize - 1) / LANES as usize;
    let mut start = y * chunk;
    if start > n {
        start = n;
    }
    let mut end = start + chunk;
    if end > n {
        end = n;
    }
    let (rs, cs) = (row_stride as usize, col_stride as usize);
    let mut counts = SharedMemory::<u32>::new((BINS * COLUMNS * LANES) as usize);
    let mut totals = Array::<u32>::new(BINS as usize);
    let mut prefix = 0u32;
    let mut remaining = k;
    for pass in 0..PASSES {
        for d in 0..BINS {
            counts[d as usize * units + unit] = 0u32;
        }
        if live {
            let mut i = start;
            while i < end {
                let key = keys[i * rs + column * cs];
                bin_key(&mut counts, unit, units, key, prefix, pass);
                i += 1;
            }
        }
        sync_cube();
        // The column's 16 totals, and the bin where they reach `remaining`.
        for d in 0..BINS {
            let mut total = 0u32;
            for lane in 0..LANES {
                total += counts[d as usize * units + (lane * COLUMNS) as usize + x];
            }
            totals[d as usize] = total;
        }
        sync_cube();
        let chosen = bin_reaching(&totals, remaining);
        remaining -= below_bin(&totals, chosen);
        prefix |= (chosen & 15u32) << shift_of(pass);
    }
    let t = i32::cast_from(prefix);
    // Below the threshold, and this lane's ties.
    let mut below = 0u32;
    let mut tied = 0u32;
    if live {
        let mut i = start;
        while i < end {
            let key = keys[i * rs + column * cs];
            if key < t {
                below += 1u32;
            } else if key == t {
                tied += 1u32;
            }
            i += 1;
        }
    }
    counts[unit] = below;
    counts[units + unit] = tied;
    sync_cube();
    let mut below_all = 0u32;
    let mut taken = 0u32;
    for lane in 0..LANES {
        let at = (lane * COLUMNS) as usize + x;
        below_all += counts[at];
        if (lane as usize) < y {
            taken += counts[units + at];
        }
    }
    let mut need = 0u32;
    if below_all < k {
        need = k - below_all;
    }
    if live {
        let mut i = start;
        while i < end {
            let key = keys[i * rs + column * cs];
            let mut flag = 0i32;
            if key < t {
                flag = 1i32;
            } else if key == t {
                if taken < need {
                    flag = 1i32;
                }
                taken += 1u32;
            }
            flags[i * cols as usize + column] = flag;
            i += 1;
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
    let cubes = cols.div_ceil(COLUMNS as usize) as u32;
    // SAFETY: every index the kernel forms is below the buffers' lengths:
    // keys at `r * row_stride + c * col_stride` for `r < rows`, `c < cols`
    // (the caller's tensor of that shape and those strides), flags at
    // `r * cols + c`; units past `cols` read and write nothing; `flags`
    // aliases nothing else; shared memory at `bin · 256 + unit` < 4 096.
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
        );
    }
}

/// The cube's 16 bin totals of the keys at `first`, `first + stride`, …
/// below `len` (filtered by `prefix`, binned by `pass`'s digit), left
/// at `counts[bin · UNITS]`. Called in uniform control flow (it
/// synchronises the cube).
#[cube]
fn cube_histogram(
    keys: &Array<i32>,
    counts: &mut SharedMemory<u32>,
    first: usize,
    stride: usize,
    len: usize,
    prefix: u32,
    pass: u32,
) {
    let u = UNIT_POS as usize;
    let units = UNITS as usize;
    for d in 0..BINS {
        counts[d as usize * units + u] = 0u32;
    }
    let mut i = first;
    while i < len {
        bin_key(counts, u, units, keys[i], prefix, pass);
        i += stride;
    }
    sync_cube();
    // CUBE_DIM (the launch's 256): a runtime value the loop may halve.
    let mut half = CUBE_DIM as usize / 2;
    while half > 0 {
        if u < half {
            for d in 0..BINS {
                let at = d as usize * units + u;
                counts[at] = counts[at] + counts[at + half];
            }
        }
        sync_cube();
        half /= 2;
    }
}

/// The smallest key `t` of the whole buffer with at least `k` keys `<= t`
/// (`1 <= k <= len`), written to `out[0]`, in one cube: the per-matrix
/// threshold where the keys are few. The order of the keys in the buffer
/// does not matter, so any layout of a whole buffer will do.
#[cube(launch_unchecked)]
pub(super) fn kth_smallest(keys: &Array<i32>, out: &mut Array<i32>, len: u32, k: u32) {
    let u = UNIT_POS as usize;
    let units = UNITS as usize;
    let mut counts = SharedMemory::<u32>::new((BINS * UNITS) as usize);
    let mut totals = Array::<u32>::new(BINS as usize);
    let mut prefix = 0u32;
    let mut remaining = k;
    for pass in 0..PASSES {
        cube_histogram(keys, &mut counts, u, units, len as usize, prefix, pass);
        for d in 0..BINS {
            totals[d as usize] = counts[d as usize * units];
        }
        sync_cube();
        let chosen = bin_reaching(&totals, remaining);
        remaining -= below_bin(&totals, chosen);
        prefix |= chosen << shift_of(pass);
    }
    if u == 0 {
        out[0] = i32::cast_from(prefix);
    }
}

/// The high bits [`kth_pass`] has fixed after `passes` passes whose bin
/// totals are `totals[0 .. 16 · passes]`: every cube replays them and so
/// agrees on them without a launch of its own. After all 8 they are the
/// threshold.
#[cube]
fn replayed_prefix(totals: &Array<Atomic<u32>>, k: u32, passes: u32) -> u32 {
    let mut prefix = 0u32;
    let mut remaining = k;
    let mut pass_totals = Array::<u32>::new(BINS as usize);
    for pass in 0..passes {
        for d in 0..BINS {
            pass_totals[d as usize] = totals[(pass * BINS + d) as usize].load();
        }
        let chosen = bin_reaching(&pass_totals, remaining);
        remaining -= below_bin(&pass_totals, chosen);
        prefix |= chosen << shift_of(pass);
    }
    prefix
}

/// Pass `pass` of [`kth_smallest`] spread over the whole device: each cube
/// bins its stride of the keys and adds its 16 totals to `totals[16 ·
/// pass ..]` (one atomic a bin).
#[cube(launch_unchecked)]
pub(super) fn kth_pass(
    keys: &Array<i32>,
    totals: &Array<Atomic<u32>>,
    len: u32,
    k: u32,
    pass: u32,
) {
    let u = UNIT_POS as usize;
    let units = UNITS as usize;
    let prefix = replayed_prefix(totals, k, pass);
    let mut counts = SharedMemory::<u32>::new((BINS * UNITS) as usize);
    let first = CUBE_POS_X as usize * units + u;
    let stride = CUBE_COUNT_X as usize * units;
    cube_histogram(keys, &mut counts, first, stride, len as usize, prefix, pass);
    if u < BINS as usize {
        let total = counts[u * units];
        if total > 0u32 {
            totals[(pass * BINS) as usize + u].fetch_add(total);
        }
    }
}

/// The threshold after the 8 passes of [`kth_pass`], to `out[0]`.
#[cube(launch_unchecked)]
pub(super) fn kth_settled(totals: &Array<Atomic<u32>>, out: &mut Array<i32>, k: u32) {
    if UNIT_POS == 0 {
        out[0] = i32::cast_from(replayed_prefix(totals, k, PASSES));
    }
}

/// Keys per unit below which one cube runs the whole search
/// ([`kth_smallest`]): under it the many-cube passes would only add
/// launches.
pub const KEYS_PER_UNIT: usize = 128;

/// Whether the device runs cubes of the selections' 256 units.
pub fn takes_selection_cubes<R: Runtime>(client: &ComputeClient<R>) -> bool {
    client.properties().hardware.max_units_per_cube >= UNITS
}

/// Launches [`kth_smallest`] (one cube of 256 units) or, past
/// [`KEYS_PER_UNIT`] keys a unit, its 8 passes over many cubes and the
/// settling launch: `keys` is a whole buffer of `len` i32, `out` one i32.
pub fn launch_kth_smallest<R: Runtime>(
    client: &ComputeClient<R>,
    keys: cubecl::server::Handle,
    out: cubecl::server::Handle,
    len: usize,
    k: usize,
) {
    let cubes = len.div_ceil(UNITS as usize * KEYS_PER_UNIT).min(4096) as u32;
    if cubes > 1 {
        return launch_kth_passes(client, (keys, out), len, k, cubes);
    }
    // SAFETY: the units read `keys[0..len]` (the caller's whole buffer of
    // `len` elements) and unit 0 writes `out[0]` (a buffer of one i32 that
    // aliases nothing else); shared memory at `bin · 256 + unit` < 4 096.
    unsafe {
        kth_smallest::launch_unchecked(
            client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_1d(UNITS),
            ArrayArg::from_raw_parts(keys, len),
            ArrayArg::from_raw_parts(out, 1),
            len as u32,
            k as u32,
        );
    }
}

/// [`kth_smallest`]'s search as 8 launches of `cubes` cubes ([`kth_pass`])
/// and one that writes the threshold ([`kth_settled`]).
fn launch_kth_passes<R: Runtime>(
    client: &ComputeClient<R>,
    (keys, out): (cubecl::server::Handle, cubecl::server::Handle),
    len: usize,
    k: usize,
    cubes: u32,
) {
    let slots = (PASSES * BINS) as usize;
    let totals = client.create_from_slice(u32::as_bytes(&[0u32; (PASSES * BINS) as usize]));
    for pass in 0..PASSES {
        // SAFETY: the cubes read `keys[0..len]` (the caller's whole buffer
        // of `len` i32; the grid stride stops at `len`), read
        // `totals[0 .. 16 · pass]` and add to `totals[16 · pass .. 16 ·
        // pass + 16]` (128 u32, made here).
        unsafe {
            kth_pass::launch_unchecked(
                client,
                CubeCount::Static(cubes, 1, 1),
                CubeDim::new_1d(UNITS),
                ArrayArg::from_raw_parts(keys.clone(), len),
                ArrayArg::from_raw_parts(totals.clone(), slots),
                len as u32,
                k as u32,
                pass,
            );
        }
    }
    // SAFETY: one unit reads `totals[0..128]` and writes `out[0]` (one i32
    // that aliases nothing else).
    unsafe {
        kth_settled::launch_unchecked(
            client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_1d(1),
            ArrayArg::from_raw_parts(totals, slots),
            ArrayArg::from_raw_parts(out, 1),
            k as u32,
        );
    }
}
