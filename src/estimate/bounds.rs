//! Bounds on a workload before anything is estimated: every term the
//! estimator forms is computed first in f64 (which cannot wrap) and refused
//! past [`MAX_BYTES`], so the u64 arithmetic that follows cannot wrap and
//! an absurd workload is "does not fit", never a small wrapped number.

use super::{Arch, EstimateError, Workload};

/// The most bytes any one term of an estimate may reach, 64 PiB: past
/// every machine by orders of magnitude, and 256× below `u64::MAX`, so the
/// estimator's sums of terms (each a product of small constants and the
/// bounded sizes) cannot wrap.
pub const MAX_BYTES: f64 = (1u64 << 56) as f64;

/// The largest terms an estimate forms, in f64 (which cannot wrap), each
/// with the flags that drive it; generous by a constant factor on purpose.
fn envelope(arch: &Arch, w: &Workload) -> [(f64, &'static str); 8] {
    let f = |v: u64| v as f64;
    let tokens = f(w.batch_size) * f(w.seqlen);
    // Calibration windows held at once: nsamples (Wanda, SparseGPT), or
    // GradProbe's batches of windows.
    let calib = f(w.nsamples).max(f(w.num_batches) * f(w.batch_size)) * f(w.seqlen);
    [
        (f(arch.params) * 32.0, "--params (or the model's size)"),
        (calib * f(arch.hidden) * 16.0, "--nsamples × --seqlen"),
        (calib * f(arch.intermediate) * 16.0, "--nsamples × --seqlen"),
        (tokens * f(arch.vocab) * 16.0, "--batch-size × --seqlen"),
        (
            tokens * f(arch.hidden) * f(arch.layers) * 64.0,
            "--batch-size × --seqlen",
        ),
        (
            tokens * f(w.seqlen) * f(arch.heads) * 16.0,
            "--batch-size × --seqlen²",
        ),
        (
            f(w.eval_windows) * f(w.seqlen) * f(arch.hidden.max(arch.intermediate)) * 16.0,
            "--eval-windows × --seqlen",
        ),
        (f(w.text_bytes) * 64.0, "the text's size"),
    ]
}

/// Refuses `w` on `arch` when any term passes [`MAX_BYTES`], naming the
/// flag that drives it.
pub fn check(arch: &Arch, w: &Workload) -> Result<(), EstimateError> {
    for (bytes, driver) in envelope(arch, w) {
        // NaN (an overflowed product) is refused too.
        if bytes.is_nan() || bytes > MAX_BYTES {
            return Err(EstimateError::TooLarge(format!(
                "this workload needs more than 64 PiB (driven by {driver}): no machine holds it"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{Device, Engine, Task, estimate, presets};
    use super::*;

    /// Sizes doubled up to u64::MAX never wrap: every estimate either grows
    /// with the size or is refused as too large, and the largest is refused
    /// (a batch of u64::MAX once estimated less than a batch of 1).
    #[test]
    fn absurd_sizes_are_refused_never_wrapped() {
        let arch = presets::load("llama-3.1-8b").expect("a preset");
        type Set = fn(&mut Workload, u64);
        let sizes: [(&str, Set); 5] = [
            ("batch", |w, v| w.batch_size = v),
            ("seqlen", |w, v| w.seqlen = v),
            ("nsamples", |w, v| w.nsamples = v),
            ("eval", |w, v| w.eval_windows = v),
            ("text", |w, v| w.text_bytes = v),
        ];
        let tasks = [
            Task::Magnitude,
            Task::Wanda,
            Task::SparseGpt,
            Task::Ria,
            Task::GradProbe,
            Task::Train,
            Task::Inference,
        ];
        for task in tasks {
            for device in [Device::Cpu, Device::Cuda, Device::Wgpu] {
                for engine in [Engine::Prunemem, Engine::Reference] {
                    for (name, set) in sizes {
                        let mut last = 0;
                        let mut refused = false;
                        for k in 0..=64u32 {
                            let mut w = Workload::new(task);
                            (w.engine, w.device) = (engine, device);
                            set(&mut w, 1u64.checked_shl(k).unwrap_or(u64::MAX).max(1));
                            if k == 64 {
                                set(&mut w, u64::MAX);
                            }
                            match estimate(&arch, &w) {
                                Ok(e) => {
                                    assert!(!refused, "{name} {k}: accepted after a refusal");
                                    assert!(e.peak() >= last, "{task:?} {name} 2^{k}: shrank");
                                    last = e.peak();
                                }
                                Err(EstimateError::TooLarge(_)) => refused = true,
                                // Not a workload prunemem estimates (wgpu's reference).
                                Err(EstimateError::Invalid(_)) if device == Device::Wgpu => {
                                    refused = true;
                                    break;
                                }
                                Err(e) => panic!("{task:?} {name} 2^{k}: {e}"),
                            }
                        }
                        assert!(refused, "{task:?} {engine:?} {name}: u64::MAX accepted");
                    }
                }
            }
        }
    }
}
