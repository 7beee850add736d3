//! The `Compute` of Burn's cubecl backends (wgpu and CUDA share one body,
//! differing only in their runtime): prunemem's kernels (`exec::kernels`;
//! the float kernels' wrappers are `exec::cube_float`'s, the selections'
//! `exec::cube_select`'s) on the tensors' own buffers, the in-place f32
//! bit view, the linear with the matmul strategy `exec::matmul` chooses,
//! and a look at the pool after each linear. Each kernel's wrapper checks
//! dtype, layout and sizes and hands the tensors back where the kernel
//! cannot take them, so the caller runs Burn's ops instead; every request
//! is counted by its outcome (`exec::tally`), so that a decline is never
//! silent.

// A kernel's way out hands its tensors back in `Err` (the `Compute`
// trait's contract), so the wrappers' results carry tensors either way.
#![allow(clippy::result_large_err)]

#[cfg(feature = "cuda")]
use super::backends::Cuda;
#[cfg(feature = "wgpu")]
use super::backends::Wgpu;

/// A device backend's linear: Burn's op, then a look at the pool while the
/// input and the output are both alive (the pass's high-water mark,
/// [`super::watch`]).
fn watched_linear<B: burn::tensor::backend::Backend>(
    linear: &burn::nn::Linear<B>,
    x: burn::tensor::Tensor<B, 3>,
) -> burn::tensor::Tensor<B, 3> {
    let y = linear.forward(x.clone());
    super::watch::after_op();
    drop(x);
    y
}

/// A device linear with the matmul strategy `exec::matmul` names (Burn's
/// own when none is named, or when the named kernel cannot take these
/// shapes), then a look at the pool while input and output are alive.
macro_rules! cube_linear {
    ($linear:expr, $x:expr) => {{
        use burn::tensor::{Tensor, TensorPrimitive};
        let (linear, x) = ($linear, $x);
        // The strategy is settled on the first linear, from the device the
        // run opened (`exec::defaults`: CUDA with TMA or not).
        let device = x.device();
        let default = || crate::exec::matmul::measured_default(crate::exec::defaults::cuda_tma());
        let Some(strategy) = crate::exec::matmul::chosen(default) else {
            return watched_linear(linear, x);
        };
        let [b, s, i] = x.dims();
        let w = linear.weight.val();
        let [_, o] = w.dims();
        let out = Tensor::<Self, 2>::empty([b * s, o], (&device, x.dtype()));
        let xp = x.clone().reshape([b * s, i]).into_primitive().tensor();
        let wp = w.into_primitive().tensor();
        let op = out.into_primitive().tensor();
        let launched = crate::exec::matmul::launch(
            &strategy,
            &op.client,
            (xp.clone().binding(), xp.dtype.into()),
            (wp.clone().binding(), wp.dtype.into()),
            (op.clone().binding(), op.dtype.into()),
        );
        if launched.is_err() {
            return watched_linear(linear, x);
        }
        let y = Tensor::<Self, 2>::from_primitive(TensorPrimitive::Float(op)).reshape([b, s, o]);
        let y = match &linear.bias {
            Some(bias) => y + bias.val().unsqueeze::<3>(),
            None => y,
        };
        super::watch::after_op();
        drop(x);
        y
    }};
}

/// `a · b` (`[m, k] · [k, n]`, any layouts cubek reads in place) with
/// cubek's `strategy`, into a new `[m, n]` tensor of `a`'s dtype: `None`
/// where the kernel declines (counted in `exec::tally` either way). Both
/// operands are consumed; callers that fall back keep clones.
macro_rules! cube_product {
    ($a:expr, $b:expr, $strategy:expr) => {{
        use burn::tensor::{Tensor, TensorPrimitive};
        let (a, b) = ($a, $b);
        let ([m, _], [_, n]) = (a.dims(), b.dims());
        let out = Tensor::<Self, 2>::empty([m, n], (&a.device(), a.dtype()));
        let ap = a.into_primitive().tensor();
        let bp = b.into_primitive().tensor();
        let op = out.into_primitive().tensor();
        let (a_type, b_type) = (ap.dtype.into(), bp.dtype.into());
        let launched = crate::exec::matmul::launch(
            $strategy,
            &op.client,
            (ap.binding(), a_type),
            (bp.binding(), b_type),
            (op.clone().binding(), op.dtype.into()),
        );
        launched
            .ok()
            .map(|()| Tensor::<Self, 2>::from_primitive(TensorPrimitive::Float(op)))
    }};
}

