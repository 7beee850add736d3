//! Every prunemem kernel compiled for CUDA on a machine without a GPU, so
//! that a kernel NVRTC rejects fails in CI and not in a GPU session's
//! first run (where a compile error ends the run). cubecl-cuda compiles a
//! kernel on first use in two steps, and both run here: cubecl's C++
//! compiler with the CUDA dialect turns the kernel's definition into CUDA
//! source (`cubecl_cpp`, the compiler `CudaRuntime` names), and NVRTC
//! compiles that source to PTX (`cudarc::nvrtc`, as cubecl-cuda calls it).
//! NVRTC is a library only, no driver and no device: `scripts/fetch-nvrtc.sh`
//! unpacks NVIDIA's PyPI wheels of it and of the CUDA headers.
//!
//! Where this differs from a GPU run: the definition takes a lavapipe
//! client's device properties (a CUDA client needs a driver), and the
//! compiler options are the ones cubecl-cuda 0.10 sets from an
//! architecture (`options`), written out here for sm_80 and sm_90a.

use burn::backend::wgpu::{WgpuDevice, WgpuRuntime};
use cubecl::Compiler;
use cubecl::prelude::*;
use cubecl_cpp::cuda::CudaDialect;
use cubecl_cpp::cuda::mma::CudaWmmaCompiler;
use cubecl_cpp::shared::{CompilationOptions, CppCompiler, CppSupportedFeatures};
use half::{bf16, f16};

use super::{
    dsnot, dsnot_launch, group, nll, obs_sweep, realloc, rms_norm, select, squares, swiglu, variant,
};

/// cubecl-cuda's compiler without `ptx-wmma` (Burn's build).
type CudaCompiler = CppCompiler<CudaDialect<CudaWmmaCompiler>>;

/// A kernel's name and its CUDA source.
struct Source {
    name: String,
    code: String,
}

/// `kernel`'s CUDA source under `options` (cubecl-cuda's
/// `compile_kernel`: unchecked launches, 32-bit addresses).
fn source<K: CubeKernel>(name: &str, kernel: K, options: &CompilationOptions) -> Source {
    let definition = kernel.define();
    let compiled = CudaCompiler::default()
        .compile(
            definition,
            options,
            ExecutionMode::Unchecked,
            AddressType::U32.unsigned_type(),
        )
        .unwrap_or_else(|e| panic!("{name}: cubecl's CUDA compiler: {e:?}"));
    Source {
        name: name.into(),
        code: compiled.to_string(),
    }
}

/// The settings a launch with `dim` gives its kernel.
fn settings(dim: CubeDim) -> KernelSettings {
    KernelSettings::default()
        .cube_dim(dim)
        .address_type(AddressType::U32)
}

/// An array parameter that aliases nothing.
fn arr() -> ArrayCompilationArg {
    ArrayCompilationArg { inplace: None }
}

/// The options cubecl-cuda 0.10 sets for compute capability `arch`
/// (`CudaRuntime`'s device setup: warp size, grid constants from 7.0,
/// fast tanh from 7.5 with CUDA ≥ 12.8, clusters and `elect.sync` from 9.0).
fn options(arch: u32) -> CompilationOptions {
    let mut o = CompilationOptions {
        supports_features: CppSupportedFeatures {
            fast_math: true,
            ..Default::default()
        },
        ..Default::default()
    };
    o.warp_size = 32;
    o.supports_features.grid_constants = arch >= 70;
    o.supports_features.fast_tanh = arch >= 75;
    o.supports_features.clusters = arch >= 90;
    o.supports_features.elect_sync = arch >= 90;
    o
}

/// `$kernel::new` as its launch builds it: the settings of a launch with
/// `$dim`, the client, one aliasing-free argument per array parameter,
/// `()` per scalar (every kernel here declares its arrays first; the
/// names are its parameters').
macro_rules! define {
    ($c:expr, $kernel:ty, $dim:expr; $($array:ident)*; $($scalar:ident)*) => {
        <$kernel>::new(
            settings($dim),
            $c.clone(),
            $({ let _ = stringify!($array); arr() },)*
            $({ let _ = stringify!($scalar); },)*
        )
    };
}

