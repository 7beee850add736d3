//! The wrapper of DSnoT's swap-loop kernels (`exec::kernels`) on Burn's
//! cubecl backends: it checks that every list and state tensor is a
//! contiguous buffer of the kernel's element type and that the lists'
//! shapes agree, allocates the outputs (a new mask, N:M's metric copy, the
//! swap counts), and hands the request back where any check fails, so the
//! caller steps the loop with Burn's ops. `exec::cube_compute` expands it
//! into both backends' `Compute` and counts each outcome.

/// [`super::Compute::dsnot_swaps`] on a cube backend.
macro_rules! cube_dsnot {
    ($job:expr) => {{
        use crate::exec::kernels::{Buf, SwapBuffers, SwapShape};
        use crate::exec::swap_loop::{SwapList, SwapPrune, Swapped};
        use burn::tensor::{DType, Int, Tensor};
        let job = $job;
        let [rows, cols] = job.d.dims();
        let device = job.d.device();
        // `t`'s buffer where it is `dtype`, row-major or column-major.
        let laid_out = |p: <Self as burn::tensor::backend::BackendTypes>::IntTensorPrimitive,
                        dtype: DType|
         -> Option<Buf> {
            let [len, c] = p.meta.shape().dims::<2>();
            let strides = p.meta.strides();
            let (s0, s1) = (strides[0], strides[1]);
            let row_major = (s0 == c || len == 1) && (s1 == 1 || c == 1);
            let column_major = s0 == 1 && s1 == len && !row_major;
            (p.dtype == dtype && (row_major || column_major)).then(|| Buf {
                handle: p.handle.clone(),
                len: len * c,
                transposed: column_major,
            })
        };
        let int = |t: &Tensor<Self, 2, Int>| laid_out(t.clone().into_primitive(), DType::I32);
        let float = |t: &Tensor<Self, 2>| laid_out(t.clone().into_primitive().tensor(), DType::F32);
        // A list's keys, inputs and flags (the keys again where a part is
        // implicit), its rows, and whether it is a whole column.
        let list = |l: &SwapList<Self>| -> Option<([Buf; 3], usize, bool)> {
            let keys = int(&l.keys)?;
            let [len, c] = l.keys.dims();
            let rows_of = match &l.rows {
                Some(r) if r.dims() == [len, c] => int(r)?,
                Some(_) => return None,
                None => keys.clone(),
            };
            let among = match &l.among {
                Some(a) if a.dims() == [len, c] => int(a)?,
                Some(_) => return None,
                None => keys.clone(),
            };
            let whole = l.rows.is_none();
            (c == cols && (!whole || len == rows)).then_some(([keys, rows_of, among], len, whole))
        };
        let client = job.d.clone().into_primitive().tensor().client;
        let fits = rows < i32::MAX as usize && rows * cols < u32::MAX as usize;
        let new = |shape: [usize; 2]| -> Option<(Tensor<Self, 2, Int>, Buf)> {
            let t = Tensor::<Self, 2, Int>::empty(shape, &device);
            let b = int(&t)?;
            Some((t, b))
        };
        let launched = (|| {
            let [front, back] = [list(&job.regrow[0])?, list(&job.regrow[1])?];
            let unfiltered = job.regrow.iter().all(|l| l.among.is_none());
            if !fits || !unfiltered || front.1 != back.1 || front.2 != back.2 {
                return None;
            }
            let [[fk, fr, _], [bk, br, _]] = [front.0, back.0];
            let first = int(&job.mask)?;
            let (d, err) = (float(&job.d)?, float(&job.err)?);
            let shape = SwapShape {
                rows,
                cols,
                regrow_len: front.1,
                regrow_whole: front.2,
                cycles: job.cycles,
                threshold: job.threshold,
            };
            let bindings = client.properties().hardware.max_bindings;
            // The prune side's buffers: the ends' lists, their counts, the
            // lists' rows and whether they are whole; or N:M's metric, its
            // raised value and `m`.
            #[allow(clippy::large_enum_variant)] // one, on the stack, briefly
            enum Side {
                Ends([Buf; 6], Buf, usize, bool),
                Groups(Buf, Buf, usize),
            }
            let side = match &job.prune {
                SwapPrune::Ends { own, whole, ends } => {
                    let [e0, e1] = [list(&own[0])?, list(&own[1])?];
                    let filtered = |l: &SwapList<Self>| l.among.is_some();
                    let agree = e0.1 == e1.1
                        && e0.2 == *whole
                        && e1.2 == *whole
                        && filtered(&own[0]) == *whole
                        && filtered(&own[1]) == *whole
                        && ends.dims() == [7, cols];
                    if !agree || bindings < 18 {
                        return None;
                    }
                    let [[k0, r0, a0], [k1, r1, a1]] = [e0.0, e1.0];
                    Side::Ends([k0, r0, k1, r1, a0, a1], int(ends)?, e0.1, *whole)
                }
                SwapPrune::Groups {
                    metric,
                    max_value,
                    m,
                } => {
                    let agree = *m > 0
                        && rows % m == 0
                        && metric.dims() == [rows, cols]
                        && max_value.dims() == [1, cols];
                    if !agree || bindings < 15 {
                        return None;
                    }
                    Side::Groups(int(metric)?, int(max_value)?, *m)
                }
            };
            let (mask, mb) = new([rows, cols])?;
            let (swaps, sb) = new([1, cols])?;
            let b = SwapBuffers {
                d,
                first,
                mask: mb,
                err,
                regrow: [(fk, fr), (bk, br)],
                swaps: sb,
            };
            match side {
                Side::Ends(prune, ends, len, whole) => {
                    crate::exec::kernels::launch_dsnot_unstructured(
                        &client,
                        &b,
                        &prune,
                        &ends,
                        &shape,
                        (len, whole),
                    );
                }
                Side::Groups(metric, max_value, m) => {
                    let (_copy, cb) = new([rows, cols])?;
                    crate::exec::kernels::launch_dsnot_nm(
                        &client,
                        &b,
                        [&metric, &cb],
                        &max_value,
                        &shape,
                        m,
                    );
                }
            }
            Some(Swapped { mask, swaps })
        })();
        launched.ok_or(job)
    }};
}
