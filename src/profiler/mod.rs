//! The profiler: named stage snapshots, nested scopes with their own peaks,
//! and a background sampler that catches peaks between stages.
//!
//! It only reads probes and emits [`Event`]s; where the events go (files, the
//! live UI, a report) is the business of the sinks on the [`Emitter`].

pub mod peaks;
mod sampler;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::events::{Emitter, Event, Level, ScopeReport};
use crate::memory::{self, DeviceProbe, HostHeapProbe, MemorySnapshot, gpu, process};
use peaks::{HeapPeak, PeakSource, PeakStack, RssPeak, TrackedPeak};

/// How a [`Profiler`] measures.
pub struct ProfilerConfig {
    /// Background sampling rate; `None` turns the sampler off.
    pub sampler_hz: Option<f64>,
    /// NVML index of the GPU to read, `None` to skip NVML.
    pub gpu_index: Option<u32>,
    /// The compute backend's allocator.
    pub device: Box<dyn DeviceProbe>,
}

impl Default for ProfilerConfig {
    fn default() -> Self {
        Self {
            sampler_hz: Some(10.0),
            gpu_index: Some(0),
            device: Box::new(HostHeapProbe),
        }
    }
}

struct Peaks {
    heap: PeakStack,
    rss: PeakStack,
    device: PeakStack,
    /// The highest device reading since the last stage and what the pool
    /// was made of then (`memory::held`).
    device_window: Option<(u64, memory::held::Parts)>,
    /// The latest device reading and its composition: a stage window
    /// starts at it, so a window whose peak is where it started (the pool
    /// only emptied inside it) has that reading's composition.
    device_latest: Option<(u64, memory::held::Parts)>,
    /// The highest bytes the device pool reserved (what the driver sees),
    /// and the phase of the run it was reached in (`timing::Phase`).
    device_reserved: Option<u64>,
    device_reserved_phase: Option<&'static str>,
    /// NVML's GPU utilisation readings: over the run and, on a device,
    /// by the phase open at each.
    gpu_busy: crate::events::fold::GpuBusy,
    scopes: Vec<OpenScope>,
}

impl Peaks {
    /// Feeds a device reading to the device peak and to the stage window's
    /// composition.
    fn observe_device(&mut self, reading: &memory::DeviceReading) {
        self.device.observe(reading.allocated);
        if reading.reserved > self.device_reserved {
            self.device_reserved = reading.reserved;
            self.device_reserved_phase = crate::timing::current_phase().map(|p| p.name());
        }
        if let (Some(a), Some(parts)) = (reading.allocated, reading.parts) {
            self.device_latest = Some((a, parts));
            if self.device_window.is_none_or(|(w, _)| a >= w) {
                self.device_window = Some((a, parts));
            }
        }
    }
}

struct OpenScope {
    id: usize,
    label: String,
    started: Instant,
    elapsed_s: f64,
    start_heap: Option<u64>,
    start_rss: Option<u64>,
}

pub(crate) struct Inner {
    emitter: Arc<Emitter>,
    start: Instant,
    start_unix_ms: u64,
    process: process::ProcessProbe,
    device: Box<dyn DeviceProbe>,
    gpu_index: Option<u32>,
    peaks: Mutex<Peaks>,
    next_scope: AtomicUsize,
    sampler: Mutex<Option<sampler::Sampler>>,
    sampler_hz: Option<f64>,
    /// The bus counters when the run started (`exec::transfer`).
    traffic_start: crate::exec::transfer::Traffic,
}

/// Takes snapshots and emits them. Cheap to clone; clones share state.
#[derive(Clone)]
pub struct Profiler {
    inner: Arc<Inner>,
}

impl Profiler {
    /// A profiler emitting to `emitter`. The sampler starts with
    /// [`Profiler::start_sampler`].
    pub fn new(emitter: Arc<Emitter>, config: ProfilerConfig) -> Self {
        // A run starts with no cached heap mappings or free malloc pages, so
        // that its resident set and peaks are its own, not what an earlier
        // run freed.
        memory::alloc::trim();
        // The run's composition at its peak starts now, like its peaks.
        memory::tag::reset_peak(memory::alloc::heap_allocated().unwrap_or(0));
        let device_peak: Box<dyn PeakSource> = if config.device.is_host_heap() {
            Box::new(HeapPeak)
        } else {
            Box::<TrackedPeak>::default()
        };
        let inner = Arc::new(Inner {
            emitter,
            start: Instant::now(),
            start_unix_ms: memory::unix_ms_now(),
            traffic_start: crate::exec::transfer::Traffic::now(),
            process: process::ProcessProbe::current(),
            device: config.device,
            gpu_index: config.gpu_index,
            peaks: Mutex::new(Peaks {
                heap: PeakStack::new(Box::new(HeapPeak)),
                rss: PeakStack::new(Box::<RssPeak>::default()),
                device: PeakStack::new(device_peak),
                device_window: None,
                device_latest: None,
                device_reserved: None,
                device_reserved_phase: None,
                gpu_busy: Default::default(),
                scopes: Vec::new(),
            }),
            next_scope: AtomicUsize::new(0),
            sampler: Mutex::new(None),
            sampler_hz: config.sampler_hz,
        });
        Self { inner }
    }

