//! The evaluation's loss over a chunk of logits in one launch: for each row
//! of `[rows, vocab]` logits (in the compute dtype), `logsumexp(row) -
//! row[target]` in f32. Written with Burn's ops this was a cast to f32, a
//! max and a sum over the vocabulary (each in pieces past 32 768,
//! `exec::reduce`), an exp, a log, a gather and a slice: about twenty
//! launches and an f32 copy of the chunk, and on an H100 cubecl's
//! reductions over the 128 256-wide rows took as long as the head's matmul
//! (docs/gpu.md). Here a cube of 256 units walks one row twice (its max,
//! then the sum of `exp(x - max)`), the units reading adjacent addresses,
//! and combines the 256 partial results in shared memory.

use cubecl::prelude::*;

/// Units per row.
pub(super) const UNITS: u32 = 256;

/// The cube's 256 partial values combined (max or sum) through `partial`;
/// every unit gets the result. Called in uniform control flow.
#[cube]
pub(super) fn combine(partial: &mut SharedMemory<f32>, value: f32, #[comptime] max: bool) -> f32 {
    let u = UNIT_POS as usize;
    partial[u] = value;
    sync_cube();
    let mut step = CUBE_DIM as usize / 2;
    while step > 0 {
        if u < step {
            let (a, b) = (partial[u], partial[u + step]);
            if comptime!(max) {
                partial[u] = f32::max(a, b);
            } else {
                partial[u] = a + b;
            }
        }
        sync_cube();
        step /= 2;
    }
    let out = partial[0];
    sync_cube();
    out
}

/// `nll[r] = logsumexp(logits[r, ..]) - logits[r, targets[r]]` for rows
/// `r >= skip` of the contiguous `[rows, vocab]` `logits`; 0 for the rows
/// before `skip` (counted by an earlier chunk).
#[cube(launch_unchecked)]
pub(super) fn row_nll<F: Float>(
    logits: &Array<F>,
    targets: &Array<i32>,
    nll: &mut Array<f32>,
    vocab: u32,
    skip: u32,
) {
    let row = CUBE_POS_X as usize;
    let base = row * vocab as usize;
    let v = vocab as usize;
    let mut partial = SharedMemory::<f32>::new(UNITS as usize);
    let mut i = UNIT_POS as usize;
    let mut largest = f32::new(-3.4028235e38);
    while i < v {
        largest = f32::max(largest, f32::cast_from(logits[base + i]));
        i += UNITS as usize;
    }
    let largest = combine(&mut partial, largest, true);
    i = UNIT_POS as usize;
    let mut sum = f32::new(0.0);
    while i < v {
        sum += f32::exp(f32::cast_from(logits[base + i]) - largest);
        i += UNITS as usize;
    }
    let sum = combine(&mut partial, sum, false);
    if UNIT_POS == 0 {
        let mut out = f32::new(0.0);
        if row as u32 >= skip {
            let picked = f32::cast_from(logits[base + targets[row] as usize]);
            out = largest + f32::ln(sum) - picked;
        }
        nll[row] = out;
    }
}

/// Launches [`row_nll`] for logits of element type `F`: `logits` is the
/// buffer of a contiguous `[rows, vocab]` tensor, `targets` of `rows`
/// i32 token ids (each `< vocab`), `nll` of `rows` f32.
#[allow(clippy::too_many_arguments)]
pub fn launch_row_nll<R: Runtime, F: Float + CubeElement>(
    client: &ComputeClient<R>,
    logits: cubecl::server::Handle,
    targets: cubecl::server::Handle,
    nll: cubecl::server::Handle,
    rows: usize,
    vocab: usize,
    skip: usize,
) {
    // SAFETY: one cube per row reads `logits[row * vocab .. (row + 1) *
    // vocab]` and `targets[row]` (each target below `vocab`, checked by
    // the caller) and writes `nll[row]`; the buffers hold `rows * vocab`,
    // `rows` and `rows` elements, and `nll` aliases nothing else.
    unsafe {
        row_nll::launch_unchecked::<F, R>(
            client,
            CubeCount::Static(rows as u32, 1, 1),
            CubeDim::new_1d(UNITS),
            ArrayArg::from_raw_parts(logits, rows * vocab),
            ArrayArg::from_raw_parts(targets, rows),
            ArrayArg::from_raw_parts(nll, rows),
            vocab as u32,
            skip as u32,
        );
    }
}
