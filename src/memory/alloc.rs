//! Heap accounting through a counting global allocator.
//!
//! Burn's CPU backend keeps no memory pool, so the only exact answer to "how
//! many bytes are allocated right now" (the CPU analogue of
//! `torch.cuda.memory_allocated`) is to count them where they are allocated.
//! [`CountingAllocator`] keeps the live byte count and its high-water mark in
//! two atomics. The binary installs it with `#[global_allocator]`; a program
//! that does not install it reads `None`.
//!
//! It also decides where tensors live. Allocations of 1 MiB and more (every
//! activation or weight buffer worth talking about) get their own anonymous
//! mapping with transparent huge pages requested ([`super::mapping`]);
//! smaller ones go to the system allocator. A freed mapping goes back to the
//! OS, or to a small cache that serves the next request of its size already
//! resident; the cache stays under the heap's high-water mark and is emptied
//! by [`trim`], which the engines call at every layer and training at
//! every step. With glibc's
//! defaults, freed tensor buffers stayed resident in malloc's arenas by an
//! amount that depended on history (18-51 MiB over the live heap on the
//! estimator's calibration runs); with this policy the resident set stays
//! within a few MiB of the live heap between layers. Installing the
//! allocator also fixes glibc's mmap threshold at 1 MiB (see
//! `fix_malloc_thresholds`).

use std::alloc::{GlobalAlloc, Layout, System};

use super::{mapping, tag};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

static ALLOCATED: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);
/// The highest live heap of the process (never reset): the mapping cache
/// stays under it.
static HIGH: AtomicU64 = AtomicU64::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// A global allocator that counts live heap bytes and their peak.
///
/// ```ignore
/// #[global_allocator]
/// static GLOBAL: prunemem::memory::CountingAllocator = prunemem::memory::CountingAllocator;
/// ```
pub struct CountingAllocator;

/// Counts `bytes` more; returns the new total.
#[inline]
fn grow(bytes: u64) -> u64 {
    let now = ALLOCATED.fetch_add(bytes, Ordering::Relaxed) + bytes;
    if now > PEAK.load(Ordering::Relaxed) {
        PEAK.fetch_max(now, Ordering::Relaxed);
    }
    if now > HIGH.load(Ordering::Relaxed) {
        HIGH.fetch_max(now, Ordering::Relaxed);
    }
    now
}

/// Counts a new block and charges it to the current tag; a large block
/// that makes a new high records the composition (`tag::on_grow`).
#[inline]
fn counted(ptr: *mut u8, size: usize) {
    tag::on_alloc(ptr, size);
    let now = grow(size as u64);
    if size >= tag::TRACKED {
        tag::on_grow(now);
    }
}

#[inline]
fn shrink(bytes: u64) {
    ALLOCATED.fetch_sub(bytes, Ordering::Relaxed);
}

/// Mappings are page-aligned: a block asking for more goes to glibc.
const PAGE: usize = 4096;

#[inline]
fn is_large(size: usize, align: usize) -> bool {
    cfg!(target_os = "linux") && size >= mapping::LARGE && align <= PAGE
}

/// A large block from [`mapping::take`], given the heap's state now.
#[inline]
unsafe fn map_large(size: usize, zeroed: bool) -> *mut u8 {
    let (live, high) = (
        ALLOCATED.load(Ordering::Relaxed),
        HIGH.load(Ordering::Relaxed),
    );
    unsafe { mapping::take(size, live, high, zeroed) }
}

/// Frees a large block to [`mapping::free`] (before the counters shrink).
#[inline]
unsafe fn unmap_large(ptr: *mut u8, size: usize) {
    let live = ALLOCATED
        .load(Ordering::Relaxed)
        .saturating_sub(size as u64);
    unsafe { mapping::free(ptr, size, live, HIGH.load(Ordering::Relaxed)) }
}

#[inline]
fn mark_installed() {
    if !INSTALLED.load(Ordering::Relaxed) && !INSTALLED.swap(true, Ordering::Relaxed) {
        fix_malloc_thresholds();
    }
}

