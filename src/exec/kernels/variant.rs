//! Wanda's α-variant where the metric is (`prune::variant_device`): each
//! output's metric sorted and summed as it goes, in the host's order
//! (`prune::variant`), and one α's thresholds and pruned counts.
//!
//! The sort is a bitonic network over keys that order as `f32::total_cmp`
//! does (the sign bit flipped on a positive float, every bit on a
//! negative one), each output's row padded to a power of two with the
//! largest key. Its steps within 1 024 keys run in one cube's shared
//! memory ([`bitonic_local`]); only the steps whose pairs are further
//! apart take a launch of their own ([`bitonic_step`]): 1 launch for a row
//! of up to 1 024, 3 for 2 048, 15 for 16 384, where one launch a step
//! took `log₂ p · (log₂ p + 1) / 2` (66 and 105). Equal values are equal
//! keys, so the sorted values are the host's stable sort's. Then one unit
//! an output ([`variant_prefix`]) turns its keys back into floats in
//! place and adds them left to right, one f32 add at a time, and sums the
//! output's metric in input order, as the host does: the running sums and
//! the totals are the host's to the bit. Only additions: no product a
//! compiler could contract into a fused multiply-add.
//!
//! Per α, a cube of 256 units an output ([`variant_rows`]) counts the
//! running sums within `total · α` (the product in f32, as the host), takes
//! the sorted value there as the output's threshold, and counts the
//! values at or below it. Counts are exact in any order.

use cubecl::prelude::*;

use super::nll::combine;

/// Units per cube.
pub(super) const UNITS: u32 = 256;
/// Keys a cube sorts in shared memory ([`bitonic_local`]: 4 KiB).
pub(super) const BLOCK: u32 = 1024;

/// The key of `bits` (an f32's) that orders as `f32::total_cmp`.
#[cube]
fn key_of(bits: u32) -> u32 {
    let mut key = bits | 0x8000_0000u32;
    if (bits & 0x8000_0000u32) != 0u32 {
        key = bits ^ 0xFFFF_FFFFu32;
    }
    key
}

/// The f32 bits of `key` ([`key_of`]'s inverse).
#[cube]
fn bits_of(key: u32) -> u32 {
    let mut bits = key ^ 0xFFFF_FFFFu32;
    if (key & 0x8000_0000u32) != 0u32 {
        bits = key & 0x7FFF_FFFFu32;
    }
    bits
}

/// `keys[o · p + j]`: the key of input `j` of output `o` of `metric` (the
/// f32 bits of `[in, out]`, read at `j · row_stride + o · col_stride`),
/// and past the inputs the largest key.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(super) fn variant_keys(
    metric: &Array<u32>,
    keys: &mut Array<u32>,
    inp: u32,
    out: u32,
    p: u32,
    row_stride: u32,
    col_stride: u32,
) {
    let cube = CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X;
    let id = (cube * UNITS + UNIT_POS) as usize;
    let pp = p as usize;
    if id < out as usize * pp {
        let o = id / pp;
        let j = id % pp;
        let mut key = 0xFFFF_FFFFu32;
        if j < inp as usize {
            key = key_of(metric[j * row_stride as usize + o * col_stride as usize]);
        }
        keys[id] = key;
    }
}

/// One step of the bitonic network over rows of `p` keys (`p` a power of
/// two): the pair `(lo, lo + j)` of each `2j` block, ascending where bit
/// `k` of `lo`'s place in its row is clear, descending where it is set.
#[cube(launch_unchecked)]
pub(super) fn bitonic_step(keys: &mut Array<u32>, pairs: u32, p: u32, j: u32, k: u32) {
    let cube = CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X;
    let id = cube * UNITS + UNIT_POS;
    if id < pairs {
        let lo = (id / j) * (2u32 * j) + id % j;
        let hi = lo + j;
        let a = keys[lo as usize];
        let b = keys[hi as usize];
        let mut swap = a < b;
        if ((lo % p) & k) == 0u32 {
            swap = a > b;
        }
        if swap {
            keys[lo as usize] = b;
            keys[hi as usize] = a;
        }
    }
}

