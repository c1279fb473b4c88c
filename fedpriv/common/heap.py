"""Freed heap back to the operating system: glibc's ``malloc_trim``.

A worker's round allocates and frees many small and medium blocks (client rows, generators,
per-sample gradient chunks). glibc keeps freed blocks in the process's heap, and its dynamic
mmap threshold moves multi-megabyte blocks into the heap too, so a worker's resident memory
grows to its largest round's high-water mark and stays there (measured: 187 to 330 MB of
heap after 10,000-client rounds of the logistic model, 116 MB once trimmed). Trimming after
each round costs no measurable time (under 1 ms here).
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=1)
def _libc() -> Any:
    """glibc, or ``None`` where the C library has no ``malloc_trim`` (macOS, musl)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def trim_heap() -> bool:
    """Return the process's free heap pages to the system; ``False`` where unsupported."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
