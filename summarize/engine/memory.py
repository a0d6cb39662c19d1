"""Give freed memory back to the operating system between spans.

glibc's allocator keeps the memory of freed activations in its heaps; spans of slightly different
lengths then fragment them, and resident memory creeps up chunk after chunk (measured on the 0.8B
shape: +50 MiB per 1.5K-token chunk without a trim, +3 MiB with one). `malloc_trim` returns it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache


@cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to do
        return None


def release_free_memory() -> None:
    """Return the allocator's free pages to the OS (cheap: a few ms); a no-op where unsupported."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
