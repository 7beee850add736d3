//! The wrappers of the selection kernels (`exec::kernels`: a mask from
//! keys, per output or per matrix, and the `k`-th smallest key) on Burn's
//! cubecl backends, and the one layout check every 2-D kernel wrapper
//! shares. Each checks dtype, layout and sizes and hands the keys back
//! where the kernel cannot take them; `exec::cube_compute` expands them
//! into both backends' `Compute` and counts each outcome.

/// The strides of a `[rows, cols]` tensor laid out whole, row-major
/// (`(cols, 1)`) or as the transpose of a row-major one (`(1, rows)`): the
/// two layouts prunemem's 2-D kernels index; `None` for any other.
pub(super) fn laid_out_2d(strides: &[usize], rows: usize, cols: usize) -> Option<(usize, usize)> {
    let strides = (strides[0], strides[1]);
    (strides == (cols, 1) || strides == (1, rows)).then_some(strides)
}

/// A selection kernel on a cube backend (`exec::kernels`): `$launch` runs
/// on the keys' own buffer (read in its layout, `[in, out]` or its
/// transpose) and writes i32 flags into a new contiguous tensor, handed
/// back as the mask. The keys come back where the kernel cannot take them
/// (`$takes` false, another dtype or layout, or sizes past u32).
macro_rules! cube_select {
    ($keys:expr, $takes:expr, $launch:path, $arg:expr) => {{
        use burn::tensor::{DType, Int, Tensor};
        let keys = $keys;
        let [rows, cols] = keys.dims();
        let device = keys.device();
        let prim = keys.into_primitive();
        let layout = crate::exec::cube_select::laid_out_2d(prim.meta.strides(), rows, cols);
        let fits = rows < i32::MAX as usize && rows * cols < u32::MAX as usize;
        let Some(strides) = layout else {
            return Err(Tensor::from_primitive(prim));
        };
        if prim.dtype != DType::I32
            || !prim.is_contiguous_buffer()
            || !fits
            || !$takes
            || !crate::exec::kernels::takes_selection_cubes(&prim.client)
        {
            return Err(Tensor::from_primitive(prim));
        }
        let flags = Tensor::<Self, 2, Int>::empty([rows, cols], &device);
        let fp = flags.into_primitive();
        if fp.dtype != DType::I32 || !fp.is_contiguous() {
            return Err(Tensor::from_primitive(prim));
        }
        $launch(
            &prim.client,
            (prim.handle.clone(), rows * cols),
            fp.handle.clone(),
            rows,
            cols,
            strides,
            $arg,
        );
        Ok(Tensor::<Self, 2, Int>::from_primitive(fp).equal_elem(1))
    }};
}

/// [`super::Compute::kth_smallest`] on a cube backend: the kernel of
/// `exec::kernels` over the keys' whole buffer (any layout).
macro_rules! cube_kth_smallest {
    ($keys:expr, $k:expr) => {{
        use burn::tensor::{DType, Int, Tensor};
        let (keys, k) = ($keys, $k);
        let [rows, cols] = keys.dims();
        let len = rows * cols;
        let prim = keys.clone().into_primitive();
        if prim.dtype != DType::I32
            || !prim.is_contiguous_buffer()
            || k == 0
            || k > len
            || len >= u32::MAX as usize
            || !crate::exec::kernels::takes_selection_cubes(&prim.client)
        {
            return None;
        }
        let out = Tensor::<Self, 2, Int>::empty([1, 1], &keys.device());
        let op = out.into_primitive();
        if op.dtype != DType::I32 {
            return None;
        }
        crate::exec::kernels::launch_kth_smallest(
            &prim.client,
            prim.handle.clone(),
            op.handle.clone(),
            len,
            k,
        );
        Some(Tensor::<Self, 2, Int>::from_primitive(op))
    }};
}
