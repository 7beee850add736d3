//! What a backend offers beyond Burn's ops: prunemem's hand-written CPU
//! kernels (fused RMSNorm, rotary, SwiGLU, one GEMM per linear, attention)
//! replace Burn's ops on the CPU backend in f32. The model asks its backend
//! through this trait, so the choice is made by the type the execution
//! context runs ([`super::Exec::run`]), never by a downcast.
//!
//! Every backend gets Burn's ops by default; the CPU backend's kernels are
//! implemented beside them, in `model::host`.

use burn::nn::Linear;
use burn::prelude::*;

/// A Burn backend prunemem computes on.
pub trait Compute: Backend {
    /// True on a device with its own memory (wgpu, CUDA): the pruning math
    /// and the evaluation's losses stay there (the pruning engine's on-device
    /// selection).
    fn is_device() -> bool {
        false
    }

    /// The f32 bit patterns of `t` as integers (non-negative floats order
    /// as their bits do: what a device-side selection bisects over). The
    /// default goes through the host; device backends reinterpret the
    /// buffer in place.
    fn float_bits<const D: usize>(t: Tensor<Self, D>) -> Tensor<Self, D, Int> {
        let dims = t.dims();
        let device = t.device();
        let values: Vec<f32> = t
            .into_data()
            .convert_dtype(burn::tensor::DType::F32)
            .into_vec()
            .unwrap_or_default();
        let bits: Vec<i32> = values.iter().map(|v| v.to_bits() as i32).collect();
        Tensor::from_data(TensorData::new(bits, dims), &device)
    }

    /// `data` on `device` through the backend's own staged copy
    /// (`exec::copies`: page-locked staging on CUDA, `exec::pinned`);
    /// `Err` says why not, and the caller takes Burn's `from_data`.
    fn staged_upload<const D: usize>(
        data: &TensorData,
        device: &Self::Device,
    ) -> Result<Tensor<Self, D>, String> {
        let _ = (data, device);
        Err("no page-locked staging on this backend".into())
    }

    /// `t`'s values on the host through the backend's own staged copy;
    /// `Err` says why not, and the caller takes Burn's `into_data`.
    fn staged_download<const D: usize>(t: &Tensor<Self, D>) -> Result<TensorData, String> {
        let _ = t;
        Err("no page-locked staging on this backend".into())
    }

    /// True when `t` takes the fused CPU kernels (RMSNorm, rotary, SwiGLU).
    fn fused<const D: usize>(_t: &Tensor<Self, D>) -> bool {
        false
    }

    /// True when attention takes the hand-written CPU kernel.
    fn host_attention() -> bool {
        false
    }

    /// Whether Burn's ops may be split across threads. On the CPU backend
    /// an op runs on the calling thread, so splitting one (attention) over
    /// scoped threads uses every core. A cubecl device keeps one stream and
    /// one memory pool per thread: work sent from a short-lived thread gets
    /// a pool of its own that outlives the thread (lavapipe: 11.4 MiB of
    /// RSS per layer forward, `examples/device_rss.rs`) and that the
    /// computing thread's probe never sees. Default: no.
    fn split_across_threads() -> bool {
        false
    }

    /// The largest buffer one tensor may take on `device` (a binding
    /// limit: lavapipe 128 MiB); `None` where there is no such limit (the
    /// CPU backend).
    fn max_buffer(_device: &Self::Device) -> Option<u64> {
        None
    }

    /// SparseGPT's sweep of rows `row0 .. row0 + count` of `w` (`[in,
    /// out]`, f32) with the block's `hinv1` (`[count, count]`, f32) in one
    /// kernel launch (`exec::kernels`): the swept `w` and the block's
    /// errors (`[count, out]`). `prune` is the block's unstructured mask;
    /// `nm` picks N:M in the kernel instead. `Err(w)` where the backend has
    /// no such kernel (the caller sweeps with Burn's ops).
    #[allow(clippy::type_complexity)]
    fn obs_sweep(
        w: Tensor<Self, 2>,
        row0: usize,
        hinv1: &Tensor<Self, 2>,
        prune: Option<&Tensor<Self, 2, burn::tensor::Bool>>,
        nm: Option<(usize, usize)>,
    ) -> Result<(Tensor<Self, 2>, Tensor<Self, 2>), Tensor<Self, 2>> {
        let _ = (row0, hinv1, prune, nm);
        Err(w)
    }

    /// For each column of `keys` (`[rows, cols]`, the bit patterns of
    /// non-negative f32, [`Self::float_bits`]), the `k` smallest (`1 <= k <
    /// rows`), ties in row order: the per-output selection in one kernel
    /// launch (`exec::kernels`). `Err(keys)` where the backend has no such
    /// kernel (the caller bisects with Burn's ops).
    #[allow(clippy::type_complexity)]
    fn smallest_per_column(
        keys: Tensor<Self, 2, Int>,
        k: usize,
    ) -> Result<Tensor<Self, 2, burn::tensor::Bool>, Tensor<Self, 2, Int>> {
        let _ = k;
        Err(keys)
    }

