//! The bridge between Burn's CPU backend and the hand-written CPU kernels
//! (`cpu_attention`, `cpu_ops`, `matmul`).
//!
//! On Burn's CPU (flex) backend a contiguous tensor that is not shared moves
//! to a `Vec<f32>` and back without a copy, and a linear's weight can be read
//! in place through its storage and strides. The CPU backend's
//! [`Compute`] implementation lives here: the model's forward
//! (`model::llama`) asks its backend ([`Compute::fused`]) and takes the
//! kernels through these helpers; autodiff, GPU and f16/bf16 keep Burn's
//! ops.

use burn::nn::Linear;
use burn::prelude::*;
use burn::tensor::{DType, TensorPrimitive};

use super::{cpu_attention, matmul};
use crate::exec::{Compute, Cpu};

impl Compute for Cpu {
    fn fused<const D: usize>(t: &Tensor<Self, D>) -> bool {
        t.dtype() == DType::F32
    }
    fn host_attention() -> bool {
        true
    }
    fn split_across_threads() -> bool {
        true
    }
    fn linear(linear: &Linear<Self>, x: Tensor<Self, 3>) -> Tensor<Self, 3> {
        cpu_linear(linear, x)
    }
}

/// The values of a float tensor as f32 (no copy when it is f32 and not
/// shared).
pub fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    let data = t.into_data();
    let data = if data.dtype == DType::F32 {
        data
    } else {
        data.convert_dtype(DType::F32)
    };
    data.into_vec().expect("a float tensor converts to f32")
}

/// An f32 tensor of `dims` over `v` (no copy).
pub fn tensor<B: Backend, const D: usize>(
    v: Vec<f32>,
    dims: [usize; D],
    device: &B::Device,
) -> Tensor<B, D> {
    Tensor::from_data(TensorData::new(v, dims), (device, DType::F32))
}

/// A linear layer's forward on Burn's CPU backend. In f32 without bias it
/// is [`matmul::sgemm`] over all `batch · seq` rows on the tensors' own
/// storage (pruned weights are transposed views: read through their
/// strides); otherwise Burn's op.
fn cpu_linear(linear: &Linear<Cpu>, x: Tensor<Cpu, 3>) -> Tensor<Cpu, 3> {
    let weight = linear.weight.val();
    if linear.bias.is_some() || x.dtype() != DType::F32 || weight.dtype() != DType::F32 {
        return linear.forward(x);
    }
    let ([b, s, k], n, device) = (x.dims(), weight.dims()[1], x.device());
    let (TensorPrimitive::Float(x), TensorPrimitive::Float(w)) =
        (x.into_primitive(), weight.into_primitive())
    else {
        unreachable!("f32 tensors are not quantized");
    };
    let x = x.to_contiguous();
    let w = if w.layout().strides().iter().all(|s| *s >= 0) {
        w
    } else {
        w.to_contiguous()
    };
    let out = matmul::sgemm(
        matmul::MatRef::row_major(&x.storage::<f32>()[..b * s * k], b * s, k),
        strided(&w, k, n),
    );
    tensor(out, [b, s, n], &device)
}

/// The last two dimensions of a CPU tensor as a strided matrix (the caller
/// made its strides non-negative).
fn strided(t: &burn_flex::FlexTensor, rows: usize, cols: usize) -> matmul::MatRef<'_> {
    let st = t.layout().strides();
    let stride = |i: usize| usize::try_from(st[i]).expect("non-negative strides");
    let (rs, cs) = (stride(st.len() - 2), stride(st.len() - 1));
    let data = &t.storage::<f32>()[t.layout().start_offset()..];
    matmul::MatRef {
        data,
        rows,
        cols,
        rs,
        cs,
    }
}

/// Runs [`cpu_attention::attention`] on host copies of `q`, `k`, `v`
/// (`[b, s, heads, d]` layouts) and returns `[b, s, heads * d]` in `q`'s
/// dtype.
pub fn attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    shape: cpu_attention::AttentionShape,
) -> Tensor<B, 3> {
    let (dtype, device) = (q.dtype(), q.device());
    let out = cpu_attention::attention(&values(q), &values(k), &values(v), shape);
    let dims = [shape.batch, shape.seq, shape.heads * shape.head_dim];
    Tensor::from_data(TensorData::new(out, dims), (&device, dtype))
}