    /// Warns once about probes that will read n/a (no NVML driver...).
    /// Called after the run's first event so the plan stays first in logs.
    pub fn warn_unavailable_probes(&self) {
        if self.inner.gpu_index.is_some()
            && let Err(reason) = gpu::status()
        {
            self.message(Level::Warn, reason);
        }
    }

    pub fn emitter(&self) -> &Arc<Emitter> {
        &self.inner.emitter
    }

    /// Name of the compute device (`cpu`, `cuda:0`).
    pub fn device_name(&self) -> String {
        self.inner.device.name()
    }

    pub fn sampler_hz(&self) -> Option<f64> {
        self.inner.sampler_hz
    }

    pub fn start_unix_ms(&self) -> u64 {
        self.inner.start_unix_ms
    }

    /// Seconds since the profiler was created.
    pub fn elapsed_s(&self) -> f64 {
        self.inner.start.elapsed().as_secs_f64()
    }

    /// Reads every probe without emitting.
    pub fn snapshot(&self, label: &str) -> MemorySnapshot {
        self.inner.read(label, true)
    }

    /// Takes a named stage snapshot and emits it.
    pub fn stage(&self, label: &str) -> MemorySnapshot {
        let mut snapshot = self.snapshot(label);
        // `snapshot` has fed its readings to the peak sources already.
        if let Ok(mut peaks) = self.inner.peaks.lock() {
            snapshot.window_rss_peak = max_opt(peaks.rss.stage_window(), snapshot.rss);
            snapshot.window_heap_peak = max_opt(peaks.heap.stage_window(), snapshot.heap_allocated);
            if !self.inner.device.is_host_heap() {
                snapshot.window_device_peak =
                    max_opt(peaks.device.stage_window(), snapshot.device_allocated);
                if let Some((_, parts)) = peaks.device_window.take() {
                    snapshot.window_device_peak_categories = memory::held::named(&parts);
                }
                peaks.device_window = peaks.device_latest;
            }
        }
        if let Some(heap) = snapshot.heap_allocated {
            let (_, parts) = memory::tag::take_window(heap);
            snapshot.window_peak_categories =
                parts.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        }
        self.inner.emitter.emit(Event::Stage {
            snapshot: snapshot.clone(),
        });
        snapshot
    }

    /// Reads the device pool now, on the computing thread, so that its peak
    /// between stages is seen (cubecl keeps no peak and its pools are per
    /// thread), and checks the run's device memory cap. A no-op on the CPU
    /// backend, whose heap peak is exact.
    pub fn device_tick(&self, at: impl FnOnce() -> String) -> Result<(), memory::DeviceOom> {
        let device = &self.inner.device;
        if device.is_host_heap() {
            return Ok(());
        }
        // The highest reading so far, in-op readings ([`Profiler::watch_device`])
        // included: a pass that went past the cap and came back under it
        // still went past it.
        // The cap is on what the pool reserves: that is what the driver
        // refuses, and what nvidia-smi shows.
        let in_use = self.inner.observe_device();
        let reserved = self.device_reserved_peak();
        match (device.cap(), in_use.max(reserved)) {
            (Some(cap), Some(held)) if held > cap => Err(memory::DeviceOom {
                device: device.name(),
                at: at(),
                in_use: held,
                cap,
            }),
            _ => Ok(()),
        }
    }

    /// Reads the device pool after every device operation on the calling
    /// thread (the computing one) until the guard drops, so that the peak
    /// inside a pass is seen, not only the pool between passes
    /// ([`crate::exec::watch`]). Nothing to do on the CPU backend, whose
    /// heap peak is exact.
    pub fn watch_device(&self) -> Option<crate::exec::watch::WatchGuard> {
        if self.inner.device.is_host_heap() {
            return None;
        }
        let inner = Arc::clone(&self.inner);
        Some(crate::exec::watch::install(move || {
            inner.observe_device();
        }))
    }

