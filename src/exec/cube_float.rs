//! The wrappers of prunemem's float kernels on Burn's cubecl backends
//! (`exec::kernels`: each evaluation window's loss, the MLP's SwiGLU,
//! Wanda's column norms, the RMS norm), which read and write the tensors'
//! own buffers in their own dtype (f32, f16 or bf16), and the one dtype
//! dispatch they share. Each checks dtype, layout and sizes and hands the
//! tensors back where its kernel cannot take them; `exec::cube_compute`
//! expands them into both backends' `Compute` and counts each outcome.

/// The launch of the float kernel `exec::kernels::$launch` (generic over
/// the runtime and the element type) for `$dtype`, else `$otherwise` (the
/// wrapper's way out: a `return` handing the tensors back).
macro_rules! float_launch {
    ($launch:ident, $runtime:ty, $dtype:expr, $otherwise:expr) => {
        match $dtype {
            burn::tensor::DType::F32 => crate::exec::kernels::$launch::<$runtime, f32>,
            burn::tensor::DType::F16 => crate::exec::kernels::$launch::<$runtime, half::f16>,
            burn::tensor::DType::BF16 => crate::exec::kernels::$launch::<$runtime, half::bf16>,
            _ => $otherwise,
        }
    };
}

/// [`super::Compute::row_nll`] on a cube backend: the kernel of
/// `exec::kernels` for the logits' dtype (f32, f16, bf16), on contiguous
/// buffers, one cube per row.
macro_rules! cube_row_nll {
    ($runtime:ty, $logits:expr, $targets:expr, $skip:expr) => {{
        use burn::tensor::{DType, Tensor, TensorPrimitive};
        let (logits, targets, skip) = ($logits, $targets, $skip);
        let [rows, vocab] = logits.dims();
        let device = logits.device();
        let lp = logits.into_primitive().tensor();
        let tp = targets.into_primitive();
        let give_back = |lp, tp| {
            Err((
                Tensor::from_primitive(TensorPrimitive::Float(lp)),
                Tensor::from_primitive(tp),
            ))
        };
        let ok = lp.is_contiguous()
            && tp.is_contiguous()
            && tp.dtype == DType::I32
            && rows <= 65_535
            && rows * vocab < u32::MAX as usize;
        if !ok {
            return give_back(lp, tp);
        }
        let launch = float_launch!(launch_row_nll, $runtime, lp.dtype, return give_back(lp, tp));
        // The output only once the kernel can run.
        let np = Tensor::<Self, 1>::empty([rows], &device)
            .into_primitive()
            .tensor();
        if !np.is_contiguous() || np.dtype != DType::F32 {
            return give_back(lp, tp);
        }
        launch(
            &lp.client,
            lp.handle.clone(),
            tp.handle.clone(),
            np.handle.clone(),
            rows,
            vocab,
            skip,
        );
        Ok(Tensor::from_primitive(TensorPrimitive::Float(np)))
    }};
}

