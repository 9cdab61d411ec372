"""Isolated execution of generated code, with per-assertion results the program cannot forge.

Model-written code is hostile. This module never ``exec``\\ s it in the caller's process. Each program
runs in a process of its own with resource limits, a scrubbed environment, its own PID, network,
mount and IPC namespaces and an unprivileged uid; it sees a minimal file tree (the standard library
read-only and a size-capped tmpfs scratch directory) instead of the host's files.

Two paths (``isolation_report()["path"]`` says which one runs):

* ``"fork_server"`` (root on Linux): one warm server process per pool slot has done the expensive
  set-up once (interpreter start, common imports, the network namespace and the hidden file-system
  view) and forks one short-lived child per program; the child makes its PID, mount and IPC
  namespaces, mounts its scratch, drops to the run's uid and limits, and runs the program. The
  server never runs program code; a server that dies or misbehaves is replaced.
* ``"process_per_program"`` (the fallback where the OS refuses the above): a fresh ``python -I -S``
  per program with the limits, the namespaces the OS allows and (as root) its own uid; the file
  system is not hidden and the disk is capped per file only.

See ``docs/sandbox.md`` for the threat model and the exact list of what is enforced on each path.

How a test is judged
--------------------
The tests (dataset code, trusted) run in the *caller*, in the pool thread that handles the program.
Inside them, ``candidate`` (the entry point) is a proxy: each call sends its arguments to the program's
process over a private pipe, that process calls the real function and sends back the return value
encoded as plain data (ints, floats, strings, lists, tuples, dicts, sets, ...; anything else comes
back as an opaque value that equals nothing). The assertion is evaluated by the caller on those
values. So the program controls only what its function returns, which is what is being tested: an
early ``exit(0)``, ``os._exit``, a redefined ``AssertionError``, patched builtins, an object whose
``__eq__`` always returns True, or printed "PASSED" markers cannot turn a failing assertion into a pass.

>>> from llm_envs.sandbox import run_tests
>>> program = "def add(a, b):\\n    return a + b\\n"
>>> tests = "def check(candidate):\\n    assert candidate(1, 2) == 3\\n    assert candidate(2, 2) == 5\\n"
>>> result = run_tests(program, tests, "add")
>>> result.passed, result.total, result.outcomes[1].message
(1, 2, 'expected 5, got 4')
"""

from __future__ import annotations

import ast
import atexit
import builtins
import concurrent.futures
import functools
import json
import marshal
import math
import operator
import os
import queue
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llm_envs._sandbox_worker import PEER_BROKE as _PEER_BROKE
from llm_envs._sandbox_worker import PEER_GONE as _PEER_GONE
from llm_envs._sandbox_worker import SCRATCH as _VIEW_SCRATCH
from llm_envs._sandbox_worker import decode_value as _decode_value
from llm_envs._sandbox_worker import encode as _encode

__all__ = [
    "DEFAULT_LIMITS",
    "FORK_SERVER_ENV",
    "ExecutionResult",
    "SandboxJob",
    "SandboxLimits",
    "TestOutcome",
    "isolation_report",
    "run_many",
    "run_tests",
    "split_tests",
]

STATUSES = ("passed", "failed", "error", "timeout", "not_run")
"""Per-assertion outcomes: the assertion held / was false / raised (in the program or the test) /
hit its time limit / was never reached (time budget spent, too many timeouts, or the program failed
to load)."""

UNPRIVILEGED_UID_BASE = 200_000
"""Root callers run each program under its own otherwise unused uid ``base + slot`` (and the same
gid): RLIMIT_NPROC is counted per uid, so a fork bomb in one program cannot starve another, and the
program can touch nothing that belongs to the caller."""
NUM_UID_SLOTS = 64
FORK_SERVER_ENV = "LLM_ENVS_SANDBOX_FORK_SERVER"
"""Set this environment variable to ``0`` to use the one-process-per-program path even where the
fork server works (read once, at the first run)."""
PRELOADED_MODULES = (
    "typing", "collections", "collections.abc", "itertools", "functools", "operator", "math", "cmath",
    "re", "string", "heapq", "bisect", "random", "statistics", "fractions", "decimal", "numbers",
    "datetime", "json", "copy", "hashlib", "array", "struct", "dataclasses", "enum", "textwrap",
    "unicodedata", "zlib", "binascii", "_bz2", "_lzma", "unittest",
)
"""Imported once by each fork server, so that programs do not pay for them (``typing`` alone takes
milliseconds) and extension modules whose system libraries are outside the hidden view still load.
Other standard-library modules import from the read-only view as usual (those that need a system
library, such as ``sqlite3`` or ``ssl``, are unavailable). ``unittest`` is there for the ClassEval
tests' process (about 16 ms a program otherwise)."""
MASKED_STDLIB_DIRS = ("site-packages", "dist-packages")
"""Directories of the standard library hidden behind an empty mount: installed packages are not
part of the minimal tree."""
SERVER_TIMEOUT_S = 10.0
"""A fork server answers every request at once; one silent for this long is replaced."""
PROGRAMS_PER_SERVER = 10_000
"""A fork server is replaced after this many programs (it keeps no state from them; this bounds the
damage of anything unforeseen)."""
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
PROGRAM_FILENAME = "<program>"
_FRAME_HEADER = struct.Struct(">I")
_MAX_DECODE_DEPTH = 64
_WORKER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sandbox_worker.py")


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