/// The bitonic network's steps with `j < BLOCK` inside one cube's
/// [`BLOCK`] keys (`keys[cube · BLOCK ..]`, the keys past `len` the
/// largest and not written back), in shared memory: for each `k` from
/// `k_first` to `k_last` (doubling), the steps from `j = min(k, BLOCK) /
/// 2` down to 1, each as [`bitonic_step`] does it. A `2j` block never
/// crosses a cube's, so one launch does what took `log₂ BLOCK` and more.
#[cube(launch_unchecked)]
pub(super) fn bitonic_local(keys: &mut Array<u32>, len: u32, p: u32, k_first: u32, k_last: u32) {
    let cube = CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X;
    let base = cube * BLOCK;
    let mut s = SharedMemory::<u32>::new(BLOCK as usize);
    for t in 0..BLOCK / UNITS {
        let i = t * UNITS + UNIT_POS;
        let mut key = 0xFFFF_FFFFu32;
        if base + i < len {
            key = keys[(base + i) as usize];
        }
        s[i as usize] = key;
    }
    sync_cube();
    let mut k = k_first;
    while k <= k_last {
        let mut j = k / 2u32;
        if j > BLOCK / 2u32 {
            j = BLOCK / 2u32;
        }
        while j > 0u32 {
            for t in 0..BLOCK / 2u32 / UNITS {
                let id = t * UNITS + UNIT_POS;
                let lo = (id / j) * (2u32 * j) + id % j;
                let hi = lo + j;
                let a = s[lo as usize];
                let b = s[hi as usize];
                let mut swap = a < b;
                if (((base + lo) % p) & k) == 0u32 {
                    swap = a > b;
                }
                if swap {
                    s[lo as usize] = b;
                    s[hi as usize] = a;
                }
            }
            sync_cube();
            j /= 2u32;
        }
        k *= 2u32;
    }
    for t in 0..BLOCK / UNITS {
        let i = t * UNITS + UNIT_POS;
        if base + i < len {
            keys[(base + i) as usize] = s[i as usize];
        }
    }
}

/// For output `o`: its sorted keys (`keys[o · p ..]`) back to f32 bits in
/// place, their running sums into `cum[o · inp ..]` left to right, and
/// its metric (`[in, out]`, as [`variant_keys`] reads it) summed in input
/// order into `totals[o]`.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(super) fn variant_prefix(
    keys: &mut Array<u32>,
    metric: &Array<f32>,
    cum: &mut Array<f32>,
    totals: &mut Array<f32>,
    inp: u32,
    out: u32,
    p: u32,
    row_stride: u32,
    col_stride: u32,
) {
    let cube = CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X;
    let o = (cube * UNITS + UNIT_POS) as usize;
    if o < out as usize {
        let n = inp as usize;
        let mut total = f32::new(0.0);
        for j in 0..n {
            total += metric[j * row_stride as usize + o * col_stride as usize];
        }
        totals[o] = total;
        let base = o * p as usize;
        let mut acc = f32::new(0.0);
        for j in 0..n {
            let bits = bits_of(keys[base + j]);
            keys[base + j] = bits;
            acc += f32::reinterpret(bits);
            cum[o * n + j] = acc;
        }
    }
}

/// For output `o` (a cube) and one α: `limit = totals[o] · alpha`; the
/// running sums of `cum[o · inp ..]` at or below it counted; the sorted
/// value there (`sorted[o · p + count − 1]`, `nothing` where the count is
/// 0) is `thresh[o]`, and `pruned[o]` counts the sorted values at or
/// below it.
#[cube(launch_unchecked)]
#[allow(clippy::too_many_arguments)]
pub(super) fn variant_rows(
    sorted: &Array<f32>,
    cum: &Array<f32>,
    totals: &Array<f32>,
    thresh: &mut Array<f32>,
    pruned: &mut Array<i32>,
    inp: u32,
    out: u32,
    p: u32,
    alpha: f32,
    nothing: f32,
) {
    let o = (CUBE_POS_Y * CUBE_COUNT_X + CUBE_POS_X) as usize;
    // A whole cube takes this branch or skips it (uniform for its syncs).
    if o < out as usize {
        let n = inp as usize;
        let mut partial = SharedMemory::<f32>::new(UNITS as usize);
        let limit = totals[o] * alpha;
        let row = o * n;
        let mut within = f32::new(0.0);
        let mut j = UNIT_POS as usize;
        while j < n {
            if cum[row + j] <= limit {
                within += f32::new(1.0);
            }
            j += UNITS as usize;
        }
        // Integer counts below 2²⁴: exact in f32 in any order.
        let count = u32::cast_from(combine(&mut partial, within, false)) as usize;
        let base = o * p as usize;
        let mut t = nothing;
        if count > 0 {
            t = sorted[base + count - 1];
        }
        let mut below = f32::new(0.0);
        j = UNIT_POS as usize;
        while j < n {
            if sorted[base + j] <= t {
                below += f32::new(1.0);
            }
            j += UNITS as usize;
        }
        let below = combine(&mut partial, below, false);
        if UNIT_POS == 0 {
            thresh[o] = t;
            pruned[o] = i32::cast_from(below);
        }
    }
}

/// The buffers of one matrix's tables (`launch_variant_prefix`): the
/// metric read, the keys (`[out, p]`, sorted values after), the running
/// sums (`[out, in]`) and the totals (`[out]`) written.
pub struct PrefixBuffers {
    pub metric: cubecl::server::Handle,
    pub keys: cubecl::server::Handle,
    pub cum: cubecl::server::Handle,
    pub totals: cubecl::server::Handle,
}