/// [`super::Compute::swiglu`] on a cube backend: one launch over the
/// contiguous operands' buffers, written over the gate where no other
/// tensor holds its buffer (the gate projection's fresh output), else
/// into a new tensor.
macro_rules! cube_swiglu {
    ($runtime:ty, $gate:expr, $up:expr) => {{
        use burn::tensor::{Tensor, TensorPrimitive};
        let (gate, up) = ($gate, $up);
        let dims = gate.dims();
        let n = dims.iter().product::<usize>();
        let device = gate.device();
        // The gate's own primitive (no clone), so that its handle's
        // count says whether another tensor holds the buffer.
        let gp = gate.into_primitive().tensor();
        let upr = up.clone().into_primitive().tensor();
        let give_back = |gp, up| Err((Tensor::from_primitive(TensorPrimitive::Float(gp)), up));
        let ok = up.dims() == dims
            && gp.dtype == upr.dtype
            && gp.is_contiguous()
            && upr.is_contiguous()
            && n > 0
            && n < u32::MAX as usize;
        if !ok {
            return give_back(gp, up);
        }
        let dtype = gp.dtype;
        let in_place = float_launch!(
            launch_swiglu_in_place,
            $runtime,
            dtype,
            return give_back(gp, up)
        );
        if gp.can_mut() && gp.is_contiguous_buffer() {
            in_place(&gp.client, gp.handle.clone(), upr.handle.clone(), n);
            return Ok(Tensor::from_primitive(TensorPrimitive::Float(gp)));
        }
        let launch = float_launch!(launch_swiglu, $runtime, dtype, return give_back(gp, up));
        let op = Tensor::<Self, 3>::empty(dims, (&device, up.dtype()))
            .into_primitive()
            .tensor();
        if !op.is_contiguous() {
            return give_back(gp, up);
        }
        launch(
            &gp.client,
            gp.handle.clone(),
            upr.handle.clone(),
            op.handle.clone(),
            n,
        );
        Ok(Tensor::from_primitive(TensorPrimitive::Float(op)))
    }};
}

/// [`super::Compute::column_square_sums`] on a cube backend: one launch
/// into `[slabs, cols]` f32 partial sums, then their sum over the slabs.
macro_rules! cube_column_square_sums {
    ($runtime:ty, $x:expr) => {{
        use burn::tensor::{DType, Tensor, TensorPrimitive};
        let x = $x;
        let [rows, cols] = x.dims();
        let xp = x.clone().into_primitive().tensor();
        let ok = xp.is_contiguous() && rows > 0 && cols > 0 && rows * cols < u32::MAX as usize;
        if !ok {
            return Err(x);
        }
        let launch = float_launch!(launch_column_squares, $runtime, xp.dtype, return Err(x));
        let slabs = crate::exec::kernels::square_slabs(rows);
        let pp = Tensor::<Self, 2>::empty([slabs, cols], &x.device())
            .into_primitive()
            .tensor();
        if !pp.is_contiguous() || pp.dtype != DType::F32 {
            return Err(x);
        }
        launch(&xp.client, xp.handle.clone(), pp.handle.clone(), rows, cols);
        let partial = Tensor::<Self, 2>::from_primitive(TensorPrimitive::Float(pp));
        let sums = if slabs == 1 {
            partial
        } else {
            crate::exec::reduce::sum_dim(partial, 0)
        };
        Ok(sums.reshape([cols]))
    }};
}

/// [`super::Compute::rms_norm`] on a cube backend: one launch over the
/// contiguous rows.
macro_rules! cube_rms_norm {
    ($runtime:ty, $x:expr, $weight:expr, $eps:expr) => {{
        use burn::tensor::{Tensor, TensorPrimitive};
        let (x, weight, eps) = ($x, $weight, $eps);
        let dims = x.dims();
        let d = dims[dims.len() - 1];
        let n = dims.iter().product::<usize>();
        let xp = x.clone().into_primitive().tensor();
        let wp = weight.clone().into_primitive().tensor();
        let ok = weight.dims() == [d]
            && wp.dtype == xp.dtype
            && xp.is_contiguous()
            && wp.is_contiguous()
            && d > 0
            && n > 0
            && n < u32::MAX as usize;
        if !ok {
            return Err(x);
        }
        let launch = float_launch!(launch_rms_norm, $runtime, xp.dtype, return Err(x));
        let op = Tensor::<Self, D>::empty(dims, (&x.device(), x.dtype()))
            .into_primitive()
            .tensor();
        if !op.is_contiguous() {
            return Err(x);
        }
        launch(
            &xp.client,
            xp.handle.clone(),
            wp.handle.clone(),
            op.handle.clone(),
            n / d,
            d,
            eps as f32,
        );
        Ok(Tensor::from_primitive(TensorPrimitive::Float(op)))
    }};
}
