//! What the device a run opened was measured to run fastest with, for the
//! choices that have an environment variable of their own (the linears'
//! layout, the large uploads, the head's product): the variable decides
//! where it is set, else this. One H200 session (2026-11-28, docs/gpu.md
//! "On an NVIDIA H200") timed the three together on CUDA against Burn's
//! ways: the 1B Wanda protocol pruned in 1.54 s against 2.59 and evaluated
//! in 0.58 s against 1.03, nvidia-smi's rise 3.33 GiB against 3.96, with
//! the same perplexity to every digit. Other devices keep Burn's ways
//! (nothing else was measured; wgpu has no staged copies).

use std::sync::atomic::{AtomicU8, Ordering};

/// Nothing opened yet, or a device without measured defaults.
const NONE: u8 = 0;
/// A CUDA device.
const CUDA: u8 = 1;
/// A CUDA device with the Tensor Memory Accelerator (sm_90 and later).
const CUDA_TMA: u8 = 2;

static OPENED: AtomicU8 = AtomicU8::new(NONE);

/// Records the device a run opened (`Exec::open`): CUDA or not, with TMA
/// or not.
pub(super) fn opened(cuda: bool, tma: bool) {
    let kind = match (cuda, tma) {
        (true, true) => CUDA_TMA,
        (true, false) => CUDA,
        _ => NONE,
    };
    OPENED.store(kind, Ordering::Relaxed);
}

/// `var`'s choice (its names, the default-off one first), read once and
/// kept in `cell`, else the device's default `measured()`.
pub(crate) fn env_or(
    cell: &std::sync::OnceLock<Option<bool>>,
    var: &str,
    names: &[&str],
    measured: impl FnOnce() -> bool,
) -> bool {
    cell.get_or_init(|| from_env(var, names))
        .unwrap_or_else(measured)
}

/// Whether the device opened is a CUDA device.
pub fn cuda() -> bool {
    OPENED.load(Ordering::Relaxed) != NONE
}

/// Whether the device opened is a CUDA device with TMA.
pub fn cuda_tma() -> bool {
    OPENED.load(Ordering::Relaxed) == CUDA_TMA
}

/// `var`'s value when it is one of `names`, else `None` (unset, empty, or
/// a name not listed, which is said on stderr; [`env_or`] asks once).
fn from_env(var: &str, names: &[&str]) -> Option<bool> {
    let v = std::env::var(var).ok()?;
    match names.iter().position(|n| *n == v) {
        Some(0) => Some(false),
        Some(_) => Some(true),
        None => {
            if !v.is_empty() {
                eprintln!(
                    "prunemem: {var}={} is not one of {}; the device's default is used",
                    crate::input::escape(&v),
                    names.join(", ")
                );
            }
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listed_name_decides_and_anything_else_defers() {
        // SAFETY: this test alone reads this variable.
        unsafe { std::env::set_var("PRUNEMEM_DEFAULTS_TEST", "on") };
        assert_eq!(
            from_env("PRUNEMEM_DEFAULTS_TEST", &["off", "on"]),
            Some(true)
        );
        unsafe { std::env::set_var("PRUNEMEM_DEFAULTS_TEST", "off") };
        assert_eq!(
            from_env("PRUNEMEM_DEFAULTS_TEST", &["off", "on"]),
            Some(false)
        );
        unsafe { std::env::set_var("PRUNEMEM_DEFAULTS_TEST", "sideways") };
        assert_eq!(from_env("PRUNEMEM_DEFAULTS_TEST", &["off", "on"]), None);
        unsafe { std::env::remove_var("PRUNEMEM_DEFAULTS_TEST") };
        assert_eq!(from_env("PRUNEMEM_DEFAULTS_TEST", &["off", "on"]), None);
    }
}
