//! The snapshot job: readings of this machine's and process's memory (and
//! the GPU's), once or every few seconds, optionally logged in prunemem's
//! formats. Each reading goes to the caller as it is taken.

use std::path::PathBuf;

use super::context::{Run, RunOptions};
use super::{JobError, base_plan};
use crate::events::{RunStatus, stages};
use crate::memory::MemorySnapshot;
use crate::profiler::ProfilerConfig;

/// How many readings, how often, from which GPU.
#[derive(Debug, Clone)]
pub struct SnapshotJob {
    /// Seconds between readings; `None`: one reading.
    pub every: Option<f64>,
    /// Stop after this many readings (with `every`); `None`: until Ctrl-C.
    pub count: Option<u64>,
    pub log_dir: Option<PathBuf>,
    /// NVML index of the GPU to read.
    pub gpu: u32,
    /// The compute device whose pool the readings carry (`--device`): this
    /// process's pool on that device, opened for the snapshot.
    pub device: crate::exec::DeviceSpec,
    pub argv: Vec<String>,
}

/// Takes the readings, handing each to `on_reading`; returns the sink
/// failures seen.
pub fn run(
    job: &SnapshotJob,
    on_reading: &mut dyn FnMut(&MemorySnapshot),
) -> Result<Vec<String>, JobError> {
    let options = RunOptions {
        log_dir: job.log_dir.clone(),
        profiler: ProfilerConfig {
            sampler_hz: None,
            gpu_index: Some(job.gpu),
            ..Default::default()
        },
        device: job.device,
        ..Default::default()
    };
    let run = Run::start(base_plan("snapshot", job.argv.clone()), options)?;
    let total = if job.every.is_some() {
        job.count
    } else {
        Some(1)
    };
    let mut taken = 0u64;
    loop {
        taken += 1;
        on_reading(&run.profiler.stage(&stages::snapshot(taken as usize)));
        if total.is_some_and(|t| taken >= t) {
            break;
        }
        std::thread::sleep(crate::timing::duration(job.every.unwrap_or(1.0)));
    }
    let (_summary, errors) = run.finish(RunStatus::Ok);
    Ok(errors)
}
