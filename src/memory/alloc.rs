//! Heap accounting through a counting global allocator.
//!
//! Burn's CPU backend keeps no memory pool, so the only exact answer to "how
//! many bytes are allocated right now" (the CPU analogue of
//! `torch.cuda.memory_allocated`) is to count them where they are allocated.
//! [`CountingAllocator`] wraps the system allocator and keeps the live byte
//! count and its high-water mark in two atomics. The binary installs it with
//! `#[global_allocator]`; a program that does not install it reads `None`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

static ALLOCATED: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// A global allocator that counts live heap bytes and their peak.
///
/// ```ignore
/// #[global_allocator]
/// static GLOBAL: prunemem::memory::CountingAllocator = prunemem::memory::CountingAllocator;
/// ```
pub struct CountingAllocator;

#[inline]
fn grow(bytes: u64) {
    let now = ALLOCATED.fetch_add(bytes, Ordering::Relaxed) + bytes;
    if now > PEAK.load(Ordering::Relaxed) {
        PEAK.fetch_max(now, Ordering::Relaxed);
    }
}

#[inline]
fn shrink(bytes: u64) {
    ALLOCATED.fetch_sub(bytes, Ordering::Relaxed);
}

#[inline]
fn mark_installed() {
    if !INSTALLED.load(Ordering::Relaxed) {
        INSTALLED.store(true, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded unchanged to `System`; the counters are
// only bookkeeping and never influence the returned pointers.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            mark_installed();
            grow(layout.size() as u64);
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            mark_installed();
            grow(layout.size() as u64);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        shrink(layout.size() as u64);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new_ptr = unsafe { System.realloc(ptr, layout, new_size) };
        if !new_ptr.is_null() {
            let old = layout.size() as u64;
            let new = new_size as u64;
            if new >= old {
                grow(new - old);
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

/// Malloc-held bytes: what the C allocator has taken from the OS, used and
/// free, the CPU analogue of `torch.cuda.memory_reserved`. glibc only.
pub fn malloc_reserved() -> Option<u64> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 only reads allocator statistics.
        let info = unsafe { libc::mallinfo2() };
        Some(info.arena as u64 + info.hblkhd as u64)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}