    /// The N:M mask of `keys` (`[rows, cols]`, the bit patterns of
    /// non-negative f32, `rows` a multiple of `m`, `1 <= n < m`): in every
    /// group of `m` consecutive rows of a column, the `n` smallest, ties to
    /// the lower row, in one kernel launch (`exec::kernels`). `Err(keys)`
    /// where the backend has no such kernel (the caller ranks with Burn's
    /// ops).
    #[allow(clippy::type_complexity)]
    fn smallest_per_group(
        keys: Tensor<Self, 2, Int>,
        n: usize,
        m: usize,
    ) -> Result<Tensor<Self, 2, burn::tensor::Bool>, Tensor<Self, 2, Int>> {
        let _ = (n, m);
        Err(keys)
    }

    /// DSnoT's swap loop, every cycle of every output, in one kernel
    /// launch (`exec::kernels`; the request is `exec::swap_loop`'s).
    /// `Err(job)` where the backend has no such kernel or cannot take the
    /// tensors (the caller steps the loop with Burn's ops,
    /// `prune::dsnot_device`).
    fn dsnot_swaps(
        job: super::swap_loop::SwapLoop<Self>,
    ) -> Result<super::swap_loop::Swapped<Self>, super::swap_loop::SwapLoop<Self>> {
        Err(job)
    }

    /// The smallest of `keys` (any shape, the bit patterns of non-negative
    /// f32) with at least `k` keys at or below it (`1 <= k <= numel`), as a
    /// `[1, 1]` tensor: a per-matrix threshold in one to nine kernel
    /// launches (`exec::kernels`). `None` where the backend has no such
    /// kernel.
    fn kth_smallest(keys: &Tensor<Self, 2, Int>, k: usize) -> Option<Tensor<Self, 2, Int>> {
        let _ = (keys, k);
        None
    }

    /// Each row's `logsumexp(row) - row[target]` (f32, `[rows]`) of
    /// `logits` (`[rows, vocab]`, the compute dtype), 0 for the rows before
    /// `skip`, in one kernel launch (`exec::kernels`). `Err` gives the
    /// arguments back where the backend has no such kernel.
    #[allow(clippy::type_complexity)]
    fn row_nll(
        logits: Tensor<Self, 2>,
        targets: Tensor<Self, 1, Int>,
        skip: usize,
    ) -> Result<Tensor<Self, 1>, (Tensor<Self, 2>, Tensor<Self, 1, Int>)> {
        let _ = skip;
        Err((logits, targets))
    }

    /// Causal attention `softmax(q·kᵀ/√d + causal mask)·v` of `q`, `k`, `v`
    /// (`[batch, heads, seq, head_dim]`, `k` and `v` with `q`'s heads) in
    /// one fused kernel (`exec::attention` names it), the scores never
    /// stored. `Err` gives the arguments back where the backend has no
    /// such kernel or it cannot take these shapes (the caller runs Burn's
    /// attention).
    #[allow(clippy::type_complexity)]
    fn fused_attention(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
    ) -> Result<Tensor<Self, 4>, (Tensor<Self, 4>, Tensor<Self, 4>, Tensor<Self, 4>)> {
        Err((q, k, v))
    }

    /// The MLP's `silu(gate) · up` (same shapes and dtype) in one kernel
    /// launch, computed in f32 and written in the operands' dtype
    /// (`exec::kernels`). `Err` gives the arguments back where the backend
    /// has no such kernel (the caller runs Burn's ops).
    #[allow(clippy::type_complexity)]
    fn swiglu(
        gate: Tensor<Self, 3>,
        up: Tensor<Self, 3>,
    ) -> Result<Tensor<Self, 3>, (Tensor<Self, 3>, Tensor<Self, 3>)> {
        Err((gate, up))
    }

    /// `Σ_rows x²` per column of `x` (`[rows, cols]`, the compute dtype),
    /// in f32 (`[cols]`), read straight from `x`: no f32 copy, no squares
    /// stored (`exec::kernels`). `Err` gives `x` back where the backend has
    /// no such kernel (the caller squares an f32 copy with Burn's ops).
    fn column_square_sums(x: Tensor<Self, 2>) -> Result<Tensor<Self, 1>, Tensor<Self, 2>> {
        Err(x)
    }

    /// Each row of `x` (`[rows, cols]`, f32) summed left to right in f32,
    /// one add at a time: the host's order, so the sums are the host's to
    /// the bit (RIA's reallocation orders inputs by them). `Err` gives `x`
    /// back where the backend has no such kernel (the caller sums on the
    /// host).
    fn ordered_row_sums(x: Tensor<Self, 2>) -> Result<Tensor<Self, 1>, Tensor<Self, 2>> {
        Err(x)
    }

