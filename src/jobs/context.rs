//! One run from start to finish: the emitter and the sinks it was given, the
//! profiler and its sampler, the first and last events, and what happens on
//! Ctrl-C.
//!
//! Jobs build a [`RunPlan`], call [`Run::start`] with the sinks their caller
//! chose (plus the log folder's files), do their work through
//! `run.profiler`, and end with [`Run::finish`]. On SIGINT or SIGTERM a
//! handler thread emits `RunFinished { Interrupted }`, waits until every sink
//! has flushed (so the logs hold every event emitted before the signal, with
//! no torn last line), and exits with status 130.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;
use thiserror::Error;

use crate::events::{Emitter, Event, EventSink, RunPlan, RunStatus, RunSummary, SinkError};
use crate::exec::{DeviceSpec, Exec};
use crate::profiler::{Profiler, ProfilerConfig};
use crate::sinks;

#[derive(Debug, Error)]
pub enum RunError {
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error("cannot install the Ctrl-C handler: {0}")]
    Signal(std::io::Error),
    #[error(transparent)]
    Exec(#[from] crate::exec::ExecError),
    /// Another run writes the log folder.
    #[error(transparent)]
    Locked(#[from] crate::model::ModelError),
}

/// How a run reports: the caller's sinks and the log folder.
pub struct RunOptions {
    /// Folder for `memory_log.csv`, `events.jsonl` and `summary.txt`.
    pub log_dir: Option<PathBuf>,
    /// The caller's sinks: the console summary, progress lines, the live
    /// UI, collectors.
    pub sinks: Vec<Box<dyn EventSink>>,
    pub profiler: ProfilerConfig,
    /// Install the SIGINT/SIGTERM handler (binaries yes, tests usually no).
    pub handle_signals: bool,
    /// Memory the run should fit in, recorded in the plan
    /// (`memory_budget`) for the live view's forecast.
    pub budget: Option<u64>,
    /// The device the run computes on (`--device`).
    pub device: DeviceSpec,
    /// Device bytes the run may hold (`--device-memory`); past it the run
    /// ends with status `oom`.
    pub device_memory: Option<u64>,
    /// Take the log folder's lock (`LOGDIR.lock`: one writer per folder).
    /// Off where the folder is inside a save's partial folder, which that
    /// save's own lock already guards.
    pub lock_logs: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            log_dir: None,
            sinks: Vec::new(),
            profiler: ProfilerConfig::default(),
            handle_signals: true,
            budget: None,
            device: DeviceSpec::Cpu,
            device_memory: None,
            lock_logs: true,
        }
    }
}

