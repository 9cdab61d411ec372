"""Handing freed memory back to the operating system between the phases of an RL iteration.

An update allocates and frees hundreds of megabytes of activations whose shapes change with every
batch (prompt and response lengths vary). glibc's allocator keeps much of what is freed inside the
process, and with shapes that never repeat exactly that cache grows iteration after iteration: on
SmolLM2-135M the resting RSS of a MAGRPO run crept up ~50 MB an iteration. ``malloc_trim`` returns
the free pages; the policy calls it before each rollout (docs/agents.md has the measurement).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys


@functools.lru_cache(maxsize=1)
def _malloc_trim():  # pragma: no cover - resolved once per process
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # musl and other C libraries have no malloc_trim
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_memory() -> bool:
    """Return the C heap's free pages to the OS (glibc's ``malloc_trim(0)``); ``False`` where the C
    library has no such call (then it does nothing). Takes a few milliseconds."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
