"""The process side of :mod:`llm_envs.sandbox`. Run as a script; standard library only.

``python -I -S -B _sandbox_worker.py <config json>`` starts in one of two modes:

* ``"mode": "single"`` (the fallback path): limit, isolate and unprivilege this very process, then
  serve one program on the request/response pipes and exit.
* ``"mode": "fork_server"`` (the fast path, root only): set up once what every program shares (the
  interpreter with common modules imported, a network namespace, the hidden file-system view), then
  for every ``run`` request on the control socket fork a child that gets its own PID, mount and IPC
  namespaces, mounts its own size-capped tmpfs scratch, drops to the run's uid and limits and serves
  one program. The server itself never runs program code, so nothing a program does reaches the next.

Nothing here imports ``llm_envs``: the caller imports this module only for :func:`encode`.
"""

from __future__ import annotations

import builtins
import json
import os
import resource
import signal
import struct
import sys
from typing import Any, NoReturn

HEADER = struct.Struct(">I")
ENCODE_DEPTH = 64
CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER = 1, 38, 36
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217, "riscv64": 41}
VIEW_DEVICES = ("null", "zero", "random", "urandom")
"""Device nodes the program sees under ``/dev`` (bound from the host)."""
SCRATCH = "/tmp"
"""Where each program's tmpfs scratch is mounted in the view: its cwd, ``HOME`` and ``TMPDIR``."""


def encode(value: Any, depth: int = 0) -> Any:
    """A value as tagged plain data (JSON-able); anything else becomes an opaque value."""
    if depth > ENCODE_DEPTH:
        return ["o", type(value).__name__, "<nested too deeply>"]
    if value is None or value is True or value is False:
        return value
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return ["i", hex(value)]
    if isinstance(value, float):
        return ["f", repr(float(value))]
    if isinstance(value, complex):
        return ["c", repr(value.real), repr(value.imag)]
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return ["b", bytes(value).hex()]
    if isinstance(value, list):
        return ["l", [encode(v, depth + 1) for v in value]]
    if isinstance(value, tuple):
        return ["t", [encode(v, depth + 1) for v in value]]
    if isinstance(value, frozenset):
        return ["z", [encode(v, depth + 1) for v in value]]
    if isinstance(value, set):
        return ["s", [encode(v, depth + 1) for v in value]]
    if isinstance(value, dict):
        return ["d", [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]]
    try:
        text = repr(value)[:200]
    except BaseException:
        text = ""
    return ["o", type(value).__name__, text]


def decode(data: Any) -> Any:
    """Inverse of :func:`encode` for the arguments the caller sends (trusted)."""
    if data is None or isinstance(data, (bool, str)):
        return data
    tag, rest = data[0], data[1:]
    if tag == "i":
        return int(rest[0], 16)
    if tag == "f":
        return float(rest[0])
    if tag == "c":
        return complex(float(rest[0]), float(rest[1]))
    if tag == "b":
        return bytes.fromhex(rest[0])
    if tag in ("l", "t", "s", "z"):
        return {"l": list, "t": tuple, "s": set, "z": frozenset}[tag](decode(v) for v in rest[0])
    if tag == "d":
        return {decode(k): decode(v) for k, v in rest[0]}
    raise ValueError("cannot decode " + repr(tag))


def write_frame(fd: int, obj: Any) -> None:
    data = json.dumps(obj).encode()
    data = HEADER.pack(len(data)) + data
    while data:
        data = data[os.write(fd, data):]


def _read_exact(fd: int, n: int) -> bytes:
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            os._exit(0)  # the caller hung up: nothing left to do
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> Any:
    (n,) = HEADER.unpack(_read_exact(fd, 4))
    return json.loads(_read_exact(fd, n))


def _describe(err: BaseException) -> list[str]:
    return [type(err).__name__, str(err)[:500]]