/// Every kernel under `options`, generic ones in each compute dtype,
/// with the cube shapes their launches use.
fn sources(c: &ComputeClient<WgpuRuntime>, o: &CompilationOptions) -> Vec<Source> {
    let d1 = CubeDim::new_1d;
    type W = WgpuRuntime;
    let mut out = vec![
        source(
            "dsnot_unstructured",
            define!(c, dsnot::dsnot_unstructured::DsnotUnstructured<W>, d1(dsnot_launch::UNITS);
            d first mask err fk fr bk br k0 r0 k1 r1 a0 a1 ends swaps;
            rows cols regrow_len prune_len regrow_whole prune_whole cycles threshold layout),
            o,
        ),
        source(
            "dsnot_nm",
            define!(c, dsnot::dsnot_nm::DsnotNm<W>, d1(dsnot_launch::UNITS);
            d first mask err fk fr bk br first_metric metric max_value swaps;
            rows cols regrow_len regrow_whole m cycles threshold layout),
            o,
        ),
        source(
            "smallest_per_group",
            define!(c, group::smallest_per_group::SmallestPerGroup<W>, d1(group::UNITS);
            keys flags; groups cols row_stride col_stride n m),
            o,
        ),
        source(
            "obs_sweep",
            define!(c, obs_sweep::obs_sweep::ObsSweep<W>, d1(obs_sweep::UNITS);
            w hinv prune err; row0 out count n m),
            o,
        ),
        source(
            "smallest_per_column",
            define!(c, select::smallest_per_column::SmallestPerColumn<W>,
            CubeDim::new_2d(select::COLUMNS, select::LANES);
            keys flags; rows cols row_stride col_stride k),
            o,
        ),
        source(
            "ordered_row_sums",
            define!(c, realloc::ordered_row_sums::OrderedRowSums<W>, d1(realloc::UNITS);
            x sums; rows cols),
            o,
        ),
        source(
            "nm_kept_sums",
            define!(c, realloc::nm_kept_sums::NmKeptSums<W>, d1(realloc::UNITS);
            metric sums; rows cols row_stride col_stride n m),
            o,
        ),
        source(
            "slot_scores",
            define!(c, realloc::slot_scores::SlotScores<W>, d1(realloc::UNITS);
            p scores; groups rows n m slot),
            o,
        ),
        source(
            "variant_keys",
            define!(c, variant::variant_keys::VariantKeys<W>, d1(variant::UNITS);
            metric keys; inp out p row_stride col_stride),
            o,
        ),
        source(
            "bitonic_step",
            define!(c, variant::bitonic_step::BitonicStep<W>, d1(variant::UNITS);
            keys; pairs p j k),
            o,
        ),
        source(
            "bitonic_local",
            define!(c, variant::bitonic_local::BitonicLocal<W>, d1(variant::UNITS);
            keys; len p k_first k_last),
            o,
        ),
        source(
            "variant_prefix",
            define!(c, variant::variant_prefix::VariantPrefix<W>, d1(variant::UNITS);
            keys metric cum totals; inp out p row_stride col_stride),
            o,
        ),
        source(
            "variant_rows",
            define!(c, variant::variant_rows::VariantRows<W>, d1(variant::UNITS);
            sorted cum totals thresh pruned; inp out p alpha nothing),
            o,
        ),
        source(
            "kth_smallest",
            define!(c, select::kth_smallest::KthSmallest<W>, d1(select::UNITS);
            keys out; len k),
            o,
        ),
        source(
            "kth_pass",
            define!(c, select::kth_pass::KthPass<W>, d1(select::UNITS);
            keys totals; len k pass),
            o,
        ),
        source(
            "kth_settled",
            define!(c, select::kth_settled::KthSettled<W>, d1(1);
            totals out; k),
            o,
        ),
    ];
    out.extend(floats::<f16>(c, o, "f16"));
    out.extend(floats::<bf16>(c, o, "bf16"));
    out.extend(floats::<f32>(c, o, "f32"));
    out
}

/// The kernels generic over the compute dtype `F`.
fn floats<F: Float>(
    c: &ComputeClient<WgpuRuntime>,
    o: &CompilationOptions,
    dtype: &str,
) -> Vec<Source> {
    let d1 = CubeDim::new_1d;
    type W = WgpuRuntime;
    vec![
        source(
            &format!("row_nll<{dtype}>"),
            define!(c, nll::row_nll::RowNll<F, W>, d1(nll::UNITS);
            logits targets nll; vocab skip),
            o,
        ),
        source(
            &format!("rms_norm<{dtype}>"),
            define!(c, rms_norm::rms_norm::RmsNorm<F, W>, d1(rms_norm::UNITS);
            x weight out; rows d eps),
            o,
        ),
        source(
            &format!("column_squares<{dtype}>"),
            define!(c, squares::column_squares::ColumnSquares<F, W>,
            d1(squares::UNITS); x partial; rows cols per_slab),
            o,
        ),
        source(
            &format!("swiglu<{dtype}>"),
            define!(c, swiglu::swiglu::Swiglu<F, W>, d1(swiglu::UNITS);
            gate up out; n),
            o,
        ),
        source(
            &format!("swiglu_in_place<{dtype}>"),
            define!(c, swiglu::swiglu_in_place::SwigluInPlace<F, W>,
            d1(swiglu::UNITS); gate up; n),
            o,
        ),
    ]
}

/// The CUDA headers' folder NVRTC is given (cubecl-cuda gives
/// `$CUDA_PATH/include`): `PRUNEMEM_CUDA_INCLUDE`, else `$CUDA_PATH/include`.
fn include_path() -> String {
    std::env::var("PRUNEMEM_CUDA_INCLUDE")
        .or_else(|_| std::env::var("CUDA_PATH").map(|p| format!("{p}/include")))
        .expect("PRUNEMEM_CUDA_INCLUDE: the folder with cuda_runtime.h (scripts/fetch-nvrtc.sh prints it)")
}

