//! Where large heap blocks live: their own anonymous mappings, and a small
//! cache of freed ones that stays below the heap's high-water mark.
//!
//! The counting allocator (`memory::alloc`, above this file) gives every block of 1 MiB and
//! more its own mapping, so that freeing it gives the pages back and the
//! resident set follows the live heap. Mapping and unmapping is not free:
//! every first touch of a fresh page is a page fault, the kernel zeroes the
//! page, charges it to the memory cgroup and puts it on its LRU lists, and
//! `munmap` undoes all of it. On the project's 2-core VM that kernel work
//! was 43% of a GradProbe run's CPU time (`perf record`, 2026-11-23), for
//! buffers of the same few shapes mapped and unmapped over and over inside
//! each layer.
//!
//! So a freed mapping is kept (up to [`SLOTS`] of them) and handed to the
//! next request of the same size class, already resident. Three rules keep
//! the resident set where it was:
//! - the cache never holds more than the heap's high-water mark leaves
//!   room for: live + cached ≤ the highest live heap seen; a request that
//!   would set a new high first unmaps cached blocks (oldest first);
//! - a cached block that no request reused within [`STALE`] large requests
//!   is unmapped;
//! - [`release`] empties the cache, and `alloc::trim` calls it: the engines
//!   trim at every layer and phase, and training at every step, so cached
//!   blocks never outlive the layer (or step) that freed them. (Keeping them across layers measured no faster,
//!   and raised a streamed magnitude run's peak RSS by 8 MiB: the cache sat
//!   full while the next layer's checkpoint pages were read.)
//!
//! Reused blocks are not zeroed unless the caller asked for zeroed memory.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Blocks at least this large get their own mapping (glibc's own mmap
/// threshold is fixed at the same size, see `alloc::fix_malloc_thresholds`).
pub const LARGE: usize = 1 << 20;
/// Mappings are sized in steps of this (a block's class).
const CLASS: usize = 64 << 10;
/// How many freed mappings the cache holds at most.
const SLOTS: usize = 128;
/// A cached block unused for this many large requests is unmapped.
const STALE: u64 = 256;

/// Bytes in large mappings: live blocks and cached ones.
static MAPPED: AtomicU64 = AtomicU64::new(0);
/// Bytes in cached (freed, still mapped) blocks.
static CACHED: AtomicU64 = AtomicU64::new(0);
/// Large requests so far (the cache's clock).
static CLOCK: AtomicU64 = AtomicU64::new(0);

#[derive(Clone, Copy)]
struct Slot {
    ptr: usize,
    len: usize,
    used: u64,
}

const EMPTY: Slot = Slot {
    ptr: 0,
    len: 0,
    used: 0,
};

/// The cached blocks behind a spin lock: the allocator cannot allocate, and
/// large requests are rare (a few thousand a second at most).
struct Cache {
    lock: AtomicBool,
    slots: UnsafeCell<[Slot; SLOTS]>,
}

// SAFETY: `slots` is only touched between `lock` and `unlock`.
unsafe impl Sync for Cache {}

static CACHE: Cache = Cache {
    lock: AtomicBool::new(false),
    slots: UnsafeCell::new([EMPTY; SLOTS]),
};

impl Cache {
    fn with<T>(&self, f: impl FnOnce(&mut [Slot; SLOTS]) -> T) -> T {
        while self
            .lock
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::hint::spin_loop();
        }
        // SAFETY: the lock is held.
        let out = f(unsafe { &mut *self.slots.get() });
        self.lock.store(false, Ordering::Release);
        out
    }
}

/// The length of the mapping that holds a block of `size` bytes.
#[inline]
pub fn mapped_len(size: usize) -> usize {
    size.div_ceil(CLASS) * CLASS
}

/// Blocks to unmap once the lock is released.
struct Evicted {
    slots: [Slot; SLOTS],
    n: usize,
}

impl Evicted {
    fn new() -> Self {
        Self {
            slots: [EMPTY; SLOTS],
            n: 0,
        }
    }

