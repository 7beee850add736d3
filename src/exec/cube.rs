//! cubecl's process-wide settings, chosen before the first device opens:
//! how its memory pool reserves, and its launch log routed into
//! [`super::transfer`]'s kernel counter.
//!
//! **The pool.** cubecl's default pools slice pages of a quarter of the
//! card down to 1/64 of it: on an 80 GB H100 one tensor above 312 MB takes
//! a 5 GB page and one above 39 MB a 1.25 GB page, so a run with 0.86 GiB
//! in use reserved 7.02 GiB (issue 42's figures) — and reserved is what
//! `nvidia-smi` shows and what the driver refuses. prunemem enforces
//! cubecl's *persistent* pool instead: every buffer is allocated at its own
//! size (aligned) and a freed one is reused only by a tensor of the same
//! size — the engine's tensors repeat their shapes batch after batch and
//! layer after layer — and the engine releases what is free at every
//! layer and phase boundary ([`super::release_free`]) and where a pass's
//! batch shape changes ([`super::BatchShapes`]). Reserved then stays within
//! the bytes in use plus the freed buffers of the current pass, which
//! `estimate::device_pool` names.
//!
//! **Compiled kernels** are kept between runs ([`kernel_cache`]): cubecl
//! compiles each kernel the first time a process launches it (NVRTC on
//! CUDA), which took 12 s of the first layer of a 1B-shape prune on an
//! H100; later runs of the same build load them from the cache (one folder
//! a build: cubecl does not notice a kernel's body change).
//!
//! **Kernel launches.** cubecl's profiling level `Minimal` logs each
//! launch's name without synchronising; forwarded to the `log` crate at
//! trace level, a small logger counts them ([`super::transfer::launched`]).
//! Where another `log` logger is already installed, the user asked for
//! cubecl's own profile (`CUBECL_DEBUG_OPTION`), or turned counting off
//! (`PRUNEMEM_COUNT_KERNELS=0`), launches are not counted and show as
//! unknown.

use std::sync::{Once, OnceLock};

use burn::cubecl::config::cache::CacheConfig;
use burn::cubecl::config::memory::PersistentMemory;
use burn::cubecl::config::profiling::ProfilingLogLevel;
use burn::cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
use cubecl_common::config::logger::LogCrateLevel;

/// Sets cubecl's configuration once per process, before any device opens
/// (cubecl reads it when its first client starts, and refuses a second).
pub(super) fn configure() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // A cubecl.toml / burn.toml and CUBECL_* variables still apply.
        let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
        config.memory.persistent_memory = PersistentMemory::Enforced;
        // Kept where a cubecl.toml puts cubecl's cache, else in this
        // build's folder (decided once: the plan names the same place).
        let place = PLACE.get_or_init(|| place_of(config.compilation.cache.as_ref()));
        if let super::kernel_cache::Place::Build(folder) = place {
            config.compilation.cache = Some(CacheConfig::File(folder.clone()));
        }
        // PRUNEMEM_COUNT_KERNELS=0 turns the count off (each launch then
        // skips formatting its name: about a microsecond on the launching
        // side).
        let wanted = std::env::var("PRUNEMEM_COUNT_KERNELS").map_or(true, |v| v != "0");
        let count = wanted
            && matches!(config.profiling.logger.level, ProfilingLogLevel::Disabled)
            && log::set_logger(&LAUNCHES).is_ok();
        if count {
            log::set_max_level(log::LevelFilter::Trace);
            config.profiling.logger.level = ProfilingLogLevel::Minimal;
            config.profiling.logger.log = Some(LogCrateLevel::Trace);
        }
        // Refused only when something read the configuration first (a
        // client opened outside `exec`): cubecl's defaults then stay.
        let set = std::panic::catch_unwind(|| CubeClRuntimeConfig::set(config)).is_ok();
        if set && count {
            super::transfer::counting_kernels();
        }
    });
}

/// Where this process's compiled kernels are kept, decided once: by
/// [`configure`] from the configuration it sets, or here where no device
/// has been opened yet.
static PLACE: OnceLock<super::kernel_cache::Place> = OnceLock::new();

