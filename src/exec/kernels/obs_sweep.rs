//! SparseGPT's column sweep over one block as a single cubecl kernel: one
//! unit per output, walking the block's inputs in order. Written with Burn's
//! ops the sweep costs about six launches per input (an H100 spent over 150
//! s on a 1B shape's 327 680 inputs, most of it launching); here a block of
//! 128 inputs is one launch.
//!
//! Each unit owns one output (a column of Burn's `[in, out]` weight), so
//! the OBS recurrence — `e = (w_i - q_i) / d_i; w_j -= e · Hinv1[i, j]` for
//! the inputs after `i` — runs within the unit, reading `Hinv1` (the same
//! 64 KiB for every unit) and its own column. The unstructured mask comes
//! in (chosen for the whole block first, as the reference does); N:M picks
//! the `n` smallest of each `m` inputs as the sweep reaches them, ties to
//! the lower input, from the values the sweep has updated so far.
//!
//! The host path (`prune::sparsegpt::fasterprune`) and the Burn-ops path
//! (`prune::sparsegpt_device`, on backends without this kernel) remain the
//! references: `tests/device/` compares them on lavapipe.

use cubecl::prelude::*;

/// Units (outputs) per cube.
pub(super) const UNITS: u32 = 256;

/// The sweep of rows `row0 .. row0 + count` of `w` (`[in, out]`, f32,
/// contiguous, changed in place) with the block's `hinv` (`[count,
/// count]`), writing each input's error into `err` (`[count, out]`).
/// `prune` (`[count, out]`, 1.0 where pruned) is read unless `m > 0`, in
/// which case N:M (`n` of every `m`) is chosen in the kernel.
#[cube(launch_unchecked)]
pub(super) fn obs_sweep(
    w: &mut Array<f32>,
    hinv: &Array<f32>,
    prune: &Array<f32>,
    err: &mut Array<f32>,
    row0: u32,
    out: u32,
    count: u32,
    n: u32,
    m: u32,
) {
    let r = ABSOLUTE_POS;
    let o = out as usize;
    let c = count as usize;
    if r < o {
        let base = row0 as usize * o;
        let mm = m as usize;
        let mut bits = 0u32;
        for i in 0..c {
            if mm > 0 && i % mm == 0 {
                // The n smallest saliencies w² / d² of this group.
                bits = 0u32;
                let mut end = i + mm;
                if end > c {
                    end = c;
                }
                for j in i..end {
                    let wj = w[base + j * o + r];
                    let dj = hinv[j * c + j];
                    let tj = wj * wj / (dj * dj);
                    let mut rank = 0u32;
                    for k in i..end {
                        let wk = w[base + k * o + r];
                        let dk = hinv[k * c + k];
                        let tk = wk * wk / (dk * dk);
                        if tk < tj || (tk == tj && k < j) {
                            rank += 1u32;
                        }
                    }
                    if rank < n {
                        bits |= 1u32 << ((j - i) as u32);
                    }
                }
            }
            let mut pruned = false;
            if mm > 0 {
                pruned = ((bits >> ((i % mm) as u32)) & 1u32) == 1u32;
            } else {
                pruned = prune[i * o + r] != f32::new(0.0);
            }
            let at = base + i * o + r;
            let wi = w[at];
            let mut q = wi;
            if pruned {
                q = f32::new(0.0);
            }
            let e = (wi - q) / hinv[i * c + i];
            for j in i + 1..c {
                let to = base + j * o + r;
                w[to] = w[to] - e * hinv[i * c + j];
            }
            w[at] = q;
            err[i * o + r] = e;
        }
    }
}

/// Launches [`obs_sweep`] on `client`: `w`, `hinv`, `prune` and `err` are
/// the buffers of contiguous f32 tensors of the sizes given.
#[allow(clippy::too_many_arguments)]
pub fn launch_obs_sweep<R: Runtime>(
    client: &ComputeClient<R>,
    w: (cubecl::server::Handle, usize),
    hinv: (cubecl::server::Handle, usize),
    prune: (cubecl::server::Handle, usize),
    err: (cubecl::server::Handle, usize),
    row0: usize,
    out: usize,
    count: usize,
    nm: Option<(usize, usize)>,
) {
    let (n, m) = nm.unwrap_or((0, 0));
    let cube_dim = CubeDim::new_1d(UNITS);
    let cube_count = cubecl::calculate_cube_count_elemwise(client, out, cube_dim);
    // SAFETY: the handles are the live buffers of contiguous f32 tensors
    // of exactly these element counts (the caller's tensors), every index
    // the kernel forms is below them (`row0 + count <= rows of w`, units
    // past `out` do nothing), and `w` and `err` alias nothing else.
    unsafe {
        obs_sweep::launch_unchecked(
            client,
            cube_count,
            cube_dim,
            ArrayArg::from_raw_parts(w.0, w.1),
            ArrayArg::from_raw_parts(hinv.0, hinv.1),
            ArrayArg::from_raw_parts(prune.0, prune.1),
            ArrayArg::from_raw_parts(err.0, err.1),
            row0 as u32,
            out as u32,
            count as u32,
            n as u32,
            m as u32,
        );
    }
}