    fn push(&mut self, s: &mut Slot) {
        CACHED.fetch_sub(s.len as u64, Ordering::Relaxed);
        self.slots[self.n] = *s;
        self.n += 1;
        *s = EMPTY;
    }

    fn unmap(self) {
        for s in &self.slots[..self.n] {
            // SAFETY: each evicted slot was a mapping of `len` bytes that no
            // one else holds.
            unsafe { unmap(s.ptr as *mut u8, s.len) };
        }
    }
}

/// A block of `size` bytes: a cached mapping of its class, or a new one.
/// `live` is the heap's live bytes before it, `high` the heap's high-water
/// mark; `zeroed` asks for zeroed memory.
///
/// # Safety
/// Returns memory the caller owns until [`free`] with the same `size`.
pub unsafe fn take(size: usize, live: u64, high: u64, zeroed: bool) -> *mut u8 {
    let len = mapped_len(size);
    let now = CLOCK.fetch_add(1, Ordering::Relaxed);
    let mut evicted = Evicted::new();
    let hit = CACHE.with(|slots| {
        let mut hit = None;
        for s in slots.iter_mut().filter(|s| s.ptr != 0) {
            if hit.is_none() && s.len == len {
                hit = Some(s.ptr);
                CACHED.fetch_sub(len as u64, Ordering::Relaxed);
                *s = EMPTY;
            } else if now.saturating_sub(s.used) > STALE {
                evicted.push(s);
            }
        }
        if hit.is_none() {
            // A fresh mapping: make room so that live + cached stays under
            // the high-water mark (or the new high this request sets).
            let limit = high.max(live + len as u64);
            while live + CACHED.load(Ordering::Relaxed) + len as u64 > limit {
                let Some(oldest) = slots
                    .iter_mut()
                    .filter(|s| s.ptr != 0)
                    .min_by_key(|s| s.used)
                else {
                    break;
                };
                evicted.push(oldest);
            }
        }
        hit
    });
    evicted.unmap();
    match hit {
        Some(ptr) => {
            let ptr = ptr as *mut u8;
            if zeroed {
                // SAFETY: the block is `len ≥ size` bytes and now ours.
                unsafe { std::ptr::write_bytes(ptr, 0, size) };
            }
            ptr
        }
        // SAFETY: a fresh anonymous mapping (zeroed by the kernel).
        None => unsafe { map(len) },
    }
}

/// Frees a block from [`take`]: cached when the cache has a slot and live +
/// cached stays under `high`, unmapped otherwise. `live` is the heap's live
/// bytes once the block is freed.
///
/// # Safety
/// `ptr` came from [`take`] (or [`resize`]) with this `size`.
pub unsafe fn free(ptr: *mut u8, size: usize, live: u64, high: u64) {
    let len = mapped_len(size);
    let now = CLOCK.load(Ordering::Relaxed);
    let kept = CACHE.with(|slots| {
        if live + CACHED.load(Ordering::Relaxed) + len as u64 > high {
            return false;
        }
        let Some(s) = slots.iter_mut().find(|s| s.ptr == 0) else {
            return false;
        };
        *s = Slot {
            ptr: ptr as usize,
            len,
            used: now,
        };
        CACHED.fetch_add(len as u64, Ordering::Relaxed);
        true
    });
    if !kept {
        // SAFETY: the caller's block, `len` bytes mapped.
        unsafe { unmap(ptr, len) };
    }
}

/// Grows or shrinks a block from [`take`] (the kernel moves it if needed).
///
/// # Safety
/// `ptr` came from [`take`] with `old` bytes.
pub unsafe fn resize(ptr: *mut u8, old: usize, new: usize) -> *mut u8 {
    let (old_len, new_len) = (mapped_len(old), mapped_len(new));
    let p = remap(ptr, old_len, new_len);
    if !p.is_null() {
        MAPPED.fetch_add(new_len as u64, Ordering::Relaxed);
        MAPPED.fetch_sub(old_len as u64, Ordering::Relaxed);
    }
    p
}

