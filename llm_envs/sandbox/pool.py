"""The fork servers: one per pool slot, started on demand, kept while idle, replaced when they fail."""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

from llm_envs.sandbox.isolation import _WORKER_PATH, NUM_UID_SLOTS, _scrubbed_env, _stdlib_dir
from llm_envs.sandbox.worker import SCRATCH as _VIEW_SCRATCH

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


# --------------------------------------------------------------------------------------------------
# Fork servers: one per pool slot, started on demand, kept while idle, replaced when they fail.


class _ServerGone(Exception):
    """A fork server died, hung or broke its protocol."""


class _ForkServer:
    """The caller's side of one fork server (``worker.py`` in ``fork_server`` mode)."""

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
    """In a child forked from the caller: the servers belong to the parent (and a lock another thread
    held at the fork would stay held here)."""
    global _idle_servers_lock
    for server in _idle_servers:
        server.sock.close()
    _idle_servers.clear()
    _idle_servers_lock = threading.Lock()


atexit.register(_close_idle_servers)
os.register_at_fork(after_in_child=_forget_after_fork)
