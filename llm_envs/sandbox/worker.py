"""The process side of :mod:`llm_envs.sandbox`. Run as a script; standard library only.

``python -I -S -B worker.py <config json>`` starts in one of two modes:

* ``"mode": "single"`` (the fallback path): limit, isolate and unprivilege this very process, then
  serve one program on the request/response pipes and exit.
* ``"mode": "fork_server"`` (the fast path, root only): set up once what every program shares (the
  interpreter with common modules imported, a PID namespace whose init is the server, a network
  namespace, the hidden file-system view), then for every ``run`` request on the control socket move
  to a fresh IPC namespace, mount a fresh size-capped tmpfs scratch and fork a child that drops to the
  run's uid and limits and serves one program; on ``end`` kill every process of the PID namespace but
  the server and unmount the scratch. The server itself never runs program code, so nothing a program
  does reaches the next.

Nothing here imports ``llm_envs``: the caller imports this module only for :func:`encode`.
"""

from __future__ import annotations

import builtins
import gc
import json
import marshal
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
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217, "riscv64": 41}
VIEW_DEVICES = ("null", "zero", "random", "urandom")
"""Device nodes the program sees under ``/dev`` (bound from the host)."""
SCRATCH = "/tmp"
PEER_GONE, PEER_BROKE = 86, 87
"""Exit statuses of a driver whose peer's process ended / broke their protocol (the caller reports the
peer's failure for the test)."""
VALUE_TYPES = {("datetime", "datetime"): "datetime", ("datetime", "date"): "date", ("datetime", "time"): "time",
               ("datetime", "timedelta"): "timedelta", ("decimal", "Decimal"): "decimal",
               ("fractions", "Fraction"): "fraction"}
"""Standard-library value types sent as text (tag ``x``) and rebuilt by the receiver (exact types only:
a subclass is not plain data)."""
"""Where each program's tmpfs scratch is mounted in the view: its cwd, ``HOME`` and ``TMPDIR``."""


def wait_status(child: int) -> int:
    """Wait for ``child``; its end as this process's exit status, the shell's way: 128 + N for death by
    signal N (the caller reads it back as that signal), the exit code otherwise.

    The init of a PID namespace ignores SIGXCPU (it has no handler), so a program running as init
    meets its CPU limit as the hard limit's SIGKILL: one that used up its CPU time is reported as
    killed by SIGXCPU, which is what the soft limit meant."""
    _, status, usage = os.wait4(child, 0)
    if not os.WIFSIGNALED(status):
        return os.waitstatus_to_exitcode(status) & 0xFF
    number = os.WTERMSIG(status)
    cpu_limit, _ = resource.getrlimit(resource.RLIMIT_CPU)  # inherited: the child's limit too
    if number == signal.SIGKILL and cpu_limit != resource.RLIM_INFINITY \
            and usage.ru_utime + usage.ru_stime >= cpu_limit:
        number = signal.SIGXCPU
    return 128 + number


def encode(value: Any, depth: int = 0, handle: Any = None) -> Any:
    """A value as tagged plain data (JSON-able); anything else becomes an opaque value, or what
    ``handle(value)`` makes of it: ``("h", id, type name)`` a handle to an object the sender keeps,
    ``("n", module, qualified name)`` a name the receiver looks up, ``("p", hex)`` a pickle (sent by
    a driver to its peer only, never read by a trusted side). A program that serves objects by
    reference defines ``__sandbox_handle__``; see :func:`serve_program`."""
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
        return ["l", [encode(v, depth + 1, handle) for v in value]]
    if isinstance(value, tuple):
        return ["t", [encode(v, depth + 1, handle) for v in value]]
    if isinstance(value, frozenset):
        return ["z", [encode(v, depth + 1, handle) for v in value]]
    if isinstance(value, set):
        return ["s", [encode(v, depth + 1, handle) for v in value]]
    if isinstance(value, dict):
        return ["d", [[encode(k, depth + 1, handle), encode(v, depth + 1, handle)] for k, v in value.items()]]
    kind = VALUE_TYPES.get((type(value).__module__, type(value).__qualname__))
    if kind is not None and sys.modules.get(type(value).__module__) is not None \
            and getattr(sys.modules[type(value).__module__], type(value).__qualname__, None) is type(value):
        return ["x", kind, str(value) if kind != "timedelta" else f"{value.days},{value.seconds},{value.microseconds}"]
    if handle is not None:
        ref = handle(value)
        if ref is not None and ref[0] == "h":
            return ["h", int(ref[1]), str(ref[2])]
        if ref is not None and ref[0] in ("n", "p"):
            return [ref[0], *(str(part) for part in ref[1:])]
    try:
        text = repr(value)[:200]
    except BaseException:
        text = ""
    return ["o", type(value).__name__, text]