/// Requests of 1 MiB and more that glibc still serves (alignment over a
/// page; before [`mapping::LARGE`] came down to 1 MiB, every block up to
/// 4 MiB): by default glibc raises its mmap threshold each time such a chunk
/// is freed, after which they are carved from arenas that keep the freed
/// pages (SparseGPT's per-block buffers left 8-9 MiB resident over the live
/// heap). A fixed threshold keeps them in mappings returned on free.
fn fix_malloc_thresholds() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes glibc's tunables; it does not allocate
    // through this allocator.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

// SAFETY: small requests are forwarded unchanged to `System`; large ones are
// served by page-aligned anonymous mappings (alignment at most one page),
// freed with the same size class they were allocated with (`is_large` sees
// the same layout at dealloc). The counters are bookkeeping only.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = if is_large(layout.size(), layout.align()) {
            unsafe { map_large(layout.size(), false) }
        } else {
            unsafe { System.alloc(layout) }
        };
        if !ptr.is_null() {
            mark_installed();
            counted(ptr, layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let ptr = if is_large(layout.size(), layout.align()) {
            unsafe { map_large(layout.size(), true) }
        } else {
            unsafe { System.alloc_zeroed(layout) }
        };
        if !ptr.is_null() {
            mark_installed();
            counted(ptr, layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if is_large(layout.size(), layout.align()) {
            unsafe { unmap_large(ptr, layout.size()) };
        } else {
            unsafe { System.dealloc(ptr, layout) };
        }
        tag::on_free(ptr, layout.size());
        shrink(layout.size() as u64);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let align = layout.align();
        let (was_large, now_large) = (is_large(layout.size(), align), is_large(new_size, align));
        let new_ptr = match (was_large, now_large) {
            (false, false) => unsafe { System.realloc(ptr, layout, new_size) },
            (true, true) => unsafe { mapping::resize(ptr, layout.size(), new_size) },
            _ => {
                // Crossing the size classes: allocate, copy, free.
                let Ok(new_layout) = Layout::from_size_align(new_size, align) else {
                    return std::ptr::null_mut();
                };
                let fresh = if now_large {
                    unsafe { map_large(new_size, false) }
                } else {
                    unsafe { System.alloc(new_layout) }
                };
                if !fresh.is_null() {
                    unsafe {
                        std::ptr::copy_nonoverlapping(ptr, fresh, layout.size().min(new_size));
                        if was_large {
                            unmap_large(ptr, layout.size());
                        } else {
                            System.dealloc(ptr, layout);
                        }
                    }
                }
                fresh
            }
        };
        if !new_ptr.is_null() {
            tag::on_realloc(ptr, layout.size(), new_ptr, new_size);
            let old = layout.size() as u64;
            let new = new_size as u64;
            if new >= old {
                let now = grow(new - old);
                if new_size >= tag::TRACKED {
                    tag::on_grow(now);
                }
            } else {
                shrink(old - new);
            }
        }
        new_ptr
    }
}

/// True once the counting allocator has served an allocation, i.e. it is the
/// process's global allocator.
pub fn is_installed() -> bool {
    INSTALLED.load(Ordering::Relaxed)
}

/// Live heap bytes, or `None` when the counting allocator is not installed.
pub fn heap_allocated() -> Option<u64> {
    is_installed().then(|| ALLOCATED.load(Ordering::Relaxed))
}

/// Highest live heap bytes since the last [`reset_heap_peak`].
pub fn heap_peak_since_reset() -> Option<u64> {
    is_installed().then(|| PEAK.load(Ordering::Relaxed))
}

/// Starts a new peak window at the current allocation.
pub fn reset_heap_peak() {
    PEAK.store(ALLOCATED.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// Heap-held bytes: what the C allocator has taken from the OS, used and
/// free, plus the large blocks' mappings, live and cached; the CPU analogue
/// of `torch.cuda.memory_reserved`. glibc only.
pub fn malloc_reserved() -> Option<u64> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads allocator statistics.
        let info = unsafe { libc::mallinfo2() };
        Some(info.arena as u64 + info.hblkhd as u64 + mapping::mapped_bytes())
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

/// Returns free heap memory to the OS (the cached large mappings, and
/// glibc's free pages through `malloc_trim`), so that the resident set
/// follows the live heap across layers and phases instead of keeping the
/// high-water mark of every earlier one.
pub fn trim() {
    mapping::release();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free pages held by malloc.
    unsafe {
        libc::malloc_trim(0);
    }
}
