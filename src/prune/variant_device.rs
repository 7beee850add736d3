//! Wanda's α-variant (`--use-variant`) where the metric is: the host's
//! search (`variant::bisect_alpha`) over tables the device builds and
//! keeps. Up: nothing. Back: one count per α tried (the matrix's pruned
//! entries, for its sparsity), about ten a linear. The mask is the last
//! α's thresholds compared with the metric, a device op.
//!
//! The tables (`Compute::variant_tables`) are the host's to the bit: each
//! output's metric sorted in `f32::total_cmp`'s order and summed left to
//! right one f32 add at a time, its total in input order. Each α's
//! thresholds and counts (`Compute::variant_rows`, or Burn's ops where the
//! backend has no kernel) compare those numbers as the host does, so the
//! α found and the mask are the host's to the position. Where a backend
//! has no tables kernel, the metric comes back and the host computes the
//! mask (`variant::wanda_variant`), which goes up: slower, the same mask.
//!
//! One difference, by construction unreachable: the device writes
//! `-inf` as the threshold of a row with nothing within α, where the host
//! prunes nothing; a Wanda metric (`|W| · sqrt(scaler_row)`) is never
//! `-inf`, so both prune nothing there.

use burn::prelude::*;
use burn::tensor::Bool;

use super::on_device::read_count;
use super::variant;
use crate::exec::copies::f32s_to_host;
use crate::exec::variant::DeviceTables;
use crate::exec::{Compute, reduce};

/// The variant's mask of `metric` (`[in, out]`, f32; `true`: prune) for
/// `ratio`, and the α it found.
pub fn wanda_variant_mask<B: Compute>(
    metric: Tensor<B, 2>,
    ratio: f64,
) -> (Tensor<B, 2, Bool>, f64) {
    let [inp, out] = metric.dims();
    let tables = match B::variant_tables(metric.clone()) {
        Ok(t) => t,
        Err(metric) => return on_host(metric, ratio),
    };
    // The tables beside the metric: the variant's widest moment.
    crate::exec::watch::after_op();
    let numel = (inp * out).max(1) as f64;
    let (thresh, alpha) = variant::bisect_alpha(ratio, |alpha| {
        let (thresh, pruned) = rows(&tables, alpha as f32);
        let pruned = read_count(reduce::sum_dim(pruned, 0));
        (thresh, pruned as f64 / numel)
    });
    drop(tables);
    let thresh = thresh.reshape([1, out]).expand([inp, out]);
    (metric.lower_equal(thresh), alpha)
}

/// One α's thresholds and pruned counts per output (`[out]` each): the
/// backend's kernel, or Burn's ops over the same tables.
pub fn rows<B: Compute>(t: &DeviceTables<B>, alpha: f32) -> (Tensor<B, 1>, Tensor<B, 1, Int>) {
    if let Some(r) = B::variant_rows(t, alpha) {
        return r;
    }
    let (inp, out) = t.dims();
    let limit = t.totals.clone().mul_scalar(alpha).reshape([out, 1]);
    let within = t.cum.clone().lower_equal(limit.expand([out, inp])).int();
    let count = reduce::sum_dim(within, 1);
    let none = count.clone().equal_elem(0);
    let at = count.sub_scalar(1).clamp_min(0);
    let thresh = t
        .sorted
        .clone()
        .gather(1, at)
        .mask_fill(none, f32::NEG_INFINITY);
    let below = t
        .sorted
        .clone()
        .narrow(1, 0, inp)
        .lower_equal(thresh.clone().expand([out, inp]))
        .int();
    let pruned = reduce::sum_dim(below, 1).reshape([out]);
    (thresh.reshape([out]), pruned)
}

/// The host's mask of `metric`, computed from a copy read back and sent
/// up (a backend without the tables' kernel).
fn on_host<B: Compute>(metric: Tensor<B, 2>, ratio: f64) -> (Tensor<B, 2, Bool>, f64) {
    let [inp, out] = metric.dims();
    let device = metric.device();
    // The host's layout, `[out, in]`.
    let host = f32s_to_host(metric.transpose());
    let order = variant::sorted_rows(&host, inp);
    let (mask, alpha) = variant::wanda_variant(&host, inp, &order, ratio);
    if B::is_device() {
        crate::exec::transfer::uploaded(mask.len() as u64);
    }
    let mask = Tensor::<B, 2, Bool>::from_data(TensorData::new(mask, [out, inp]), &device);
    (mask.transpose(), alpha)
}

#[cfg(test)]
mod tests {
    //! The device path on Burn's CPU backend, which has neither kernel:
    //! the host's mask through the fallback, and one α's thresholds and
    //! counts as Burn's ops compute them over the host's tables, against
    //! the host's. `tests/device/` repeats it on wgpu with the kernels.
    use super::*;
    use crate::exec::Cpu;
    use crate::model::synthetic::Normal;

    /// Tables built on the host and sent up, for testing [`rows`]'s Burn ops
    /// on a backend without the kernels.
    fn upload_tables<B: Compute>(
        t: &variant::VariantTables,
        (inp, out): (usize, usize),
        device: &B::Device,
    ) -> DeviceTables<B> {
        let up = |v: &[f32], shape: [usize; 2]| {
            Tensor::<B, 2>::from_data(TensorData::new(v.to_vec(), shape), device)
        };
        DeviceTables {
            sorted: up(&t.sorted, [out, inp]),
            cum: up(&t.cum, [out, inp]),
            totals: up(&t.totals, [1, out]).reshape([out]),
        }
    }

    #[test]
    fn burn_ops_threshold_each_alpha_as_the_host() {
        let device = Default::default();
        let mut rng = Normal::new(7);
        let (out, inp) = (24, 40);
        // On a grid: ties between values and between running sums.
        let host: Vec<f32> = (0..out * inp)
            .map(|_| (rng.sample().abs() * 4.0).round() / 4.0)
            .collect();
        let t = variant::tables(&host, inp);
        let dt = upload_tables::<Cpu>(&t, (inp, out), &device);
        for alpha in [0.0, 0.05, 0.2, 0.4, 0.6, 1.0] {
            let want = variant::thresholds(&t, inp, alpha);
            let (thresh, pruned) = rows(&dt, alpha as f32);
            let thresh: Vec<f32> = thresh.into_data().iter::<f32>().collect();
            let pruned: Vec<i64> = pruned.into_data().iter::<i64>().collect();
            for (o, w) in want.iter().enumerate() {
                let row = &host[o * inp..(o + 1) * inp];
                match w {
                    Some(w) => assert_eq!(thresh[o], *w, "α {alpha} row {o}"),
                    None => assert_eq!(thresh[o], f32::NEG_INFINITY, "α {alpha} row {o}"),
                }
                let below = row.iter().filter(|v| **v <= thresh[o]).count() as i64;
                assert_eq!(pruned[o], below, "α {alpha} row {o}");
            }
        }
        // The whole mask through the CPU backend's fallback.
        let metric =
            Tensor::<Cpu, 2>::from_data(TensorData::new(host.clone(), [out, inp]), &device)
                .transpose();
        let (want, want_alpha) = crate::prune::methods::wanda_mask(
            &host,
            inp,
            0.5,
            crate::prune::Pattern::Unstructured,
            true,
        );
        let (got, alpha) = wanda_variant_mask(metric, 0.5);
        let got: Vec<bool> = got.transpose().into_data().iter::<bool>().collect();
        assert_eq!(got, want);
        assert_eq!(Some(alpha), want_alpha);
    }
}
