"""What isolates a program on this host: the namespaces the OS grants, the unused uid of each run,
its resource limits, its scrubbed environment, and the worker script every program's process runs."""

from __future__ import annotations

import functools
import os
import queue
import subprocess
import sys
import threading
from typing import Any

from llm_envs.sandbox.limits import SandboxLimits

UNPRIVILEGED_UID_BASE = 200_000
"""Root callers run each program under its own otherwise unused uid ``base + slot`` (and the same
gid): RLIMIT_NPROC is counted per uid, so a fork bomb in one program cannot starve another, and the
program can touch nothing that belongs to the caller."""
NUM_UID_SLOTS = 64
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
_WORKER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
"""Run as a script (``python -I -S -B``), never imported there: the program's process loads no
``llm_envs``."""


# --------------------------------------------------------------------------------------------------
# Host capabilities, probed once per process.


@functools.cache
def _namespace_flags() -> tuple[int, bool]:
    """The unshare flags of the process-per-program path, and whether they include a PID namespace.
    Root gets new network, PID, mount and IPC namespaces; other users try a user namespace holding all
    but the mount namespace."""
    candidates = [CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC] if os.geteuid() == 0 else []
    candidates.append(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC)
    for flags in candidates:
        probe = (
            "import ctypes, os\n"
            f"libc = ctypes.CDLL(None, use_errno=True)\nos._exit(0 if libc.unshare({flags}) == 0 else 1)\n"
        )
        try:
            done = subprocess.run([sys.executable, "-I", "-S", "-c", probe], timeout=30, env=_scrubbed_env("/"),
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0:
            return flags, True
    return 0, False


def _path_flags(fast: bool) -> dict[str, bool]:
    if fast:
        return {"network_isolated": True, "pid_namespace": True, "filesystem_hidden": True, "disk_capped": True,
                "privileges_dropped": True}
    flags, pid_ns = _namespace_flags()
    return {"network_isolated": bool(flags & CLONE_NEWNET), "pid_namespace": pid_ns, "filesystem_hidden": False,
            "disk_capped": False, "privileges_dropped": os.geteuid() == 0}


@functools.cache
def _stdlib_dir() -> str:
    return os.path.realpath(os.path.dirname(os.__file__))


def _scrubbed_env(home: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}


_uid_slots: queue.SimpleQueue[int] | None = None
_uid_slots_lock = threading.Lock()


def _acquire_uid() -> int | None:
    """An unused uid for one run (root only); distinct per caller process and per concurrent run."""
    global _uid_slots
    if os.geteuid() != 0:
        return None
    with _uid_slots_lock:
        if _uid_slots is None:
            _uid_slots = queue.SimpleQueue()
            for slot in range(NUM_UID_SLOTS):
                _uid_slots.put(slot)
    slot = _uid_slots.get()
    return UNPRIVILEGED_UID_BASE + (os.getpid() % 100_000) * NUM_UID_SLOTS + slot


def _release_uid(uid: int | None) -> None:
    if uid is not None and _uid_slots is not None:
        _uid_slots.put((uid - UNPRIVILEGED_UID_BASE) % NUM_UID_SLOTS)


def _user_process_count() -> int:
    uid = os.getuid()
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                count += entry.stat().st_uid == uid
            except OSError:
                pass
    return count


def _rlimits(limits: SandboxLimits, uid: int | None) -> list[list[Any]]:
    nproc = limits.max_processes if uid is not None else _user_process_count() + limits.max_processes
    file_bytes = limits.max_file_mb * 2**20
    memory = limits.memory_mb * 2**20
    return [["RLIMIT_CPU", limits.cpu_time_s, limits.cpu_time_s + 1], ["RLIMIT_AS", memory, memory],
            ["RLIMIT_NPROC", nproc, nproc], ["RLIMIT_FSIZE", file_bytes, file_bytes],
            ["RLIMIT_NOFILE", limits.max_open_files, limits.max_open_files], ["RLIMIT_CORE", 0, 0]]


def _forget_after_fork() -> None:
    """In a child forked from the caller: the uid slots belong to the parent (and a lock another thread
    held at the fork would stay held here)."""
    global _uid_slots, _uid_slots_lock
    _uid_slots, _uid_slots_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
