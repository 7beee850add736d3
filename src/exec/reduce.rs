//! Sums and maxima along an axis that may be long. On lavapipe, cubecl
//! 0.10's `sum_dim` stops short on long axes: over a `[73 728, 1]` tensor
//! it returns 65 532, over a row of 331 776 ones 262 128 (= 4 × 65 532),
//! while shorter axes and a full `sum()` are right (`cargo run --example
//! reduce_limits --features wgpu` prints them). The engine's reductions
//! that can be long — a whole matrix's counts, a vocabulary's
//! log-sum-exp, a wide layer's input columns — go through here, which
//! splits the axis into pieces of at most [`PIECE`] and combines them.

use burn::prelude::*;
use burn::tensor::BasicOps;
use burn::tensor::Numeric;

/// The longest axis reduced in one op (half the longest seen right).
pub const PIECE: usize = 32 << 10;

/// `t.sum_dim(dim)`, for an axis of any length.
pub fn sum_dim<B, const D: usize, K>(t: Tensor<B, D, K>, dim: usize) -> Tensor<B, D, K>
where
    B: Backend,
    K: Numeric<B> + BasicOps<B>,
    K::Elem: burn::tensor::Element,
{
    by_pieces(t, dim, |p| p.sum_dim(dim), |a, b| a + b)
}

/// `t.max_dim(dim)`, for an axis of any length.
pub fn max_dim<B: Backend, const D: usize>(t: Tensor<B, D>, dim: usize) -> Tensor<B, D> {
    by_pieces(t, dim, |p| p.max_dim(dim), |a, b| a.max_pair(b))
}

/// `t.min_dim(dim)` of integers, for an axis of any length.
pub fn min_dim_int<B: Backend, const D: usize>(
    t: Tensor<B, D, Int>,
    dim: usize,
) -> Tensor<B, D, Int> {
    by_pieces(t, dim, |p| p.min_dim(dim), |a, b| a.min_pair(b))
}

/// `t.max_dim(dim)` of integers, for an axis of any length.
pub fn max_dim_int<B: Backend, const D: usize>(
    t: Tensor<B, D, Int>,
    dim: usize,
) -> Tensor<B, D, Int> {
    by_pieces(t, dim, |p| p.max_dim(dim), |a, b| a.max_pair(b))
}

/// Every element's sum, as `[1; D]`.
pub fn sum_all<B, const D: usize, K>(t: Tensor<B, D, K>) -> Tensor<B, D, K>
where
    B: Backend,
    K: Numeric<B> + BasicOps<B>,
    K::Elem: burn::tensor::Element,
{
    (0..D).rev().fold(t, sum_dim)
}

fn by_pieces<B: Backend, const D: usize, K: BasicOps<B>>(
    t: Tensor<B, D, K>,
    dim: usize,
    reduce: impl Fn(Tensor<B, D, K>) -> Tensor<B, D, K>,
    combine: impl Fn(Tensor<B, D, K>, Tensor<B, D, K>) -> Tensor<B, D, K>,
) -> Tensor<B, D, K> {
    let len = t.dims()[dim];
    if len <= PIECE {
        return reduce(t);
    }
    let mut acc: Option<Tensor<B, D, K>> = None;
    let mut start = 0;
    while start < len {
        let end = (start + PIECE).min(len);
        let part = reduce(t.clone().narrow(dim, start, end - start));
        acc = Some(match acc {
            Some(a) => combine(a, part),
            None => part,
        });
        start = end;
    }
    acc.expect("a long axis has pieces")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::Cpu;

    #[test]
    fn long_axes_are_reduced_in_pieces() {
        let device = Default::default();
        let n = 3 * PIECE + 17;
        let t = Tensor::<Cpu, 2>::ones([2, n], &device);
        let s: Vec<f32> = sum_dim(t.clone(), 1).into_data().iter::<f32>().collect();
        assert_eq!(s, vec![n as f32; 2]);
        let ramp = Tensor::<Cpu, 1>::from_data(
            TensorData::new((0..n).map(|i| i as f32).collect::<Vec<f32>>(), [n]),
            &device,
        )
        .reshape([1, n]);
        let m: Vec<f32> = max_dim(ramp, 1).into_data().iter::<f32>().collect();
        assert_eq!(m, vec![(n - 1) as f32]);
        let ints = Tensor::<Cpu, 2, Int>::ones([n, 2], &device);
        let all: Vec<i64> = sum_all(ints).into_data().iter::<i64>().collect();
        assert_eq!(all, vec![2 * n as i64]);
    }
}