/// Where this process's compiled kernels are kept: where a `cubecl.toml`
/// or `burn.toml` (in the working directory or above it) puts cubecl's
/// cache, which [`configure`] leaves in force, else this build's folder
/// ([`kernel_cache`]), else nowhere.
pub fn cache_place() -> super::kernel_cache::Place {
    PLACE
        .get_or_init(|| {
            place_of(
                CubeClRuntimeConfig::from_current_dir()
                    .compilation
                    .cache
                    .as_ref(),
            )
        })
        .clone()
}

/// [`cache_place`] given cubecl's own setting (`None`: none set).
fn place_of(cubecl: Option<&CacheConfig>) -> super::kernel_cache::Place {
    use super::kernel_cache::Place;
    match cubecl {
        Some(CacheConfig::File(path)) => {
            Place::Cubecl(format!("{} (cubecl.toml's)", path.display()))
        }
        Some(other) => Place::Cubecl(format!("cubecl's {other:?} cache (cubecl.toml's)")),
        None => kernel_cache().map_or(Place::Off, Place::Build),
    }
}

/// Where compiled kernels are kept between runs: under
/// `PRUNEMEM_KERNEL_CACHE` (`off` or `0`: nowhere), else
/// `$XDG_CACHE_HOME/prunemem/kernels`, else `~/.cache/prunemem/kernels`,
/// in a folder named for this build ([`build_fingerprint`]).
pub fn kernel_cache() -> Option<std::path::PathBuf> {
    let root = match std::env::var_os("PRUNEMEM_KERNEL_CACHE") {
        Some(v) if v == "off" || v == "0" || v.is_empty() => return None,
        Some(v) => std::path::PathBuf::from(v),
        None => std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(std::path::PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cache")))?
            .join("prunemem")
            .join("kernels"),
    };
    Some(root.join(build_fingerprint()))
}

/// The sources a compiled kernel depends on: prunemem's kernels and every
/// dependency's version (Burn's and cubek's kernels, cubecl's compilers).
pub(crate) const KERNEL_SOURCES: [(&str, &[u8]); 14] = [
    ("cuda_source.rs", include_bytes!("kernels/cuda_source.rs")),
    ("dsnot.rs", include_bytes!("kernels/dsnot.rs")),
    ("dsnot_launch.rs", include_bytes!("kernels/dsnot_launch.rs")),
    ("group.rs", include_bytes!("kernels/group.rs")),
    ("mod.rs", include_bytes!("kernels/mod.rs")),
    ("nll.rs", include_bytes!("kernels/nll.rs")),
    ("obs_sweep.rs", include_bytes!("kernels/obs_sweep.rs")),
    ("realloc.rs", include_bytes!("kernels/realloc.rs")),
    ("rms_norm.rs", include_bytes!("kernels/rms_norm.rs")),
    ("select.rs", include_bytes!("kernels/select.rs")),
    ("squares.rs", include_bytes!("kernels/squares.rs")),
    ("swiglu.rs", include_bytes!("kernels/swiglu.rs")),
    ("variant.rs", include_bytes!("kernels/variant.rs")),
    ("Cargo.lock", include_bytes!("../../Cargo.lock")),
];

/// This build's kernels, as a folder name: prunemem's version and an
/// FNV-1a hash of [`KERNEL_SOURCES`]. cubecl keys a compiled kernel by
/// its name and compile-time arguments, not by its body (under cubecl's
/// own version), so a cache shared across builds served a kernel compiled
/// from older code: a changed kernel passed its test against the stale
/// one on lavapipe. Each build now reads only what it compiled itself.
pub fn build_fingerprint() -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (name, bytes) in KERNEL_SOURCES {
        for b in name.as_bytes().iter().chain(bytes) {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{}-{h:016x}", env!("CARGO_PKG_VERSION"))
}

/// Counts cubecl's `Executing KERNEL` lines (launches), its compiles and
/// its kernel-cache loads ([`Line`]); everything else is dropped without
/// being formatted past its first words.
struct LaunchLog;

/// The lines of cubecl's that are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    /// `Executing NAME` (the launch log, trace).
    Launch,
    /// `Compiling kernel` (CUDA, trace: before NVRTC) or `Compiling NAME`
    /// (Vulkan, debug: before the SPIR-V compiler).
    Compile,
    /// `Using PTX cache` (CUDA) or `Using SPIR-V cache` (Vulkan), trace:
    /// a compiled kernel read from the kernel cache instead.
    CacheLoad,
}

fn line(args: &std::fmt::Arguments<'_>) -> Option<Line> {
    if starts_with(args, "Executing ") {
        Some(Line::Launch)
    } else if starts_with(args, "Compiling ") {
        Some(Line::Compile)
    } else if starts_with(args, "Using PTX cache") || starts_with(args, "Using SPIR-V cache") {
        Some(Line::CacheLoad)
    } else {
        None
    }
}

static LAUNCHES: LaunchLog = LaunchLog;

impl log::Log for LaunchLog {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        // Debug or trace (Vulkan's compile line is a debug one).
        metadata.level() >= log::Level::Debug && metadata.target().starts_with("cubecl")
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        match line(record.args()) {
            Some(Line::Launch) => super::transfer::launched(),
            Some(Line::Compile) => super::transfer::compiled(),
            Some(Line::CacheLoad) => super::transfer::loaded_from_cache(),
            None => {}
        }
    }

    fn flush(&self) {}
}

