//! RIA's channel reallocation (`--reallocation`, `--lsa`) where the metric
//! is: the host's algorithm (`reallocation`), with only what orders the
//! inputs crossing the bus. Up: nothing weight-sized. Back: the inputs'
//! summed metric (`in` f32), and per assignment round one slot's scores
//! (`(in / m)²` f32) for the host's exact linear-sum-assignment solver;
//! up again: the order (`in` integers). The permuted metric, its N:M mask
//! and the mask in the original order are device tensors.
//!
//! The sums and the scores are added in the host's order, one f32 add at
//! a time (`Compute::ordered_row_sums`, `Compute::slot_scores`), so the
//! order is the host's and the mask the host's to the position. Where a
//! backend has no such kernel (or `m` is past its local array), the metric
//! comes back and the host adds: slower, the same numbers. The report's
//! kept metric is a device sum in f32, where the host's is an f64 one
//! (they agree to about 1e-6 of the total): one kernel that sorts each
//! group and adds what N:M keeps (`Compute::nm_kept_sums`, no mask), else
//! Burn's ops an eighth of the inputs at a time so their mask and masked
//! copy stay small. The widest moment is the metric beside its
//! permutation (8 bytes a weight of the linear, where direct N:M's mask
//! takes the metric's own buffer).

use burn::prelude::*;
use burn::tensor::Bool;

use super::on_device::nm_mask;
use super::reallocation::{self, ReallocationReport};
use crate::exec::Compute;
use crate::exec::copies::{f32s_to_host as read_floats, ints_to_device};

/// RIA's N:M mask of `metric` (`[in, out]`, f32) with the inputs permuted
/// by the heuristic reallocation (and the assignment rounds when `lsa`),
/// in the original order. `in` must be a multiple of `m`.
pub fn nm_mask_reallocated<B: Compute>(
    metric: Tensor<B, 2>,
    n: usize,
    m: usize,
    lsa: bool,
) -> (Tensor<B, 2, Bool>, ReallocationReport) {
    let [inp, _] = metric.dims();
    let device = metric.device();
    let before = kept(&metric, n, m);
    let mut index = reallocation::heuristic_from_sums(&input_sums(&metric), m);
    if lsa {
        for c in 0..m {
            // As the host lays it out, `[out, in]` (a new contiguous buffer).
            let p = metric
                .clone()
                .transpose()
                .select(1, upload(&index, &device));
            let scores = scores(p, inp, n, m, c);
            index = reallocation::assign(&index, &scores, m, c);
        }
    }
    // The widest moment: the metric and its permutation.
    let p = permuted(&metric, &index);
    drop(metric);
    let after = kept(&p, n, m);
    // The permuted metric's last use: its keys become its mask.
    let mask = nm_mask(B::float_bits(p), n, m);
    // Input `index[j]` of the original order is input `j` here.
    let mut inverse = vec![0usize; inp];
    for (j, i) in index.iter().enumerate() {
        inverse[*i] = j;
    }
    let mask = mask.select(0, upload(&inverse, &device));
    let report = ReallocationReport {
        kept_before: before,
        kept_after: after,
    };
    (mask, report)
}

/// `metric`'s inputs in `index`'s order (`metric[index, :]`).
fn permuted<B: Compute>(metric: &Tensor<B, 2>, index: &[usize]) -> Tensor<B, 2> {
    metric.clone().select(0, upload(index, &metric.device()))
}

/// `index` as a device tensor (counted as traffic).
fn upload<B: Compute>(index: &[usize], device: &B::Device) -> Tensor<B, 1, Int> {
    ints_to_device(index.iter().map(|i| *i as i64).collect(), device)
}

/// Slices of the inputs a kept sum takes at a time: the slice's keys, its
/// mask and its masked copy are an eighth of the metric each, so the
/// report widens the selection by half a byte a weight in use (measured;
/// the estimate's `reallocation_kept`), where the whole matrix took four.
const KEPT_SLICES: usize = 8;

/// The metric direct N:M keeps of `metric` (`[in, out]`, `in` a multiple
/// of `m`): one f32 back, per output in one launch where the backend has
/// the kernel, else summed a slice of whole groups at a time.
fn kept<B: Compute>(metric: &Tensor<B, 2>, n: usize, m: usize) -> f64 {
    let total = match B::nm_kept_sums(metric.clone(), n, m) {
        Ok(sums) => crate::exec::reduce::sum_all(sums).reshape([1]),
        Err(metric) => kept_in_slices(&metric, n, m),
    };
    read_floats(total).first().map_or(0.0, |v| *v as f64)
}

