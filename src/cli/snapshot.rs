//! `prunemem snapshot`: the memory status of this machine and process, once or
//! every few seconds (like `nvidia-smi -l`), as text or JSON, optionally
//! logged in prunemem's formats.

use std::path::PathBuf;

use clap::Args;
use serde_json::json;

use super::CliResult;
use super::common::job_error;
use crate::jobs::{self, snapshot::SnapshotJob};
use crate::memory::{MemorySnapshot, gpu};
use crate::units::{format_bytes, format_opt_bytes};

#[derive(Args, Debug)]
pub struct SnapshotArgs {
    /// Open this compute device and read its memory pool too: cpu, wgpu, wgpu:N, wgpu:cpu, cuda, cuda:N
    #[arg(long, default_value = "cpu", value_parser = super::common::parse_device)]
    device: crate::exec::DeviceSpec,
    /// Print JSON (one object per reading) instead of text
    #[arg(long)]
    json: bool,
    /// Repeat every SECS seconds until Ctrl-C (or --count readings)
    #[arg(long, value_name = "SECS", value_parser = positive_secs)]
    every: Option<f64>,
    /// Stop after N readings (with --every)
    #[arg(long, value_name = "N", requires = "every")]
    count: Option<u64>,
    /// Also write memory_log.csv, events.jsonl and summary.txt to DIR
    #[arg(long = "log-memory", alias = "log_memory", value_name = "DIR")]
    log_memory: Option<PathBuf>,
    /// NVML index of the GPU to read
    #[arg(long, default_value_t = 0)]
    gpu: u32,
}

fn positive_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("'{s}' is not a positive number of seconds")),
    }
}

pub fn run(args: SnapshotArgs, argv: Vec<String>) -> CliResult<i32> {
    let job = SnapshotJob {
        every: args.every,
        count: args.count,
        log_dir: args.log_memory.clone(),
        gpu: args.gpu,
        device: args.device,
        argv,
    };
    let gpu_name = gpu::read(args.gpu).and_then(|g| g.name);
    let errors = jobs::snapshot::run(&job, &mut |snap| {
        if args.json {
            println!("{}", to_json(snap, gpu_name.as_deref()));
        } else {
            print!("{}", render_text(snap, gpu_name.as_deref()));
        }
    })
    .map_err(job_error)?;
    if let Some(e) = errors.first() {
        return Err(e.clone().into());
    }
    Ok(0)
}

fn percent(part: Option<u64>, whole: Option<u64>) -> Option<f64> {
    match (part, whole) {
        (Some(p), Some(w)) if w > 0 => Some(100.0 * p as f64 / w as f64),
        _ => None,
    }
}

fn fmt_pct(p: Option<f64>) -> String {
    p.map(|v| format!("{v:.1}%"))
        .unwrap_or_else(|| "n/a".into())
}

/// The text form: what `print_gpu_memory_summary` shows, plus the process.
pub fn render_text(s: &MemorySnapshot, gpu_name: Option<&str>) -> String {
    let mut out = format!("Memory status at {}\n", s.timestamp_iso());
    match (s.gpu_used, s.gpu_total) {
        (Some(used), Some(total)) => {
            out += &format!(
                "  GPU {}: used {} of {} ({}), free {}, utilisation {}\n",
                gpu_name.unwrap_or("0"),
                format_bytes(used),
                format_bytes(total),
                fmt_pct(percent(Some(used), Some(total))),
                format_opt_bytes(s.gpu_free),
                s.gpu_util_percent
                    .map(|u| format!("{u:.0}%"))
                    .unwrap_or_else(|| "n/a".into()),
            );
        }
        _ => {
            let why = gpu::status().err().unwrap_or_else(|| "no reading".into());
            out += &format!("  GPU: n/a ({why})\n");
        }
    }
    out += &format!(
        "  Backend allocator: allocated {}, reserved {}, peak {}\n",
        format_opt_bytes(s.device_allocated),
        format_opt_bytes(s.device_reserved),
        format_opt_bytes(s.device_peak),
    );
    out += &format!(
        "  Process: RSS {} (peak {}), heap {} (peak {}), CPU {}\n",
        format_opt_bytes(s.rss),
        format_opt_bytes(s.rss_peak),
        format_opt_bytes(s.heap_allocated),
        format_opt_bytes(s.heap_peak),
        s.cpu_percent
            .map(|c| format!("{c:.1}%"))
            .unwrap_or_else(|| "n/a".into()),
    );
    out += &format!(
        "  CPU memory: used {} of {} ({})\n",
        format_opt_bytes(s.system_used),
        format_opt_bytes(s.system_total),
        fmt_pct(percent(s.system_used, s.system_total)),
    );
    out
}

/// The JSON form: the snapshot's fields (bytes as integers) plus derived
/// percentages.
pub fn to_json(s: &MemorySnapshot, gpu_name: Option<&str>) -> String {
    let mut value = serde_json::to_value(s).unwrap_or_else(|_| json!({}));
    if let Some(map) = value.as_object_mut() {
        map.insert("timestamp".into(), json!(s.timestamp_iso()));
        map.insert("gpu_name".into(), json!(gpu_name));
        map.insert(
            "gpu_used_percent".into(),
            json!(percent(s.gpu_used, s.gpu_total)),
        );
        map.insert(
            "system_used_percent".into(),
            json!(percent(s.system_used, s.system_total)),
        );
        map.insert("gpu_status".into(), json!(gpu::status().err()));
    }
    value.to_string()
}
