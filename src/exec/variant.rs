//! What a backend's Wanda α-variant kernels (`Compute::variant_tables`,
//! `Compute::variant_rows`) hand each other: one matrix's tables where
//! the metric is, in the host's layout (`prune::variant`'s
//! `VariantTables`, one output a row).

use burn::prelude::*;

/// One matrix's tables on the device.
pub struct DeviceTables<B: Backend> {
    /// `[out, p]` f32, `p >= in`: each output's metric ascending (as
    /// `f32::total_cmp`) in its first `in` entries.
    pub sorted: Tensor<B, 2>,
    /// `[out, in]` f32: the running sums of `sorted`, left to right.
    pub cum: Tensor<B, 2>,
    /// `[out]` f32: each output's metric summed in input order.
    pub totals: Tensor<B, 1>,
}

impl<B: Backend> DeviceTables<B> {
    /// `(in, out)`.
    pub fn dims(&self) -> (usize, usize) {
        let [out, inp] = self.cum.dims();
        (inp, out)
    }
}
