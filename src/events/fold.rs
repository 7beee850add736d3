//! The one fold of a run's events into what every reader shows: the stage
//! rows with the peak reached since the previous stage, the time series, the
//! latest readings and their peaks, layer progress and its ETA.
//!
//! The live UI, the console summary, the plain progress lines, reports and
//! `estimate --against` all read runs through [`RunFold`], so a peak or an
//! ETA means the same thing wherever it is shown. Events go in one at a time
//! ([`RunFold::apply`]), live or from a log; nothing here touches a terminal
//! or a file.
//!
//! Rules, once:
//! - the peak of a stage window (from the previous stage to this one) is the
//!   highest RSS of every snapshot inside it, and the kernel's high-water
//!   mark when it rose inside the window (so a peak between two samples
//!   still counts); the heap peak likewise, with the counting allocator's
//!   peak and the peaks of scopes that ended inside it; and a stage that
//!   carries the profiler's exact window peaks (`window_rss_peak`,
//!   `window_heap_peak`: the kernel's mark and the allocator's, restarted at
//!   every stage) counts them too;
//! - an ETA is the pace of the current progress sequence (from the last
//!   stage before its first unit) times the units left.

use std::collections::BTreeMap;

mod bus;
mod busy;

pub use bus::{BusNow, BusRates, compiles};
pub use busy::{GpuBusy, Mean, idlest, phase_of};

use super::{Event, RunPlan, RunSummary, stages};
use crate::memory::MemorySnapshot;

/// One reading in time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Point {
    pub t: f64,
    pub rss: Option<u64>,
    /// Live heap (the counting allocator).
    pub heap: Option<u64>,
    /// The compute backend's allocated bytes, or the heap on the CPU.
    pub allocated: Option<u64>,
    pub reserved: Option<u64>,
    pub gpu_used: Option<u64>,
}

impl Point {
    pub fn of(s: &MemorySnapshot) -> Self {
        Self {
            t: s.elapsed_s,
            rss: s.rss,
            heap: s.heap_allocated,
            allocated: s.device_allocated.or(s.heap_allocated),
            reserved: s.device_reserved,
            gpu_used: s.gpu_used,
        }
    }
}

/// One named stage and what happened since the previous one.
#[derive(Debug, Clone, PartialEq)]
pub struct StageRow {
    pub snapshot: MemorySnapshot,
    pub point: Point,
    /// Highest RSS since the previous stage.
    pub peak: Option<u64>,
    /// Highest live heap since the previous stage.
    pub heap_peak: Option<u64>,
    /// RSS change from the previous stage.
    pub delta: Option<i64>,
    /// Seconds since the previous stage.
    pub seconds: f64,
    /// NVML's mean GPU utilisation (%) over the readings since the
    /// previous stage, this one's included; `None` without a reading.
    pub gpu_busy: Option<f64>,
}

impl StageRow {
    pub fn label(&self) -> &str {
        &self.snapshot.label
    }
}

/// A reading and its highest value so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Reading {
    pub now: Option<u64>,
    pub peak: Option<u64>,
    /// What the reading is a part of (GPU total), when known.
    pub total: Option<u64>,
}

impl Reading {
    fn update(&mut self, now: Option<u64>, peak: Option<u64>) {
        if now.is_some() {
            self.now = now;
        }
        self.peak = [self.peak, now, peak].into_iter().flatten().max();
    }
}

/// Progress through a sequence of units (decoder layers, eval batches).
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    pub done: usize,
    pub total: usize,
    /// Name of the last finished unit.
    pub name: String,
    /// The pass the sequence belongs to (empty in older logs).
    pub pass: String,
    /// When the sequence began (the last stage before its first unit).
    pub origin_s: f64,
}

