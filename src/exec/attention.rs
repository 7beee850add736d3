//! Which attention a device layer runs. Burn 0.21 without its `autotune`
//! feature always takes its fallback: `q·kᵀ`, a scale, a causal mask, a
//! softmax in five element-wise steps and `·v`, each a `[batch, heads,
//! seq, seq]` tensor that cubecl's pool keeps a page for (at a 7B shape
//! and 2048-token windows in batches of 8 those pages are most of the
//! pool's reserve: docs/gpu.md). cubek's flash attention keeps the scores
//! in registers and shared memory instead. `PRUNEMEM_ATTENTION=NAME` names
//! the kernel for a run, [`set`] for a measurement; `fallback` keeps
//! Burn's. Unnamed, a device gets what was measured on it
//! ([`measured_default`]).

use super::named::Named;

/// The kernels by name, `fallback` first (Burn's separate kernels).
/// `unit`: cubek's flash attention on plain units (any device with
/// planes); `accelerated`: on the tensor cores (CUDA's mma), 4 planes a
/// cube.
pub const NAMES: &[&str] = &["fallback", "unit", "accelerated"];

/// The kernel in use, by name (`PRUNEMEM_ATTENTION`).
static CHOICE: Named = Named::new("PRUNEMEM_ATTENTION", NAMES, "Burn's attention");

/// Uses `name` from now on; `false` (nothing changed) for an unknown name.
pub fn set(name: &str) -> bool {
    CHOICE.set(name)
}

/// The kernel a device gets when `PRUNEMEM_ATTENTION` is unset, as
/// measured. On lavapipe (wgpu) `unit` (docs/gpu.md: the same losses,
/// the scores' pages gone from the pool). On CUDA `fallback` until an H100
/// has timed the flash kernels against it (`scripts/bench/cuda.sh`'s
/// `attention` runs).
pub fn measured_default(cuda: bool) -> &'static str {
    if cuda { "fallback" } else { "unit" }
}

/// The kernel a device run in `f16` (or another dtype) will take: the name
/// in use where the run computes in f16, else `fallback` (the flash
/// kernels hold their operands in f16 tiles: `Compute::fused_attention`).
/// A run's plan records it (`attention`); the estimator's pool model reads
/// it back.
pub fn planned(cuda: bool, f16: bool) -> &'static str {
    match f16 {
        true => chosen_name_or(|| measured_default(cuda)),
        false => NAMES[0],
    }
}

/// The name in use: `PRUNEMEM_ATTENTION`'s, or the last [`set`], else
/// `default()` (asked once); `fallback` for an unknown name.
pub fn chosen_name_or(default: impl FnOnce() -> &'static str) -> &'static str {
    CHOICE.chosen_or(default)
}

/// The flash kernel in use (`None`: Burn's fallback).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub fn chosen(
    default: impl FnOnce() -> &'static str,
) -> Option<cubek::attention::launch::Strategy> {
    strategy(chosen_name_or(default))
}

#[cfg(any(feature = "wgpu", feature = "cuda"))]
fn strategy(name: &str) -> Option<cubek::attention::launch::Strategy> {
    use cubek::attention::launch::{BlueprintStrategy, Strategy};
    use cubek::attention::routines::blackbox_accelerated::BlackboxAcceleratedStrategy;
    Some(match name {
        "unit" => Strategy::Unit(BlueprintStrategy::Inferred(())),
        "accelerated" => Strategy::BlackboxAccelerated(BlueprintStrategy::Inferred(
            BlackboxAcceleratedStrategy {
                num_planes: 4,
                seq_q: 1,
                seq_kv: 1,
            },
        )),
        _ => return None,
    })
}

/// Causal attention of `q`, `k`, `v` (bindings of contiguous `[batch,
/// heads, seq, head_dim]` tensors of one runtime, `k` and `v` with `q`'s
/// heads) into `out` with `strategy`, accumulating in f32; `Err` says why
/// the kernel cannot run these shapes (the caller then takes Burn's
/// fallback).
#[cfg(any(feature = "wgpu", feature = "cuda"))]
pub fn launch<R: cubecl::Runtime>(
    strategy: cubek::attention::launch::Strategy,
    client: &cubecl::prelude::ComputeClient<R>,
    [q, k, v, out]: [cubecl::prelude::TensorBinding<R>; 4],
    float: cubecl::ir::StorageType,
) -> Result<(), String> {
    use cubecl::ir::{ElemType, FloatKind, StorageType};
    use cubek::attention::definition::{
        AccumulatorPrecision, AttentionGlobalTypes, AttentionOptions,
    };
    let types = AttentionGlobalTypes {
        query: float,
        key: float,
        value: float,
        mask: StorageType::Scalar(ElemType::UInt(cubecl::ir::UIntKind::U8)),
        out: float,
    };
    let options = AttentionOptions {
        causal: true,
        accumulator_precision: AccumulatorPrecision::Strict(StorageType::Scalar(ElemType::Float(
            FloatKind::F32,
        ))),
    };
    let launched =
        cubek::attention::launch::launch_ref(strategy, client, q, k, v, None, out, &types, options);
    launched.map_err(|e| format!("{e:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_taken_and_unknown_ones_change_nothing() {
        assert!(set("unit"));
        assert_eq!(chosen_name_or(|| "fallback"), "unit");
        assert!(!set("flashier"));
        assert_eq!(chosen_name_or(|| "fallback"), "unit");
        assert!(set("fallback"));
        assert_eq!(chosen_name_or(|| "unit"), "fallback");
        // Unnamed again, for the tests beside this one in the process.
        CHOICE.reset();
        #[cfg(any(feature = "wgpu", feature = "cuda"))]
        for name in &NAMES[1..] {
            assert!(strategy(name).is_some(), "{name}");
        }
    }
}