/// A device run's plan: what runs where on the device (each setting is
/// what an estimate or a view reads back), and the kernel cache, marked as
/// used and tidied ([`kernel_cache_settings`]). Returns the cache's
/// warning, if any.
fn device_settings(
    plan: &mut RunPlan,
    exec: &Exec,
    device: DeviceSpec,
    cap: Option<u64>,
) -> Option<String> {
    // SparseGPT's Hinv is factored on the device
    // (`prune::factor_device`; the estimate's `factor_on_device`).
    plan.settings.insert("factor".into(), "device".into());
    // DSnoT's SparseGPT saliency too (`prune::factor_device::Saliency`;
    // the estimate's `saliency_on_device`).
    plan.settings
        .insert("dsnot_saliency".into(), "device".into());
    plan.settings
        .insert("adapter".into(), exec.adapter().into());
    // The attention kernel the run will take (the pool's pages
    // depend on it: `estimate::device_pool`).
    let f16 = plan.settings.get("dtype").and_then(|v| v.as_str()) == Some("f16");
    let cuda = matches!(device, DeviceSpec::Cuda(_));
    plan.settings.insert(
        "attention".into(),
        crate::exec::attention::planned(cuda, f16).into(),
    );
    // The linears' weights as the reader leaves them
    // (`model::prefetch::stored_layout`: as stored on CUDA).
    let layout = match crate::model::prefetch::stored_layout() {
        true => "stored",
        false => "burn",
    };
    plan.settings.insert("weight_layout".into(), layout.into());
    // How the large copies cross the bus (`exec::copies`): Burn's,
    // or through page-locked staging (CUDA's default,
    // `exec::defaults`; PRUNEMEM_TRANSFERS names either).
    plan.settings
        .insert("transfers".into(), crate::exec::copies::name().into());
    // The head's product (`exec::matmul::times_rows`): the
    // device's measured strategy (`double_tma_mma` on CUDA with
    // TMA, else Burn's matmul) unless PRUNEMEM_HEAD_MATMUL names one.
    plan.settings.insert(
        "head_matmul".into(),
        crate::exec::matmul::head_name().into(),
    );
    // The MLP's gate (written over the gate's buffer), Wanda's
    // norms and the RMS norm run prunemem's kernels on every cube
    // device.
    for (kernel, how) in [
        ("swiglu", "in_place"),
        ("norms", "kernel"),
        ("rms_norm", "kernel"),
    ] {
        plan.settings.insert(kernel.into(), how.into());
    }
    // DSnoT's cycles: one launch a linear, unless PRUNEMEM_DSNOT=ops.
    plan.settings
        .insert("dsnot".into(), crate::exec::swap_loop::name().into());
    if let Some(cap) = cap {
        plan.settings.insert("device_memory".into(), cap.into());
    }
    kernel_cache_settings(plan)
}

/// Where this build's compiled kernels are kept between runs
/// (`kernel_cache`, `off`: compiled in every run; `transfers`' `compiled`
/// and `from_cache` say how many this run compiled and loaded), and the
/// older builds' folders this run removed (`kernel_cache_removed`:
/// `exec::kernel_cache`); where a cubecl.toml names cubecl's cache, that
/// instead, untouched. Returns why the cache could not be tidied.
fn kernel_cache_settings(plan: &mut RunPlan) -> Option<String> {
    use crate::exec::kernel_cache::Place;
    let place = crate::exec::kernel_cache_place();
    plan.settings
        .insert("kernel_cache".into(), place.setting().into());
    // cubecl's own setting is the user's to keep: nothing marked or removed.
    let Place::Build(folder) = place else {
        return None;
    };
    let prepared = crate::exec::kernel_cache::prepare(&folder);
    if !prepared.removed.is_empty() {
        let removed = serde_json::to_value(&prepared.removed).unwrap_or_default();
        plan.settings.insert("kernel_cache_removed".into(), removed);
    }
    prepared.warning
}

/// A run in progress.
pub struct Run {
    pub profiler: Profiler,
    emitter: Arc<Emitter>,
    results: BTreeMap<String, Value>,
    finished: bool,
    pub log_dir: Option<PathBuf>,
    /// Where the time went is measured from here (`timing`).
    timing: crate::timing::Totals,
    /// What crossed the bus is counted from here (`exec::transfer`).
    traffic: crate::exec::transfer::Traffic,
    /// prunemem's kernels are counted from here (`exec::tally`).
    kernels: crate::exec::tally::Tally,
    /// The backend and device the run computes with.
    pub exec: Exec,
    /// Reads the device pool after every device op on this (the computing)
    /// thread for as long as the run lives (`Profiler::watch_device`).
    _device_watch: Option<crate::exec::watch::WatchGuard>,
    /// The plan as emitted (the estimator's advice on a device OOM).
    plan: RunPlan,
    /// The log folder's lock, held for the run.
    _log_lock: Option<crate::model::lock::DestLock>,
    /// Rank 0 of a distributed run: the other ranks' logs, followed.
    ranks: Option<super::ranks::Collector>,
}

