//! Peaks that nest.
//!
//! A peak counter has one window: resetting it for an inner measurement
//! destroys the outer one (PyTorch's `reset_peak_memory_stats`, pytorch#16266).
//! [`PeakStack`] keeps one software floor per open scope: opening a scope
//! saves the enclosing window's running peak and restarts the counter;
//! closing it reports the inner peak and folds it back into the saved floor.
//! The whole-run peak is the maximum over every saved floor and the live
//! window, so no scope can lower it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::memory::{alloc, process};

/// A counter with a single restartable peak window.
pub trait PeakSource: Send + Sync {
    /// Highest value since the last [`PeakSource::reset`].
    fn peak(&self) -> Option<u64>;
    /// Starts a new window at the current value.
    fn reset(&self);
    /// Feeds a reading taken elsewhere (sampler, stage); sources with
    /// exact peaks ignore it.
    fn observe(&self, _value: Option<u64>) {}
}

/// The counting allocator's exact heap peak.
pub struct HeapPeak;

impl PeakSource for HeapPeak {
    fn peak(&self) -> Option<u64> {
        alloc::heap_peak_since_reset()
    }
    fn reset(&self) {
        alloc::reset_heap_peak();
    }
}

/// A peak tracked from readings, for allocators that keep none (cubecl).
#[derive(Default)]
pub struct TrackedPeak {
    value: AtomicU64,
    seen: AtomicBool,
    current: AtomicU64,
}

impl PeakSource for TrackedPeak {
    fn peak(&self) -> Option<u64> {
        self.seen
            .load(Ordering::Relaxed)
            .then(|| self.value.load(Ordering::Relaxed))
    }
    fn reset(&self) {
        self.value
            .store(self.current.load(Ordering::Relaxed), Ordering::Relaxed);
    }
    fn observe(&self, value: Option<u64>) {
        if let Some(v) = value {
            self.current.store(v, Ordering::Relaxed);
            self.value.fetch_max(v, Ordering::Relaxed);
            self.seen.store(true, Ordering::Relaxed);
        }
    }
}

/// Resident-set peak from the kernel's `VmHWM`, restarted through
/// `/proc/self/clear_refs`. Where the kernel refuses a restart, it falls back
/// to the peak of observed readings for the window.
#[derive(Default)]
pub struct RssPeak {
    unresettable: AtomicBool,
    tracked: TrackedPeak,
}

impl PeakSource for RssPeak {
    fn peak(&self) -> Option<u64> {
        if self.unresettable.load(Ordering::Relaxed) {
            self.tracked.peak()
        } else {
            process::rss_peak_since_reset()
        }
    }
    fn reset(&self) {
        if self.unresettable.load(Ordering::Relaxed) || !process::reset_rss_peak() {
            self.unresettable.store(true, Ordering::Relaxed);
            self.tracked.observe(process::rss_now());
            self.tracked.reset();
        }
    }
    fn observe(&self, value: Option<u64>) {
        self.tracked.observe(value);
    }
}

/// Software floors over one [`PeakSource`], one per open scope.
pub struct PeakStack {
    source: Box<dyn PeakSource>,
    saved: Vec<Option<u64>>,
    floor: Option<u64>,
    /// Highest value since the last stage, gathered at every source reset
    /// ([`PeakStack::stage_window`]).
    stage: Option<u64>,
}

fn max_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

impl PeakStack {
    /// A stack whose first window starts now: a run's peaks are its own,
    /// not the process's high-water mark from before it (a dense
    /// evaluation the same process ran first, say).
    pub fn new(source: Box<dyn PeakSource>) -> Self {
        source.reset();
        Self {
            source,
            saved: Vec::new(),
            floor: None,
            stage: None,
        }
    }

    /// Closes the stage window: returns the highest value since the
    /// previous call (exact for sources with exact peaks: the kernel's
    /// VmHWM, the counting allocator), and starts the next window now. The
    /// open scopes' windows keep their running peaks.
    pub fn stage_window(&mut self) -> Option<u64> {
        let window = max_opt(self.stage, self.source.peak());
        self.floor = self.running();
        self.source.reset();
        self.stage = None;
        window
    }

    /// Running peak of the innermost open window.
    fn running(&self) -> Option<u64> {
        max_opt(self.floor, self.source.peak())
    }

    /// Opens a nested window.
    pub fn begin(&mut self) {
        self.stage = max_opt(self.stage, self.source.peak());
        let running = self.running();
        self.saved.push(running);
        self.source.reset();
        self.floor = None;
    }

    /// Closes the innermost window and returns its peak.
    pub fn end(&mut self) -> Option<u64> {
        let inner = self.running();
        let outer = self.saved.pop().flatten();
        self.floor = max_opt(outer, inner);
        inner
    }

    /// Highest value of the whole run so far, whatever scopes are open.
    pub fn run_peak(&self) -> Option<u64> {
        self.saved
            .iter()
            .fold(self.running(), |acc, s| max_opt(acc, *s))
    }

    /// Feeds a reading to sources that track peaks from readings.
    pub fn observe(&self, value: Option<u64>) {
        self.source.observe(value);
    }

    pub fn depth(&self) -> usize {
        self.saved.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nested windows over a tracked source: an inner reset must not lower
    /// the outer peak, and the run peak survives everything.
    #[test]
    fn inner_scope_does_not_clobber_outer_peak() {
        let mut stack = PeakStack::new(Box::<TrackedPeak>::default());
        stack.observe(Some(10));
        stack.begin(); // outer
        stack.observe(Some(100)); // outer spike
        stack.observe(Some(20));
        stack.begin(); // inner starts at 20
        stack.observe(Some(50));
        stack.observe(Some(30));
        assert_eq!(stack.end(), Some(50), "inner peak");
        stack.observe(Some(25));
        assert_eq!(stack.end(), Some(100), "outer peak keeps its spike");
        assert_eq!(stack.run_peak(), Some(100));
    }

    #[test]
    fn inner_peak_above_outer_propagates() {
        let mut stack = PeakStack::new(Box::<TrackedPeak>::default());
        stack.observe(Some(5));
        stack.begin();
        stack.observe(Some(7));
        stack.begin();
        stack.observe(Some(70));
        stack.observe(Some(6));
        assert_eq!(stack.run_peak(), Some(70));
        assert_eq!(stack.end(), Some(70));
        assert_eq!(stack.end(), Some(70), "outer contains the inner spike");
        assert_eq!(stack.depth(), 0);
    }

    /// Stage windows see only their own peak, and scopes keep theirs.
    #[test]
    fn stage_windows_are_their_own() {
        let mut stack = PeakStack::new(Box::<TrackedPeak>::default());
        stack.observe(Some(100));
        stack.observe(Some(10));
        assert_eq!(stack.stage_window(), Some(100));
        stack.begin();
        stack.observe(Some(40));
        stack.observe(Some(15));
        assert_eq!(stack.stage_window(), Some(40), "a spike inside a scope");
        stack.observe(Some(20));
        assert_eq!(stack.stage_window(), Some(20), "the earlier spike is gone");
        assert_eq!(stack.end(), Some(40), "the scope's own peak survives");
        assert_eq!(stack.run_peak(), Some(100));
    }

    #[test]
    fn unknown_readings_stay_unknown() {
        let mut stack = PeakStack::new(Box::<TrackedPeak>::default());
        stack.begin();
        assert_eq!(stack.end(), None);
        assert_eq!(stack.run_peak(), None);
    }
}
