"""Give freed memory back to the operating system between spans, and say how much there is.

glibc's allocator keeps the memory of freed activations in its heaps; spans of slightly different
lengths then fragment them, and resident memory creeps up chunk after chunk. `malloc_trim`
returns it.

Two caches of CPU kernels (oneDNN's primitives, ideep's computations) keep one entry per distinct
matmul shape, up to 1024 each, so every chunk of a new length adds to them for good.
`bound_kernel_caches` holds them to a few dozen entries, after which resident memory stays flat.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from functools import cache

KERNEL_CACHE_ENTRIES = 32
KERNEL_CACHE_SETTINGS = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")  # oneDNN, ideep


@cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to do
        return None


def release_free_memory() -> None:
    """Return the allocator's free pages to the OS (cheap next to a span); a no-op where unsupported."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def available_bytes() -> int | None:
    """Memory the OS could give this process now without swapping (Linux's MemAvailable, else
    its free pages); None where neither is known."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def bound_kernel_caches() -> None:
    """Cap the CPU kernel caches (see the module docstring) unless the user has set them.

    Read once, when the first kernel is built: call this before the process's first matmul.
    """
    for setting in KERNEL_CACHE_SETTINGS:
        os.environ.setdefault(setting, str(KERNEL_CACHE_ENTRIES))
