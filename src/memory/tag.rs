//! Where the heap went, by category, measured where bytes are allocated.
//!
//! The engine marks what it is doing with a scoped tag ([`tag`]: loading
//! weights, collecting statistics, computing logits…). The counting
//! allocator charges every allocation of [`TRACKED`] bytes or more to the
//! tag current when it was made and remembers the block's category until it
//! is freed, so live bytes per category are exact; smaller allocations form
//! their own category ("small allocations"), derived as the rest of the
//! counted heap, so the categories always sum to the heap exactly.
//!
//! The tag is process-wide, not per thread: work the engine hands to rayon
//! or Burn's worker threads is charged to the engine's current tag without
//! any hand-off. Other threads (sampler, UI, log writers) allocate small
//! buffers, which land in "small allocations" whatever the tag.
//!
//! Block categories live in a fixed, allocation-free open-addressing table
//! (the allocator cannot allocate for itself); a block that finds no free
//! slot is charged to "untagged", on both ends, so accounting stays exact.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};

/// What a block of memory is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Category {
    Untagged = 0,
    Weights,
    Activations,
    Statistics,
    Gradients,
    Masks,
    Logits,
    Tokenizer,
    Runtime,
    Optimizer,
}

/// Every category that a tag can name, in display order.
pub const CATEGORIES: [Category; 10] = [
    Category::Weights,
    Category::Activations,
    Category::Statistics,
    Category::Gradients,
    Category::Optimizer,
    Category::Masks,
    Category::Logits,
    Category::Tokenizer,
    Category::Runtime,
    Category::Untagged,
];

/// The display colour of a category (by name), the same in every view: the
/// live UI's bar, report tables and charts.
pub fn color(name: &str) -> (u8, u8, u8) {
    match name {
        "weights" => (31, 119, 180),
        "activations" => (44, 160, 44),
        "statistics" => (148, 103, 189),
        "gradients" => (214, 39, 40),
        "masks" => (255, 127, 14),
        "logits" => (23, 190, 207),
        "tokenizer" => (227, 119, 194),
        "runtime" => (188, 189, 34),
        "optimizer" => (140, 86, 75),
        "untagged" => (127, 127, 127),
        _ => (199, 199, 199), // small allocations
    }
}

/// Display order of category names: the tags, then the small allocations.
pub fn order(name: &str) -> usize {
    CATEGORIES
        .iter()
        .position(|c| c.name() == name)
        .unwrap_or(CATEGORIES.len())
}

/// The name of the derived category of small allocations.
pub const SMALL: &str = "small allocations";

impl serde::Serialize for Category {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl Category {
    pub fn name(self) -> &'static str {
        match self {
            Category::Untagged => "untagged",
            Category::Weights => "weights",
            Category::Activations => "activations",
            Category::Statistics => "statistics",
            Category::Gradients => "gradients",
            Category::Masks => "masks",
            Category::Logits => "logits",
            Category::Tokenizer => "tokenizer",
            Category::Runtime => "runtime",
            Category::Optimizer => "optimizer",
        }
    }

    /// The category of a name as [`Category::name`] spells it.
    pub fn from_name(name: &str) -> Option<Self> {
        CATEGORIES.into_iter().find(|c| c.name() == name)
    }

    fn from_u8(v: u8) -> Self {
        CATEGORIES
            .into_iter()
            .find(|c| *c as u8 == v)
            .unwrap_or(Category::Untagged)
    }
}

/// Allocations this large or larger are charged to the current tag.
pub const TRACKED: usize = 64 << 10;

const N: usize = 10;
/// Attribution on or off (`examples/tag_overhead` measures the difference).
static ENABLED: AtomicBool = AtomicBool::new(true);
static CURRENT: AtomicU8 = AtomicU8::new(0);
static LIVE: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];
/// Per-category live bytes at the highest heap since [`reset_peak`] (the
/// run's start; profiler scopes do not reset it), and that heap.
static AT_PEAK: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];
static PEAK_TOTAL: AtomicU64 = AtomicU64::new(0);
/// The same for the current stage window (restarted by [`take_window`] at
/// every stage snapshot), so each phase's peak has its own composition.
static WINDOW_AT_PEAK: [AtomicU64; N] = [const { AtomicU64::new(0) }; N];
static WINDOW_TOTAL: AtomicU64 = AtomicU64::new(0);

const SLOTS: usize = 1 << 16;
const EMPTY: usize = 0;
const GONE: usize = usize::MAX;
static KEYS: [AtomicUsize; SLOTS] = [const { AtomicUsize::new(EMPTY) }; SLOTS];
static CATS: [AtomicU8; SLOTS] = [const { AtomicU8::new(0) }; SLOTS];

fn slot_of(ptr: usize) -> usize {
    // Fibonacci hashing of the address (low bits are alignment).
    ((ptr >> 6).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 48) % SLOTS
}

/// Turns attribution on or off, for measuring what it costs. Switch it
/// only while no block of [`TRACKED`] bytes or more is live: a block
/// allocated on one side and freed on the other is miscounted.
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Sets the current tag until the guard drops (restoring the previous one).
#[must_use = "the tag lasts as long as the guard"]
pub struct TagGuard {
    previous: u8,
}

/// Charges large allocations from now on to `category`.
pub fn tag(category: Category) -> TagGuard {
    TagGuard {
        previous: CURRENT.swap(category as u8, Ordering::Relaxed),
    }
}

impl Drop for TagGuard {
    fn drop(&mut self) {
        CURRENT.store(self.previous, Ordering::Relaxed);
    }
}