/// Whether `args` formats to text starting with `prefix`, formatting no
/// further than the prefix.
fn starts_with(args: &std::fmt::Arguments<'_>, prefix: &str) -> bool {
    struct Prefix<'a> {
        want: &'a [u8],
        seen: usize,
    }
    impl std::fmt::Write for Prefix<'_> {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            let rest = &self.want[self.seen..];
            let n = rest.len().min(s.len());
            if s.as_bytes()[..n] != rest[..n] {
                return Err(std::fmt::Error);
            }
            self.seen += n;
            match self.seen == self.want.len() {
                true => Err(std::fmt::Error),
                false => Ok(()),
            }
        }
    }
    let mut p = Prefix {
        want: prefix.as_bytes(),
        seen: 0,
    };
    let _ = std::fmt::write(&mut p, *args);
    p.seen == p.want.len()
}

#[cfg(test)]
mod tests {
    use super::{KERNEL_SOURCES, Line, build_fingerprint, line, starts_with};

    /// Every kernel file counts towards the cache's folder, so a new one
    /// cannot be served stale.
    #[test]
    fn every_kernel_source_names_the_cache_folder() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/exec/kernels");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".rs"))
            .collect();
        on_disk.sort();
        let listed: Vec<&str> = KERNEL_SOURCES
            .iter()
            .map(|(n, _)| *n)
            .filter(|n| n.ends_with(".rs"))
            .collect();
        assert_eq!(on_disk, listed);
        let f = build_fingerprint();
        assert!(
            f.starts_with(env!("CARGO_PKG_VERSION")) && f.len() > 17,
            "{f}"
        );
    }

    #[test]
    fn the_launch_prefix_is_recognised_without_formatting_the_rest() {
        let name = "burn_cubecl::kernel::matmul";
        assert!(starts_with(&format_args!("Executing {name}"), "Executing "));
        assert!(starts_with(
            &format_args!("{}{}", "Exec", "uting x"),
            "Executing "
        ));
        assert!(!starts_with(
            &format_args!("Compiling {name}"),
            "Executing "
        ));
        assert!(!starts_with(&format_args!("Exec"), "Executing "));
    }

    /// The lines cubecl 0.10 writes where it compiles a kernel or loads
    /// one from the cache (cubecl-cuda's `compute/context.rs`,
    /// cubecl-wgpu's `backend/vulkan.rs` and `backend/base.rs`), as each
    /// is counted; anything else is not.
    #[test]
    fn compiles_and_cache_loads_are_told_apart_from_launches() {
        let name = "prunemem::exec::kernels::select::smallest_per_column";
        assert_eq!(line(&format_args!("Executing {name}")), Some(Line::Launch));
        assert_eq!(line(&format_args!("Compiling kernel")), Some(Line::Compile));
        assert_eq!(line(&format_args!("Compiling {name}")), Some(Line::Compile));
        assert_eq!(
            line(&format_args!("Using PTX cache")),
            Some(Line::CacheLoad)
        );
        assert_eq!(
            line(&format_args!("Using SPIR-V cache")),
            Some(Line::CacheLoad)
        );
        assert_eq!(line(&format_args!("Using compilation cache")), None);
        assert_eq!(line(&format_args!("Supported CMMA sizes: []")), None);
        assert_eq!(
            line(&format_args!("[cubecl-wgpu] compiling WGSL module")),
            None
        );
    }
}