/// [`super::Compute::matmul_f32`] on a cube backend: cubek's unit matmul
/// (`simple_unit`, what Burn's own matmul falls back to on devices without
/// tensor cores, lavapipe's included), so no input is rounded to TF32.
/// Burn's matmul where the inputs are not f32 or the kernel declines.
macro_rules! cube_matmul_f32 {
    ($a:expr, $b:expr) => {{
        use burn::tensor::DType;
        let (a, b) = ($a, $b);
        if a.dtype() != DType::F32 || b.dtype() != DType::F32 {
            return a.matmul(b);
        }
        let unit = cubek::matmul::launch::Strategy::SimpleUnit(Default::default());
        match cube_product!(a.clone(), b.clone(), &unit) {
            Some(product) => product,
            None => a.matmul(b),
        }
    }};
}

/// [`super::Compute::matmul_rows`] on a cube backend: cubek's strategy
/// by name on `a` and `b`'s transposed view (a column-major operand, which
/// cubek's kernels read in place), into a new `[n, m]` tensor of `a`'s
/// dtype. The arguments back for `auto`, an unknown name, mixed dtypes,
/// or a kernel that declines.
macro_rules! cube_matmul_rows {
    ($a:expr, $b:expr, $strategy:expr) => {{
        let (a, b) = ($a, $b);
        let Some(strategy) = crate::exec::matmul::strategy($strategy) else {
            return Err((a, b));
        };
        if a.dtype() != b.dtype() {
            return Err((a, b));
        }
        cube_product!(a.clone(), b.clone().transpose(), &strategy).ok_or((a, b))
    }};
}

/// The largest allocation cubecl's pool takes on `device` (wgpu: the
/// adapter's storage-binding limit; CUDA: a quarter of the card).
fn cube_max_buffer<R: burn::cubecl::Runtime>(device: &R::Device) -> Option<u64> {
    Some(R::client(device).properties().memory.max_page_size)
}

/// A cube tensor's f32 bits as an i32 tensor of the same shape: the
/// buffer is shared, only the dtype it is read as changes (the Int element
/// of Burn's wgpu and CUDA backends is i32).
macro_rules! cube_float_bits {
    ($t:expr) => {{
        use burn::tensor::{DType, FloatDType};
        let t = $t;
        let t = match t.dtype() {
            DType::F32 => t,
            _ => t.cast(FloatDType::F32),
        };
        let mut prim = t.into_primitive().tensor();
        prim.dtype = DType::I32;
        burn::tensor::Tensor::from_primitive(prim)
    }};
}

/// [`super::Compute::obs_sweep`] on a cube backend: the kernel of
/// `exec::kernels` on the tensors' own buffers, when every one is
/// contiguous f32.
macro_rules! cube_obs_sweep {
    ($w:expr, $row0:expr, $hinv1:expr, $prune:expr, $nm:expr) => {{
        use burn::tensor::{DType, Tensor, TensorPrimitive};
        let (w, row0, hinv1, prune, nm) = ($w, $row0, $hinv1, $prune, $nm);
        let [rows, out] = w.dims();
        let [count, _] = hinv1.dims();
        let device = w.device();
        let mask = match prune {
            Some(p) => p.clone().float(),
            None => Tensor::zeros([1, 1], &device),
        };
        let err = Tensor::<Self, 2>::empty([count, out], &device);
        let f32s = [&w, hinv1, &mask, &err]
            .iter()
            .all(|t| t.dtype() == DType::F32);
        let wp = w.into_primitive().tensor();
        let hp = hinv1.clone().into_primitive().tensor();
        let mp = mask.into_primitive().tensor();
        let ep = err.into_primitive().tensor();
        let contiguous = [&wp, &hp, &mp, &ep].iter().all(|t| t.is_contiguous());
        if !f32s || !contiguous || row0 + count > rows {
            return Err(Tensor::from_primitive(TensorPrimitive::Float(wp)));
        }
        let mask_len = mp.meta.num_elements();
        crate::exec::kernels::launch_obs_sweep(
            &wp.client,
            (wp.handle.clone(), rows * out),
            (hp.handle.clone(), count * count),
            (mp.handle.clone(), mask_len),
            (ep.handle.clone(), count * out),
            row0,
            out,
            count,
            nm,
        );
        Ok((
            Tensor::from_primitive(TensorPrimitive::Float(wp)),
            Tensor::from_primitive(TensorPrimitive::Float(ep)),
        ))
    }};
}