/// Launches the keys, the bitonic network and the prefix over `b.metric`
/// (`[inp, out]` f32 at `strides`, an element's offset `j · strides.0 +
/// o · strides.1` below `inp · out`), `p = inp.next_power_of_two()`,
/// `out · p < u32::MAX`.
pub fn launch_variant_prefix<R: Runtime>(
    client: &ComputeClient<R>,
    b: PrefixBuffers,
    (inp, out): (usize, usize),
    strides: (usize, usize),
) {
    let p = inp.next_power_of_two();
    let (rs, cs) = (strides.0 as u32, strides.1 as u32);
    let dims = (inp as u32, out as u32);
    // SAFETY: unit `id < out · p` reads one metric element at an offset
    // below `inp · out` (the wrapper's strides) and writes `keys[id]`.
    unsafe {
        variant_keys::launch_unchecked(
            client,
            super::grid(out * p, UNITS),
            CubeDim::new_1d(UNITS),
            ArrayArg::from_raw_parts(b.metric.clone(), inp * out),
            ArrayArg::from_raw_parts(b.keys.clone(), out * p),
            dims.0,
            dims.1,
            p as u32,
            rs,
            cs,
        );
    }
    let (len, block) = (out * p, BLOCK as usize);
    let local = |k_first: usize, k_last: usize| {
        // SAFETY: cube `c` reads and writes keys `c · BLOCK ..` below
        // `len` only; its pairs stay inside its block.
        unsafe {
            bitonic_local::launch_unchecked(
                client,
                super::grid(len.div_ceil(block) * UNITS as usize, UNITS),
                CubeDim::new_1d(UNITS),
                ArrayArg::from_raw_parts(b.keys.clone(), len),
                len as u32,
                p as u32,
                k_first as u32,
                k_last as u32,
            );
        }
    };
    if p >= 2 {
        local(2, p.min(block));
    }
    let pairs = len / 2;
    let mut k = 2 * block;
    while k <= p {
        // The steps whose pairs span blocks, one launch each; then the
        // rest of this `k` in shared memory.
        let mut j = k / 2;
        while j >= block {
            // SAFETY: unit `id < pairs` touches `lo` and `lo + j` of one
            // `2j` block of one row: below `out · p`, no other unit's.
            unsafe {
                bitonic_step::launch_unchecked(
                    client,
                    super::grid(pairs, UNITS),
                    CubeDim::new_1d(UNITS),
                    ArrayArg::from_raw_parts(b.keys.clone(), len),
                    pairs as u32,
                    p as u32,
                    j as u32,
                    k as u32,
                );
            }
            j /= 2;
        }
        local(k, k);
        k *= 2;
    }
    // SAFETY: unit `o < out` reads its column of the metric and its row of
    // keys, and writes its row of keys, of `cum` and `totals[o]`.
    unsafe {
        variant_prefix::launch_unchecked(
            client,
            super::grid(out, UNITS),
            CubeDim::new_1d(UNITS),
            ArrayArg::from_raw_parts(b.keys, out * p),
            ArrayArg::from_raw_parts(b.metric, inp * out),
            ArrayArg::from_raw_parts(b.cum, out * inp),
            ArrayArg::from_raw_parts(b.totals, out),
            dims.0,
            dims.1,
            p as u32,
            rs,
            cs,
        );
    }
}

/// Launches [`variant_rows`] for one α over the tables (`sorted` `[out,
/// p]`, `cum` `[out, inp]`, `totals` `[out]`) into `thresh` (f32) and
/// `pruned` (i32), `[out]` each.
pub fn launch_variant_rows<R: Runtime>(
    client: &ComputeClient<R>,
    tables: [cubecl::server::Handle; 3],
    [thresh, pruned]: [cubecl::server::Handle; 2],
    (inp, out, p): (usize, usize, usize),
    alpha: f32,
) {
    let [sorted, cum, totals] = tables;
    // SAFETY: cube `o < out` reads row `o` of `sorted` (below `p`) and of
    // `cum`, and `totals[o]`; its unit 0 writes `thresh[o]`, `pruned[o]`.
    unsafe {
        variant_rows::launch_unchecked(
            client,
            super::grid(out * UNITS as usize, UNITS),
            CubeDim::new_1d(UNITS),
            ArrayArg::from_raw_parts(sorted, out * p),
            ArrayArg::from_raw_parts(cum, out * inp),
            ArrayArg::from_raw_parts(totals, out),
            ArrayArg::from_raw_parts(thresh, out),
            ArrayArg::from_raw_parts(pruned, out),
            inp as u32,
            out as u32,
            p as u32,
            alpha,
            f32::NEG_INFINITY,
        );
    }
}