/// The run as its events so far describe it.
#[derive(Debug, Clone, Default)]
pub struct RunFold {
    pub plan: Option<RunPlan>,
    pub summary: Option<RunSummary>,
    pub stages: Vec<StageRow>,
    /// Every reading (stages and samples) in order; thinned when a limit is set.
    pub points: Vec<Point>,
    /// The engine's component accounting, by stage, in order.
    pub components: Vec<(String, BTreeMap<String, u64>)>,
    pub progress: Option<Progress>,
    pub elapsed_s: f64,
    pub rss: Reading,
    pub heap: Reading,
    pub reserved: Reading,
    /// Device runs: the pool's bytes in use and the profiler's peak of
    /// them (readings inside passes too); `None` readings on the CPU.
    pub device: Reading,
    pub gpu: Reading,
    /// NVML's GPU utilisation: the latest reading, the mean over the run
    /// so far, and a device run's by phase.
    pub gpu_busy: GpuBusy,
    /// Device runs: what crossed the bus and the kernels launched so far,
    /// their rates and the phase open; `None` without a bus reading.
    pub bus: Option<BusNow>,
    /// The machine's memory, when a reading said.
    pub host_total: Option<u64>,
    /// Highest RSS among background samples, and when.
    pub sampled_rss_peak: Option<(u64, f64)>,
    /// The latest heap breakdown by category (`memory::tag`).
    pub categories: BTreeMap<String, u64>,
    /// The heap's breakdown at its peak, once the run has finished.
    pub peak_categories: BTreeMap<String, u64>,
    /// The fullest breakdown any reading (stage or sample) carried so far:
    /// the at-peak view while the run goes, between stage boundaries too.
    live_peak_categories: BTreeMap<String, u64>,
    /// The breakdown over time (kept only without a point limit: reports).
    pub category_points: Vec<(f64, BTreeMap<String, u64>)>,
    /// Device runs: the latest breakdown of the device pool
    /// (`memory::held`); empty on the CPU backend.
    pub device_categories: BTreeMap<String, u64>,
    /// Device runs: the fullest pool breakdown any reading carried.
    live_device_peak_categories: BTreeMap<String, u64>,
    /// A distributed run: the other ranks' latest readings, by rank
    /// (`Event::Rank`).
    pub ranks: BTreeMap<usize, super::RankReading>,
    point_limit: Option<usize>,
    window_rss: Option<u64>,
    window_heap: Option<u64>,
    kernel_rss_peak: Option<u64>,
    heap_counter_peak: Option<u64>,
}

impl RunFold {
    pub fn new() -> Self {
        Self::default()
    }

    /// A fold that keeps at most about `limit` points, thinning the older
    /// half when it overflows (the live view's history).
    pub fn with_point_limit(limit: usize) -> Self {
        Self {
            point_limit: Some(limit.max(2)),
            ..Self::default()
        }
    }

    /// Folds a whole log.
    pub fn of(events: &[Event]) -> Self {
        let mut f = Self::new();
        for e in events {
            f.apply(e);
        }
        f
    }