# --------------------------------------------------------------------------------------------------
# Values: the program's process encodes (llm_envs._sandbox_worker.encode), the caller decodes. The
# caller never unpickles or evaluates anything the program sends.


class OpaqueValue:
    """A return value the sandbox could not send as plain data (a custom object, a generator, ...).
    It equals nothing but itself, so it fails every equality test."""

    __slots__ = ("description", "type_name")

    def __init__(self, type_name: str, description: str = "") -> None:
        self.type_name = type_name
        self.description = description

    def __repr__(self) -> str:
        return f"<{self.type_name} object{': ' + self.description if self.description else ''}>"

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)


class _DecodeError(ValueError):
    pass


def _decode(data: Any, depth: int = 0) -> Any:
    if depth > _MAX_DECODE_DEPTH + 1:
        raise _DecodeError("value nested too deeply")
    if data is None or isinstance(data, (bool, str)):
        return data
    if not isinstance(data, list) or not data or not isinstance(data[0], str):
        raise _DecodeError(f"malformed value {str(data)[:80]!r}")
    tag, rest = data[0], data[1:]
    try:
        if tag == "i":
            return int(rest[0], 16)
        if tag == "f":
            return float(rest[0])
        if tag == "c":
            return complex(float(rest[0]), float(rest[1]))
        if tag == "b":
            return bytes.fromhex(rest[0])
        if tag in ("l", "t", "s", "z"):
            items = [_decode(v, depth + 1) for v in rest[0]]
            return {"l": list, "t": tuple, "s": set, "z": frozenset}[tag](items)
        if tag == "d":
            return {_decode(k, depth + 1): _decode(v, depth + 1) for k, v in rest[0]}
        if tag == "x":
            return _decode_value(str(rest[0]), str(rest[1]))
        if tag == "o":
            return OpaqueValue(str(rest[0])[:100], str(rest[1])[:200])
    except _DecodeError:
        raise
    except (TypeError, ValueError, IndexError, KeyError, ArithmeticError) as err:
        raise _DecodeError(f"malformed value ({type(err).__name__}: {err})") from None
    raise _DecodeError(f"unknown value tag {tag!r}")



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


# --------------------------------------------------------------------------------------------------
# Fork servers: one per pool slot, started on demand, kept while idle, replaced when they fail.


class _ServerGone(Exception):
    """A fork server died, hung or broke its protocol."""


class _ForkServer:
    """The caller's side of one fork server (``_sandbox_worker.py`` in ``fork_server`` mode)."""

    def __init__(self) -> None:
        self.programs = 0
        self.dead = False
        self.proc: subprocess.Popen | None = None
        self.server_pid: int | None = None
        """The server's pid as the caller sees it (its launcher, ``proc``, waits outside its PID namespace)."""
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # The server mounts its view's root here, in its own mount namespace; for everyone else it
        # stays an empty directory, removed once the server has started.
        view = tempfile.mkdtemp(prefix="llm-envs-sandbox-view-")
        try:
            config = {"mode": "fork_server", "control_fd": theirs.fileno(), "view": view, "stdlib": _stdlib_dir(),
                      "masked": list(MASKED_STDLIB_DIRS), "preload": list(PRELOADED_MODULES)}
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", _WORKER_PATH, json.dumps(config)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                pass_fds=(theirs.fileno(),), cwd="/", env=_scrubbed_env(_VIEW_SCRATCH), start_new_session=True,
            )
            theirs.close()
            deadline = time.monotonic() + SERVER_TIMEOUT_S
            try:
                reply = self._receive(deadline)  # the server's pid, from outside its PID namespace
                if isinstance(reply.get("pid"), int):
                    self.server_pid = reply["pid"]
                    reply = self._receive(deadline)
            except _ServerGone as gone:
                reply = {"error": str(gone)}
            if reply.get("ready") is not True:
                self.close()
                assert self.proc.stderr is not None
                stderr = self.proc.stderr.read(4000).decode("utf-8", "replace").strip()
                raise OSError(f"the sandbox's fork server did not start: {reply.get('error', reply)}"
                              + (f"\n{stderr}" if stderr else ""))
        except BaseException:
            self.close()
            raise
        finally:
            theirs.close()
            if self.proc is not None and self.proc.stderr is not None:
                self.proc.stderr.close()
            try:
                os.rmdir(view)
            except OSError:
                pass

    def request(self, message: dict[str, Any], fds: Sequence[int] = ()) -> dict[str, Any]:
        if self.dead:
            raise _ServerGone("the fork server was closed")
        data = json.dumps(message).encode()
        try:
            if fds:
                socket.send_fds(self.sock, [data], list(fds))
            else:
                self.sock.send(data)
        except OSError as err:
            self.close()
            raise _ServerGone(f"the fork server is gone ({err})") from None
        return self._receive(time.monotonic() + SERVER_TIMEOUT_S)

    def _receive(self, deadline: float) -> dict[str, Any]:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.close()
                raise _ServerGone(f"the fork server did not answer within {SERVER_TIMEOUT_S:g} s")
            if select.select([self.sock], [], [], remaining)[0]:
                break
        data = b""
        try:
            data = self.sock.recv(65536)
            reply = json.loads(data) if data else None
        except (OSError, ValueError):  # reset by a dying server, or not JSON
            reply = None
        if not isinstance(reply, dict):
            self.close()
            raise _ServerGone("the fork server broke its protocol" if data else "the fork server exited")
        return reply

    def close(self) -> None:
        """Stop the server (and with it any program it still runs: it is their PID namespace's init)."""
        self.dead = True
        self.sock.close()
        if self.proc is not None and self.proc.returncode is None:
            # The launcher leads the process group the server is in; until we reap the launcher the
            # group id cannot name anyone else. The server's death ends its PID namespace.
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.proc.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                pass