/// Unmaps every cached block, so that the resident set is the live heap.
pub fn release() {
    let mut evicted = Evicted::new();
    CACHE.with(|slots| {
        for s in slots.iter_mut().filter(|s| s.ptr != 0) {
            evicted.push(s);
        }
    });
    evicted.unmap();
}

/// Bytes held in large mappings, live and cached.
pub fn mapped_bytes() -> u64 {
    MAPPED.load(Ordering::Relaxed)
}

/// Bytes held in cached (freed) mappings.
pub fn cached_bytes() -> u64 {
    CACHED.load(Ordering::Relaxed)
}

#[cfg(target_os = "linux")]
unsafe fn map(len: usize) -> *mut u8 {
    // SAFETY: an anonymous private mapping; the kernel returns zeroed pages.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return std::ptr::null_mut();
    }
    // SAFETY: advice on the mapping just created; failure only means no THP.
    unsafe {
        libc::madvise(p, len, libc::MADV_HUGEPAGE);
    }
    MAPPED.fetch_add(len as u64, Ordering::Relaxed);
    p as *mut u8
}

#[cfg(target_os = "linux")]
unsafe fn unmap(ptr: *mut u8, len: usize) {
    // SAFETY: `ptr` is a mapping of `len` bytes.
    unsafe {
        libc::munmap(ptr as *mut libc::c_void, len);
    }
    MAPPED.fetch_sub(len as u64, Ordering::Relaxed);
}

#[cfg(target_os = "linux")]
fn remap(ptr: *mut u8, old_len: usize, new_len: usize) -> *mut u8 {
    // SAFETY: `ptr` is a mapping of `old_len` bytes; the kernel moves it if
    // needed.
    let p = unsafe {
        libc::mremap(
            ptr as *mut libc::c_void,
            old_len,
            new_len,
            libc::MREMAP_MAYMOVE,
        )
    };
    if p == libc::MAP_FAILED {
        std::ptr::null_mut()
    } else {
        p as *mut u8
    }
}

#[cfg(not(target_os = "linux"))]
unsafe fn map(_len: usize) -> *mut u8 {
    std::ptr::null_mut()
}
#[cfg(not(target_os = "linux"))]
unsafe fn unmap(_ptr: *mut u8, _len: usize) {}
#[cfg(not(target_os = "linux"))]
fn remap(_ptr: *mut u8, _old: usize, _new: usize) -> *mut u8 {
    std::ptr::null_mut()
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    // One test: the cache is process-wide state.
    #[test]
    fn reuses_freed_mappings_under_the_high_water_mark() {
        let size = LARGE + 12_345;
        let len = mapped_len(size) as u64;
        // SAFETY: blocks are used within their size and freed with it.
        unsafe {
            let a = take(size, 0, 4 * len, false);
            assert!(!a.is_null());
            a.write_bytes(7, size);
            free(a, size, 0, 4 * len);
            assert_eq!(cached_bytes(), len, "a block under the mark is cached");
            // Same class: the same mapping, zeroed on request.
            let b = take(size + 1, 0, 4 * len, true);
            assert_eq!(b, a);
            assert_eq!(cached_bytes(), 0);
            assert!(
                std::slice::from_raw_parts(b, size + 1)
                    .iter()
                    .all(|v| *v == 0)
            );
            // Freed with the live heap at the mark: no room, unmapped.
            let mapped = mapped_bytes();
            free(b, size + 1, 4 * len, 4 * len);
            assert_eq!(cached_bytes(), 0);
            assert_eq!(mapped_bytes(), mapped - len);
            // A fresh request that would pass the mark evicts the cache.
            let c = take(size, 0, 2 * len, false);
            free(c, size, 0, 2 * len);
            assert_eq!(cached_bytes(), len);
            let d = take(2 * size, len, 2 * len, false);
            assert_eq!(
                cached_bytes(),
                0,
                "live + cached + new stayed under the mark"
            );
            free(d, 2 * size, 0, 0);
            // release() empties the cache.
            let e = take(size, 0, 4 * len, false);
            free(e, size, 0, 4 * len);
            assert_eq!(cached_bytes(), len);
            release();
            assert_eq!(cached_bytes(), 0);
        }
    }
}