class DecodeError(ValueError):
    """A value that is not what :func:`encode` writes (or nested deeper than it writes)."""


DECODE_DEPTH = ENCODE_DEPTH + 1  # the deepest value encode writes: its cut-off marker included
SCALARS = {"i": lambda r: int(r[0], 16), "f": lambda r: float(r[0]), "c": lambda r: complex(float(r[0]), float(r[1])),
           "b": lambda r: bytes.fromhex(r[0]), "x": lambda r: decode_value(str(r[0]), str(r[1]))}
CONTAINERS = {"l": list, "t": tuple, "s": set, "z": frozenset, "d": dict}


def decode(data: Any, hook: Any = None, depth: int = 0) -> Any:
    """Inverse of :func:`encode`, the one decoder of both sides (the caller's, :mod:`llm_envs.sandbox.wire`,
    reads an untrusted process's values with it): references and opaque values (tags ``h``, ``n``, ``o``,
    ``p``) become ``hook(tag, rest)``, whose errors pass through as they are; anything else that is not
    what encode writes raises :class:`DecodeError`."""
    if depth > DECODE_DEPTH:
        raise DecodeError("value nested too deeply")
    if data is None or isinstance(data, (bool, str)):
        return data
    if not isinstance(data, list) or not data or not isinstance(data[0], str):
        raise DecodeError(f"malformed value {str(data)[:80]!r}")
    tag, rest = data[0], data[1:]
    if tag in ("h", "n", "o", "p") and hook is not None:
        return hook(tag, rest)
    if tag not in SCALARS and tag not in CONTAINERS:
        raise DecodeError(f"unknown value tag {tag!r}")
    try:
        if tag in SCALARS:
            return SCALARS[tag](rest)
        items = [(k, v) for k, v in rest[0]] if tag == "d" else list(rest[0])
    except (TypeError, ValueError, IndexError, KeyError, ArithmeticError) as err:
        raise DecodeError(f"malformed value ({type(err).__name__}: {err})") from None
    # The items outside the try: a hook's own errors inside a container pass through too.
    if tag == "d":
        values: Any = [(decode(k, hook, depth + 1), decode(v, hook, depth + 1)) for k, v in items]
    else:
        values = [decode(v, hook, depth + 1) for v in items]
    try:
        return CONTAINERS[tag](values)
    except TypeError as err:  # an unhashable member of a set or key of a dict
        raise DecodeError(f"malformed value ({type(err).__name__}: {err})") from None


def decode_value(kind: str, text: str) -> Any:
    """A standard-library value sent as text (tag ``x``): datetime, date, time, timedelta, Decimal,
    Fraction."""
    if kind in ("datetime", "date", "time"):
        import datetime

        return getattr(datetime, kind).fromisoformat(text)
    if kind == "timedelta":
        import datetime

        days, seconds, microseconds = (int(part) for part in text.split(","))
        return datetime.timedelta(days, seconds, microseconds)
    if kind == "decimal":
        import decimal

        return decimal.Decimal(text)
    if kind == "fraction":
        import fractions

        return fractions.Fraction(text)
    raise ValueError("cannot decode a value of kind " + repr(kind))


def write_frame(fd: int, obj: Any) -> None:
    data = json.dumps(obj).encode()
    data = HEADER.pack(len(data)) + data
    while data:
        data = data[os.write(fd, data):]


def _read_exact(fd: int, n: int, eof_status: int = 0) -> bytes:
    chunks = []
    while n:
        chunk = os.read(fd, n)
        if not chunk:
            os._exit(eof_status)  # the caller hung up: nothing left to do (a driver's peer: see PEER_GONE)
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> Any:
    (n,) = HEADER.unpack(_read_exact(fd, 4))
    return json.loads(_read_exact(fd, n))