impl Run {
    /// Attaches the sinks, emits `RunStarted` and starts the sampler.
    pub fn start(mut plan: RunPlan, mut options: RunOptions) -> Result<Self, RunError> {
        // The device opens first, on this thread (the one that computes):
        // a missing driver is one line before any log is written.
        // A CUDA card's memory (NVML) caps the device pool unless
        // --device-memory says otherwise; wgpu adapters report none.
        let cap = options.device_memory.or(match options.device {
            DeviceSpec::Cuda(i) => crate::memory::gpu::read(i as u32).and_then(|g| g.total),
            _ => None,
        });
        let exec = Exec::open(options.device, cap)?;
        // A streamed embedding reads its windows' rows, not the table
        // (`model::vocab`; the estimate's `embedding_rows`).
        plan.settings.insert("embedding".into(), "rows".into());
        let cache_warning = if exec.is_device() {
            options.profiler.device = exec.probe();
            device_settings(&mut plan, &exec, options.device, cap)
        } else {
            None
        };
        // A distributed run's views and printed results are rank 0's; every
        // other rank computes silently and logs into `LOGDIR/rank-R/`
        // (`events::ranks` folds the ranks' logs).
        let (rank, world) = crate::exec::dist::world();
        if world > 1 {
            plan.settings.insert("ranks".into(), world.into());
            plan.settings.insert("rank".into(), rank.into());
            if rank != 0 {
                options.log_dir = options
                    .log_dir
                    .map(|d| d.join(crate::events::ranks::folder(rank)));
                options.sinks.clear();
            }
        }
        // One writer per log folder: a second run would interleave its
        // events into the first's and leave neither readable.
        let log_lock = match (&options.log_dir, options.lock_logs) {
            (Some(dir), true) => Some(crate::model::lock::DestLock::acquire(dir)?),
            _ => None,
        };
        let emitter = Arc::new(Emitter::new());
        if let Some(dir) = &options.log_dir {
            sinks::attach_log_dir(&emitter, dir)?;
        }
        for sink in options.sinks {
            emitter.add(sink);
        }
        let profiler = Profiler::new(emitter.clone(), options.profiler);
        plan.device = profiler.device_name();
        plan.sampler_hz = profiler.sampler_hz();
        plan.started_unix_ms = profiler.start_unix_ms();
        if plan.tool.is_empty() {
            plan.tool = format!("prunemem {}", env!("CARGO_PKG_VERSION"));
        }
        if plan.engine.is_empty() {
            plan.engine = "prunemem".into();
        }
        if let Some(b) = options.budget {
            plan.settings.insert("memory_budget".into(), b.into());
        }
        emitter.emit(Event::RunStarted { plan: plan.clone() });
        profiler.warn_unavailable_probes();
        if let Some(w) = cache_warning {
            profiler.message(crate::events::Level::Warn, w);
        }
        if options.handle_signals {
            install_signal_handler(profiler.clone()).map_err(RunError::Signal)?;
        }
        profiler.start_sampler();
        let ranks = match (&options.log_dir, rank, world) {
            (Some(dir), 0, w) if w > 1 => {
                Some(super::ranks::Collector::start(dir, w, emitter.clone()))
            }
            _ => None,
        };
        Ok(Self {
            _log_lock: log_lock,
            ranks,
            _device_watch: profiler.watch_device(),
            plan,
            profiler,
            emitter,
            results: BTreeMap::new(),
            finished: false,
            log_dir: options.log_dir,
            timing: crate::timing::Totals::now(),
            traffic: crate::exec::transfer::Traffic::now(),
            kernels: crate::exec::tally::Tally::now(),
            exec,
        })
    }

    /// The estimator's peak for this run's plan (the device pool's on a
    /// device run) with its pruned layers streamed to the evaluation: what
    /// the choice of where they wait adds to (`jobs::waiting`). `None`
    /// where the estimator cannot place the plan.
    pub fn predicted_peak(&self) -> Option<u64> {
        let (arch, mut w) = crate::estimate::against::workload_of(&self.plan).ok()?;
        w.eval_inline = false;
        crate::estimate::estimate(&arch, &w).ok().map(|e| e.peak())
    }

