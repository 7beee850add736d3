//! GradProbe's per-weight work where the weights are, on a device. The
//! original pass's candidates are chosen there (exactly `k` smallest, ties
//! in PyTorch's flat order, as the host's `select::tentative`) and come
//! back as one bit per weight; the earlier steps' zeros and the modified
//! pass's reduction are applied by a scatter there; and each batch's weight
//! gradient is folded into the running maxima at the candidates by a
//! gather there. So no weight-sized tensor crosses the bus: a linear's
//! candidates come back as bits, its gradients as one maximum per
//! candidate per pass.
//!
//! The host path (`State::prepare`, `select::fold_max`) stays the CPU's.
//! Both give the same bits: one f32 product or a zero per position, and
//! maxima of absolute values that start at zero and skip a NaN.

use burn::module::Param;
use burn::prelude::*;
use burn::tensor::{DType, IndexingUpdateOp};

use super::pass::{State, Which};
use super::select;
use crate::exec::Compute;
use crate::memory::held::Held;
use crate::memory::tag::Category;
use crate::model::llama::DecoderLayer;
use crate::prune::on_device;

/// Burn's flat `[in, out]` indices of PyTorch `[out, in]` positions, on the
/// device (`[k]`; counted as 4 bytes each), computed on every core (a 1B
/// shape's candidates are about 10⁸ positions a pass).
fn index<B: Compute>(
    positions: &[u32],
    out: usize,
    inp: usize,
    device: &B::Device,
) -> Tensor<B, 1, Int> {
    use rayon::prelude::*;
    let flat: Vec<i64> = positions
        .par_iter()
        .map(|p| {
            let (o, i) = (*p as usize / inp, *p as usize % inp);
            (i * out + o) as i64
        })
        .collect();
    crate::exec::copies::ints_to_device(flat, device)
}

/// What [`prepare`] did to one linear.
pub(super) struct Prepared<B: Compute> {
    /// Bytes of the new weight written (0 when none was).
    pub bytes: u64,
    /// In the modified pass, the candidates' indices it uploaded to scale
    /// them, for the pass's maxima to gather at ([`Maxima::new`]) instead
    /// of uploading them again.
    pub candidates: Option<Tensor<B, 1, Int>>,
}

/// [`State::prepare`] on the device: zeroes `full`'s already-pruned
/// positions in `layer`'s linear `name`, and in the modified pass multiplies
/// its candidates by `reduction`. Nothing moves when there is nothing to do.
pub(super) fn prepare<B: Compute>(
    state: &State,
    which: Which,
    full: &str,
    layer: &mut DecoderLayer<B>,
    name: &str,
    reduction: f64,
) -> Prepared<B> {
    let nothing = Prepared {
        bytes: 0,
        candidates: None,
    };
    let pruned = state.pruned.get(full).filter(|p| !p.is_empty());
    let tentative = state
        .tentative
        .get(full)
        .filter(|t| which == Which::Modified && !t.is_empty());
    if pruned.is_none() && tentative.is_none() {
        return nothing;
    }
    let Some(lin) = layer.linear_mut(name) else {
        return nothing;
    };
    let w = lin.weight.val();
    let [inp, out] = w.dims();
    let device = w.device();
    let mut flat = w.reshape([inp * out]);
    if let Some(p) = pruned {
        flat = scale_at(flat, index::<B>(p, out, inp, &device), 0.0);
    }
    let candidates = tentative.map(|t| index::<B>(t, out, inp, &device));
    if let Some(at) = &candidates {
        flat = scale_at(flat, at.clone(), reduction as f32);
    }
    let bytes = crate::memory::held::tensor_bytes(&flat);
    lin.weight = Param::from_tensor(flat.reshape([inp, out]));
    Prepared { bytes, candidates }
}

/// The host's `select::scale_at` on a weight where it is (Burn's `[inp,
/// out]`, flattened): a zero written at the flat indices `at` ([`index`])
/// for a factor of 0, else the factor multiplied in.
fn scale_at<B: Compute>(flat: Tensor<B, 1>, at: Tensor<B, 1, Int>, factor: f32) -> Tensor<B, 1> {
    let device = flat.device();
    let [k] = at.dims();
    let update = match factor {
        0.0 => IndexingUpdateOp::Assign,
        _ => IndexingUpdateOp::Mul,
    };
    let values = Tensor::<B, 1>::full([k], factor, (&device, flat.dtype()));
    flat.scatter_nd(at.reshape([k, 1]), values, update)
}