    /// Opens a scope; when the guard drops, a [`Event::ScopeEnd`] reports the
    /// peaks reached inside it. Scopes nest; they belong to one thread.
    pub fn scope(&self, label: &str) -> ScopeGuard {
        let id = self.inner.next_scope.fetch_add(1, Ordering::Relaxed);
        let elapsed_s = self.elapsed_s();
        let depth = {
            let Ok(mut peaks) = self.inner.peaks.lock() else {
                return ScopeGuard { inner: None, id };
            };
            let start_rss = process::rss_now();
            peaks.rss.observe(start_rss);
            let start_heap = memory::alloc::heap_allocated();
            peaks.heap.begin();
            peaks.rss.begin();
            peaks.device.begin();
            peaks.scopes.push(OpenScope {
                id,
                label: label.to_string(),
                started: Instant::now(),
                elapsed_s,
                start_heap,
                start_rss,
            });
            peaks.scopes.len() - 1
        };
        self.inner.emitter.emit(Event::ScopeBegin {
            label: label.to_string(),
            depth,
            elapsed_s,
        });
        ScopeGuard {
            inner: Some(self.inner.clone()),
            id,
        }
    }

    /// The highest bytes the device pool reserved so far (`None` on the CPU
    /// backend, whose heap has no such figure).
    pub fn device_reserved_peak(&self) -> Option<u64> {
        if self.inner.device.is_host_heap() {
            return None;
        }
        self.inner.peaks.lock().ok().and_then(|p| p.device_reserved)
    }

    /// The phase the device pool's reserved peak was reached in.
    pub fn device_reserved_peak_phase(&self) -> Option<&'static str> {
        self.inner
            .peaks
            .lock()
            .ok()
            .and_then(|p| p.device_reserved_phase)
    }

    /// NVML's GPU utilisation over the readings so far, and on a device
    /// by phase; `None` without a reading (no NVML).
    pub fn gpu_busy(&self) -> Option<crate::events::fold::GpuBusy> {
        let busy = self.inner.peaks.lock().ok()?.gpu_busy.clone();
        (busy.run.samples > 0).then_some(busy)
    }

    /// Whole-run peaks so far: heap, RSS, device.
    pub fn run_peaks(&self) -> (Option<u64>, Option<u64>, Option<u64>) {
        self.inner.run_peaks()
    }

    /// Starts the background sampler if configured and not running.
    pub fn start_sampler(&self) {
        let Some(hz) = self.inner.sampler_hz else {
            return;
        };
        if let Ok(mut slot) = self.inner.sampler.lock()
            && slot.is_none()
        {
            let period = crate::timing::duration(1.0 / hz.max(0.01));
            *slot = Some(sampler::Sampler::start(self.inner.clone(), period));
        }
    }

    /// Stops the sampler and waits for its thread.
    pub fn stop_sampler(&self) {
        let sampler = self.inner.sampler.lock().ok().and_then(|mut s| s.take());
        if let Some(s) = sampler {
            s.stop();
        }
    }

    /// Emits progress through `total` units of work.
    pub fn progress(&self, pass: &str, index: usize, total: usize, name: &str) {
        self.inner.emitter.emit(Event::Progress {
            index,
            total,
            name: name.to_string(),
            pass: pass.to_string(),
            elapsed_s: self.elapsed_s(),
        });
    }

    /// Emits a message for the user.
    pub fn message(&self, level: Level, text: impl Into<String>) {
        self.inner.emitter.emit(Event::Message {
            level,
            text: text.into(),
            elapsed_s: self.elapsed_s(),
        });
    }

    /// Emits the engine's accounting of what it holds at `stage`.
    pub fn components(&self, stage: &str, bytes: BTreeMap<String, u64>) {
        self.inner.emitter.emit(Event::Components {
            stage: stage.to_string(),
            elapsed_s: self.elapsed_s(),
            bytes,
        });
    }
}

impl Inner {
    /// Reads the device pool (on the computing thread), feeds the reading
    /// to the device peak, and returns the run's device peak so far.
    fn observe_device(&self) -> Option<u64> {
        let reading = self.device.read();
        match self.peaks.lock() {
            Ok(mut peaks) => {
                peaks.observe_device(&reading);
                peaks.device.run_peak()
            }
            Err(_) => reading.allocated,
        }
    }

    fn run_peaks(&self) -> (Option<u64>, Option<u64>, Option<u64>) {
        match self.peaks.lock() {
            Ok(p) => (p.heap.run_peak(), p.rss.run_peak(), p.device.run_peak()),
            Err(_) => (None, None, None),
        }
    }

