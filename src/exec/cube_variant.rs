//! The wrappers of Wanda's α-variant kernels (`exec::kernels`: the sorted
//! rows and running sums, one α's thresholds) on Burn's cubecl backends.
//! Each checks that its inputs are f32 buffers laid out as the kernel
//! reads them and of sizes it indexes, allocates the outputs, and hands
//! the input back otherwise; `exec::cube_compute` expands them into both
//! backends' `Compute` and counts each outcome.

/// Whether `handle` starts its buffer and holds at least `bytes`: a
/// tensor's own buffer, which the pool may have rounded up (lavapipe:
/// 10 816 bytes for 2 700 f32), not a view at an offset into another's.
pub(super) fn unsliced(handle: &cubecl::server::Handle, bytes: usize) -> bool {
    handle.offset_start.unwrap_or(0) == 0 && handle.size_in_used() >= bytes as u64
}

/// [`super::Compute::variant_tables`] on a cube backend: the metric read
/// in its own buffer, `[in, out]` or its transpose.
macro_rules! cube_variant_tables {
    ($runtime:ty, $metric:expr) => {{
        use burn::tensor::{DType, Int, Tensor, TensorPrimitive};
        let metric = $metric;
        let [inp, out] = metric.dims();
        let device = metric.device();
        let mp = metric.clone().into_primitive().tensor();
        let Some(strides) = crate::exec::cube_select::laid_out_2d(mp.meta.strides(), inp, out)
        else {
            return Err(metric);
        };
        let p = inp.next_power_of_two();
        let ok = mp.dtype == DType::F32
            && crate::exec::cube_variant::unsliced(&mp.handle, inp * out * 4)
            && inp > 0
            && out > 0
            && out.checked_mul(p).is_some_and(|n| n < u32::MAX as usize);
        if !ok {
            return Err(metric);
        }
        let keys = Tensor::<Self, 2, Int>::empty([out, p], &device).into_primitive();
        let cum = Tensor::<Self, 2>::empty([out, inp], &device)
            .into_primitive()
            .tensor();
        let totals = Tensor::<Self, 1>::empty([out], &device)
            .into_primitive()
            .tensor();
        let fresh = keys.dtype == DType::I32
            && [&keys, &cum, &totals].iter().all(|t| t.is_contiguous())
            && cum.dtype == DType::F32
            && totals.dtype == DType::F32;
        if !fresh {
            return Err(metric);
        }
        crate::exec::kernels::launch_variant_prefix::<$runtime>(
            &mp.client,
            crate::exec::kernels::PrefixBuffers {
                metric: mp.handle.clone(),
                keys: keys.handle.clone(),
                cum: cum.handle.clone(),
                totals: totals.handle.clone(),
            },
            (inp, out),
            strides,
        );
        // The keys' buffer holds the sorted values' f32 bits now.
        let mut sorted = keys;
        sorted.dtype = DType::F32;
        Ok(crate::exec::variant::DeviceTables {
            sorted: Tensor::from_primitive(TensorPrimitive::Float(sorted)),
            cum: Tensor::from_primitive(TensorPrimitive::Float(cum)),
            totals: Tensor::from_primitive(TensorPrimitive::Float(totals)),
        })
    }};
}

/// [`super::Compute::variant_rows`] on a cube backend.
macro_rules! cube_variant_rows {
    ($runtime:ty, $tables:expr, $alpha:expr) => {{
        use burn::tensor::{DType, Int, Tensor, TensorPrimitive};
        let (tables, alpha): (&crate::exec::variant::DeviceTables<Self>, f32) = ($tables, $alpha);
        let (inp, out) = tables.dims();
        let [_, p] = tables.sorted.dims();
        let device = tables.cum.device();
        let prims = [&tables.sorted, &tables.cum].map(|t| t.clone().into_primitive().tensor());
        let totals = tables.totals.clone().into_primitive().tensor();
        let ok = prims.iter().chain([&totals]).all(|t| {
            let bytes = t.meta.num_elements() * 4;
            t.dtype == DType::F32
                && t.is_contiguous()
                && crate::exec::cube_variant::unsliced(&t.handle, bytes)
        }) && p >= inp
            && out * p < u32::MAX as usize;
        if !ok {
            return None;
        }
        let thresh = Tensor::<Self, 1>::empty([out], &device)
            .into_primitive()
            .tensor();
        let pruned = Tensor::<Self, 1, Int>::empty([out], &device).into_primitive();
        if thresh.dtype != DType::F32 || pruned.dtype != DType::I32 {
            return None;
        }
        let [sorted, cum] = prims;
        crate::exec::kernels::launch_variant_rows::<$runtime>(
            &cum.client,
            [
                sorted.handle.clone(),
                cum.handle.clone(),
                totals.handle.clone(),
            ],
            [thresh.handle.clone(), pruned.handle.clone()],
            (inp, out, p),
            alpha,
        );
        Some((
            Tensor::<Self, 1>::from_primitive(TensorPrimitive::Float(thresh)),
            Tensor::<Self, 1, Int>::from_primitive(pruned),
        ))
    }};
}

/// Both `Compute` methods of the variant on a cube backend, each request
/// counted (`exec::tally`).
macro_rules! cube_variant_methods {
    ($runtime:ty) => {
        fn variant_tables(
            metric: burn::tensor::Tensor<Self, 2>,
        ) -> Result<crate::exec::variant::DeviceTables<Self>, burn::tensor::Tensor<Self, 2>> {
            crate::exec::tally::counted(
                crate::exec::tally::Kernel::VariantPrefix,
                (|| cube_variant_tables!($runtime, metric))(),
            )
        }

        #[allow(clippy::type_complexity)]
        fn variant_rows(
            tables: &crate::exec::variant::DeviceTables<Self>,
            alpha: f32,
        ) -> Option<(
            burn::tensor::Tensor<Self, 1>,
            burn::tensor::Tensor<Self, 1, burn::tensor::Int>,
        )> {
            let rows = (|| cube_variant_rows!($runtime, tables, alpha))();
            crate::exec::tally::count(crate::exec::tally::Kernel::VariantRows, rows.is_some());
            rows
        }
    };
}
