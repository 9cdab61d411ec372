"""Handing freed memory back to the operating system between the phases of an RL iteration.

An update allocates and frees hundreds of megabytes of activations whose shapes change with every
batch (prompt and response lengths vary). glibc's allocator keeps much of what is freed inside the
process, and with shapes that never repeat exactly that cache grows iteration after iteration: on
SmolLM2-135M the resting RSS of a MAGRPO run crept up ~50 MB an iteration. ``malloc_trim`` returns
the free pages; the policy calls it before each rollout (docs/agents.md has the measurement).

The opposite problem costs time: with glibc's defaults, large blocks are mapped afresh (``mmap``) and
whatever a pass frees beyond a small threshold goes back to the OS (the heap is trimmed at twice the
mmap threshold, itself at most 32 MB), so the next pass's activations (LM-head logits in chunks of up
to 24 MiB, layer inputs) are paid for again in page faults on first touch: on SmolLM2-135M a quarter of an
update's forward + backward. :func:`tune_allocator` keeps such blocks in the heap for reuse, and the
explicit :func:`release_memory` before each rollout bounds what the heap keeps.

How much memory is left to spend: :func:`free_memory_bytes` (a device's free memory: CUDA's free
memory plus what torch's caching allocator holds unused; on the CPU the kernel's ``MemAvailable``,
capped by the process's cgroup limit) and :func:`auto_activation_budget_mb`, the activation budget of a
gradient pass under ``activation_budget_mb="auto"`` (:class:`~agents.policy.MultiAgentPolicy`).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

ALLOCATOR_ENV = "LLM_ENVS_TUNE_MALLOC"
"""Set to ``0`` to leave glibc's allocator settings alone (:func:`tune_allocator` then does nothing)."""
MMAP_THRESHOLD_BYTES = 32 * 2**20
"""Allocations below this come from the heap and are reused (glibc's largest allowed value)."""
FLOAT32_MMAP_THRESHOLD_BYTES = 2**20
"""The same for a float32 base on the CPU: its activations are twice bf16's, and what glibc keeps of
them between the update's passes took `make demo` to 1.70 GB (float32, AVX2 kernels; 1.34 GB of it
live). Blocks from 1 MiB up are mapped and handed back when freed: training then peaks at 1.35 GB."""
TRIM_THRESHOLD_BYTES = 64 * 2**20
"""Free memory at the top of the heap kept for reuse before glibc trims it on its own."""
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters, from glibc's malloc.h
AUTO_BUDGET_FRACTION = 0.25
"""The share of the free memory of its device that a gradient pass's kept activations may take under
``activation_budget_mb="auto"``. The rest is headroom for what the estimate leaves out (written-out
attention scores, the backward's temporaries, the allocator's fragments), for what the run allocates
after the pass (the rollout's KV cache, evaluation) and for other processes sharing the machine, which
read the same free memory. A quarter keeps every layer of a SmolLM2-135M update (float32 passes of up
to 2048 tokens) on a machine with tens of GB free, and keeps only some layers where a model's passes
are large against its device (a 1.7B model's long passes on a 24 GB GPU)."""


@functools.lru_cache(maxsize=1)
def _libc():  # pragma: no cover - resolved once per process
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.mallopt.restype = ctypes.c_int
    except (OSError, AttributeError):  # musl and other C libraries have neither call
        return None
    return libc


def _malloc_trim():
    libc = _libc()
    return None if libc is None else libc.malloc_trim


_tuned: list[int] = []  # the mmap threshold this process set, once set