    /// A device run's bus traffic and kernel launches by phase
    /// (`transfers`) and the pool's reserved peak (`device_reserved_peak`).
    fn device_results(&mut self) {
        if !self.exec.is_device() {
            return;
        }
        let traffic = crate::exec::transfer::Traffic::now().since(&self.traffic);
        self.results
            .insert("transfers".into(), serde_json::json!(traffic));
        // Which of prunemem's kernels ran, and how often one handed its
        // work back to Burn's ops; the attention's beside its planned name.
        let kernels = crate::exec::tally::Tally::now().since(&self.kernels);
        let attention = kernels.get("attention").copied().unwrap_or_default();
        self.results.insert(
            "attention".into(),
            serde_json::json!({
                "kernel": self.plan.settings.get("attention"),
                "fused": attention.ran,
                "fell_back": attention.fell_back,
            }),
        );
        self.results
            .insert("device_kernels".into(), serde_json::json!(kernels));
        if let Some(r) = self.profiler.device_reserved_peak() {
            self.results.insert("device_reserved_peak".into(), r.into());
        }
        if let Some(p) = self.profiler.device_reserved_peak_phase() {
            self.results
                .insert("device_reserved_peak_phase".into(), p.into());
        }
        // What nvidia-smi's utilisation said over the run (the sampler's
        // readings), for "why is my GPU idle?".
        if let Some(busy) = self.profiler.gpu_busy() {
            self.results.insert("gpu_util".into(), gpu_util_json(&busy));
        }
    }

    pub fn emitter(&self) -> &Arc<Emitter> {
        &self.emitter
    }

    /// Records a result for the summary (perplexity, sparsity...).
    pub fn result(&mut self, key: &str, value: impl Into<Value>) {
        self.results.insert(key.to_string(), value.into());
    }

    /// Ends the run as failed by `error`: the error as a message for the
    /// user, then `RunFinished { Failed }` (`{ Oom }` when the device ran
    /// out of memory). Returns the error to pass on.
    ///
    /// A run that passed its device memory cap also gets the estimator's
    /// advice for that cap: the largest sizes that fit it, each with the
    /// others as the run had them (results `fits_device_memory`).
    pub fn fail(mut self, error: super::JobError) -> super::JobError {
        self.profiler
            .message(crate::events::Level::Error, error.to_string());
        let fit = error.device_oom().and_then(|oom| {
            let (arch, w) = crate::estimate::against::workload_of(&self.plan).ok()?;
            crate::estimate::fit::limits(&arch, &w, oom.cap).ok()
        });
        let status = match error.is_out_of_memory() {
            true => RunStatus::Oom(error.to_string()),
            false => RunStatus::Failed(error.to_string()),
        };
        if let Some(f) = &fit {
            self.result("fits_device_memory", serde_json::json!(f));
        }
        self.finish(status);
        match fit {
            Some(fit) => super::JobError::OutOfMemory {
                error: Box::new(error),
                fit,
            },
            None => error,
        }
    }

    /// Stops the sampler, emits `RunFinished` and flushes every sink.
    /// Returns the summary and the sink failures seen during the run.
    pub fn finish(mut self, status: RunStatus) -> (RunSummary, Vec<String>) {
        self.finished = true;
        self.profiler.stop_sampler();
        if let Some(c) = self.ranks.take() {
            c.stop();
        }
        self.device_results();
        let summary = summary_of(
            &self.profiler,
            status,
            std::mem::take(&mut self.results),
            &self.timing,
        );
        self.emitter.emit(Event::RunFinished {
            summary: summary.clone(),
        });
        self.emitter.flush();
        (summary, self.emitter.take_errors())
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        if !self.finished {
            self.profiler.stop_sampler();
            if let Some(c) = self.ranks.take() {
                c.stop();
            }
            self.device_results();
            let summary = summary_of(
                &self.profiler,
                RunStatus::Failed("the run ended without finishing".into()),
                std::mem::take(&mut self.results),
                &self.timing,
            );
            self.emitter.emit(Event::RunFinished { summary });
            self.emitter.flush();
        }
    }
}