def _peer_frame(fd: int, max_bytes: int) -> Any:
    """A driver reads its peer's frame: the peer's end or any breach of the protocol ends the driver
    with :data:`PEER_GONE` / :data:`PEER_BROKE`, for the caller to report as the peer's."""
    (n,) = HEADER.unpack(_read_exact(fd, 4, PEER_GONE))
    if n > max_bytes:
        os._exit(PEER_BROKE)
    try:
        frame = json.loads(_read_exact(fd, n, PEER_GONE))
    except ValueError:
        os._exit(PEER_BROKE)
    if not isinstance(frame, dict):
        os._exit(PEER_BROKE)
    return frame


def _peer_write(fd: int, obj: Any) -> None:
    try:
        write_frame(fd, obj)
    except OSError:
        os._exit(PEER_GONE)


def _describe(err: BaseException) -> list[str]:
    return [type(err).__name__, str(err)[:500]]


def _load_peer(peer: tuple[int, int], init: dict[str, Any]) -> dict[str, Any] | None:
    """A driver loads its peer's program; the peer's load error as the frame to send the caller."""
    _peer_write(peer[0], {"program": init["peer_program"], "filename": init["filename"]})
    frame = _peer_frame(peer[1], init["max_bytes"])
    if frame.get("ready") is True:
        return None
    if "load_error" in frame or "setup_error" in frame:
        return {**frame, "peer": True}
    os._exit(PEER_BROKE)


def _relay(peer: tuple[int, int], namespace: dict[str, Any], max_bytes: int) -> Any:
    """``__sandbox_relay__(name, args, kwargs)`` of a driver: call ``name`` in its peer's process over
    their private pipes. Returns ``("ok", value)`` (decoded here: plain data, or what the driver's
    ``__sandbox_object__`` makes of references) or ``("raised", type name, message)``."""

    def relay(name: str, args: Any, kwargs: Any) -> tuple[Any, ...]:
        handle, hook = namespace.get("__sandbox_handle__"), namespace.get("__sandbox_object__")
        request = {"call": name, "args": [encode(a, 0, handle) for a in args],
                   "kwargs": [[k, encode(v, 0, handle)] for k, v in kwargs.items()]}
        _peer_write(peer[0], request)
        reply = _peer_frame(peer[1], max_bytes)
        try:
            if "ok" in reply:
                return ("ok", decode(reply["ok"], hook))
            kind, message = reply["raised"]
            return ("raised", str(kind)[:100], str(message)[:500])
        except (ValueError, TypeError, KeyError, IndexError, ArithmeticError, RecursionError):
            os._exit(PEER_BROKE)

    return relay


