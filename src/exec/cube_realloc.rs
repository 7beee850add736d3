//! The wrappers of RIA's reallocation kernels (`exec::kernels`: the
//! inputs' ordered sums, one slot's assignment scores, the report's kept
//! metric) on Burn's cubecl
//! backends. Each checks that its input is a contiguous f32 buffer of a
//! size the kernel indexes, allocates the output, and hands the input
//! back otherwise, so the caller computes on the host; `exec::cube_compute`
//! expands them into both backends' `Compute` and counts each outcome.

/// [`super::Compute::ordered_row_sums`] on a cube backend.
macro_rules! cube_ordered_row_sums {
    ($runtime:ty, $x:expr) => {{
        use burn::tensor::{DType, Tensor, TensorPrimitive};
        let x = $x;
        let [rows, cols] = x.dims();
        let xp = x.clone().into_primitive().tensor();
        let ok = xp.is_contiguous()
            && xp.dtype == DType::F32
            && rows > 0
            && rows * cols < u32::MAX as usize;
        if !ok {
            return Err(x);
        }
        let sp = Tensor::<Self, 1>::empty([rows], &x.device())
            .into_primitive()
            .tensor();
        if !sp.is_contiguous() || sp.dtype != DType::F32 {
            return Err(x);
        }
        crate::exec::kernels::launch_ordered_row_sums::<$runtime>(
            &xp.client,
            xp.handle.clone(),
            sp.handle.clone(),
            rows,
            cols,
        );
        Ok(Tensor::<Self, 1>::from_primitive(TensorPrimitive::Float(
            sp,
        )))
    }};
}

/// [`super::Compute::slot_scores`] on a cube backend.
macro_rules! cube_slot_scores {
    ($runtime:ty, $p:expr, $n:expr, $m:expr, $slot:expr) => {{
        use burn::tensor::{DType, Tensor, TensorPrimitive};
        let (p, n, m, slot) = ($p, $n, $m, $slot);
        let [rows, cols] = p.dims();
        let pp = p.clone().into_primitive().tensor();
        let groups = if m > 0 { cols / m } else { 0 };
        let ok = pp.is_contiguous()
            && pp.dtype == DType::F32
            && (1..m).contains(&n)
            && m <= crate::exec::kernels::REALLOC_MAX_M
            && slot < m
            && groups > 0
            && groups * m == cols
            && rows > 0
            && rows * cols < u32::MAX as usize
            && groups * groups < u32::MAX as usize;
        if !ok {
            return Err(p);
        }
        let sp = Tensor::<Self, 2>::empty([groups, groups], &p.device())
            .into_primitive()
            .tensor();
        if !sp.is_contiguous() || sp.dtype != DType::F32 {
            return Err(p);
        }
        crate::exec::kernels::launch_slot_scores::<$runtime>(
            &pp.client,
            pp.handle.clone(),
            sp.handle.clone(),
            (rows, groups),
            (n, m, slot),
        );
        Ok(Tensor::<Self, 2>::from_primitive(TensorPrimitive::Float(
            sp,
        )))
    }};
}

/// [`super::Compute::nm_kept_sums`] on a cube backend: the metric read in
/// its layout (`[in, out]` or its transpose, one whole buffer).
macro_rules! cube_nm_kept_sums {
    ($runtime:ty, $metric:expr, $n:expr, $m:expr) => {{
        use burn::tensor::{DType, Tensor, TensorPrimitive};
        let (metric, n, m) = ($metric, $n, $m);
        let [rows, cols] = metric.dims();
        let prim = metric.clone().into_primitive().tensor();
        let Some(strides) = crate::exec::cube_select::laid_out_2d(prim.meta.strides(), rows, cols)
        else {
            return Err(metric);
        };
        let ok = prim.dtype == DType::F32
            && prim.is_contiguous_buffer()
            && (1..m).contains(&n)
            && m <= crate::exec::kernels::REALLOC_MAX_M
            && rows > 0
            && rows % m == 0
            && cols > 0
            && rows * cols < u32::MAX as usize;
        if !ok {
            return Err(metric);
        }
        let sp = Tensor::<Self, 1>::empty([cols], &metric.device())
            .into_primitive()
            .tensor();
        if !sp.is_contiguous() || sp.dtype != DType::F32 {
            return Err(metric);
        }
        crate::exec::kernels::launch_nm_kept_sums::<$runtime>(
            &prim.client,
            (prim.handle.clone(), rows * cols),
            sp.handle.clone(),
            (rows, cols),
            strides,
            (n, m),
        );
        Ok(Tensor::<Self, 1>::from_primitive(TensorPrimitive::Float(
            sp,
        )))
    }};
}