def tune_allocator(float32: bool = False) -> bool:
    """Keep large freed blocks in glibc's heap for reuse instead of unmapping them: up to
    :data:`MMAP_THRESHOLD_BYTES`, or :data:`FLOAT32_MMAP_THRESHOLD_BYTES` when ``float32`` (a float32
    base on the CPU, whose larger working set is what the heap would keep). Set once per process: the
    first policy decides, except that a later float32 base lowers the threshold (memory wins over
    reuse). :class:`~agents.policy.MultiAgentPolicy` calls it. Returns whether settings are applied
    (``False`` off glibc, or with ``LLM_ENVS_TUNE_MALLOC=0``).

    Measured on SmolLM2-135M in bfloat16 (2 threads), one agent's forward + backward over 4 x 90
    tokens: 0.77 s with glibc's defaults, 0.62 s tuned (0.59 s with a 256 MB trim threshold, but
    `make demo` then peaked at 1.77 GB instead of 1.52; with 64 MB, 1.56 GB). The same settings as the environment
    variables ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_``; the process's own settings
    from those variables are left as they are."""
    if os.environ.get(ALLOCATOR_ENV, "1") == "0":
        return False
    if any(f"MALLOC_{name}_" in os.environ for name in ("MMAP_THRESHOLD", "TRIM_THRESHOLD")):
        return False  # the user tuned glibc already
    libc = _libc()
    if libc is None:
        return False
    threshold = FLOAT32_MMAP_THRESHOLD_BYTES if float32 else MMAP_THRESHOLD_BYTES
    if _tuned and _tuned[-1] <= threshold:
        return True
    applied = bool(libc.mallopt(_M_MMAP_THRESHOLD, threshold)) and bool(
        libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
    if applied:
        _tuned.append(threshold)
    return applied


@contextlib.contextmanager
def mapped_large_blocks(threshold: int = FLOAT32_MMAP_THRESHOLD_BYTES) -> Iterator[None]:
    """Within the block, blocks from ``threshold`` bytes up are mapped and handed back to the OS when
    freed (not kept in the heap for reuse), after the free pages are returned first; on leaving, the
    process's tuned threshold again. For a phase whose working set is larger than the run's steady one
    (MARLHF's reward-model fit reads every agent's prompt and response in one row): its activations then
    do not stay in the heap, and do not raise the run's peak. Does nothing where :func:`tune_allocator`
    did not tune (off glibc, ``LLM_ENVS_TUNE_MALLOC=0``, the user's own ``MALLOC_*_`` variables)."""
    libc = _libc()
    if libc is None or not _tuned or _tuned[-1] <= threshold:
        yield
        return
    release_memory()
    libc.mallopt(_M_MMAP_THRESHOLD, threshold)
    try:
        yield
    finally:
        libc.mallopt(_M_MMAP_THRESHOLD, _tuned[-1])
        release_memory()


def release_memory() -> bool:
    """Return the C heap's free pages to the OS (glibc's ``malloc_trim(0)``); ``False`` where the C
    library has no such call (then it does nothing). Takes a few milliseconds."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def file_mapped_ranges() -> list[tuple[int, int]] | None:
    """The address ranges of this process that map a file (``/proc/self/maps``: safetensors weights
    that ``from_pretrained`` left mapped, shared libraries), or ``None`` where that is not known."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return None
    ranges = []
    for line in lines:
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[4] != "0" and fields[5].startswith("/"):
            lo, _, hi = fields[0].partition("-")
            ranges.append((int(lo, 16), int(hi, 16)))
    return ranges


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # cgroup v2 writes "max" for no limit


def _stat_field(path: Path, name: str) -> int:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return 0


def _cgroup_available_bytes() -> int | None:
    """What the process's memory cgroup still allows: its limit less its usage, the inactive page cache
    (reclaimable) counted as free; ``None`` without a limit (or off Linux). Containers see the host's
    ``/proc/meminfo``, so this is what keeps a limited container's budget inside its limit."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        rel = path.lstrip("/")
        if controllers == "":  # cgroup v2
            roots = [Path("/sys/fs/cgroup") / rel, Path("/sys/fs/cgroup")]
            files = ("memory.max", "memory.current", "memory.stat", "inactive_file")
        elif "memory" in controllers.split(","):  # cgroup v1
            roots = [Path("/sys/fs/cgroup/memory") / rel, Path("/sys/fs/cgroup/memory")]
            files = ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.stat", "total_inactive_file")
        else:
            continue
        for root in roots:  # inside a container the process's own path may not be mounted
            limit, usage = _read_int(root / files[0]), _read_int(root / files[1])
            if limit is not None and usage is not None:
                if limit >= 2**62:  # cgroup v1's "no limit"
                    return None
                return max(0, limit - usage + _stat_field(root / files[2], files[3]))
    return None


def host_available_bytes() -> int | None:
    """Bytes of host memory a process can still allocate without swapping: the kernel's
    ``MemAvailable`` (free memory plus reclaimable caches), capped by the process's cgroup limit; where
    there is no ``/proc/meminfo``, the free pages ``sysconf`` reports (cache not counted); ``None``
    where neither is known."""
    available = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError):
        available = None
    if available is None:
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    limited = _cgroup_available_bytes()
    return available if limited is None else min(available, limited)


def free_memory_bytes(device: torch.device | str) -> int | None:
    """Bytes the tensors of this process can still get on ``device``: on CUDA (and other accelerators
    with ``mem_get_info``) the device's free memory plus what torch's caching allocator holds reserved
    but unused; on the CPU :func:`host_available_bytes`; ``None`` where it is not known."""
    device = torch.device(device)
    if device.type == "cpu":
        return host_available_bytes()
    backend = getattr(torch, device.type, None)
    mem_get_info = getattr(backend, "mem_get_info", None)
    if mem_get_info is None:
        return None
    free, _ = mem_get_info(device)
    cached = 0
    if hasattr(backend, "memory_reserved") and hasattr(backend, "memory_allocated"):
        cached = backend.memory_reserved(device) - backend.memory_allocated(device)
    return int(free) + max(0, int(cached))


def check_activation_budget(value: object, name: str = "activation_budget_mb") -> float | str:
    """``value`` as an activation budget: ``"auto"`` as it is, a number of megabytes (>= 0, finite) as a
    float; anything else raises ``ValueError`` quoting it."""
    if value == "auto" and isinstance(value, str):
        return "auto"
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not 0 <= value < float("inf")):  # also rejects nan
        raise ValueError(f"{name} must be 'auto' or a number of megabytes >= 0 and finite, got {value!r}")
    return float(value)


def auto_activation_budget_mb(device: torch.device | str) -> float:
    """The activation budget (megabytes) of a gradient pass on ``device`` under
    ``activation_budget_mb="auto"``: :data:`AUTO_BUDGET_FRACTION` of :func:`free_memory_bytes`, read
    now; on the CPU shared among the processes of a data-parallel run on this host (torchrun's
    ``LOCAL_WORLD_SIZE``), which read the same free memory. 0 (every layer recomputed) where the free
    memory is not known."""
    device = torch.device(device)
    free = free_memory_bytes(device)
    if free is None:
        return 0.0
    share = 1
    if device.type == "cpu":
        raw = os.environ.get("LOCAL_WORLD_SIZE", "1")
        share = max(1, int(raw)) if raw.isdigit() else 1
    return AUTO_BUDGET_FRACTION * free / share / 2**20
