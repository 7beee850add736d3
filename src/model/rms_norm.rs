//! The decoder's RMS normalisation, computed the way transformers'
//! `LlamaRMSNorm` computes it (in f32 whatever the model dtype, rounded
//! back before the weight multiplies it): the CPU's fused kernel
//! (`model::cpu_ops`), a device's one-launch kernel (`Compute::rms_norm`),
//! else Burn's ops. Its own file since the device kernel came (llama.rs
//! had passed 600 lines).

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::DType;

use super::dtype::{float_dtype, to_f32};
use super::{cpu_ops, host};
use crate::exec::Compute;

/// RMS normalisation, computed in f32 whatever the model dtype (as
/// transformers' `LlamaRMSNorm` does).
#[derive(Module, Debug)]
pub struct LlamaRmsNorm<B: Backend> {
    pub weight: Param<Tensor<B, 1>>,
    pub eps: f64,
}

impl<B: Backend> LlamaRmsNorm<B> {
    pub fn new(weight: Tensor<B, 1>, eps: f64) -> Self {
        Self {
            weight: Param::from_tensor(weight),
            eps,
        }
    }
}

impl<B: Compute> LlamaRmsNorm<B> {
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        if B::fused(&x) {
            let (dims, device) = (x.dims(), x.device());
            let w = host::values(self.weight.val());
            let out = cpu_ops::rms_norm(&host::values(x), &w, self.eps);
            return host::tensor(out, dims, &device);
        }
        // A device's kernel (no f32 copy of the batch), else Burn's ops.
        let weight = self.weight.val();
        let x = match B::rms_norm(x, &weight, self.eps) {
            Ok(out) => return out,
            Err(x) => x,
        };
        let dtype = x.dtype();
        let xf = to_f32(x);
        let variance = xf.clone().square().mean_dim(D - 1);
        let normed = xf * variance.add_scalar(self.eps).sqrt().recip();
        let normed = if dtype == DType::F32 {
            normed
        } else {
            normed.cast(float_dtype(dtype))
        };
        normed * weight.unsqueeze::<D>()
    }
}