/// [`super::Compute::fused_attention`] on a cube backend, in f16: the flash
/// kernel `exec::attention` names, on contiguous copies of the operands where
/// they are strided views (the query arrives as `[b, s, h, d]` with its
/// middle dimensions swapped).
macro_rules! cube_attention {
    ($runtime:ty, $cuda:expr, $q:expr, $k:expr, $v:expr) => {{
        use burn::tensor::{Tensor, TensorPrimitive};
        let (q, k, v) = ($q, $k, $v);
        let default = || crate::exec::attention::measured_default($cuda);
        let Some(strategy) = crate::exec::attention::chosen(default) else {
            return Err((q, k, v));
        };
        let [b, h, s, d] = q.dims();
        let q_dtype = q.dtype();
        let like_q = |t: &Tensor<Self, 4>| t.dims() == [b, h, s, d] && t.dtype() == q_dtype;
        // cubek's flash kernels hold q, k, v and the softmax's weights in
        // f16 tiles whatever the operands' dtype: exact for f16 only (f32
        // lost 3e-4 of the output's scale on lavapipe; bf16 would lose
        // range).
        if q.dtype() != burn::tensor::DType::F16 {
            return Err((q, k, v));
        }
        // Asked for: from here every way out is counted.
        let result = (|| {
            if !like_q(&k) || !like_q(&v) || s < 2 {
                return Err((q, k, v));
            }
            // Merging the heads with the positions cannot be a view of a
            // swapped tensor, so Burn copies it into order; the second reshape
            // is a view of the copy.
            let laid_out = |t: &Tensor<Self, 4>| {
                let p = t.clone().into_primitive().tensor();
                if p.is_contiguous() {
                    return Some(p);
                }
                let p = t.clone().reshape([b, h * s, d]).reshape([b, h, s, d]);
                let p = p.into_primitive().tensor();
                p.is_contiguous().then_some(p)
            };
            let (Some(qp), Some(kp), Some(vp)) = (laid_out(&q), laid_out(&k), laid_out(&v)) else {
                return Err((q, k, v));
            };
            let op = Tensor::<Self, 4>::empty([b, h, s, d], (&q.device(), q.dtype()))
                .into_primitive()
                .tensor();
            let launched = crate::exec::attention::launch::<$runtime>(
                strategy,
                &qp.client,
                [
                    qp.clone().binding(),
                    kp.binding(),
                    vp.binding(),
                    op.clone().binding(),
                ],
                qp.dtype.into(),
            );
            match launched {
                Ok(()) => Ok(Tensor::from_primitive(TensorPrimitive::Float(op))),
                Err(_) => Err((q, k, v)),
            }
        })();
        crate::exec::tally::counted(crate::exec::tally::Kernel::Attention, result)
    }};
}