/// What NVRTC made of a source: its PTX and the machine code ptxas made
/// from it (NVRTC runs ptxas for a real architecture, `sm_…`), with
/// ptxas's registers a thread and bytes spilled to local memory.
#[derive(Debug)]
struct Compiled {
    ptx: usize,
    cubin: usize,
    registers: Option<u32>,
    spilled: Option<u32>,
}

/// NVRTC's verdict on `src` for `arch`, with the options cubecl-cuda
/// passes and ptxas's report: `Err` holds NVRTC's log.
fn nvrtc(src: &Source, arch: &str, include: &str) -> Result<Compiled, String> {
    use cudarc::nvrtc::{result, sys};
    let code = std::ffi::CString::new(src.code.as_str()).map_err(|e| e.to_string())?;
    let options = [
        format!("--gpu-architecture={arch}"),
        format!("--include-path={include}"),
        "-lineinfo".to_string(),
        "--ptxas-options=-v".to_string(),
    ];
    let prog = result::create_program(&code, None).map_err(|e| format!("{e:?}"))?;
    // SAFETY: `prog` was created above from `code`, which outlives it, and
    // is destroyed once, after its last use.
    unsafe {
        let compiled = result::compile_program(prog, &options);
        let log = result::get_program_log(prog)
            .map(|l| {
                std::ffi::CStr::from_ptr(l.as_ptr())
                    .to_string_lossy()
                    .into_owned()
            })
            .unwrap_or_default();
        let mut cubin = 0usize;
        let out = match (compiled, result::get_ptx(prog)) {
            (Ok(()), Ok(ptx)) => match sys::nvrtcGetCUBINSize(prog, &mut cubin).result() {
                Ok(()) => Ok(Compiled {
                    ptx: ptx.len(),
                    cubin,
                    registers: number_before(&log, " registers"),
                    spilled: number_before(&log, " bytes spill stores"),
                }),
                Err(e) => Err(format!("{e:?}\n{log}")),
            },
            (Err(e), _) | (_, Err(e)) => Err(format!("{e:?}\n{log}")),
        };
        let _ = result::destroy_program(prog);
        out
    }
}

/// The number just before `marker` in ptxas's report ("Used 40
/// registers", "0 bytes spill stores").
fn number_before(log: &str, marker: &str) -> Option<u32> {
    let head = &log[..log.find(marker)?];
    let start = head
        .rfind(|c: char| !c.is_ascii_digit())
        .map_or(0, |i| i + 1);
    head[start..].parse().ok()
}

/// How many kernels the kernel files declare (cubecl's launch attribute).
fn declared() -> usize {
    crate::exec::cube::KERNEL_SOURCES
        .iter()
        .map(|(_, text)| {
            String::from_utf8_lossy(text)
                .matches(concat!("#[cube(", "launch"))
                .count()
        })
        .sum()
}

#[test]
#[ignore = "needs NVRTC: eval \"$(scripts/fetch-nvrtc.sh DIR)\", then cargo test --features wgpu --lib cuda_source -- --ignored"]
fn every_kernel_compiles_for_cuda_with_nvrtc() {
    let client = WgpuRuntime::client(&WgpuDevice::Cpu);
    let include = include_path();
    let mut failed = Vec::new();
    let mut compiled = 0;
    for (cc, arch) in [(80, "sm_80"), (90, "sm_90a")] {
        let all = sources(&client, &options(cc));
        let distinct: std::collections::BTreeSet<_> = all
            .iter()
            .map(|s| s.name.split('<').next().unwrap_or_default().to_string())
            .collect();
        assert_eq!(
            distinct.len(),
            declared(),
            "a kernel is not listed here: {distinct:?}"
        );
        for s in &all {
            match nvrtc(s, arch, &include) {
                Ok(c) if c.cubin > 0 => {
                    compiled += 1;
                    let or_unread = |n: Option<u32>| n.map_or("?".to_string(), |n| n.to_string());
                    let (regs, spill) = (or_unread(c.registers), or_unread(c.spilled));
                    println!(
                        "{arch} {:<24} {:>6} B of CUDA -> {:>6} B of PTX -> {:>6} B of machine code, \
                         {regs:>3} registers, {spill} B spilled",
                        s.name,
                        s.code.len(),
                        c.ptx,
                        c.cubin,
                    );
                }
                Ok(_) => failed.push(format!("{arch} {}: no machine code", s.name)),
                Err(log) => failed.push(format!("{arch} {}: {log}\n{}", s.name, s.code)),
            }
        }
    }
    assert!(
        failed.is_empty(),
        "NVRTC rejected {} kernels:\n{}",
        failed.len(),
        failed.join("\n\n")
    );
    // The check itself can fail: NVRTC is really asked, and its errors seen.
    let broken = Source {
        name: "broken".into(),
        code: "extern \"C\" __global__ void broken() { undeclared(); }\n".into(),
    };
    let log = nvrtc(&broken, "sm_90a", &include)
        .expect_err("NVRTC took a call to an undeclared function");
    assert!(log.contains("undeclared"), "{log}");
    // Two architectures; 16 kernels in f32, 5 in each of the 3 compute dtypes.
    assert_eq!(compiled, 2 * (16 + 3 * 5));
}
