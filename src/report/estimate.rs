//! The human-readable report of one estimate: the model and workload, the
//! phase peaks, the breakdown at the peak, what the reference scripts would
//! need, and which GPUs of the catalogue fit. `prunemem estimate` prints it;
//! it reads an [`Estimate`] and runs nothing.

use crate::estimate::{Device, Engine, Estimate, Task, catalog};
use crate::units::{format_bytes, format_count};

/// The whole report; `reference` is the same run on the reference scripts,
/// `gpus` the cards to check on a GPU device.
pub fn render(
    est: &Estimate,
    reference: Option<&Estimate>,
    gpus: &[catalog::Gpu],
    device: Device,
) -> String {
    let mut s = header(est, device);
    s += &phases(est, device);
    if let Some(r) = reference {
        let ratio = r.peak() as f64 / est.peak().max(1) as f64;
        s += &format!(
            "\nThe reference scripts would peak at {} in their {} phase ({ratio:.1}× this).\n",
            format_bytes(r.peak()),
            r.phases[r.peak_phase()].name
        );
    }
    if device.is_gpu() {
        s += &gpu_table(est, gpus);
    }
    s
}

/// The model and the workload, two lines.
fn header(est: &Estimate, device: Device) -> String {
    let a = &est.arch;
    let w = &est.workload;
    let model = format!(
        "Model     {} — {} parameters ({} layers, hidden {}, {} heads / {} kv, intermediate {}, vocab {}{})\n",
        a.name,
        format_count(a.params),
        a.layers,
        a.hidden,
        a.heads,
        a.kv_heads,
        a.intermediate,
        a.vocab,
        if a.tied { ", tied embeddings" } else { "" }
    );
    let sizes = if w.task == Task::Train {
        format!(
            "batch {} × {} tokens, accumulation {}, {:?}{}",
            w.batch_size,
            w.seqlen,
            w.grad_accum,
            w.optimizer,
            if w.checkpointing {
                ", checkpointing"
            } else {
                ""
            }
        )
    } else {
        format!(
            "{} samples × {} tokens, batch {}",
            w.nsamples, w.seqlen, w.batch_size
        )
    };
    let workload = format!(
        "Workload  {:?} on {:?} in {}, {:?} engine{}, {sizes}{}\n\n",
        w.task,
        device,
        w.dtype,
        w.engine,
        if w.resident { " (resident)" } else { "" },
        if w.eval_windows > 0 {
            format!(", {} eval windows", w.eval_windows)
        } else {
            String::new()
        }
    )
    .to_lowercase();
    model + &workload
}

/// Each phase's peak, then the components of the highest one.
fn phases(est: &Estimate, device: Device) -> String {
    let peak_i = est.peak_phase();
    let mut s = String::from("Phase peaks\n");
    for (i, p) in est.phases.iter().enumerate() {
        s += &format!(
            "  {:<20} {:>12}{}\n",
            p.name,
            format_bytes(p.total()),
            if i == peak_i { "   ← peak" } else { "" }
        );
    }
    let peak = &est.phases[peak_i];
    s += &format!("\nBreakdown at the peak ({})\n", peak.name);
    for c in crate::estimate::prunemem::sorted(peak) {
        s += &format!("  {:<34} {:>12}\n", c.name, format_bytes(c.bytes));
    }
    s += &format!("  {:<34} {:>12}\n", "total", format_bytes(peak.total()));
    if est.workload.engine == Engine::Reference && device == Device::Cuda {
        s += &format!(
            "  {:<34} {:>12}   (torch.cuda.max_memory_allocated)\n",
            "of which allocated",
            format_bytes(est.peak_allocated())
        );
    }
    if let Some(pool) = &est.device_pool {
        s += &format!(
            "\nThe device pool reserves at most {} (in {}: the bytes in use outside its passes and the buffers they keep)",
            format_bytes(pool.reserved),
            pool.phase
        );
        match pool.nvidia_smi {
            Some(smi) => {
                s += &format!(
                    "; nvidia-smi would show about {} with the CUDA context\n",
                    format_bytes(smi)
                )
            }
            None => s += "\n",
        }
    }
    s
}

/// Fits or not on each card, and the smallest that fits.
fn gpu_table(est: &Estimate, gpus: &[catalog::Gpu]) -> String {
    let need = est.device_need();
    let mut s = String::from("\nGPUs (usable = memory − CUDA context)\n");
    for g in gpus {
        let verdict = if need <= g.usable() {
            format!("fits ({} to spare)", format_bytes(g.usable() - need))
        } else {
            format!(
                "does not fit (short by {})",
                format_bytes(need - g.usable())
            )
        };
        s += &format!(
            "  {:<18} {:>10} usable  {verdict}\n",
            g.name,
            format_bytes(g.usable())
        );
    }
    match catalog::smallest_fitting(need, 0.0) {
        Some(g) => s += &format!("Smallest GPU that fits: {}\n", g.name),
        None => s += "No single GPU in the catalogue fits.\n",
    }
    s
}