def serve_program(req: int, resp: int, peer: tuple[int, int] | None = None) -> NoReturn:
    """Load the program sent by the caller, then answer calls of its functions until hung up on.
    From here on nothing in this process is trusted.

    A program may serve objects by reference: ``__sandbox_handle__(value)`` gives the reference to send
    for a value that is not plain data (see :func:`encode`), ``__sandbox_object__(tag, rest)`` turns a
    received reference back into an object. A driver (``peer`` = its write and read ends of the pipes
    to its peer's process) first loads the peer's program, then gets ``__sandbox_relay__`` to call the
    peer's functions; it runs no peer code and decodes what the peer sends as data."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # oversized writes raise OSError instead of killing
    sys.setrecursionlimit(3000)
    init = read_frame(req)
    namespace = {"__name__": "__sandbox__", "__builtins__": builtins}
    if peer is not None:
        failed = _load_peer(peer, init)
        if failed is not None:
            write_frame(resp, failed)
            os._exit(0)
        namespace["__sandbox_relay__"] = _relay(peer, namespace, init["max_bytes"])
    try:
        if init.get("prelude"):  # trusted code the caller compiled (the same interpreter): a code object
            exec(marshal.loads(bytes.fromhex(init["prelude"])), namespace)
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
            hook = namespace.get("__sandbox_object__")
            args = [decode(a, hook) for a in request["args"]]
            kwargs = {k: decode(v, hook) for k, v in request["kwargs"]}
            result = encode(function(*args, **kwargs), 0, namespace.get("__sandbox_handle__"))
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
    status = cfg.get("pid_fd", resp)  # a peer's requests and responses are its driver's: it reports its pid apart
    peer = tuple(cfg["peer_fds"]) if cfg.get("peer_fds") else None
    _set_rlimits(cfg["rlimits"])
    libc = None
    if cfg["unshare_flags"] or cfg["uid"] is not None or cfg.get("nondumpable"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
    if cfg["unshare_flags"] and libc.unshare(cfg["unshare_flags"]) != 0:
        os._exit(121)
    if cfg["stdlib"]:
        # The dropped uid may not traverse the directory the interpreter lives in (a pyenv under /root):
        # show it the standard library read-only inside the scratch directory, in a private mount table.
        # A driver's view is outside the scratch it shares with its peer, in a directory the run's uid
        # cannot write: the peer cannot swap the driver's standard library for modules of its own.
        view = os.path.join(cfg.get("view_dir") or cfg["scratch"], ".python")
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
            write_frame(status, {"pid": child})
            os.write(go_w, b"x")
            for fd in {req, resp, go_w, status, *(peer or ())}:
                os.close(fd)
            os._exit(wait_status(child))
        os.close(go_w)
        os.read(go_r, 1)
        os.close(go_r)
    else:
        write_frame(status, {"pid": os.getpid()})
    if cfg["uid"] is not None:
        _drop_privileges(cfg["uid"])
    if libc is not None:
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # no setuid binaries
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # die with the launcher
        if cfg.get("nondumpable"):  # a driver: no process of the same uid may ptrace it
            libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    os.chdir(cfg["scratch"])
    del cfg, libc
    if status != resp:
        os.close(status)
    serve_program(req, resp, peer)


# --------------------------------------------------------------------------------------------------
# The fast path: a fork server per pool slot.


class _ForkServer:
    """Runs as root, as the init (pid 1) of its own PID namespace, inside its own mount and network
    namespaces, in the hidden view. Program processes are the only other members of its PID
    namespace: after each program one ``kill(-1)`` ends every process it started, and if the server
    dies the kernel kills them all."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        # Imported here, not at the top: the caller imports this module for ``encode`` only.
        import ctypes
        import fcntl
        import socket
        import time

        self.ctypes, self.fcntl, self.socket, self.time = ctypes, fcntl, socket, time
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.cfg = cfg
        self.control = socket.socket(fileno=cfg["control_fd"])
        self.child: int | None = None
        self.peer_child: int | None = None
        self.scratch_mounted = False
        self.devnull = -1

    # -- set-up, once ------------------------------------------------------------------------------
    def _check(self, result: int, step: str) -> None:
        if result != 0:
            errno = self.ctypes.get_errno()
            raise OSError(f"{step}: {os.strerror(errno)} (errno {errno})")

    def _mount(self, source: str | None, target: str, fstype: str | None, flags: int, data: str | None,
               step: str) -> None:
        encoded = [None if v is None else v.encode() for v in (source, target, fstype, data)]
        self._check(self.libc.mount(encoded[0], encoded[1], encoded[2], flags, encoded[3]), step)

    def enter_pid_namespace(self) -> None:
        """Fork into a new PID namespace as its init; the launcher process stays outside, tells the
        caller the server's pid, waits for it and exits with its status."""
        self._check(self.libc.unshare(CLONE_NEWPID), "unshare(pid)")
        server = os.fork()
        if server:
            self._send({"pid": server})
            self.control.close()
            os._exit(wait_status(server))

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
    # Work done here, in the server before the fork, costs no copy-on-write page faults: a fork
    # shares the server's pages with the child, and Python touches (refcounts) every object it uses.

    def run(self, request: dict[str, Any], fds: list[int]) -> dict[str, Any]:
        """Give the next program a fresh IPC namespace and scratch tmpfs, then fork its process. With
        ``"layout": [6, 4]`` it forks two: a driver (6 descriptors: the caller's 4 and its pipes to the
        peer) and its peer (4), sharing the scratch and the uid. Every program process is
        non-dumpable, so that a peer cannot ptrace its driver."""
        try:
            layout = request.get("layout", [4])
            if self.child is not None or layout not in ([4], [6, 4]) or len(fds) != sum(layout):
                return {"error": "bad run request (a program is still running or fds are missing)"}
            uid = request["uid"]
            try:
                # The server moves to a new IPC namespace: the last one, with any System V objects
                # of the last program, is freed with it.
                self._check(self.libc.unshare(CLONE_NEWIPC), "unshare(ipc)")
                self._mount("tmpfs", SCRATCH, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                            f"size={request['disk_bytes']},nr_inodes={request['disk_files']},mode=700,"
                            f"uid={uid},gid={uid}", "mounting the scratch tmpfs")
                self.scratch_mounted = True
                pids, first = [], 0
                for count in layout:
                    child = os.fork()
                    if child == 0:
                        try:
                            self._program_child(request, fds[first:first + count])
                        finally:
                            os._exit(127)
                    first += count
                    pids.append(child)
                    self.child, self.peer_child = pids[0], (pids[1] if len(pids) > 1 else None)
            except OSError as error:
                return {"error": str(error)}
            return {"pid": pids[0], "peer_pid": self.peer_child}
        finally:
            for fd in fds:
                os.close(fd)

    def _program_child(self, request: dict[str, Any], fds: list[int]) -> NoReturn:
        """The program's process, until it runs the program: descriptors, limits, uid, cwd."""
        req, resp, out, err, *to_peer = fds
        channel = resp
        try:
            # stdin, stdout, stderr, requests, responses: 0-4; a driver's pipes to its peer: 5, 6
            keep = [self.devnull, out, err, req, resp, *to_peer]
            base = max(keep) + 1
            high = [self.fcntl.fcntl(fd, self.fcntl.F_DUPFD, base) for fd in keep]
            for i, fd in enumerate(high):
                os.dup2(fd, i)
            channel = 4
            os.closerange(len(keep), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
            _set_rlimits(request["rlimits"])
            _drop_privileges(request["uid"])
            self._check(self.libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(dumpable)")
            os.chdir(SCRATCH)
        except OSError as error:
            write_frame(channel, {"setup_error": str(error)})
            os._exit(0)
        serve_program(3, 4, (5, 6) if to_peer else None)

    def end(self, request: dict[str, Any]) -> dict[str, Any]:
        """End the running program (after ``grace_s`` seconds for one that is already exiting: the
        peer if ``wait_for`` says so): kill every other process of the namespace, reap them all and
        unmount the scratch. Returns the program's wait status (and its peer's)."""
        status = peer_status = None
        waited = self.peer_child if request.get("wait_for") == "peer" else self.child
        if waited is not None:
            deadline = self.time.monotonic() + min(float(request.get("grace_s", 0.0)), 5.0)
            while True:
                pid, found = os.waitpid(waited, os.WNOHANG)
                if pid:
                    if waited == self.child:
                        status = found
                    else:
                        peer_status = found
                    break
                if self.time.monotonic() >= deadline:
                    break
                self.time.sleep(0.001)
        # As init, kill(-1) reaches every process of this PID namespace but the server itself: the
        # program's process and anything it left behind (orphans are reparented to the server). It is
        # repeated before every wait, so that nothing can outlast the loop.
        while True:
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                pass  # nothing left but zombies
            try:
                pid, found = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            if pid == self.child:
                status = found
            elif pid == self.peer_child:
                peer_status = found
        self.child = self.peer_child = None
        if self.scratch_mounted:
            self.scratch_mounted = False
            self._check(self.libc.umount2(SCRATCH.encode(), MNT_DETACH), "unmounting the scratch tmpfs")
        return {"status": status, "peer_status": peer_status}

    def serve(self) -> NoReturn:
        try:
            self.enter_pid_namespace()
            self.preload()
            self.build_view()
            self.devnull = os.open("/dev/null", os.O_RDWR)
            # No program gains privileges through execve (the view holds no set-uid file anyway).
            self._check(self.libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(no_new_privs)")
        except OSError as error:
            self._send({"error": str(error)})
            os._exit(1)
        self._send({"ready": True})
        os.dup2(self.devnull, 2)  # the caller's set-up error pipe is closed from here on
        gc.freeze()  # the set-up's objects: never traversed by a program's garbage collector
        while True:
            try:
                message, fds, _, _ = self.socket.recv_fds(self.control, 65536, 16)
            except OSError:
                message, fds = b"", []
            if not message:
                break
            request = json.loads(message)
            op = request.get("op")
            if op == "run":
                reply = self.run(request, fds)
            elif op == "end":
                try:
                    reply = self.end(request)
                except OSError as error:
                    reply = {"error": str(error)}
            else:
                reply = {"error": f"unknown op {op!r}"}
            self._send(reply)
        os._exit(0)  # as init: the kernel kills whatever still runs in the namespace

    def _send(self, obj: Any) -> None:
        self.control.send(json.dumps(obj).encode())


def main() -> NoReturn:
    cfg = json.loads(sys.argv[1])
    if cfg["mode"] == "fork_server":
        _ForkServer(cfg).serve()
    single(cfg)


if __name__ == "__main__":
    main()
