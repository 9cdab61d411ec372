"""The public entry points: :func:`run_tests`, :func:`run_many` on the process-wide pool, and
:func:`isolation_report` (which path runs here, probed once by running a program)."""

from __future__ import annotations

import concurrent.futures
import os
import sys
import threading
from collections.abc import Sequence
from typing import Any

from llm_envs.sandbox.isolation import NUM_UID_SLOTS, _path_flags, _stdlib_dir
from llm_envs.sandbox.limits import DEFAULT_LIMITS, ExecutionResult, SandboxJob, SandboxLimits
from llm_envs.sandbox.pool import _close_idle_servers, _ForkServer
from llm_envs.sandbox.runner import _Runner
from llm_envs.sandbox.suite import _compiled, _parse_suite
from llm_envs.sandbox.worker import SCRATCH as _VIEW_SCRATCH

FORK_SERVER_ENV = "LLM_ENVS_SANDBOX_FORK_SERVER"
"""Set this environment variable to ``0`` to use the one-process-per-program path even where the
fork server works (read once, at the first run)."""


_fork_server_probe: tuple[bool, str] | None = None
_fork_server_probe_lock = threading.Lock()


def _fork_server_status() -> tuple[bool, str]:
    """Whether the fork-server path works here, and if not, why (probed once, by running a program)."""
    global _fork_server_probe
    with _fork_server_probe_lock:
        if _fork_server_probe is None:
            _fork_server_probe = _probe_fork_server()
        return _fork_server_probe


_PROBE_PROGRAM = "import os\n\ndef view():\n    return sorted(os.listdir('/')), os.getcwd(), os.getuid()\n"


def _probe_fork_server() -> tuple[bool, str]:
    if os.environ.get(FORK_SERVER_ENV, "1").strip() == "0":
        return False, f"switched off by {FORK_SERVER_ENV}=0"
    if not sys.platform.startswith("linux"):
        return False, f"needs Linux namespaces, this is {sys.platform}"
    if os.geteuid() != 0:
        return False, "needs root (to mount each program's scratch and switch it to an unused uid)"
    try:
        server = _ForkServer()
    except OSError as err:
        return False, str(err)
    expected = sorted({"dev", _VIEW_SCRATCH.strip("/"), _stdlib_dir().strip("/").split("/")[0]})
    tests = (f"def check(candidate):\n    assert (lambda view: view[:2] == ({expected!r}, {_VIEW_SCRATCH!r})"
             f" and view[2] != 0)(candidate())\n")
    runner = _Runner(SandboxJob(_PROBE_PROGRAM, tests, "view", limits=SandboxLimits(timeout_s=30.0,
                                                                                  test_timeout_s=30.0)),
                     fast=True, server=server)
    result = runner.run()  # the runner gives the server back to the idle list
    if not result.all_passed:
        _close_idle_servers()
        detail = result.load_error or "; ".join(f"{o.status}: {o.message}" for o in result.outcomes) or result.reason
        return False, f"a probe program did not run as expected in the fork server ({detail})"
    return True, ""


def isolation_report() -> dict[str, Any]:
    """Which path runs programs here and what it enforces (the limits always apply).

    ``path`` is ``"fork_server"`` or ``"process_per_program"``; the booleans say whether programs get
    no network, their own PID namespace, a hidden file system and a capped scratch disk, and run
    under a dropped uid; ``fallback_reason`` says why the fork server is not used ("" when it is).
    """
    fast, reason = _fork_server_status()
    return {"path": "fork_server" if fast else "process_per_program", **_path_flags(fast), "fallback_reason": reason}


def run_tests(
    program: str,
    tests: str,
    entry_point: str,
    *,
    test_globals: str = "",
    limits: SandboxLimits = DEFAULT_LIMITS,
    peer: str = "",
    prelude: str = "",
) -> ExecutionResult:
    """Run ``program`` (untrusted) in the sandbox and judge each test statement of ``tests`` (a
    HumanEval-style ``check(candidate)`` source) with ``candidate`` bound to its ``entry_point``.

    ``test_globals`` is trusted code run in the tests' namespace first (for example the problem's own
    helper functions that the tests call, like HumanEval's ``poly``). Never raises for anything the
    program does; raises ``ValueError`` for unusable tests or arguments.

    With ``peer`` (untrusted code), ``program`` is a *driver*: trusted-side code that still runs
    sandboxed (say, unittest tests that must drive objects) in a process holding no peer code. The
    peer runs in a second process beside it (same scratch directory and uid; the driver cannot be
    ptraced) and the driver reaches it only through ``__sandbox_relay__(name, args, kwargs)``: the
    caller forwards the call and checks that what comes back is plain data or handles to the peer's
    objects (``__sandbox_handle__`` / ``__sandbox_object__``, see ``llm_envs.sandbox.worker.serve_program``).
    A peer that dies, hangs or breaks the channel fails the test it happened in, whatever the driver
    says; both are restarted for the next test.

    ``prelude`` is trusted code run in the program's namespace before the program (a driver's harness):
    compiled once in the caller and sent as a code object, so that the same prelude is not compiled
    again for every program.
    """
    if not isinstance(program, str) or not isinstance(peer, str):
        raise TypeError(f"program and peer must be str, got {type(program).__name__}, {type(peer).__name__}.")
    if not isinstance(entry_point, str) or not entry_point.isidentifier():
        raise ValueError(f"entry_point must be a Python identifier, got {entry_point!r}.")
    if not isinstance(limits, SandboxLimits):
        raise TypeError(f"limits must be a SandboxLimits, got {type(limits).__name__}.")
    _parse_suite(tests)  # fail fast on bad tests, outside the sandbox
    if prelude:
        _compiled(prelude)  # fail fast on a bad prelude, outside the sandbox
    job = SandboxJob(program, tests, entry_point, test_globals, limits, peer, prelude)
    fast = _fork_server_status()[0]
    try:
        return _Runner(job, fast).run()
    except OSError as err:  # cannot fork, no memory, no server: the sandbox failed, not the program
        return ExecutionResult((), f"{type(err).__name__}: {err}", "sandbox_error",
                               path="fork_server" if fast else "process_per_program", **_path_flags(fast))


_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _pool_size() -> int:
    return min(os.cpu_count() or 1, NUM_UID_SLOTS)


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    """The process-wide pool (one thread per core; each thread drives one program at a time)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(max_workers=_pool_size(),
                                                          thread_name_prefix="llm-envs-sandbox")
        return _pool


def run_many(jobs: Sequence[SandboxJob]) -> list[ExecutionResult]:
    """Run many programs concurrently (as many at once as there are cores); results in the order of
    ``jobs``."""
    jobs = list(jobs)
    for i, job in enumerate(jobs):
        if not isinstance(job, SandboxJob):
            raise TypeError(f"jobs[{i}] must be a SandboxJob, got {type(job).__name__}.")
    if len(jobs) <= 1:
        return [run_tests(j.program, j.tests, j.entry_point, test_globals=j.test_globals, limits=j.limits,
                          peer=j.peer, prelude=j.prelude) for j in jobs]
    futures = [
        _executor().submit(run_tests, j.program, j.tests, j.entry_point, test_globals=j.test_globals,
                           limits=j.limits, peer=j.peer, prelude=j.prelude)
        for j in jobs
    ]
    return [f.result() for f in futures]


def _forget_after_fork() -> None:
    """In a child forked from the caller: the pool belongs to the parent (and a lock another thread held
    at the fork would stay held here)."""
    global _pool, _pool_lock, _fork_server_probe_lock
    _pool, _pool_lock, _fork_server_probe_lock = None, threading.Lock(), threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