/// Runs `f` with `category` as the tag.
pub fn tagged<T>(category: Category, f: impl FnOnce() -> T) -> T {
    let _tag = tag(category);
    f()
}

/// The current tag.
pub fn current() -> Category {
    Category::from_u8(CURRENT.load(Ordering::Relaxed))
}

/// Records a new block under the current tag; called by the allocator.
#[inline]
pub(crate) fn on_alloc(ptr: *mut u8, size: usize) {
    if size >= TRACKED && ENABLED.load(Ordering::Relaxed) {
        on_alloc_as(ptr, size, CURRENT.load(Ordering::Relaxed));
    }
}

fn on_alloc_as(ptr: *mut u8, size: usize, cat: u8) {
    let key = ptr as usize;
    let start = slot_of(key);
    let mut charged = 0u8; // untagged unless a slot remembers the category
    for k in 0..SLOTS {
        let i = (start + k) % SLOTS;
        let cur = KEYS[i].load(Ordering::Relaxed);
        if (cur == EMPTY || cur == GONE)
            && KEYS[i]
                .compare_exchange(cur, key, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            CATS[i].store(cat, Ordering::Release);
            charged = cat;
            break;
        }
        if k > 4096 {
            break; // a full neighbourhood: charge it as untagged
        }
    }
    LIVE[charged as usize].fetch_add(size as u64, Ordering::Relaxed);
}

/// Forgets a block; returns the category it was charged to.
#[inline]
pub(crate) fn on_free(ptr: *mut u8, size: usize) -> Option<Category> {
    if size < TRACKED || !ENABLED.load(Ordering::Relaxed) {
        return None;
    }
    let key = ptr as usize;
    let start = slot_of(key);
    let mut charged = 0u8;
    for k in 0..=4097.min(SLOTS - 1) {
        let i = (start + k) % SLOTS;
        let cur = KEYS[i].load(Ordering::Acquire);
        if cur == key {
            charged = CATS[i].load(Ordering::Acquire);
            KEYS[i].store(GONE, Ordering::Release);
            break;
        }
        if cur == EMPTY {
            break;
        }
    }
    LIVE[charged as usize].fetch_sub(size as u64, Ordering::Relaxed);
    Some(Category::from_u8(charged))
}

/// Re-charges a reallocated block to the category of the old one.
pub(crate) fn on_realloc(old: *mut u8, old_size: usize, new: *mut u8, new_size: usize) {
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    let cat = on_free(old, old_size).unwrap_or_else(current);
    if new_size >= TRACKED {
        on_alloc_as(new, new_size, cat as u8);
    }
}

/// Called by the allocator after a block of [`TRACKED`] bytes or more made
/// the heap `total`: when that is a new high for the run or for the stage
/// window, remembers what the heap was made of.
#[inline]
pub(crate) fn on_grow(total: u64) {
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    if total > WINDOW_TOTAL.load(Ordering::Relaxed) {
        WINDOW_TOTAL.store(total, Ordering::Relaxed);
        copy_live(&WINDOW_AT_PEAK);
        if total > PEAK_TOTAL.load(Ordering::Relaxed) {
            PEAK_TOTAL.store(total, Ordering::Relaxed);
            copy_live(&AT_PEAK);
        }
    }
}

fn copy_live(into: &[AtomicU64; N]) {
    for (p, l) in into.iter().zip(&LIVE) {
        p.store(l.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

/// Starts a new peak window at `total` bytes (a run's start).
pub fn reset_peak(total: u64) {
    PEAK_TOTAL.store(total, Ordering::Relaxed);
    copy_live(&AT_PEAK);
    WINDOW_TOTAL.store(total, Ordering::Relaxed);
    copy_live(&WINDOW_AT_PEAK);
}

/// What the heap was made of at its highest since the previous call (or
/// the run's start), and that height; starts a new window at `heap` bytes.
/// Called at every stage snapshot, so each stage carries the composition of
/// the peak of the window that ended at it.
pub fn take_window(heap: u64) -> (u64, Vec<(&'static str, u64)>) {
    let total = WINDOW_TOTAL.swap(heap, Ordering::Relaxed);
    let (total, parts) = if total >= heap {
        (total, composed(&WINDOW_AT_PEAK, total))
    } else {
        (heap, composed(&LIVE, heap))
    };
    copy_live(&WINDOW_AT_PEAK);
    (total, parts)
}

/// Live bytes per category, plus the small allocations (the rest of
/// `heap`), non-zero entries only.
pub fn breakdown(heap: u64) -> Vec<(&'static str, u64)> {
    composed(&LIVE, heap)
}

/// What the heap was made of at its highest since [`reset_peak`] (as seen
/// at allocations of [`TRACKED`] bytes or more).
pub fn breakdown_at_peak() -> (u64, Vec<(&'static str, u64)>) {
    let total = PEAK_TOTAL.load(Ordering::Relaxed);
    (total, composed(&AT_PEAK, total))
}

fn composed(values: &[AtomicU64; N], heap: u64) -> Vec<(&'static str, u64)> {
    let mut out: Vec<(&'static str, u64)> = CATEGORIES
        .into_iter()
        .map(|c| (c.name(), values[c as usize].load(Ordering::Relaxed)))
        .collect();
    let tracked: u64 = out.iter().map(|(_, v)| *v).sum();
    out.push((SMALL, heap.saturating_sub(tracked)));
    out.retain(|(_, v)| *v > 0);
    out
}
