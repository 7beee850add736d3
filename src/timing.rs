//! Where the time went: wall seconds by phase of a run (loading a layer,
//! OWL's outlier pass, the statistics pass, pruning, the output pass,
//! writing, evaluation, and GradProbe's forward, head and backward through
//! the layers) and
//! by kind of work (matrix products, attention, norms/rope/activations,
//! statistics, selection and sorting, SparseGPT's sweep, checkpoint I/O,
//! logits, uploads to a device, and a device run's computing thread
//! waiting for its reader thread), measured where the work is done.
//!
//! Code marks what it is doing with scoped spans ([`work`], [`phase`]).
//! Work spans are exclusive per thread: opening one pauses the enclosing one
//! on the same thread, so kinds add up to the time spent inside spans and
//! nothing is counted twice. Phase spans are coarser and exclusive the same
//! way: a layer's load inside a GradProbe pass is `load_layer`'s time, not
//! the pass's, so phases add up to at most the wall time. Work handed to rayon or Burn's threads is covered by the wall time of
//! the span the engine thread holds while it waits, so kinds are wall time
//! of the engine thread, not CPU time. Totals are process-wide; a run reads
//! them at its start and at its end ([`Totals::since`]).

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::thread::LocalKey;
use std::time::{Duration, Instant};

/// A kind of work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Work {
    /// Linear layers' matrix products (and the LM head's).
    Gemm,
    Attention,
    /// Norms, rotary embedding, SwiGLU, residual adds, embedding lookups.
    Elementwise,
    /// Collecting calibration statistics (Wanda norms, SparseGPT's XᵀX,
    /// GradProbe's gradients' maxima).
    Statistics,
    /// Metrics, sorting and selecting what to prune, applying masks.
    Selection,
    /// SparseGPT's factorisation and blocked OBS sweep.
    Sweep,
    /// DSnoT's swap loop over a first mask.
    Refine,
    /// Reading and writing checkpoint tensors.
    Io,
    /// Log-softmax and losses over logits.
    Logits,
    /// Host tensors put on the device by the computing thread (cubecl copies
    /// them into its staging memory there, then the bus carries them).
    Upload,
    /// The computing thread waiting for the reader thread's next layer or
    /// the head's table: the device idles on the host.
    ReaderWait,
}

/// How many kinds of work there are.
const WORK_COUNT: usize = 11;

/// A phase of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Phase {
    Load,
    /// OWL: the dense pass measuring each layer's outlier ratio.
    Outliers,
    StatsPass,
    /// GradProbe: the embedding and every layer forward, boundaries kept.
    ProbeForward,
    /// GradProbe: the loss and the head's backward, by vocabulary blocks.
    ProbeHead,
    /// GradProbe: every layer again, last to first, under autodiff, its
    /// gradients folded at the candidates; the embeddings' gradient last.
    ProbeBackward,
    Prune,
    OutputPass,
    Write,
    Eval,
}

const WORKS: [Work; WORK_COUNT] = [
    Work::Gemm,
    Work::Attention,
    Work::Elementwise,
    Work::Statistics,
    Work::Selection,
    Work::Sweep,
    Work::Refine,
    Work::Io,
    Work::Logits,
    Work::Upload,
    Work::ReaderWait,
];
/// How many phases there are.
pub const PHASE_COUNT: usize = 10;

/// Every phase, in index order, which is the order a run goes through
/// them (GradProbe's passes before its step 6, `prune`).
pub const PHASES: [Phase; PHASE_COUNT] = [
    Phase::Load,
    Phase::Outliers,
    Phase::StatsPass,
    Phase::ProbeForward,
    Phase::ProbeHead,
    Phase::ProbeBackward,
    Phase::Prune,
    Phase::OutputPass,
    Phase::Write,
    Phase::Eval,
];

/// Where the phase named `name` comes in a run ([`PHASES`] order); any
/// other name (`other`, outside every phase) after them all.
pub fn phase_order(name: &str) -> usize {
    PHASES
        .iter()
        .position(|p| p.name() == name)
        .unwrap_or(PHASE_COUNT)
}

/// `(phase name, value)` pairs in the order a run goes through the phases
/// (a log's maps have them by name), other names last in their order.
pub fn in_run_order<'a, V>(pairs: impl IntoIterator<Item = (&'a str, V)>) -> Vec<(&'a str, V)> {
    let mut v: Vec<(&'a str, V)> = pairs.into_iter().collect();
    v.sort_by_key(|(k, _)| phase_order(k));
    v
}

impl Work {
    pub fn name(self) -> &'static str {
        match self {
            Work::Gemm => "gemm",
            Work::Attention => "attention",
            Work::Elementwise => "norms_rope_activations",
            Work::Statistics => "statistics",
            Work::Selection => "selection",
            Work::Sweep => "sparsegpt_sweep",
            Work::Refine => "dsnot_refine",
            Work::Io => "checkpoint_io",
            Work::Logits => "logits",
            Work::Upload => "upload",
            Work::ReaderWait => "waiting_for_reader",
        }
    }
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Load => "load_layer",
            Phase::Outliers => "owl_outliers",
            Phase::StatsPass => "stats_pass",
            Phase::Prune => "prune",
            Phase::OutputPass => "output_pass",
            Phase::Write => "write",
            Phase::Eval => "eval",
            Phase::ProbeForward => "probe_forward",
            Phase::ProbeHead => "probe_head",
            Phase::ProbeBackward => "probe_backward",
        }
    }
}