    /// Takes one event.
    pub fn apply(&mut self, event: &Event) {
        match event {
            Event::RunStarted { plan } => self.plan = Some(plan.clone()),
            Event::Stage { snapshot } => self.stage(snapshot),
            Event::Sample { snapshot } => {
                if let Some(rss) = snapshot.rss
                    && self.sampled_rss_peak.is_none_or(|(p, _)| rss > p)
                {
                    self.sampled_rss_peak = Some((rss, snapshot.elapsed_s));
                }
                self.reading(snapshot);
            }
            Event::ScopeEnd { report } => {
                self.window_heap = self.window_heap.max(report.peak_heap);
            }
            Event::Components { stage, bytes, .. } => {
                self.components.push((stage.clone(), bytes.clone()))
            }
            Event::Progress {
                index,
                total,
                name,
                pass,
                elapsed_s,
            } => {
                let origin_s = match &self.progress {
                    Some(p) if p.total == *total && *index > 0 => p.origin_s,
                    // A new sequence starts at the last stage before it.
                    _ => self.stages.last().map_or(0.0, |s| s.point.t),
                };
                self.progress = Some(Progress {
                    done: index + 1,
                    total: *total,
                    name: name.clone(),
                    pass: pass.clone(),
                    origin_s,
                });
                self.elapsed_s = self.elapsed_s.max(*elapsed_s);
            }
            Event::RunFinished { summary } => {
                self.elapsed_s = self.elapsed_s.max(summary.wall_s);
                self.rss.update(None, summary.rss_peak);
                self.heap.update(None, summary.heap_peak);
                if let Some(serde_json::Value::Object(m)) =
                    summary.results.get("heap_peak_by_category")
                {
                    self.peak_categories = m
                        .iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.as_u64()?)))
                        .collect();
                }
                self.summary = Some(summary.clone());
            }
            // Each reading is the rank's latest whole (its peak included).
            Event::Rank { rank, reading } => {
                self.ranks.insert(*rank, reading.clone());
            }
            Event::ScopeBegin { .. } | Event::Message { .. } => {}
        }
    }

    fn stage(&mut self, snapshot: &MemorySnapshot) {
        self.reading(snapshot);
        let point = Point::of(snapshot);
        let prev = self.stages.last();
        let delta = match (prev.and_then(|p| p.point.rss), point.rss) {
            (Some(a), Some(b)) => Some(b as i64 - a as i64),
            _ => None,
        };
        let seconds = (point.t - prev.map_or(0.0, |p| p.point.t)).max(0.0);
        // The profiler's exact window peaks, when the log has them.
        let peak = self.window_rss.max(snapshot.window_rss_peak);
        let heap_peak = self.window_heap.max(snapshot.window_heap_peak);
        self.stages.push(StageRow {
            snapshot: snapshot.clone(),
            point,
            peak,
            heap_peak,
            delta,
            seconds,
            gpu_busy: self.gpu_busy.end_window(),
        });
        self.window_rss = point.rss;
        self.window_heap = point.heap;
    }

    /// Every snapshot, stage or sample: readings, peaks, the time series.
    fn reading(&mut self, s: &MemorySnapshot) {
        self.elapsed_s = self.elapsed_s.max(s.elapsed_s);
        // The kernel's high-water mark counts even between samples: when it
        // rose, the new high happened in the current stage window.
        let rose = s
            .rss_peak
            .filter(|k| self.kernel_rss_peak.is_some_and(|l| *k > l));
        self.kernel_rss_peak = self.kernel_rss_peak.max(s.rss_peak);
        self.window_rss = [self.window_rss, s.rss, rose].into_iter().flatten().max();
        let heap_rose = s
            .heap_peak
            .filter(|k| self.heap_counter_peak.is_some_and(|l| *k > l));
        self.heap_counter_peak = self.heap_counter_peak.max(s.heap_peak);
        self.window_heap = [self.window_heap, s.heap_allocated, heap_rose]
            .into_iter()
            .flatten()
            .max();
        if !s.categories.is_empty() {
            follow_composition(
                &s.categories,
                &mut self.categories,
                &mut self.live_peak_categories,
            );
            if self.point_limit.is_none() {
                self.category_points
                    .push((s.elapsed_s, s.categories.clone()));
            }
        }
        if !s.device_categories.is_empty() {
            follow_composition(
                &s.device_categories,
                &mut self.device_categories,
                &mut self.live_device_peak_categories,
            );
        }
        self.rss.update(s.rss, s.rss_peak);
        self.heap.update(s.heap_allocated, s.heap_peak);
        self.host_total = s.system_total.or(self.host_total);
        self.reserved.update(s.device_reserved, None);
        if self.on_device() {
            self.device.update(s.device_allocated, s.device_peak);
        }
        self.gpu.update(s.gpu_used, None);
        self.gpu_busy
            .observe(s.gpu_util_percent, phase_of(s.bus.as_ref()));
        if s.gpu_total.is_some() {
            self.gpu.total = s.gpu_total;
        }
        if let Some(b) = &s.bus {
            self.bus
                .get_or_insert_with(BusNow::default)
                .observe(s.elapsed_s, b);
        }
        self.points.push(Point::of(s));
        if let Some(limit) = self.point_limit
            && self.points.len() > limit
        {
            // Thin the older half: keep every other point.
            let half = self.points.len() / 2;
            let mut i = 0;
            self.points.retain(|_| {
                let keep = i >= half || i % 2 == 0;
                i += 1;
                keep
            });
        }
    }

    /// True when the run computes on a device (wgpu, CUDA), whose pool the
    /// device readings are; false on the CPU backend and before the plan.
    pub fn on_device(&self) -> bool {
        self.plan.as_ref().is_some_and(|p| p.device != "cpu")
    }

    /// The run with only the last row of each stage label: a run that
    /// repeats its stages (GradProbe's `--iterative` steps) seen through
    /// its last repetition. Each row keeps its own window (the readings
    /// since the row before it in the log), so a window between two kept
    /// rows is the last repetition's.
    pub fn last_of_each_stage(&self) -> RunFold {
        let mut seen = std::collections::HashSet::new();
        let mut stages: Vec<StageRow> = (self.stages.iter().rev())
            .filter(|s| seen.insert(s.label()))
            .cloned()
            .collect();
        stages.reverse();
        RunFold {
            stages,
            ..self.clone()
        }
    }

    /// Index of the stage labelled `label`.
    pub fn stage_index(&self, label: &str) -> Option<usize> {
        self.stages.iter().position(|s| s.label() == label)
    }

    /// The stage rows that are not per-layer rows (the run's outline).
    pub fn outline(&self) -> impl Iterator<Item = &StageRow> {
        self.stages.iter().filter(|s| !stages::is_layer(s.label()))
    }

    /// Where the run's plan kept compiled kernels (`off`: nowhere); `None`
    /// where the plan does not say (a CPU run, an older log).
    pub fn kernel_cache(&self) -> Option<&str> {
        self.plan.as_ref()?.settings.get("kernel_cache")?.as_str()
    }

    /// The older builds' folders the run removed from the kernel cache's
    /// root (`exec::kernel_cache`): how many, and their bytes; `None`
    /// where it removed none.
    pub fn kernel_cache_removed(&self) -> Option<(usize, u64)> {
        let settings = &self.plan.as_ref()?.settings;
        let list = settings.get("kernel_cache_removed")?.as_array()?;
        let bytes = list.iter().filter_map(|r| r["bytes"].as_u64()).sum();
        (!list.is_empty()).then_some((list.len(), bytes))
    }

    /// The stage row whose window reached the highest RSS.
    pub fn peak_stage(&self) -> Option<usize> {
        self.stages
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.peak.map(|p| (i, p)))
            .max_by_key(|(_, p)| *p)
            .map(|(i, _)| i)
    }

    /// Highest RSS from stage `from` to stage `to`, both included.
    pub fn peak_between(&self, from: &str, to: &str) -> Option<u64> {
        self.window_max(from, to, |r| r.point.rss, |r| r.peak)
    }

    /// Highest live heap from stage `from` to stage `to`, both included.
    pub fn heap_peak_between(&self, from: &str, to: &str) -> Option<u64> {
        self.window_max(from, to, |r| r.point.heap, |r| r.heap_peak)
    }

    /// Highest device bytes in use from stage `from` to stage `to`, both
    /// included (a device run's pool, readings inside passes too); `None`
    /// for runs on the CPU backend and logs without device readings.
    pub fn device_peak_between(&self, from: &str, to: &str) -> Option<u64> {
        self.window_max(
            from,
            to,
            |r| {
                r.snapshot
                    .device_allocated
                    .filter(|_| r.snapshot.window_device_peak.is_some())
            },
            |r| r.snapshot.window_device_peak,
        )
    }

    /// What the heap was made of at its highest from stage `from` to stage
    /// `to`: the composition at the highest of the stage windows' peaks
    /// (`MemorySnapshot::window_peak_categories`) and of `from`'s own
    /// reading. `None` for logs without categories.
    pub fn categories_at_peak_between(
        &self,
        from: &str,
        to: &str,
    ) -> Option<BTreeMap<String, u64>> {
        self.composition_between(from, to, |s| (&s.categories, &s.window_peak_categories))
    }

    /// What the device pool was made of at its highest from stage `from`
    /// to stage `to` (`MemorySnapshot::window_device_peak_categories`);
    /// `None` for CPU runs and logs without them.
    pub fn device_categories_at_peak_between(
        &self,
        from: &str,
        to: &str,
    ) -> Option<BTreeMap<String, u64>> {
        self.composition_between(from, to, |s| {
            (&s.device_categories, &s.window_device_peak_categories)
        })
    }

    /// The fullest composition from `from`'s own reading and the later
    /// stages' windows up to `to`; `parts` picks (reading, window).
    fn composition_between(
        &self,
        from: &str,
        to: &str,
        parts: impl Fn(&MemorySnapshot) -> (&BTreeMap<String, u64>, &BTreeMap<String, u64>),
    ) -> Option<BTreeMap<String, u64>> {
        let (a, b) = (self.stage_index(from)?, self.stage_index(to)?);
        if b < a {
            return None;
        }
        let first = std::iter::once(parts(&self.stages[a].snapshot).0);
        let windows = self.stages[a + 1..=b].iter().map(|r| parts(&r.snapshot).1);
        fullest(first.chain(windows)).cloned()
    }

    /// What the device pool was made of at its highest so far: the fullest
    /// of the stage windows' and of every reading's; `None` for CPU runs.
    pub fn device_peak_composition(&self) -> Option<&BTreeMap<String, u64>> {
        let windows = self
            .stages
            .iter()
            .map(|r| &r.snapshot.window_device_peak_categories);
        fullest(windows.chain(std::iter::once(&self.live_device_peak_categories)))
    }

    fn window_max(
        &self,
        from: &str,
        to: &str,
        at: impl Fn(&StageRow) -> Option<u64>,
        window: impl Fn(&StageRow) -> Option<u64>,
    ) -> Option<u64> {
        let (a, b) = (self.stage_index(from)?, self.stage_index(to)?);
        if b < a {
            return None;
        }
        let first = at(&self.stages[a]);
        let inside = self.stages[a + 1..=b].iter().filter_map(window).max();
        [first, inside, at(&self.stages[b])]
            .into_iter()
            .flatten()
            .max()
    }

    /// Seconds left in the current progress sequence, from its pace so far.
    pub fn eta_s(&self) -> Option<f64> {
        let p = self.progress.as_ref()?;
        if p.done == 0 || p.done >= p.total || self.summary.is_some() {
            return None;
        }
        let per = (self.elapsed_s - p.origin_s) / p.done as f64;
        Some(per * (p.total - p.done) as f64)
    }

    /// What the heap was made of at its highest so far: the run's own
    /// figure once finished, else the fullest of the stage windows' and of
    /// every reading's so far (samples included, so it follows the run
    /// between stages); `None` for logs without categories.
    pub fn heap_peak_composition(&self) -> Option<&BTreeMap<String, u64>> {
        if !self.peak_categories.is_empty() {
            return Some(&self.peak_categories);
        }
        let windows = self
            .stages
            .iter()
            .map(|r| &r.snapshot.window_peak_categories);
        fullest(windows.chain(std::iter::once(&self.live_peak_categories)))
    }

    /// The run's highest RSS: the kernel's mark when known.
    pub fn peak_rss(&self) -> Option<u64> {
        let sampled = self.points.iter().filter_map(|p| p.rss).max();
        [self.summary.as_ref().and_then(|s| s.rss_peak), sampled]
            .into_iter()
            .flatten()
            .max()
    }

    /// The run's highest allocated bytes.
    pub fn peak_allocated(&self) -> Option<u64> {
        let sampled = self.points.iter().filter_map(|p| p.allocated).max();
        [self.summary.as_ref().and_then(|s| s.heap_peak), sampled]
            .into_iter()
            .flatten()
            .max()
    }
}

/// The composition with the most bytes, empty ones left out.
/// A reading's composition becomes the latest, and the fullest so far when
/// it is.
fn follow_composition(
    reading: &BTreeMap<String, u64>,
    latest: &mut BTreeMap<String, u64>,
    fullest_so_far: &mut BTreeMap<String, u64>,
) {
    if reading.values().sum::<u64>() > fullest_so_far.values().sum::<u64>() {
        *fullest_so_far = reading.clone();
    }
    *latest = reading.clone();
}

fn fullest<'a>(
    compositions: impl Iterator<Item = &'a BTreeMap<String, u64>>,
) -> Option<&'a BTreeMap<String, u64>> {
    compositions
        .filter(|c| !c.is_empty())
        .max_by_key(|c| c.values().sum::<u64>())
}

/// `1h02m`, `3m05s`, `42s`.
pub fn format_duration(s: f64) -> String {
    let s = s.max(0.0).round() as u64;
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, (s / 60) % 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests;
