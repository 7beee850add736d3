"""prunemem's Python door.

The ``prunemem`` command this wheel installs is the Rust binary; this package
holds only the probe, :func:`checkpoint`, for scripts that do not print the
memory-logging fork's ``Memory Checkpoint`` blocks themselves::

    from prunemem import checkpoint
    checkpoint("after_layer_3")

It prints the block ``prunemem watch -- python script.py`` reads into the
stage's allocator readings (allocated, reserved, peak, free, total) and the
process's resident memory. It is plain text: it works with no GPU (CPU
figures only, and it says so) and without prunemem watching. It never
imports torch: it uses torch only if the script has already imported it.
"""

import os
import sys

__all__ = ["checkpoint", "block"]

_GIB = 1024**3


def _rss_bytes():
    """This process's resident set, from /proc (Linux) or getrusage's peak."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):
        pass
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024
    except (ImportError, OSError):
        return None


def _total_ram_bytes():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def block(name, device=None):
    """The checkpoint's text: a header and the figures under it (lines)."""
    lines = ["=== Memory Checkpoint: %s ===" % name]
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if cuda is not None and cuda.is_available():
        dev = cuda.current_device() if device is None else device
        allocated = cuda.memory_allocated(dev)
        reserved = cuda.memory_reserved(dev)
        peak = cuda.max_memory_allocated(dev)
        total = cuda.get_device_properties(dev).total_memory
        lines += [
            "GPU Memory:",
            "  Allocated: %.2f GB" % (allocated / _GIB),
            "  Reserved: %.2f GB" % (reserved / _GIB),
            "  Peak: %.2f GB" % (peak / _GIB),
            "  Free: %.2f GB" % ((total - reserved) / _GIB),
            "  Total: %.2f GB" % (total / _GIB),
        ]
    else:
        lines.append("GPU Memory: none (no CUDA device in this process: CPU figures only)")
    rss, ram = _rss_bytes(), _total_ram_bytes()
    if rss is not None:
        percent = " (%.1f%%)" % (100.0 * rss / ram) if ram else ""
        lines.append("CPU Memory: Used: %.2f GB%s" % (rss / _GIB, percent))
    return lines


def checkpoint(name, device=None, file=None):
    """Prints the ``Memory Checkpoint`` block for stage ``name`` and flushes,
    so ``prunemem watch`` sees it at once."""
    out = sys.stdout if file is None else file
    out.write("\n".join(block(name, device)) + "\n")
    out.flush()