_idle_servers: list[_ForkServer] = []
_idle_servers_lock = threading.Lock()


def _take_server() -> _ForkServer:
    """An idle fork server (the most recently used one), or a new one."""
    with _idle_servers_lock:
        while _idle_servers:
            server = _idle_servers.pop()
            if not server.dead:
                return server
    return _ForkServer()


def _give_back_server(server: _ForkServer) -> None:
    """Keep a healthy server for the next run. As many are kept as ran at once (at most one per uid
    slot, since a run holds a uid), so that callers with their own threads do not restart servers."""
    if not server.dead and server.programs < PROGRAMS_PER_SERVER:
        with _idle_servers_lock:
            if len(_idle_servers) < NUM_UID_SLOTS:
                _idle_servers.append(server)
                return
    server.close()


def _close_idle_servers() -> None:
    with _idle_servers_lock:
        servers = list(_idle_servers)
        _idle_servers.clear()
    for server in servers:
        server.close()


def _forget_after_fork() -> None:
    """In a child forked from the caller: the pool, servers and uid slots belong to the parent (and a
    lock another thread held at the fork would stay held here)."""
    global _pool, _pool_lock, _uid_slots, _uid_slots_lock, _idle_servers_lock, _fork_server_probe_lock
    for server in _idle_servers:
        server.sock.close()
    _idle_servers.clear()
    _pool, _uid_slots = None, None
    _pool_lock, _uid_slots_lock = threading.Lock(), threading.Lock()
    _idle_servers_lock, _fork_server_probe_lock = threading.Lock(), threading.Lock()


atexit.register(_close_idle_servers)
os.register_at_fork(after_in_child=_forget_after_fork)


# --------------------------------------------------------------------------------------------------
# The caller's side of one program's process.