def serve_program(req: int, resp: int) -> NoReturn:
    """Load the program sent by the caller, then answer calls of its functions until hung up on.
    From here on nothing in this process is trusted."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # oversized writes raise OSError instead of killing
    sys.setrecursionlimit(3000)
    init = read_frame(req)
    namespace = {"__name__": "__sandbox__", "__builtins__": builtins}
    try:
        exec(compile(init["program"], init["filename"], "exec"), namespace)
    except BaseException as err:
        lineno = getattr(err, "lineno", None)
        tb = err.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == init["filename"]:
                lineno = tb.tb_lineno
            tb = tb.tb_next
        write_frame(resp, {"load_error": _describe(err), "line": lineno})
        os._exit(0)
    write_frame(resp, {"ready": True})
    while True:
        request = read_frame(req)
        try:
            function = namespace[request["call"]]
            args = [decode(a) for a in request["args"]]
            kwargs = {k: decode(v) for k, v in request["kwargs"]}
            result = encode(function(*args, **kwargs))
        except BaseException as err:
            reply = {"raised": _describe(err)}
        else:
            reply = {"ok": result}
        try:
            write_frame(resp, reply)
        except BaseException as err:
            write_frame(resp, {"raised": _describe(err)})


def _set_rlimits(rlimits: list[list[Any]]) -> None:
    for name, soft, hard in rlimits:
        resource.setrlimit(getattr(resource, name), (soft, hard))


def _drop_privileges(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


# --------------------------------------------------------------------------------------------------
# The fallback path: one process per program.


def single(cfg: dict[str, Any]) -> NoReturn:
    req, resp = cfg["req_fd"], cfg["resp_fd"]
    _set_rlimits(cfg["rlimits"])
    libc = None
    if cfg["unshare_flags"] or cfg["uid"] is not None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
    if cfg["unshare_flags"] and libc.unshare(cfg["unshare_flags"]) != 0:
        os._exit(121)
    if cfg["stdlib"]:
        # The dropped uid may not traverse the directory the interpreter lives in (a pyenv under /root):
        # show it the standard library read-only inside the scratch directory, in a private mount table.
        view = os.path.join(cfg["scratch"], ".python")
        os.makedirs(view, 0o755, exist_ok=True)
        if (libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0
                or libc.mount(cfg["stdlib"].encode(), view.encode(), None, MS_BIND | MS_REC, None) != 0
                or libc.mount(None, view.encode(), None, MS_BIND | MS_REMOUNT | MS_RDONLY, None) != 0):
            os._exit(122)

        def moved(paths: list[str], stdlib: str = cfg["stdlib"]) -> list[str]:
            return [view + os.path.realpath(p)[len(stdlib):] if os.path.realpath(p).startswith(stdlib) else p
                    for p in paths]

        sys.path[:] = moved(sys.path)
        for module in list(sys.modules.values()):
            if isinstance(getattr(module, "__path__", None), list):
                module.__path__[:] = moved(module.__path__)
        sys.path_importer_cache.clear()
    if cfg["pid_namespace"]:
        go_r, go_w = os.pipe()
        child = os.fork()
        if child:
            # Tell the caller the worker's real pid (inside the new namespace it is 1), then wait.
            os.close(go_r)
            write_frame(resp, {"pid": child})
            os.write(go_w, b"x")
            for fd in (req, resp, go_w):
                os.close(fd)
            _, status = os.waitpid(child, 0)
            os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
        os.close(go_w)
        os.read(go_r, 1)
        os.close(go_r)
    else:
        write_frame(resp, {"pid": os.getpid()})
    if cfg["uid"] is not None:
        _drop_privileges(cfg["uid"])
    if libc is not None:
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # no setuid binaries
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # die with the launcher
    os.chdir(cfg["scratch"])
    del cfg, libc
    serve_program(req, resp)


# --------------------------------------------------------------------------------------------------
# The fast path: a fork server per pool slot.


class _ForkServer:
    """Runs as root inside its own mount and network namespaces, in the hidden view."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        import ctypes
        import fcntl
        import select
        import socket
        import time

        self.ctypes, self.fcntl, self.select, self.socket, self.time = ctypes, fcntl, select, socket, time
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.cfg = cfg
        self.control = socket.socket(fileno=cfg["control_fd"])
        self.child: int | None = None

    # -- set-up, once ------------------------------------------------------------------------------
    def _check(self, result: int, step: str) -> None:
        if result != 0:
            errno = self.ctypes.get_errno()
            raise OSError(errno, f"{step}: {os.strerror(errno)}")

    def _mount(self, source: str | None, target: str, fstype: str | None, flags: int, data: str | None,
               step: str) -> None:
        encoded = [None if v is None else v.encode() for v in (source, target, fstype, data)]
        self._check(self.libc.mount(encoded[0], encoded[1], encoded[2], flags, encoded[3]), step)

    def preload(self) -> None:
        """Import the modules programs commonly use: once here instead of once per program, and so
        that extension modules needing system libraries outside the view still work."""
        import importlib

        for name in self.cfg["preload"]:
            try:
                importlib.import_module(name)
            except ImportError:
                pass  # missing on this host: missing for programs too, as outside the sandbox

    def build_view(self) -> None:
        """The minimal tree, as the new root: the standard library read-only (installed packages
        masked), a few device nodes, and ``/tmp`` where each program mounts its scratch."""
        os.umask(0o022)
        self._check(self.libc.unshare(CLONE_NEWNS | CLONE_NEWNET), "unshare(mount, network)")
        self._mount(None, "/", None, MS_REC | MS_PRIVATE, None, "making the mount table private")
        root, stdlib = self.cfg["view"], self.cfg["stdlib"]
        self._mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=1024,mode=755",
                    "mounting the view's root tmpfs")
        os.makedirs(root + stdlib, 0o755)
        self._mount(stdlib, root + stdlib, None, MS_BIND | MS_REC, None, "binding the standard library")
        self._mount(None, root + stdlib, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None,
                    "making the standard library read-only")
        for name in self.cfg["masked"]:
            if os.path.isdir(os.path.join(stdlib, name)):
                self._mount("tmpfs", os.path.join(root + stdlib, name), "tmpfs",
                            MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,nr_inodes=4,mode=755",
                            f"masking {name}")
        os.makedirs(root + "/dev", 0o755)
        for name in VIEW_DEVICES:
            if os.path.exists("/dev/" + name):
                os.close(os.open(f"{root}/dev/{name}", os.O_WRONLY | os.O_CREAT, 0o666))
                self._mount("/dev/" + name, f"{root}/dev/{name}", None, MS_BIND, None, f"binding /dev/{name}")
        os.makedirs(root + SCRATCH, 0o755)
        os.chdir(root)
        number = SYS_PIVOT_ROOT.get(os.uname().machine)
        os.makedirs(root + "/.old", 0o700)
        if number is not None and self.libc.syscall(number, b".", b".old") == 0:
            self._check(self.libc.umount2(b"/.old", MNT_DETACH), "detaching the old root")
            os.chdir("/")
            os.rmdir("/.old")
        else:  # no pivot_root here: a chroot also hides the rest from an unprivileged program
            os.rmdir(root + "/.old")
            os.chroot(".")
            os.chdir("/")
        self._mount(None, "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None,
                    "making the view read-only")

    # -- per program ------------------------------------------------------------------------------
    def run(self, request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        """Fork the program's process: a short-lived child makes the new PID/mount/IPC namespaces
        and forks the program as their init (pid 1), so that all it starts dies with it."""
        if self.child is not None or len(fds) != 4:
            for fd in fds:
                os.close(fd)
            return {"error": "bad run request (a program is still running or fds are missing)"}
        pid_r, pid_w = os.pipe()
        go_r, go_w = os.pipe()
        first = os.fork()
        if first == 0:
            try:
                os.close(pid_r)
                os.close(go_w)
                if self.libc.unshare(CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC) != 0:
                    os._exit(self.ctypes.get_errno() or 1)
                program = os.fork()
                if program:
                    os.write(pid_w, program.to_bytes(4, "big"))
                    os._exit(0)
                os.close(pid_w)
                self._program_child(request, fds, go_r)
            finally:
                os._exit(127)
        os.close(pid_w)
        os.close(go_r)
        for fd in fds:
            os.close(fd)
        data = b""
        while chunk := os.read(pid_r, 4):
            data += chunk
        os.close(pid_r)
        _, status = os.waitpid(first, 0)
        if len(data) != 4:
            os.close(go_w)
            code = os.waitstatus_to_exitcode(status)
            return {"error": f"could not create the program's namespaces: {os.strerror(code) if code > 0 else code}"}
        # The program's process is now our child (we are a subreaper): let it go on.
        self.child = int.from_bytes(data, "big")
        os.write(go_w, b"g")
        os.close(go_w)
        return {"pid": self.child}

    def _program_child(self, request: dict[str, Any], fds: list[int], go_r: int) -> NoReturn:
        req, resp, out, err = fds
        if os.read(go_r, 1) != b"g":
            os._exit(0)
        os.close(go_r)
        uid = request["uid"]
        channel = resp
        try:
            self._mount("tmpfs", SCRATCH, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                        f"size={request['disk_bytes']},nr_inodes={request['disk_files']},mode=700,"
                        f"uid={uid},gid={uid}", "mounting the scratch tmpfs")
            devnull = os.open("/dev/null", os.O_RDONLY)
            # stdin, stdout, stderr, requests, responses on 0-4, the server's liveness pipe on 5.
            keep = [devnull, out, err, req, resp, self.cfg["life_fd"]]
            base = max(keep) + 1
            high = [self.fcntl.fcntl(fd, self.fcntl.F_DUPFD, base) for fd in keep]
            for i, fd in enumerate(high):
                os.dup2(fd, i)
            channel = 4
            os.closerange(len(keep), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
            _set_rlimits(request["rlimits"])
            _drop_privileges(uid)
            self.libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
            # Set after the uid change (which clears it); if the server died before, the pipe says so.
            self.libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
            if self.select.select([5], [], [], 0)[0]:
                os._exit(0)
            os.close(5)
            os.chdir(SCRATCH)
        except OSError as error:
            write_frame(channel, {"setup_error": str(error)})
            os._exit(0)
        serve_program(3, 4)

    def end(self, request: dict[str, Any]) -> dict[str, Any]:
        """End the running program (after ``grace_s`` seconds for one that is already exiting) and
        reap it; its PID namespace, scratch tmpfs and IPC objects go with it."""
        if self.child is None:
            return {"status": None}
        deadline = self.time.monotonic() + min(float(request.get("grace_s", 0.0)), 5.0)
        status = None
        while True:
            pid, found = os.waitpid(self.child, os.WNOHANG)
            if pid:
                status = found
                break
            if self.time.monotonic() >= deadline:
                break
            self.time.sleep(0.001)
        if status is None:
            os.kill(self.child, signal.SIGKILL)
            _, status = os.waitpid(self.child, 0)
        self.child = None
        return {"status": status}

    def serve(self) -> NoReturn:
        life_r, life_w = os.pipe()  # only this process holds life_w: programs see EOF when it dies
        self.cfg["life_fd"] = life_r
        try:
            self.preload()
            self.libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
            self.build_view()
            devnull = os.open("/dev/null", os.O_RDWR)
        except OSError as error:
            self._send({"error": str(error)})
            os._exit(1)
        self._send({"ready": True})
        os.dup2(devnull, 2)  # the caller's set-up error pipe is closed from here on
        os.close(devnull)
        while True:
            try:
                message, fds, _, _ = self.socket.recv_fds(self.control, 65536, 8)
            except OSError:
                message, fds = b"", []
            if not message:
                break
            request = json.loads(message)
            op = request.get("op")
            if op == "run":
                reply = self.run(request, fds)
            elif op == "end":
                reply = self.end(request)
            else:
                reply = {"error": f"unknown op {op!r}"}
            self._send(reply)
        self.end({})
        os._exit(0)

    def _send(self, obj: Any) -> None:
        self.control.send(json.dumps(obj).encode())


def main() -> NoReturn:
    cfg = json.loads(sys.argv[1])
    if cfg["mode"] == "fork_server":
        _ForkServer(cfg).serve()
    single(cfg)


if __name__ == "__main__":
    main()