    /// Reads every probe. `full` adds the slower readings (malloc statistics).
    pub(crate) fn read(&self, label: &str, full: bool) -> MemorySnapshot {
        let proc_reading = self.process.read();
        let heap = memory::alloc::heap_allocated();
        let device = if self.device.is_host_heap() {
            // The CPU backend's allocator is the heap: one reading for both.
            memory::DeviceReading {
                allocated: heap,
                reserved: if full {
                    memory::alloc::malloc_reserved()
                } else {
                    None
                },
                parts: None,
            }
        } else {
            self.device.read()
        };
        let gpu = self.gpu_index.and_then(gpu::read);
        let bus = (!self.device.is_host_heap()).then(|| self.bus());
        let (heap_peak, rss_peak, device_peak) = match self.peaks.lock() {
            Ok(mut p) => {
                p.rss.observe(proc_reading.rss);
                p.observe_device(&device);
                // Under the phase the snapshot's bus reading names, as
                // the log's fold counts it.
                p.gpu_busy.observe(
                    gpu.as_ref().and_then(|g| g.utilization_percent),
                    crate::events::fold::phase_of(bus.as_ref()),
                );
                (p.heap.run_peak(), p.rss.run_peak(), p.device.run_peak())
            }
            Err(_) => (None, None, None),
        };
        MemorySnapshot {
            label: label.to_string(),
            unix_ms: memory::unix_ms_now(),
            elapsed_s: self.start.elapsed().as_secs_f64(),
            rss: proc_reading.rss,
            rss_peak: max_opt(rss_peak, proc_reading.rss),
            heap_allocated: heap,
            heap_peak,
            device_allocated: device.allocated,
            device_reserved: device.reserved,
            device_peak: max_opt(device_peak, device.allocated),
            gpu_used: gpu.as_ref().and_then(|g| g.used),
            gpu_free: gpu.as_ref().and_then(|g| g.free),
            gpu_total: gpu.as_ref().and_then(|g| g.total),
            gpu_util_percent: gpu.as_ref().and_then(|g| g.utilization_percent),
            cpu_percent: proc_reading.cpu_percent,
            system_total: proc_reading.system_total,
            system_used: proc_reading.system_used,
            categories: heap
                .map(|h| memory::tag::breakdown(h).into_iter())
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            window_peak_categories: Default::default(),
            window_rss_peak: None,
            window_heap_peak: None,
            window_device_peak: None,
            device_categories: device
                .parts
                .as_ref()
                .map(memory::held::named)
                .unwrap_or_default(),
            window_device_peak_categories: Default::default(),
            bus,
        }
    }

    /// What crossed the bus since the profiler started, and the phase open
    /// now.
    fn bus(&self) -> memory::BusReading {
        let total = crate::exec::transfer::Traffic::now().total_since(&self.traffic_start);
        memory::BusReading {
            host_to_device_bytes: total.host_to_device_bytes,
            device_to_host_bytes: total.device_to_host_bytes,
            kernels: total.kernels,
            phase: crate::timing::current_phase().map(|p| p.name().to_string()),
            compiled: total.compiled,
        }
    }

    fn end_scope(&self, id: usize) {
        let mut reports = Vec::new();
        if let Ok(mut peaks) = self.peaks.lock() {
            let Some(pos) = peaks.scopes.iter().position(|s| s.id == id) else {
                return;
            };
            // Scopes opened after this one and still open end first.
            while peaks.scopes.len() > pos {
                let end_rss = process::rss_now();
                peaks.rss.observe(end_rss);
                let peak_heap = peaks.heap.end();
                let peak_rss = peaks.rss.end();
                let peak_device = peaks.device.end();
                let Some(scope) = peaks.scopes.pop() else {
                    break;
                };
                reports.push(ScopeReport {
                    label: scope.label,
                    depth: peaks.scopes.len(),
                    elapsed_s: scope.elapsed_s,
                    duration_s: scope.started.elapsed().as_secs_f64(),
                    peak_heap,
                    peak_rss,
                    peak_device,
                    start_heap: scope.start_heap,
                    end_heap: memory::alloc::heap_allocated(),
                    start_rss: scope.start_rss,
                    end_rss,
                });
            }
        }
        for report in reports {
            self.emitter.emit(Event::ScopeEnd { report });
        }
    }
}

fn max_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// Ends its scope when dropped.
#[must_use = "a scope ends when its guard is dropped"]
pub struct ScopeGuard {
    inner: Option<Arc<Inner>>,
    id: usize,
}

impl ScopeGuard {
    /// Ends the scope now.
    pub fn end(self) {}
}

impl Drop for ScopeGuard {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            inner.end_scope(self.id);
        }
    }
}