fn summary_of(
    profiler: &Profiler,
    status: RunStatus,
    mut results: BTreeMap<String, Value>,
    timing: &crate::timing::Totals,
) -> RunSummary {
    // Where the time went, by phase and by kind of work (`timing`).
    let (work, phase) = crate::timing::Totals::now().since(timing);
    let seconds = |v: Vec<(&str, f64)>| -> Value {
        Value::Object(
            v.into_iter()
                .map(|(k, s)| (k.to_string(), s.into()))
                .collect(),
        )
    };
    if !work.is_empty() {
        results.insert("seconds_by_work".into(), seconds(work));
    }
    if !phase.is_empty() {
        results.insert("seconds_by_phase".into(), seconds(phase));
    }
    let (heap_peak, rss_peak, device_peak) = profiler.run_peaks();
    // What the heap was made of at its peak, by category (memory::tag).
    let (total, parts) = crate::memory::tag::breakdown_at_peak();
    if crate::memory::alloc::is_installed() && total > 0 {
        let parts: serde_json::Map<String, Value> = parts
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.into()))
            .collect();
        results.insert("heap_peak_by_category".into(), Value::Object(parts));
    }
    RunSummary {
        status,
        wall_s: profiler.elapsed_s(),
        rss_peak: rss_peak.or_else(crate::memory::process::rss_peak_since_reset),
        heap_peak,
        device_peak,
        results,
    }
}

/// Asks this process to stop as if Ctrl-C had been pressed (used by the live
/// UI, whose raw terminal mode turns Ctrl-C into a key press).
pub fn request_interrupt() {
    // SAFETY: raise only sends a signal to the calling process.
    unsafe {
        libc::raise(libc::SIGINT);
    }
}

fn install_signal_handler(profiler: Profiler) -> std::io::Result<()> {
    let start = crate::timing::Totals::now();
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])?;
    std::thread::Builder::new()
        .name("prunemem-signals".into())
        .spawn(move || {
            if signals.forever().next().is_some() {
                profiler.stop_sampler();
                crate::scratch::remove_all();
                let summary =
                    summary_of(&profiler, RunStatus::Interrupted, BTreeMap::new(), &start);
                profiler
                    .emitter()
                    .close_with(Event::RunFinished { summary });
                eprintln!("prunemem: interrupted; logs flushed");
                std::process::exit(130);
            }
        })?;
    Ok(())
}

/// `gpu_util` in a run's results: NVML's mean over the run, and by the
/// phase each reading was taken in (`{"prune": {"mean_percent",
/// "samples"}}`), so a summary says which phase left the GPU idle.
fn gpu_util_json(busy: &crate::events::fold::GpuBusy) -> Value {
    let by_phase: serde_json::Map<String, Value> = busy
        .by_phase
        .iter()
        .filter_map(|(p, m)| {
            let mean = m.percent()?;
            Some((
                p.clone(),
                serde_json::json!({"mean_percent": mean, "samples": m.samples}),
            ))
        })
        .collect();
    serde_json::json!({
        "mean_percent": busy.run.percent(),
        "samples": busy.run.samples,
        "by_phase": by_phase,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn gpu_util_carries_each_phase_with_a_reading() {
        let mut busy = crate::events::fold::GpuBusy::default();
        busy.observe(Some(10.0), Some("load_layer"));
        busy.observe(Some(70.0), Some("prune"));
        busy.observe(Some(90.0), Some("prune"));
        busy.observe(None, Some("eval"));
        let j = super::gpu_util_json(&busy);
        assert_eq!(j["mean_percent"], 170.0 / 3.0);
        assert_eq!(j["samples"], 3);
        assert_eq!(j["by_phase"]["prune"]["mean_percent"], 80.0);
        assert_eq!(j["by_phase"]["prune"]["samples"], 2);
        assert_eq!(j["by_phase"]["load_layer"]["mean_percent"], 10.0);
        assert!(j["by_phase"].get("eval").is_none(), "{j}");
    }
}
