"""What one run may use (:class:`SandboxLimits`), what it asks for (:class:`SandboxJob`) and what it
reports (:class:`ExecutionResult`, one :class:`TestOutcome` per test statement)."""

from __future__ import annotations

import math
from dataclasses import dataclass

STATUSES = ("passed", "failed", "error", "timeout", "not_run")
"""Per-assertion outcomes: the assertion held / was false / raised (in the program or the test) /
hit its time limit / was never reached (time budget spent, too many timeouts, or the program failed
to load)."""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one program run. Times in seconds, sizes in bytes unless the name says otherwise."""

    timeout_s: float = 10.0
    """Wall-clock budget of the whole program: start-up, loading and every test."""
    test_timeout_s: float = 3.0
    """Wall-clock budget of one test statement (all the calls it makes into the program)."""
    cpu_time_s: int = 10
    """CPU seconds of the program's process (RLIMIT_CPU); the kernel kills it beyond."""
    memory_mb: int = 512
    """Address-space limit of the program's process (RLIMIT_AS)."""
    max_processes: int = 16
    """Processes the program may have at once (RLIMIT_NPROC, per uid)."""
    max_file_mb: int = 8
    """Largest file the program may write, its captured stdout/stderr included (RLIMIT_FSIZE)."""
    max_disk_mb: int = 16
    """Total size of the program's scratch directory (a tmpfs; fork-server path). Writing beyond it
    fails with ``OSError: [Errno 28] No space left on device``."""
    max_disk_files: int = 512
    """Files and directories the scratch directory may hold (tmpfs inodes; fork-server path)."""
    max_open_files: int = 64
    max_output_bytes: int = 16_384
    """How much of the program's stdout and stderr is kept in the result."""
    max_result_bytes: int = 1_000_000
    """Largest encoded return value accepted from one call; larger ones fail the test."""
    max_timeouts: int = 3
    """After this many timed-out tests the remaining ones are not run (as in the reference)."""
    max_restarts: int = 5
    """How often a dead or timed-out program is restarted for the next test."""

    def __post_init__(self) -> None:
        for name in ("timeout_s", "test_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not value > 0 or not math.isfinite(value):
                raise ValueError(f"SandboxLimits.{name} must be a positive finite number, got {value!r}.")
        for name in ("cpu_time_s", "memory_mb", "max_processes", "max_file_mb", "max_disk_mb", "max_disk_files",
                     "max_open_files", "max_output_bytes", "max_result_bytes", "max_timeouts"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"SandboxLimits.{name} must be a positive int, got {value!r}.")
        if not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise ValueError(f"SandboxLimits.max_restarts must be an int >= 0, got {self.max_restarts!r}.")
        if self.memory_mb < 64:
            raise ValueError(f"SandboxLimits.memory_mb must be at least 64 (Python needs it), got {self.memory_mb}.")


DEFAULT_LIMITS = SandboxLimits()


@dataclass(frozen=True)
class TestOutcome:
    """Result of one test statement."""

    source: str
    status: str
    message: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@dataclass(frozen=True)
class ExecutionResult:
    """Result of running one program against its tests."""

    outcomes: tuple[TestOutcome, ...]
    load_error: str | None = None
    """Why the program could not be loaded (exception while defining it), else None."""
    reason: str = "ok"
    """"ok", "load_error", "no_tests", "timeout" (a test or the whole budget ran out), "crashed" (the
    program's process died), "sandbox_error" (the sandbox itself failed: the message is in
    ``load_error``)."""
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0
    path: str = ""
    """"fork_server" or "process_per_program" (see the module docstring)."""
    network_isolated: bool = False
    pid_namespace: bool = False
    filesystem_hidden: bool = False
    disk_capped: bool = False
    privileges_dropped: bool = False

    @property
    def passed(self) -> int:
        return sum(o.status == "passed" for o in self.outcomes)

    @property
    def total(self) -> int:
        return len(self.outcomes)

    @property
    def fraction(self) -> float:
        """Fraction of tests passed (0.0 when there are none)."""
        return self.passed / self.total if self.outcomes else 0.0

    @property
    def all_passed(self) -> bool:
        return bool(self.outcomes) and self.passed == self.total


@dataclass(frozen=True)
class SandboxJob:
    """One program and its tests, for :func:`run_many`."""

    program: str
    tests: str
    entry_point: str
    test_globals: str = ""
    limits: SandboxLimits = DEFAULT_LIMITS
    peer: str = ""
    """An untrusted program that ``program`` drives (see :func:`run_tests`); "" for none."""
    prelude: str = ""
    """Trusted code run in the program's process before it (see :func:`run_tests`)."""