/// The original pass's candidates of `layer`'s linear `name` (PyTorch
/// `[out, in]` positions), chosen where the weight is: exactly the host's
/// `select::tentative` (the `k` smallest `|W|`, or `|W|·norm` of the
/// input with `norms`, ties in PyTorch's flat order), read back as one bit
/// per weight instead of the weight in f32.
pub(super) fn tentative<B: Compute>(
    layer: &DecoderLayer<B>,
    name: &str,
    norms: Option<&[f32]>,
    sparsity: f64,
) -> Vec<u32> {
    let Some(lin) = layer.linear(name) else {
        return Vec::new();
    };
    let w = lin.weight.val();
    let [inp, out] = w.dims();
    let k = select::candidate_count(sparsity, inp * out);
    if k == 0 {
        return Vec::new();
    }
    let device = w.device();
    let mut metric = w.cast(DType::F32).abs().transpose();
    if let Some(n) = norms.filter(|n| n.len() == inp && inp > 0) {
        crate::exec::transfer::uploaded(inp as u64 * 4);
        let n = Tensor::<B, 1>::from_data(TensorData::new(n.to_vec(), [inp]), &device);
        metric = metric * n.reshape([1, inp]);
    }
    let keys = B::float_bits(metric);
    on_device::set_positions(on_device::smallest_exactly(keys, k))
}

/// One linear's gradient maxima at its candidates, kept on the device
/// across the batches of a pass.
pub(super) struct Maxima<B: Compute> {
    at: Tensor<B, 1, Int>,
    acc: Tensor<B, 1>,
    /// Both, held as statistics (`memory::held`).
    _held: Held,
}

impl<B: Compute> Maxima<B> {
    /// For the candidate `positions` (PyTorch `[out, in]`) of a weight
    /// `[inp, out]` in Burn's layout, at their indices `at` where
    /// [`prepare`] uploaded them already; `None` without candidates.
    pub fn new(
        positions: &[u32],
        (out, inp): (usize, usize),
        at: Option<Tensor<B, 1, Int>>,
        device: &B::Device,
    ) -> Option<Self> {
        if positions.is_empty() {
            return None;
        }
        let at = at
            .filter(|a| a.dims() == [positions.len()])
            .unwrap_or_else(|| index::<B>(positions, out, inp, device));
        let acc = Tensor::zeros([positions.len()], (device, DType::F32));
        let bytes = positions.len() as u64 * (4 + at.dtype().size() as u64);
        Some(Self {
            at,
            acc,
            _held: Held::new(Category::Statistics, bytes),
        })
    }

    /// Folds one batch's weight gradient (`[inp, out]`): `acc = max(acc, |g|)`
    /// at the candidates, as `select::fold_max` does on the host.
    pub fn fold(&mut self, grad: Tensor<B, 2>) {
        let [inp, out] = grad.dims();
        let at_candidates = grad.reshape([inp * out]).select(0, self.at.clone()).abs();
        self.acc = self.acc.clone().max_pair(at_candidates);
    }

    /// The maxima, read back once.
    pub fn finish(self) -> Vec<f32> {
        crate::exec::copies::f32s_to_host(self.acc)
    }
}

/// `lin`'s weight, taken out of its `Param` (a one-element placeholder
/// left there), so that where nothing else holds it — a layer streamed in,
/// or handed over by the probe — cubecl's scatter writes into its buffer
/// instead of a copy (`scatter_nd` copies a shared tensor: a resident
/// layer another step still reads keeps its values).
fn take_weight<B: Compute>(lin: &mut burn::nn::Linear<B>) -> Tensor<B, 2> {
    let device = lin.weight.device();
    let placeholder = Param::from_tensor(Tensor::<B, 2>::empty([1, 1], &device));
    std::mem::replace(&mut lin.weight, placeholder).into_value()
}

/// Zeroes `positions` (PyTorch `[out, in]`) of `layer`'s linear `name`
/// where it is; returns its zeros after (one count read back) and its size.
pub(super) fn zero_at<B: Compute>(
    layer: &mut DecoderLayer<B>,
    name: &str,
    positions: &[u32],
) -> (u64, u64) {
    let Some(lin) = layer.linear_mut(name) else {
        return (0, 0);
    };
    let w = take_weight(lin);
    let [inp, out] = w.dims();
    let w_device = w.device();
    let mut flat = w.reshape([inp * out]);
    if !positions.is_empty() {
        flat = scale_at(flat, index::<B>(positions, out, inp, &w_device), 0.0);
    }
    let w = flat.reshape([inp, out]);
    // Counted over the matrix, not the flat vector: a flat axis is summed
    // in 32 Ki pieces one after the other, each on one cube (512 launches
    // for an MLP linear of a 1B shape, 19.9 s of the step on an H200).
    let count = crate::exec::reduce::sum_all(w.clone().equal_elem(0.0).int()).into_data();
    crate::exec::transfer::read_back(count.bytes.len() as u64);
    let zeros = count.iter::<i64>().next().unwrap_or(0).max(0) as u64;
    // The zeroing's pages are still reserved (the caller gives them back
    // before the next linear): a reading here is step 6's widest moment.
    crate::exec::watch::after_op();
    lin.weight = Param::from_tensor(w);
    (zeros, (inp * out) as u64)
}