    /// What N:M (`n` of every `m` inputs pruned) keeps of `metric`
    /// (`[in, out]`, f32, `in` a multiple of `m`), summed per output in f32
    /// (`[out]`): the reallocation report's kept metric without a mask or
    /// a masked copy. `Err` gives `metric` back where the backend has no
    /// such kernel, `m` is past its local array or the layout is another
    /// (the caller masks slices with Burn's ops).
    fn nm_kept_sums(
        metric: Tensor<Self, 2>,
        n: usize,
        m: usize,
    ) -> Result<Tensor<Self, 1>, Tensor<Self, 2>> {
        let _ = (n, m);
        Err(metric)
    }

    /// RIA's assignment scores of slot `slot` (`[groups, groups]`, f32:
    /// target, source) over `p`, the permuted metric as the host lays it
    /// out (`[out, in]`, row-major), summed in the host's order
    /// (`prune::reallocation`). `Err` gives `p` back where the backend has
    /// no such kernel or `m` is past its local array (the caller scores on
    /// the host).
    fn slot_scores(
        p: Tensor<Self, 2>,
        n: usize,
        m: usize,
        slot: usize,
    ) -> Result<Tensor<Self, 2>, Tensor<Self, 2>> {
        let _ = (n, m, slot);
        Err(p)
    }

    /// Wanda's α-variant's tables of `metric` (`[in, out]`, f32): each
    /// output's metric sorted, its running sums and its total, added in
    /// the host's order (`prune::variant`), so they are the host's to the
    /// bit. `Err` gives `metric` back where the backend has no such kernel
    /// or cannot take the tensor (the caller computes the mask on the
    /// host).
    fn variant_tables(
        metric: Tensor<Self, 2>,
    ) -> Result<super::variant::DeviceTables<Self>, Tensor<Self, 2>> {
        Err(metric)
    }

    /// One α of Wanda's variant over `tables`: each output's threshold
    /// (`[out]` f32, `f32::NEG_INFINITY` where nothing is within α) and
    /// how many of its values are at or below it (`[out]`). `None` where
    /// the backend has no such kernel (the caller takes Burn's ops).
    #[allow(clippy::type_complexity)]
    fn variant_rows(
        tables: &super::variant::DeviceTables<Self>,
        alpha: f32,
    ) -> Option<(Tensor<Self, 1>, Tensor<Self, 1, Int>)> {
        let _ = (tables, alpha);
        None
    }

    /// RMS normalisation of `x` over its last dimension (`weight`'s
    /// length, the same dtype), in f32 registers, rounded to the compute
    /// dtype before `weight` multiplies it (transformers' `LlamaRMSNorm`),
    /// in one kernel launch (`exec::kernels`): no f32 copy, no squares
    /// stored. `Err` gives `x` back where the backend has no such kernel
    /// (the caller runs Burn's ops).
    fn rms_norm<const D: usize>(
        x: Tensor<Self, D>,
        weight: &Tensor<Self, 1>,
        eps: f64,
    ) -> Result<Tensor<Self, D>, Tensor<Self, D>> {
        let _ = (weight, eps);
        Err(x)
    }

    /// `a · b` (`[m, k] · [k, n]`) with every f32 bit kept. Burn's matmul
    /// on CUDA takes cubek's tensor-core kernel, which rounds f32 inputs to
    /// TF32 (10 bits of mantissa, not 23) on cards that have it; PyTorch's
    /// default matmul does not. SparseGPT's factorisation and its updates
    /// are f32 arithmetic in the reference, so they come here: the cube
    /// backends run cubek's unit (non-tensor-core) kernel, the others
    /// Burn's matmul.
    fn matmul_f32(a: Tensor<Self, 2>, b: Tensor<Self, 2>) -> Tensor<Self, 2> {
        a.matmul(b)
    }

    /// `a · bᵀ` (`[n, k] · [m, k]ᵀ`) with cubek's strategy `strategy`
    /// (`exec::matmul::NAMES`): the head's product, its `[vocab, hidden]`
    /// table read in its stored layout, not copied transposed. `Err` gives
    /// the arguments back where the backend has no such kernel, the name
    /// is Burn's own (`auto`), or the kernel declines the shapes; the
    /// caller then takes Burn's matmul (`exec::matmul::times_rows`).
    #[allow(clippy::type_complexity)]
    fn matmul_rows(
        a: Tensor<Self, 2>,
        b: Tensor<Self, 2>,
        strategy: &str,
    ) -> Result<Tensor<Self, 2>, (Tensor<Self, 2>, Tensor<Self, 2>)> {
        let _ = strategy;
        Err((a, b))
    }

    /// A linear layer's forward.
    fn linear(linear: &Linear<Self>, x: Tensor<Self, 3>) -> Tensor<Self, 3> {
        linear.forward(x)
    }
}

/// Autodiff keeps Burn's ops (and their backward) on every backend, and
/// its inner backend's threading.
impl<B: Compute> Compute for burn::backend::Autodiff<B> {
    fn is_device() -> bool {
        B::is_device()
    }

    fn split_across_threads() -> bool {
        B::split_across_threads()
    }
}
