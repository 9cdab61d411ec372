"""The caller's side of the protocol with a program's process: frames over its two pipes, with
deadlines (:class:`_Channel`), and the values that cross back, decoded as plain data or as an
:class:`OpaqueValue`. The process's side is :mod:`llm_envs.sandbox.worker`."""

from __future__ import annotations

import json
import os
import select
import signal
import struct
import time
from collections.abc import Mapping, Sequence
from typing import Any

from llm_envs.sandbox.limits import SandboxLimits
from llm_envs.sandbox.suite import _compiled
from llm_envs.sandbox.worker import PEER_BROKE as _PEER_BROKE
from llm_envs.sandbox.worker import PEER_GONE as _PEER_GONE
from llm_envs.sandbox.worker import DecodeError as _DecodeError
from llm_envs.sandbox.worker import decode as _decode_tree
from llm_envs.sandbox.worker import encode as _encode

PROGRAM_FILENAME = "<program>"
_FRAME_HEADER = struct.Struct(">I")


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


def _opaque(tag: str, rest: list) -> OpaqueValue:
    """The hook of :func:`_decode`: an opaque value; a reference (which only a program reads) is malformed here."""
    if tag != "o":
        raise _DecodeError(f"unknown value tag {tag!r}")
    return OpaqueValue(str(rest[0])[:100], str(rest[1])[:200])


def _decode(data: Any) -> Any:
    """A value the program's process sent (the worker's decoder, which it also reads the caller's with):
    plain data or an :class:`OpaqueValue`; anything malformed a :class:`_DecodeError`."""
    try:
        return _decode_tree(data, _opaque)
    except _DecodeError:
        raise
    except (TypeError, ValueError, IndexError, KeyError, ArithmeticError) as err:
        raise _DecodeError(f"malformed value ({type(err).__name__}: {err})") from None


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


def _error_pair(value: Any) -> tuple[str, str]:
    if isinstance(value, list) and len(value) == 2 and all(isinstance(v, str) for v in value):
        return value[0][:100], value[1][:500]
    return "Error", ""