/// The `Compute` of a cubecl backend: wgpu and CUDA share one body (the
/// device kernels of `exec::kernels`, the in-place bit view, the watched
/// linear), differing only in their runtime.
macro_rules! cube_compute {
    ($backend:ty, $runtime:ty, $cuda:expr $(, staged: $up:path, $down:path)?) => {
        impl super::Compute for $backend {
            $(
            fn staged_upload<const D: usize>(
                data: &burn::tensor::TensorData,
                device: &Self::Device,
            ) -> Result<burn::tensor::Tensor<Self, D>, String> {
                $up(data, device)
            }

            fn staged_download<const D: usize>(
                t: &burn::tensor::Tensor<Self, D>,
            ) -> Result<burn::tensor::TensorData, String> {
                $down(t)
            }
            )?

            fn obs_sweep(
                w: burn::tensor::Tensor<Self, 2>,
                row0: usize,
                hinv1: &burn::tensor::Tensor<Self, 2>,
                prune: Option<&burn::tensor::Tensor<Self, 2, burn::tensor::Bool>>,
                nm: Option<(usize, usize)>,
            ) -> Result<
                (burn::tensor::Tensor<Self, 2>, burn::tensor::Tensor<Self, 2>),
                burn::tensor::Tensor<Self, 2>,
            > {
                crate::exec::tally::counted(
                    crate::exec::tally::Kernel::ObsSweep,
                    (|| cube_obs_sweep!(w, row0, hinv1, prune, nm))(),
                )
            }

            fn smallest_per_column(
                keys: burn::tensor::Tensor<Self, 2, burn::tensor::Int>,
                k: usize,
            ) -> Result<
                burn::tensor::Tensor<Self, 2, burn::tensor::Bool>,
                burn::tensor::Tensor<Self, 2, burn::tensor::Int>,
            > {
                let rows = keys.dims()[0];
                let selected = (|| {
                    cube_select!(
                        keys,
                        k > 0 && k < rows,
                        crate::exec::kernels::launch_smallest_per_column,
                        k
                    )
                })();
                crate::exec::tally::counted(crate::exec::tally::Kernel::PerOutput, selected)
            }

            fn smallest_per_group(
                keys: burn::tensor::Tensor<Self, 2, burn::tensor::Int>,
                n: usize,
                m: usize,
            ) -> Result<
                burn::tensor::Tensor<Self, 2, burn::tensor::Bool>,
                burn::tensor::Tensor<Self, 2, burn::tensor::Int>,
            > {
                let rows = keys.dims()[0];
                let selected = (|| {
                    cube_select!(
                        keys,
                        n > 0 && n < m && m <= 64 && rows % m == 0,
                        crate::exec::kernels::launch_smallest_per_group,
                        (n, m)
                    )
                })();
                crate::exec::tally::counted(crate::exec::tally::Kernel::NM, selected)
            }

            fn dsnot_swaps(
                job: crate::exec::swap_loop::SwapLoop<Self>,
            ) -> Result<crate::exec::swap_loop::Swapped<Self>, crate::exec::swap_loop::SwapLoop<Self>>
            {
                crate::exec::tally::counted(crate::exec::tally::Kernel::Dsnot, cube_dsnot!(job))
            }

            fn kth_smallest(
                keys: &burn::tensor::Tensor<Self, 2, burn::tensor::Int>,
                k: usize,
            ) -> Option<burn::tensor::Tensor<Self, 2, burn::tensor::Int>> {
                let t = (|| cube_kth_smallest!(keys, k))();
                crate::exec::tally::count(crate::exec::tally::Kernel::KthSmallest, t.is_some());
                t
            }

            fn row_nll(
                logits: burn::tensor::Tensor<Self, 2>,
                targets: burn::tensor::Tensor<Self, 1, burn::tensor::Int>,
                skip: usize,
            ) -> Result<
                burn::tensor::Tensor<Self, 1>,
                (
                    burn::tensor::Tensor<Self, 2>,
                    burn::tensor::Tensor<Self, 1, burn::tensor::Int>,
                ),
            > {
                crate::exec::tally::counted(
                    crate::exec::tally::Kernel::RowNll,
                    (|| cube_row_nll!($runtime, logits, targets, skip))(),
                )
            }

            fn fused_attention(
                q: burn::tensor::Tensor<Self, 4>,
                k: burn::tensor::Tensor<Self, 4>,
                v: burn::tensor::Tensor<Self, 4>,
            ) -> Result<
                burn::tensor::Tensor<Self, 4>,
                (
                    burn::tensor::Tensor<Self, 4>,
                    burn::tensor::Tensor<Self, 4>,
                    burn::tensor::Tensor<Self, 4>,
                ),
            > {
                cube_attention!($runtime, $cuda, q, k, v)
            }

            fn swiglu(
                gate: burn::tensor::Tensor<Self, 3>,
                up: burn::tensor::Tensor<Self, 3>,
            ) -> Result<
                burn::tensor::Tensor<Self, 3>,
                (burn::tensor::Tensor<Self, 3>, burn::tensor::Tensor<Self, 3>),
            > {
                crate::exec::tally::counted(
                    crate::exec::tally::Kernel::Swiglu,
                    (|| cube_swiglu!($runtime, gate, up))(),
                )
            }

            fn column_square_sums(
                x: burn::tensor::Tensor<Self, 2>,
            ) -> Result<burn::tensor::Tensor<Self, 1>, burn::tensor::Tensor<Self, 2>> {
                crate::exec::tally::counted(
                    crate::exec::tally::Kernel::Norms,
                    (|| cube_column_square_sums!($runtime, x))(),
                )
            }

            fn ordered_row_sums(
                x: burn::tensor::Tensor<Self, 2>,
            ) -> Result<burn::tensor::Tensor<Self, 1>, burn::tensor::Tensor<Self, 2>> {
                crate::exec::tally::counted(
                    crate::exec::tally::Kernel::RowSums,
                    (|| cube_ordered_row_sums!($runtime, x))(),
                )
            }

            fn nm_kept_sums(
                metric: burn::tensor::Tensor<Self, 2>,
                n: usize,
                m: usize,
            ) -> Result<burn::tensor::Tensor<Self, 1>, burn::tensor::Tensor<Self, 2>> {
                crate::exec::tally::counted(
                    crate::exec::tally::Kernel::KeptSums,
                    (|| cube_nm_kept_sums!($runtime, metric, n, m))(),
                )
            }

            fn slot_scores(
                p: burn::tensor::Tensor<Self, 2>,
                n: usize,
                m: usize,
                slot: usize,
            ) -> Result<burn::tensor::Tensor<Self, 2>, burn::tensor::Tensor<Self, 2>> {
                crate::exec::tally::counted(
                    crate::exec::tally::Kernel::SlotScores,
                    (|| cube_slot_scores!($runtime, p, n, m, slot))(),
                )
            }

            cube_variant_methods!($runtime);

            fn rms_norm<const D: usize>(
                x: burn::tensor::Tensor<Self, D>,
                weight: &burn::tensor::Tensor<Self, 1>,
                eps: f64,
            ) -> Result<burn::tensor::Tensor<Self, D>, burn::tensor::Tensor<Self, D>> {
                crate::exec::tally::counted(
                    crate::exec::tally::Kernel::RmsNorm,
                    (|| cube_rms_norm!($runtime, x, weight, eps))(),
                )
            }

            fn is_device() -> bool {
                true
            }

            fn float_bits<const D: usize>(
                t: burn::tensor::Tensor<Self, D>,
            ) -> burn::tensor::Tensor<Self, D, burn::tensor::Int> {
                cube_float_bits!(t)
            }

            fn max_buffer(device: &Self::Device) -> Option<u64> {
                cube_max_buffer::<$runtime>(device)
            }

            fn matmul_f32(
                a: burn::tensor::Tensor<Self, 2>,
                b: burn::tensor::Tensor<Self, 2>,
            ) -> burn::tensor::Tensor<Self, 2> {
                cube_matmul_f32!(a, b)
            }

            fn matmul_rows(
                a: burn::tensor::Tensor<Self, 2>,
                b: burn::tensor::Tensor<Self, 2>,
                strategy: &str,
            ) -> Result<
                burn::tensor::Tensor<Self, 2>,
                (burn::tensor::Tensor<Self, 2>, burn::tensor::Tensor<Self, 2>),
            > {
                cube_matmul_rows!(a, b, strategy)
            }

            fn linear(
                linear: &burn::nn::Linear<Self>,
                x: burn::tensor::Tensor<Self, 3>,
            ) -> burn::tensor::Tensor<Self, 3> {
                cube_linear!(linear, x)
            }
        }
    };
}

// wgpu has no staged copies (its queue stages its writes itself): the
// trait's defaults hand every request back.
#[cfg(feature = "wgpu")]
cube_compute!(Wgpu, burn::backend::wgpu::WgpuRuntime, false);
#[cfg(feature = "cuda")]
cube_compute!(
    Cuda,
    burn::cubecl::cuda::CudaRuntime,
    true,
    staged: super::pinned::upload,
    super::pinned::download
);