static WORK_NS: [AtomicU64; WORK_COUNT] = [const { AtomicU64::new(0) }; WORK_COUNT];
static PHASE_NS: [AtomicU64; PHASE_COUNT] = [const { AtomicU64::new(0) }; PHASE_COUNT];

thread_local! {
    /// Open work spans on this thread, by kind; the last one is the
    /// running one.
    static OPEN: Spans = const { RefCell::new(Vec::new()) };
    /// Open phase spans on this thread, by phase, the same way.
    static OPEN_PHASES: Spans = const { RefCell::new(Vec::new()) };
}

/// A thread's open spans: the index of each one's counter and when it last
/// started counting.
type Spans = RefCell<Vec<(usize, Instant)>>;

fn add(counter: &AtomicU64, since: Instant, now: Instant) {
    let ns = now.duration_since(since).as_nanos() as u64;
    counter.fetch_add(ns, Ordering::Relaxed);
}

/// Opens span `k` (counted in `counters[k]`) on this thread's `stack`,
/// pausing the one it opens inside: work spans and phase spans alike are
/// exclusive.
fn open_span(stack: &'static LocalKey<Spans>, counters: &[AtomicU64], k: usize) {
    let now = Instant::now();
    stack.with(|open| {
        let mut open = open.borrow_mut();
        if let Some((outer, since)) = open.last_mut() {
            add(&counters[*outer], *since, now);
            *since = now;
        }
        open.push((k, now));
    });
}

/// Closes the innermost span of `stack`, resuming the one around it.
fn close_span(stack: &'static LocalKey<Spans>, counters: &[AtomicU64]) {
    let now = Instant::now();
    stack.with(|open| {
        let mut open = open.borrow_mut();
        if let Some((k, since)) = open.pop() {
            add(&counters[k], since, now);
        }
        if let Some((_, since)) = open.last_mut() {
            *since = now;
        }
    });
}

/// Counts the time until the guard drops as `w`, pausing the enclosing work
/// span on this thread.
#[must_use = "the span lasts as long as the guard"]
pub struct WorkSpan(());

pub fn work(w: Work) -> WorkSpan {
    open_span(&OPEN, &WORK_NS, w as usize);
    WorkSpan(())
}

impl Drop for WorkSpan {
    fn drop(&mut self) {
        close_span(&OPEN, &WORK_NS);
    }
}

/// Runs `f` as work of kind `w`.
pub fn timed<T>(w: Work, f: impl FnOnce() -> T) -> T {
    let _span = work(w);
    f()
}

/// The innermost open phase (`NO_PHASE`: none), process-wide: the
/// computing thread opens phases, and what other threads count on its
/// behalf (cubecl's launch log, a prefetching reader) lands in the same
/// phase.
static CURRENT: AtomicUsize = AtomicUsize::new(NO_PHASE);
const NO_PHASE: usize = usize::MAX;

/// The innermost phase open now, if any.
pub fn current_phase() -> Option<Phase> {
    PHASES.get(CURRENT.load(Ordering::Relaxed)).copied()
}

/// Counts the time until the guard drops as phase `p`, pausing the
/// enclosing phase span on this thread (its time resumes when this one
/// ends), and charges what is counted meanwhile ([`current_phase`]) to `p`.
#[must_use = "the span lasts as long as the guard"]
pub struct PhaseSpan(usize);

pub fn phase(p: Phase) -> PhaseSpan {
    open_span(&OPEN_PHASES, &PHASE_NS, p as usize);
    PhaseSpan(CURRENT.swap(p as usize, Ordering::Relaxed))
}

impl Drop for PhaseSpan {
    fn drop(&mut self) {
        close_span(&OPEN_PHASES, &PHASE_NS);
        CURRENT.store(self.0, Ordering::Relaxed);
    }
}

/// Seconds by name, non-zero only.
pub type Seconds = Vec<(&'static str, f64)>;

/// The process's totals at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Totals {
    work: [u64; WORK_COUNT],
    phase: [u64; PHASE_COUNT],
}

impl Totals {
    pub fn now() -> Self {
        let mut t = Self::default();
        for (v, a) in t.work.iter_mut().zip(&WORK_NS) {
            *v = a.load(Ordering::Relaxed);
        }
        for (v, a) in t.phase.iter_mut().zip(&PHASE_NS) {
            *v = a.load(Ordering::Relaxed);
        }
        t
    }

    /// Seconds by kind of work and by phase since `start`, non-zero only.
    pub fn since(&self, start: &Totals) -> (Seconds, Seconds) {
        let work_names = WORKS.map(Work::name);
        let phase_names = PHASES.map(Phase::name);
        (
            deltas(&work_names, &self.work, &start.work),
            deltas(&phase_names, &self.phase, &start.phase),
        )
    }
}

/// `(name, seconds)` for each counter that moved from `start` to `now`.
fn deltas(names: &[&'static str], now: &[u64], start: &[u64]) -> Seconds {
    names
        .iter()
        .zip(now.iter().zip(start))
        .map(|(n, (a, b))| (*n, a.saturating_sub(*b) as f64 / 1e9))
        .filter(|(_, s)| *s > 0.0)
        .collect()
}

/// `secs` as a [`Duration`], never a panic: negative or NaN is zero, and
/// anything past a century (`--every 1e300`, a replay at `--speed 1e-300`)
/// is a century.
pub fn duration(secs: f64) -> Duration {
    const CENTURY: f64 = 100.0 * 365.25 * 86_400.0;
    if secs.is_nan() || secs <= 0.0 {
        return Duration::ZERO;
    }
    Duration::from_secs_f64(secs.min(CENTURY))
}