/// [`kept`] with Burn's ops, a slice of whole groups at a time: the
/// slice's keys, its mask and its masked copy.
fn kept_in_slices<B: Compute>(metric: &Tensor<B, 2>, n: usize, m: usize) -> Tensor<B, 1> {
    let [inp, _] = metric.dims();
    let step = (inp.div_ceil(KEPT_SLICES).div_ceil(m) * m).max(m);
    let mut total: Option<Tensor<B, 1>> = None;
    for start in (0..inp).step_by(step) {
        let slice = metric.clone().narrow(0, start, step.min(inp - start));
        // The slice's keys in a buffer of their own (the N:M kernel reads
        // whole buffers; a narrowed view is an offset into the metric's).
        let keys = B::float_bits(slice.clone()).add_scalar(0);
        let pruned = nm_mask(keys, n, m);
        let sum = crate::exec::reduce::sum_all(slice.mask_fill(pruned, 0.0)).reshape([1]);
        total = Some(match total {
            Some(t) => t + sum,
            None => sum,
        });
    }
    total.unwrap_or_else(|| Tensor::zeros([1], &metric.device()))
}

/// Each input's summed metric, in the host's order (`in` f32 back; where
/// the backend has no kernel, the metric back and the host's sums).
fn input_sums<B: Compute>(metric: &Tensor<B, 2>) -> Vec<f32> {
    match B::ordered_row_sums(metric.clone()) {
        Ok(sums) => read_floats(sums),
        Err(metric) => {
            // The host's layout, `[out, in]`, summed by the host.
            let [inp, _] = metric.dims();
            let host = read_floats(metric.transpose());
            reallocation::column_sums(&host, inp)
        }
    }
}

/// Slot `c`'s scores over `p` (the permuted metric, `[out, in]`), in the
/// host's order (`(in / m)²` f32 back; where the backend has no kernel,
/// `p` back and the host's scores).
fn scores<B: Compute>(p: Tensor<B, 2>, inp: usize, n: usize, m: usize, c: usize) -> Vec<f32> {
    match B::slot_scores(p, n, m, c) {
        Ok(scores) => read_floats(scores),
        Err(p) => reallocation::slot_scores(&read_floats(p), inp, n, m, c),
    }
}

#[cfg(test)]
mod tests {
    //! The device path on Burn's CPU backend, which has neither kernel: the
    //! host's sums and scores through the fallback, the permutation, the
    //! N:M ranks and the mask mapped back as Burn's ops run them on a
    //! device. `tests/device/` repeats it on wgpu with the kernels.
    use super::*;
    use crate::exec::Cpu;
    use crate::model::synthetic::Normal;
    use crate::prune::reallocation::reallocated_nm_mask;

    #[test]
    fn the_device_path_reallocates_as_the_host() {
        let device = Default::default();
        let mut rng = Normal::new(5);
        let (out, inp) = (24, 64);
        // Inputs of very different importance, so placement matters.
        let scale: Vec<f32> = (0..inp).map(|_| rng.sample().abs() * 3.0).collect();
        let host: Vec<f32> = (0..out * inp)
            .map(|t| rng.sample().abs() * scale[t % inp])
            .collect();
        let metric =
            Tensor::<Cpu, 2>::from_data(TensorData::new(host.clone(), [out, inp]), &device)
                .transpose();
        for (n, m) in [(2, 4), (4, 8)] {
            for lsa in [false, true] {
                let (want, wr) = reallocated_nm_mask(&host, inp, n, m, lsa);
                let (got, gr) = nm_mask_reallocated(metric.clone(), n, m, lsa);
                let got: Vec<bool> = got.transpose().into_data().iter::<bool>().collect();
                let differ = want.iter().zip(&got).filter(|(a, b)| a != b).count();
                assert_eq!(differ, 0, "{n}:{m} lsa {lsa}");
                for (w, g) in [
                    (wr.kept_before, gr.kept_before),
                    (wr.kept_after, gr.kept_after),
                ] {
                    assert!(
                        (w - g).abs() <= 1e-5 * w,
                        "{n}:{m} lsa {lsa}: {wr:?} {gr:?}"
                    );
                }
                // The permutation kept more than direct N:M.
                assert!(gr.kept_after > gr.kept_before, "{n}:{m} lsa {lsa}: {gr:?}");
            }
        }
    }
}
