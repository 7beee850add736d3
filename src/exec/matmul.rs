//! Which of cubecl's matmul kernels a device linear runs. Burn 0.21 without
//! its `autotune` feature always takes cubek's `Auto` (the simple cyclic
//! tensor-core kernel); on an H100 a 1B shape's matmuls ran at about 42
//! TFLOP/s that way (cubecl's profile, docs/gpu.md), and Burn's autotune
//! spent 133 s tuning the first layer. Here the strategy is named instead
//! — `PRUNEMEM_MATMUL=NAME` for a run, [`set`] for a measurement
//! (`examples/matmul_rate.rs` times every name on the model's shapes) —
//! and `auto` keeps Burn's own path. Unnamed, a device gets the strategy
//! measured fastest on it ([`measured_default`]).

use super::named::Named;

#[cfg(any(feature = "wgpu", feature = "cuda"))]
use cubek::matmul::launch::Strategy;

/// The strategies by name, `auto` first (Burn's own matmul).
pub const NAMES: &[&str] = &[
    "auto",
    "simple_cyclic_cmma",
    "simple_cyclic_mma",
    "simple_strided_cmma",
    "simple_tilewise_cmma",
    "simple_async_cyclic_cmma",
    "simple_tma_cmma",
    "simple_tma_mma",
    "double_cyclic_cmma",
    "double_cyclic_mma",
    "double_tilewise_cmma",
    "double_hybrid_cmma",
    "double_async_cyclic_cmma",
    "double_tma_cmma",
    "double_tma_mma",
    "specialized_cyclic_cmma",
    "specialized_tma_cmma",
    "specialized_tma_mma",
    "ordered_double_cmma",
    "ordered_double_mma",
    "simple_unit",
    "double_unit",
];

/// The strategy in use, by name (`PRUNEMEM_MATMUL`).
static CHOICE: Named = Named::new("PRUNEMEM_MATMUL", NAMES, "Burn's matmul");

/// Uses `name` from now on; `false` (nothing changed) for an unknown name.
pub fn set(name: &str) -> bool {
    CHOICE.set(name)
}

/// The strategy a device gets when `PRUNEMEM_MATMUL` is unset, as
/// measured: on a CUDA device with the Tensor Memory Accelerator (Hopper,
/// sm_90 and later) `double_tma_mma` — on an H100 it ran a 1B layer's four
/// linear shapes at 124–259 TFLOP/s against `auto`'s 27–114, with the same
/// outputs, and the 1B Wanda protocol's evaluation in 1.26 s against 2.01
/// (docs/gpu.md); everywhere else `auto` (Burn's own matmul: no other
/// device was measured, and cubek checks no TMA support before launching).
pub fn measured_default(cuda_with_tma: bool) -> &'static str {
    if cuda_with_tma {
        "double_tma_mma"
    } else {
        "auto"
    }
}

/// The head's strategy (`PRUNEMEM_HEAD_MATMUL`): the evaluation's
/// `[rows, hidden] · [vocab, hidden]ᵀ` reads the table in its stored
/// layout. Unnamed, the linears' measured default ([`measured_default`]):
/// `double_tma_mma` on CUDA with TMA, which an H200 ran with the stored
/// layout and staged copies (`exec::defaults`) for the 1B Wanda
/// protocol's evaluation in 0.58 s against Burn's matmul's 1.03; Burn's
/// matmul elsewhere.
static HEAD: Named = Named::new("PRUNEMEM_HEAD_MATMUL", NAMES, "Burn's matmul");

/// The head's strategy in use: `PRUNEMEM_HEAD_MATMUL`'s, else the device's
/// measured default (asked once, after the device opened).
pub fn head_name() -> &'static str {
    HEAD.chosen_or(|| measured_default(super::defaults::cuda_tma()))
}

/// `a · bᵀ` for a `[n, k]` `a` and a `[m, k]` `b` stored row by row (the
/// head's table): the head's strategy ([`head_name`]) where the backend
/// runs it, else Burn's matmul on the transposed view.
pub fn times_rows<B: super::Compute>(
    a: burn::tensor::Tensor<B, 2>,
    b: burn::tensor::Tensor<B, 2>,
) -> burn::tensor::Tensor<B, 2> {
    match B::matmul_rows(a, b, head_name()) {
        Ok(product) => product,
        Err((a, b)) => a.matmul(b.transpose()),
    }
}