class _WorkerGone(Exception):
    """The program's process died, hung or broke the protocol; ``kind`` is "timeout" or "crashed"."""

    def __init__(self, kind: str, message: str, outcome: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.outcome = outcome
        """For a timeout that is not the wall clock's: what the test's outcome says instead."""


class ProgramError(Exception):
    """The program raised an exception inside a call made by a test."""


def _exit_reason(signal_number: int | None, code: int | None, label: str = "program") -> str:
    if signal_number is not None:
        name = signal.Signals(signal_number).name if signal_number in signal.valid_signals() else str(signal_number)
        hint = {"SIGKILL": " (killed: memory or process limit?)", "SIGXCPU": " (CPU time limit)",
                "SIGSEGV": " (crashed)"}.get(name, "")
        return f"the {label}'s process was killed by {name}{hint}"
    if code is None:
        return f"the {label}'s process is gone"
    return f"the {label}'s process exited with status {code}"


class _Channel:
    """Frames to and from a program's process over its two pipes, with deadlines."""

    req_w: int
    resp_r: int
    label = "program"
    """Whose process this is, in messages: "program", or "driver" for a job's driver (``SandboxJob.peer``)."""

    def __init__(self, limits: SandboxLimits, peer_program: str | None = None) -> None:
        self.limits = limits
        self.buffer = b""
        self.peer_program = peer_program
        """A driver's: its peer's program, which the driver loads and calls (``SandboxJob.peer``)."""
        if peer_program is not None:
            self.label = "driver"

    def _peer_death_reason(self) -> tuple[int | None, int | None]:
        """(signal, exit code) of a driver's peer, once the driver reported the peer's end."""
        raise NotImplementedError

    def _death_reason(self) -> tuple[int | None, int | None]:
        """(signal, exit code) of the program's process once its channel closed; both None if unknown."""
        raise NotImplementedError

    def _gone(self) -> _WorkerGone:
        signal_number, code = self._death_reason()
        label = self.label
        if self.peer_program is not None and signal_number is None and code == _PEER_BROKE:
            return _WorkerGone("crashed", "the program broke the result channel (or sent a value larger than "
                                          f"max_result_bytes={self.limits.max_result_bytes})")
        if self.peer_program is not None and signal_number is None and code == _PEER_GONE:
            signal_number, code = self._peer_death_reason()  # the driver saw its peer end: the peer's failure
            label = "program"
        if signal_number == signal.SIGXCPU:
            # The kernel enforcing ``cpu_time_s``: the program ran out of time, it did not crash. (A
            # CPU-bound program reaches its CPU limit and its wall-clock deadline together; whichever
            # the caller sees first, the run is a timeout.)
            return _WorkerGone("timeout", _exit_reason(signal_number, code, label),
                               outcome=f"CPU time limit of {self.limits.cpu_time_s} s reached")
        return _WorkerGone("crashed", _exit_reason(signal_number, code, label))

    def _read_frame(self, deadline: float, kind: str = "timeout") -> dict:
        while True:
            if len(self.buffer) >= 4:
                (size,) = _FRAME_HEADER.unpack(self.buffer[:4])
                if size > self.limits.max_result_bytes:
                    raise _WorkerGone("crashed", f"the program sent a value of {size} bytes "
                                      f"(limit max_result_bytes={self.limits.max_result_bytes})")
                if len(self.buffer) >= 4 + size:
                    data, self.buffer = self.buffer[4:4 + size], self.buffer[4 + size:]
                    try:
                        frame = json.loads(data)
                    except ValueError:
                        raise _WorkerGone("crashed", "the program broke the result channel") from None
                    if not isinstance(frame, dict):
                        raise _WorkerGone("crashed", "the program broke the result channel")
                    return frame
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _WorkerGone(kind, "time limit exceeded")
            ready, _, _ = select.select([self.resp_r], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(self.resp_r, 65536)
            if not chunk:
                raise self._gone()
            self.buffer += chunk

    def _write_frame(self, obj: Any, deadline: float) -> None:
        data = json.dumps(obj).encode()
        data = _FRAME_HEADER.pack(len(data)) + data
        while data:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _WorkerGone("timeout", "time limit exceeded")
            _, ready, _ = select.select([], [self.req_w], [], remaining)
            if ready:
                try:
                    written = os.write(self.req_w, data[:65536])
                except OSError:
                    raise self._gone() from None
                data = data[written:]

    def load(self, program: str, deadline: float, prelude: str = "") -> str | None:
        """Send the program; returns its load error text, or None when it is ready."""
        init: dict[str, Any] = {"program": program, "filename": PROGRAM_FILENAME}
        if prelude:
            init["prelude"] = _compiled(prelude)
        if self.peer_program is not None:
            init.update(peer_program=self.peer_program, max_bytes=self.limits.max_result_bytes)
        self._write_frame(init, deadline)
        frame = self._read_frame(deadline)
        if "setup_error" in frame and frame.get("peer") is True:
            raise _WorkerGone("crashed", f"the sandbox could not set up the program's process: "
                                         f"{str(frame['setup_error'])[:300]}")
        if "load_error" in frame:
            kind, message = _error_pair(frame["load_error"])
            line = frame.get("line")
            where = f" (line {line})" if isinstance(line, int) else ""
            whose = "" if self.peer_program is None or frame.get("peer") is True else "(the driver) "
            return f"{whose}{kind}{where}: {message}"
        if "setup_error" in frame:
            raise _WorkerGone("crashed", f"the sandbox could not set up the program's process: "
                                         f"{str(frame['setup_error'])[:300]}")
        if frame.get("ready") is not True:
            raise _WorkerGone("crashed", "the program broke the result channel")
        return None

    def call(self, name: str, args: Sequence[Any], kwargs: Mapping[str, Any], deadline: float) -> Any:
        try:
            request = {"call": name, "args": [_encode(a) for a in args],
                       "kwargs": [[k, _encode(v)] for k, v in kwargs.items()]}
        except RecursionError:
            raise ProgramError("the test's arguments are nested too deeply to send") from None
        self._write_frame(request, deadline)
        frame = self._read_frame(deadline)
        if "ok" in frame:
            try:
                return _decode(frame["ok"])
            except _DecodeError as err:
                raise _WorkerGone("crashed", f"the {self.label} sent a malformed value: {err}") from None
        if "raised" in frame:
            kind, message = _error_pair(frame["raised"])
            raise ProgramError(f"{kind}: {message}" if message else kind)
        raise _WorkerGone("crashed", f"the {self.label} broke the result channel")

    def _close_pipes(self) -> None:
        for fd in (self.req_w, self.resp_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self.req_w = self.resp_r = -1


class _Worker(_Channel):
    """Process-per-program path: a fresh interpreter (``_sandbox_worker.py`` in ``single`` mode). A
    driver's peer is a second one in the same scratch directory, on pipes that only the two hold."""

    def __init__(self, limits: SandboxLimits, scratch: str, uid: int | None, peer_program: str | None = None) -> None:
        super().__init__(limits, peer_program)
        self.pid: int | None = None
        self.proc: subprocess.Popen | None = None
        self.peer_proc: subprocess.Popen | None = None
        self.peer_pid: int | None = None
        self.view_dir = ""
        self.scratch, self.uid = scratch, uid
        req_r, self.req_w = os.pipe()
        self.resp_r, resp_w = os.pipe()
        extra: dict[str, Any] = {}
        if peer_program is not None:
            to_peer_r, to_peer_w = os.pipe()
            from_peer_r, from_peer_w = os.pipe()
            pid_r, pid_w = os.pipe()
            try:
                self.peer_proc = self._spawn({"req_fd": to_peer_r, "resp_fd": from_peer_w, "pid_fd": pid_w})
                self.peer_pid = self._peer_pid(pid_r)
            finally:
                for fd in (to_peer_r, from_peer_w, pid_r, pid_w):
                    os.close(fd)
            extra = {"peer_fds": [to_peer_w, from_peer_r], "nondumpable": True}
            if uid is not None:
                self.view_dir = tempfile.mkdtemp(prefix="llm-envs-sandbox-view-")  # the caller's: read-only to uid
                os.chmod(self.view_dir, 0o755)
                extra["view_dir"] = self.view_dir
        try:
            self.proc = self._spawn({"req_fd": req_r, "resp_fd": resp_w, **extra})
        finally:
            for fd in (req_r, resp_w, *extra.get("peer_fds", ())):
                os.close(fd)

    def _spawn(self, fds: dict[str, Any]) -> subprocess.Popen:
        flags, pid_ns = _namespace_flags()
        scratch, uid = self.scratch, self.uid
        out = os.open(os.path.join(scratch, ".stdout"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        err = os.open(os.path.join(scratch, ".stderr"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        if uid is not None:
            for path in (".stdout", ".stderr"):
                os.chown(os.path.join(scratch, path), uid, uid)
        config = {
            "mode": "single", "uid": uid, "scratch": scratch, "unshare_flags": flags, "pid_namespace": pid_ns,
            "stdlib": _stdlib_dir() if uid is not None and flags & CLONE_NEWNS else None,
            "rlimits": _rlimits(self.limits, uid), **fds,
        }
        passed = tuple(v for k, v in fds.items() if k.endswith("_fd")) + tuple(fds.get("peer_fds", ()))
        try:
            return subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", _WORKER_PATH, json.dumps(config)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=err, pass_fds=passed, cwd=scratch,
                env=_scrubbed_env(scratch), start_new_session=True,
            )
        finally:
            os.close(out)
            os.close(err)

    def _peer_pid(self, pid_r: int) -> int | None:
        """The peer's pid, from its own pipe (its requests and responses go to the driver)."""
        data = b""
        deadline = time.monotonic() + SERVER_TIMEOUT_S
        while len(data) < 4 or len(data) < 4 + _FRAME_HEADER.unpack(data[:4])[0]:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([pid_r], [], [], remaining)[0]:
                return None
            chunk = os.read(pid_r, 4096)
            if not chunk:
                return None
            data += chunk
        frame = json.loads(data[4:])
        return frame.get("pid") if isinstance(frame, dict) and isinstance(frame.get("pid"), int) else None

    @staticmethod
    def _exit_of(proc: subprocess.Popen | None) -> tuple[int | None, int | None]:
        if proc is None:
            return None, None
        try:
            code = proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return None, None
        if code < 0:
            return -code, None
        if code >= 128 and code - 128 in signal.valid_signals():
            return code - 128, None
        return None, code

    def _death_reason(self) -> tuple[int | None, int | None]:
        return self._exit_of(self.proc)

    def _peer_death_reason(self) -> tuple[int | None, int | None]:
        return self._exit_of(self.peer_proc)

    def start(self, program: str, deadline: float, prelude: str = "") -> str | None:
        """Start the process and load the program; returns the load error text, or None."""
        frame = self._read_frame(deadline)
        if not isinstance(frame.get("pid"), int):
            raise _WorkerGone("crashed", "the sandbox worker failed to start")
        self.pid = frame["pid"]
        if self.peer_program is not None and self.peer_pid is None:
            raise _WorkerGone("crashed", "the sandbox worker of the program failed to start")
        return self.load(program, deadline, prelude)

    def kill(self) -> None:
        """Kill the process (and its peer); inside its own PID namespace that kills every process it
        started."""
        procs = (self.proc, self.peer_proc)
        for pid in (self.pid, self.peer_pid, *(p.pid for p in procs if p is not None)):
            if pid is None:
                continue
            for target in (pid, -pid):
                try:
                    (os.killpg if target < 0 else os.kill)(abs(target), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for proc in procs:
            if proc is not None:
                try:
                    proc.wait(timeout=5.0)
                except subprocess.TimeoutExpired:
                    pass
        self._close_pipes()
        if self.view_dir:
            shutil.rmtree(self.view_dir, ignore_errors=True)
            self.view_dir = ""


class _ForkedWorker(_Channel):
    """Fork-server path: one program's process, forked by a warm server. A driver's peer is forked in
    the same run: same scratch and uid, pipes that only the two hold, ended together."""

    def __init__(self, server: _ForkServer, limits: SandboxLimits, uid: int, out: int, err: int,
                 peer_program: str | None = None) -> None:
        super().__init__(limits, peer_program)
        self.server = server
        self.ended = False
        self.statuses: dict[str, int] = {}
        req_r, self.req_w = os.pipe()
        self.resp_r, resp_w = os.pipe()
        fds, layout = [req_r, resp_w, out, err], [4]
        if peer_program is not None:
            to_peer_r, to_peer_w = os.pipe()
            from_peer_r, from_peer_w = os.pipe()
            fds, layout = [*fds, to_peer_w, from_peer_r, to_peer_r, from_peer_w, out, err], [6, 4]
        request = {"op": "run", "uid": uid, "rlimits": _rlimits(limits, uid), "layout": layout,
                   "disk_bytes": limits.max_disk_mb * 2**20, "disk_files": limits.max_disk_files}
        try:
            reply = server.request(request, fds)
        except _ServerGone:
            self._close_pipes()
            raise
        finally:
            for fd in set(fds) - {out, err}:
                os.close(fd)
        if not isinstance(reply.get("pid"), int):  # nothing of the program has run yet: the server failed
            self._close_pipes()
            server.close()
            raise _ServerGone(f"the fork server could not start the program: {reply.get('error', reply)}")
        self.pid = reply["pid"]
        server.programs += 1

    def start(self, program: str, deadline: float, prelude: str = "") -> str | None:
        return self.load(program, deadline, prelude)

    def _end(self, grace_s: float, wait_for: str = "main") -> None:
        """Have the server kill and reap the process (its peer, namespaces, scratch and IPC objects go
        too), after ``grace_s`` for the one named by ``wait_for`` to finish exiting."""
        if not self.ended:
            self.ended = True
            try:
                reply = self.server.request({"op": "end", "grace_s": grace_s, "wait_for": wait_for})
            except _ServerGone:
                reply = {}  # the server is closed, and the program died with it
            if "error" in reply:  # it could not clean up after the program: replace it
                self.server.close()
            self.statuses = {k: v for k, v in reply.items() if k in ("status", "peer_status") and isinstance(v, int)}

    def _death_reason(self) -> tuple[int | None, int | None]:
        self._end(grace_s=1.0)  # it closed its channel: most likely it is exiting
        return _status_reason(self.statuses.get("status"))

    def _peer_death_reason(self) -> tuple[int | None, int | None]:
        self._end(grace_s=1.0, wait_for="peer")
        return _status_reason(self.statuses.get("peer_status"))

    def kill(self) -> None:
        self._end(grace_s=0.0)
        self._close_pipes()


def _status_reason(status: int | None) -> tuple[int | None, int | None]:
    if status is None:
        return None, None
    if os.WIFSIGNALED(status):
        return os.WTERMSIG(status), None
    return None, os.waitstatus_to_exitcode(status)


def _error_pair(value: Any) -> tuple[str, str]:
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
        return value[0][:100], value[1][:500]
    return "Error", ""


# --------------------------------------------------------------------------------------------------
# Tests: split a HumanEval-style `check(candidate)` into statements, judged one by one.


@dataclass(frozen=True)
class _Statement:
    source: str
    code: Any  # compiled statement
    is_test: bool
    compare: tuple[Any, Any, Any, bool] | None = None  # (left code, right code, op, left_is_actual)


_COMPARE_OPS: dict[type, tuple[Callable[[Any, Any], Any], str]] = {
    ast.Eq: (operator.eq, "=="), ast.NotEq: (operator.ne, "!="), ast.Lt: (operator.lt, "<"),
    ast.LtE: (operator.le, "<="), ast.Gt: (operator.gt, ">"), ast.GtE: (operator.ge, ">="),
    ast.Is: (operator.is_, "is"), ast.IsNot: (operator.is_not, "is not"), ast.In: (lambda a, b: a in b, "in"),
    ast.NotIn: (lambda a, b: a not in b, "not in"),
}


def _mentions(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))


def _is_test_statement(node: ast.stmt, param: str) -> bool:
    """A test is a statement holding an assertion on the candidate (``assert True, "..."`` lines and
    other set-up are run but not counted), the same set the reference counts, plus asserts in loops."""
    return any(isinstance(n, ast.Assert) and not isinstance(n.test, ast.Constant) for n in ast.walk(node)) and (
        _mentions(node, param) or any(isinstance(n, ast.Assert) and _mentions(n.test, param) for n in ast.walk(node))
    )


@dataclass(frozen=True)
class _Suite:
    preamble: tuple[Any, ...]
    param: str
    statements: tuple[_Statement, ...]


AST_LOCK = threading.RLock()
"""Held around every conversion between source, ``ast`` objects and code in this package. CPython 3.11
keeps the ``ast`` module's recursion-depth counter per interpreter, not per thread: two threads
converting at once (the envs score batches in a thread pool) can fail with ``SystemError: AST constructor
recursion depth mismatch`` (CPython gh-106905; seen in this suite's CI)."""


def parse_python(source: str) -> ast.Module:
    """``ast.parse(source)`` under :data:`AST_LOCK` (raises ``SyntaxError`` as ``ast.parse`` does)."""
    with AST_LOCK:
        return ast.parse(source)


@functools.lru_cache(maxsize=512)
def _parse_suite(tests: str) -> _Suite:
    with AST_LOCK:
        return _parse_suite_locked(tests)


def _parse_suite_locked(tests: str) -> _Suite:
    try:
        module = ast.parse(tests)
    except SyntaxError as err:
        raise ValueError(f"The test code does not parse (line {err.lineno}: {err.msg}): {tests[:200]!r}") from None
    checks = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if not checks:
        raise ValueError(f"The test code defines no `check(candidate)` function: {tests[:200]!r}")
    check = checks[-1]
    if len(check.args.args) != 1:
        raise ValueError(f"`check` must take exactly one argument (the candidate), got {ast.unparse(check.args)!r}.")
    param = check.args.args[0].arg
    preamble = tuple(
        compile(ast.Module(body=[n], type_ignores=[]), "<tests>", "exec") for n in module.body if n is not check
    )
    statements = []
    for node in check.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # docstring
        source = ast.get_source_segment(tests, node) or ast.unparse(node)
        code = compile(ast.Module(body=[node], type_ignores=[]), "<tests>", "exec")
        compare = None
        if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1:
            op_type = type(node.test.ops[0])
            left, right = node.test.left, node.test.comparators[0]
            compare = (
                compile(ast.Expression(body=left), "<tests>", "eval"),
                compile(ast.Expression(body=right), "<tests>", "eval"),
                _COMPARE_OPS[op_type],
                _mentions(left, param) or not _mentions(right, param),
            )
        statements.append(_Statement(source, code, _is_test_statement(node, param), compare))
    return _Suite(preamble, param, tuple(statements))


def split_tests(tests: str) -> list[str]:
    """The test statements of a ``check(candidate)`` test (each one scored on its own).

    >>> split_tests("def check(candidate):\\n    assert True\\n    assert candidate(1) == 2\\n")
    ['assert candidate(1) == 2']
    """
    return [s.source for s in _parse_suite(tests).statements if s.is_test]


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _TestTimeout(Exception):
    def __init__(self, message: str, outcome: str | None = None) -> None:
        super().__init__(message)
        self.outcome = outcome
        """What the test's outcome says, when not "no result within ``test_timeout_s``"."""




@functools.lru_cache(maxsize=512)
def _compile_globals(source: str) -> Any:
    return compile(source, "<test globals>", "exec")


@functools.lru_cache(maxsize=64)
def _compiled(prelude: str) -> str:
    """A prelude's code object, marshalled (hex) for the program's process: the caller and the worker run
    the same interpreter."""
    with AST_LOCK:
        try:
            code = compile(prelude, "<prelude>", "exec", dont_inherit=True)
        except SyntaxError as err:
            raise ValueError(f"The prelude does not compile (line {err.lineno}: {err.msg}).") from None
    return marshal.dumps(code).hex()


class _Runner:
    """Runs one program against one test suite; the caller side of the sandbox."""

    def __init__(self, job: SandboxJob, fast: bool, server: _ForkServer | None = None) -> None:
        self.job = job
        self.limits = job.limits
        self.fast = fast
        self.server = server
        self.worker: _Worker | _ForkedWorker | None = None
        self.restarts = 0
        self.load_error: str | None = None
        self.load_timeout: _TestTimeout | None = None
        self.deadline = 0.0
        self.test_deadline = 0.0
        self.crashed = False
        self.uid: int | None = None
        self.scratch = ""
        self.capture: tuple[int, int] | None = None

    def _candidate(self, *args: Any, **kwargs: Any) -> Any:
        if self.worker is None:
            self._start_worker()
        assert self.worker is not None
        try:
            return self.worker.call(self.job.entry_point, args, kwargs, min(self.deadline, self.test_deadline))
        except _WorkerGone as gone:
            self.worker.kill()
            self.worker = None
            if gone.kind == "timeout":
                raise _TestTimeout(str(gone), gone.outcome) from None
            self.crashed = True
            raise ProgramError(str(gone)) from None

    def _new_worker(self) -> _Worker | _ForkedWorker:
        peer = self.job.peer or None
        if not self.fast:
            return _Worker(self.limits, self.scratch, self.uid, peer)
        assert self.uid is not None and self.capture is not None
        for attempt in range(2):  # a server found dead is replaced once, before the program starts
            if self.server is None or self.server.dead:
                self.server = _take_server()
            try:
                return _ForkedWorker(self.server, self.limits, self.uid, *self.capture, peer)
            except _ServerGone as gone:
                if attempt:
                    raise _WorkerGone("crashed", f"the sandbox failed: {gone}") from None
        raise AssertionError("unreachable")

    def _start_worker(self) -> None:
        if self.load_error is not None:
            raise ProgramError(f"the program failed to load: {self.load_error}")
        if self.load_timeout is not None:
            # Its top level ran out of time once: it would again, and a retry is no restart to count.
            raise _TestTimeout(str(self.load_timeout), self.load_timeout.outcome)
        if self.restarts > self.limits.max_restarts:
            raise ProgramError("the program's process died too often")
        self.restarts += 1
        try:
            self.worker = self._new_worker()
            error = self.worker.start(self.job.program, min(self.deadline, self.test_deadline), self.job.prelude)
        except _WorkerGone as gone:
            if self.worker is not None:
                self.worker.kill()
                self.worker = None
            if gone.kind == "timeout":
                self.load_timeout = _TestTimeout(f"loading the program: {gone}", gone.outcome)
                raise self.load_timeout from None
            self.crashed = True
            raise ProgramError(f"loading the program: {gone}") from None
        if error is not None:
            self.load_error = error
            self.worker.kill()
            self.worker = None
            raise ProgramError(f"the program failed to load: {error}")

    def _judge(self, statement: _Statement, namespace: dict) -> TestOutcome:
        try:
            if statement.compare is not None:
                left_code, right_code, (op, symbol), left_is_actual = statement.compare
                left = eval(left_code, namespace)
                right = eval(right_code, namespace)
                if op(left, right):
                    return TestOutcome(statement.source, "passed")
                if symbol == "==":
                    actual, expected = (left, right) if left_is_actual else (right, left)
                    return TestOutcome(statement.source, "failed", f"expected {_short(expected)}, got {_short(actual)}")
                return TestOutcome(statement.source, "failed", f"{_short(left)} {symbol} {_short(right)} is false")
            exec(statement.code, namespace)
        except _TestTimeout as err:
            return TestOutcome(statement.source, "timeout",
                               err.outcome or f"no result within {self.limits.test_timeout_s:g} s")
        except AssertionError as err:
            return TestOutcome(statement.source, "failed", str(err)[:300] or "assertion failed")
        except ProgramError as err:
            return TestOutcome(statement.source, "error", str(err))
        except Exception as err:  # the test itself raised on the program's values (TypeError, ...)
            return TestOutcome(statement.source, "error", f"{type(err).__name__}: {str(err)[:300]}")
        return TestOutcome(statement.source, "passed")

    def run(self) -> ExecutionResult:
        start = time.monotonic()
        self.deadline = start + self.limits.timeout_s
        suite = _parse_suite(self.job.tests)
        self.uid = _acquire_uid()
        try:
            if self.fast:
                self.capture = (os.memfd_create("llm-envs-sandbox-stdout"), os.memfd_create("llm-envs-sandbox-stderr"))
            else:
                self.scratch = tempfile.mkdtemp(prefix="llm-envs-sandbox-")
                if self.uid is not None:
                    os.chown(self.scratch, self.uid, self.uid)
                os.chmod(self.scratch, 0o700)
            outcomes = self._run_suite(suite)
            stdout, stderr = self._read_capture(0), self._read_capture(1)
        finally:
            if self.worker is not None:
                self.worker.kill()
                self.worker = None
            if self.server is not None:
                _give_back_server(self.server)
                self.server = None
            if self.capture is not None:
                for fd in self.capture:
                    os.close(fd)
            if self.scratch:
                shutil.rmtree(self.scratch, ignore_errors=True)
            _release_uid(self.uid)
        statuses = {o.status for o in outcomes}
        if not outcomes:
            reason = "no_tests"
        elif self.load_error is not None:
            reason = "load_error"
        elif "timeout" in statuses or time.monotonic() > self.deadline:
            reason = "timeout"
        elif self.crashed:
            reason = "crashed"
        else:
            reason = "ok"
        return ExecutionResult(tuple(outcomes), self.load_error, reason, stdout, stderr, time.monotonic() - start,
                               "fork_server" if self.fast else "process_per_program", **_path_flags(self.fast))

    def _run_suite(self, suite: _Suite) -> list[TestOutcome]:
        namespace: dict[str, Any] = {"__builtins__": builtins, "__name__": "__tests__"}
        if self.job.test_globals:
            exec(_compile_globals(self.job.test_globals), namespace)
        for code in suite.preamble:
            exec(code, namespace)
        # HumanEval tests sometimes call the entry point by its own name (HumanEval/33).
        namespace[self.job.entry_point] = self._candidate
        namespace[suite.param] = self._candidate
        outcomes: list[TestOutcome] = []
        timeouts = 0
        self.test_deadline = self.deadline
        try:
            self._start_worker()
        except (_TestTimeout, ProgramError):
            pass  # reported on the first test
        for statement in suite.statements:
            now = time.monotonic()
            stop = None
            if self.load_error is not None:
                stop = f"the program failed to load: {self.load_error}"
            elif timeouts >= self.limits.max_timeouts:
                stop = f"skipped after {timeouts} timed-out tests"
            elif now >= self.deadline:
                stop = f"the program's time budget of {self.limits.timeout_s:g} s is spent"
            if stop is not None:
                if statement.is_test:
                    outcomes.append(TestOutcome(statement.source, "not_run", stop))
                continue
            self.test_deadline = now + self.limits.test_timeout_s
            outcome = self._judge(statement, namespace)
            timeouts += outcome.status == "timeout"
            if statement.is_test:
                outcomes.append(outcome)
        return outcomes

    def _read_capture(self, stream: int) -> str:
        try:
            if self.capture is not None:
                data = os.pread(self.capture[stream], self.limits.max_output_bytes, 0)
            else:
                with open(os.path.join(self.scratch, (".stdout", ".stderr")[stream]), "rb") as handle:
                    data = handle.read(self.limits.max_output_bytes)
        except OSError:
            return ""
        return data.decode("utf-8", "replace")


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
    objects (``__sandbox_handle__`` / ``__sandbox_object__``, see ``_sandbox_worker.serve_program``).
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
