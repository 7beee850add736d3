//! The launches of DSnoT's swap-loop kernels (`kernels::dsnot`): the
//! buffers the wrapper (`exec::cube_dsnot`) hands over, their layout bits,
//! one unit per output.

use cubecl::prelude::*;

use super::dsnot::{dsnot_nm, dsnot_unstructured, layout};

/// Units (outputs) per cube.
pub(super) const UNITS: u32 = 64;

/// A buffer, its element count, and whether it is column-major (a
/// `[len, cols]` tensor with strides `(1, len)`; else `(cols, 1)`).
#[derive(Clone)]
pub struct Buf {
    pub handle: cubecl::server::Handle,
    pub len: usize,
    pub transposed: bool,
}

/// The buffers both loops take: `d`, the first mask, the mask written,
/// `err`, the regrowing lists' keys and inputs (front, back), and `swaps`
/// (written).
pub struct SwapBuffers {
    pub d: Buf,
    pub first: Buf,
    pub mask: Buf,
    pub err: Buf,
    pub regrow: [(Buf, Buf); 2],
    pub swaps: Buf,
}

impl SwapBuffers {
    /// The layout bits of the buffers both loops share.
    fn layout(&self) -> u32 {
        let [(fk, fr), (bk, br)] = &self.regrow;
        bits(&[
            (&self.d, layout::D),
            (&self.first, layout::FIRST),
            (fk, layout::FRONT_KEYS),
            (fr, layout::FRONT_ROWS),
            (bk, layout::BACK_KEYS),
            (br, layout::BACK_ROWS),
        ])
    }
}

/// `layout`'s bits of the column-major buffers of `bufs`.
fn bits(bufs: &[(&Buf, u32)]) -> u32 {
    bufs.iter()
        .filter(|(b, _)| b.transposed)
        .fold(0, |acc, (_, bit)| acc | (1 << bit))
}

/// The loop's sizes: `rows`, `cols`, the regrowing lists' rows and whether
/// they are whole columns, the cycles, the threshold.
pub struct SwapShape {
    pub rows: usize,
    pub cols: usize,
    pub regrow_len: usize,
    pub regrow_whole: bool,
    pub cycles: usize,
    pub threshold: f32,
}

fn cubes<R: Runtime>(client: &ComputeClient<R>, cols: usize) -> (CubeCount, CubeDim) {
    let dim = CubeDim::new_1d(UNITS);
    (
        cubecl::calculate_cube_count_elemwise(client, cols, dim),
        dim,
    )
}

/// `b` as a kernel argument.
///
/// # Safety
/// `b.handle` is a live buffer of at least `b.len` elements of the kernel
/// parameter's element type.
unsafe fn arg<R: Runtime>(b: &Buf) -> ArrayArg<R> {
    unsafe { ArrayArg::from_raw_parts(b.handle.clone(), b.len) }
}

/// Launches [`dsnot_unstructured`]: `prune` holds end 0's and end 1's
/// keys and inputs (`prune_len` rows), then their `among` flags (read
/// where `prune_whole`), and `ends` (`[7, cols]`, row-major).
pub fn launch_dsnot_unstructured<R: Runtime>(
    client: &ComputeClient<R>,
    b: &SwapBuffers,
    prune: &[Buf; 6],
    ends: &Buf,
    s: &SwapShape,
    (prune_len, prune_whole): (usize, bool),
) {
    let (count, dim) = cubes(client, s.cols);
    let [(fk, fr), (bk, br)] = &b.regrow;
    let [k0, r0, k1, r1, a0, a1] = prune;
    let layout = b.layout()
        | bits(&[
            (k0, layout::KEYS_0),
            (r0, layout::ROWS_0),
            (k1, layout::KEYS_1),
            (r1, layout::ROWS_1),
            (a0, layout::AMONG_0),
            (a1, layout::AMONG_1),
        ]);
    // SAFETY: every buffer is a live i32 / f32 buffer (`d` and `err` f32)
    // of the element count given, laid out as `layout` says (the caller's
    // tensors); a unit works only for `col < cols` and reads rows below
    // the lists' lengths (the regrowing lists hold `regrow_len` rows, the
    // prune lists `prune_len`, `ends` 7) and the inputs those lists name
    // (below `rows`: `d`, `first` and `mask` hold `rows · cols`); `mask`
    // and `swaps` are new buffers that alias nothing.
    unsafe {
        dsnot_unstructured::launch_unchecked(
            client,
            count,
            dim,
            arg(&b.d),
            arg(&b.first),
            arg(&b.mask),
            arg(&b.err),
            arg(fk),
            arg(fr),
            arg(bk),
            arg(br),
            arg(k0),
            arg(r0),
            arg(k1),
            arg(r1),
            arg(a0),
            arg(a1),
            arg(ends),
            arg(&b.swaps),
            s.rows as u32,
            s.cols as u32,
            s.regrow_len as u32,
            prune_len as u32,
            u32::from(s.regrow_whole),
            u32::from(prune_whole),
            s.cycles as u32,
            s.threshold,
            layout,
        );
    }
}

/// Launches [`dsnot_nm`]: the first `metric` and its copy (`[rows,
/// cols]`, written, row-major) and `max_value` (`[cols]`) beside the
/// shared buffers; `rows` a multiple of `m`.
pub fn launch_dsnot_nm<R: Runtime>(
    client: &ComputeClient<R>,
    b: &SwapBuffers,
    metric: [&Buf; 2],
    max_value: &Buf,
    s: &SwapShape,
    m: usize,
) {
    let (count, dim) = cubes(client, s.cols);
    let [(fk, fr), (bk, br)] = &b.regrow;
    let layout = b.layout() | bits(&[(metric[0], layout::METRIC)]);
    // SAFETY: as for `launch_dsnot_unstructured`; a group's `m` rows start
    // at a multiple of `m` below `rows`, so they lie in the metric's
    // `rows · cols`; its copy is a new buffer that aliases nothing.
    unsafe {
        dsnot_nm::launch_unchecked(
            client,
            count,
            dim,
            arg(&b.d),
            arg(&b.first),
            arg(&b.mask),
            arg(&b.err),
            arg(fk),
            arg(fr),
            arg(bk),
            arg(br),
            arg(metric[0]),
            arg(metric[1]),
            arg(max_value),
            arg(&b.swaps),
            s.rows as u32,
            s.cols as u32,
            s.regrow_len as u32,
            u32::from(s.regrow_whole),
            m as u32,
            s.cycles as u32,
            s.threshold,
            layout,
        );
    }
}
