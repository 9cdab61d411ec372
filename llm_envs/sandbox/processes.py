"""One program's process, as the caller drives it: a fresh interpreter (the fallback path) or a child
forked by a warm server (the fork-server path); a driver's peer beside it."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from llm_envs.sandbox.isolation import _WORKER_PATH, CLONE_NEWNS, _namespace_flags, _rlimits, _scrubbed_env, _stdlib_dir
from llm_envs.sandbox.limits import SandboxLimits
from llm_envs.sandbox.pool import SERVER_TIMEOUT_S, _ForkServer, _ServerGone
from llm_envs.sandbox.wire import _FRAME_HEADER, _Channel, _WorkerGone


class _Worker(_Channel):
    """Process-per-program path: a fresh interpreter (``worker.py`` in ``single`` mode). A
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