/// The name in use: `PRUNEMEM_MATMUL`'s, or the last [`set`], else
/// `default()` (asked once, on the first call); `auto` (Burn's matmul) for
/// an unknown `PRUNEMEM_MATMUL` (said once on stderr).
pub fn chosen_name_or(default: impl FnOnce() -> &'static str) -> &'static str {
    CHOICE.chosen_or(default)
}

/// The strategy in use (`None`: Burn's matmul), `default()` when nothing
/// is named.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub fn chosen(default: impl FnOnce() -> &'static str) -> Option<Strategy> {
    strategy(chosen_name_or(default))
}

/// The strategy called `name`; `None` for `auto` (Burn's matmul) and
/// unknown names.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub fn strategy(name: &str) -> Option<Strategy> {
    Some(match name {
        "simple_cyclic_cmma" => Strategy::SimpleCyclicCmma(Default::default()),
        "simple_cyclic_mma" => Strategy::SimpleCyclicMma(Default::default()),
        "simple_strided_cmma" => Strategy::SimpleStridedCmma(Default::default()),
        "simple_tilewise_cmma" => Strategy::SimpleTilewiseCmma(Default::default()),
        "simple_async_cyclic_cmma" => Strategy::SimpleAsyncCyclicCmma(Default::default()),
        "simple_tma_cmma" => Strategy::SimpleTmaCmma(Default::default()),
        "simple_tma_mma" => Strategy::SimpleTmaMma(Default::default()),
        "double_cyclic_cmma" => Strategy::DoubleCyclicCmma(Default::default()),
        "double_cyclic_mma" => Strategy::DoubleCyclicMma(Default::default()),
        "double_tilewise_cmma" => Strategy::DoubleTilewiseCmma(Default::default()),
        "double_hybrid_cmma" => Strategy::DoubleHybridCmma(Default::default()),
        "double_async_cyclic_cmma" => Strategy::DoubleAsyncCyclicCmma(Default::default()),
        "double_tma_cmma" => Strategy::DoubleTmaCmma(Default::default()),
        "double_tma_mma" => Strategy::DoubleTmaMma(Default::default()),
        "specialized_cyclic_cmma" => Strategy::SpecializedCyclicCmma(Default::default()),
        "specialized_tma_cmma" => Strategy::SpecializedTmaCmma(Default::default()),
        "specialized_tma_mma" => Strategy::SpecializedTmaMma(Default::default()),
        "ordered_double_cmma" => Strategy::OrderedDoubleCmma(Default::default()),
        "ordered_double_mma" => Strategy::OrderedDoubleMma(Default::default()),
        "simple_unit" => Strategy::SimpleUnit(Default::default()),
        "double_unit" => Strategy::DoubleUnit(Default::default()),
        _ => return None,
    })
}

/// `lhs · rhs` into `out` (bindings of one runtime's tensors, any layouts
/// cubek takes, with their element types) with `strategy`; `Err` says why
/// the kernel cannot run these shapes (the caller then takes Burn's
/// matmul). Counted in `exec::tally` either way.
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub fn launch<R: cubecl::Runtime>(
    strategy: &Strategy,
    client: &cubecl::prelude::ComputeClient<R>,
    (lhs, lhs_type): (cubecl::prelude::TensorBinding<R>, cubecl::ir::StorageType),
    (rhs, rhs_type): (cubecl::prelude::TensorBinding<R>, cubecl::ir::StorageType),
    (out, out_type): (cubecl::prelude::TensorBinding<R>, cubecl::ir::StorageType),
) -> Result<(), String> {
    use cubek::matmul::definition::{MatmulElems, MatmulGlobalElems};
    use cubek::std::InputBinding;
    let mut dtypes = MatmulElems::from_globals(&MatmulGlobalElems {
        lhs: lhs_type,
        rhs: rhs_type,
        out: out_type,
    });
    let launched = cubek::matmul::launch::launch_ref(
        strategy,
        client,
        InputBinding::new(lhs, lhs_type),
        InputBinding::new(rhs, rhs_type),
        out,
        &mut dtypes,
    )
    .map_err(|e| format!("{e:?}"));
    super::tally::counted(super::tally::Kernel::Matmul, launched)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_taken_and_unknown_ones_change_nothing() {
        assert!(set("double_cyclic_mma"));
        assert_eq!(chosen_name_or(|| "auto"), "double_cyclic_mma");
        assert!(!set("fastest_please"));
        assert_eq!(chosen_name_or(|| "auto"), "double_cyclic_mma");
        assert!(set("auto"));
        assert_eq!(chosen_name_or(|| "auto"), "auto");
        // Every name but auto is a strategy.
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        for name in &NAMES[1..] {
            assert!(strategy(name).is_some(), "{name}");
        }
    }
}
