"""A server in a process of its own, for tests, benches and scripts: :func:`spawn` starts ``llm-envs serve ID`` on
127.0.0.1 at a free port (:func:`spawn_command` any command that takes its port last and answers ``GET /health``),
waits until it answers, and :meth:`Spawned.stop` stops it by its process id (SIGTERM, then SIGKILL if it does not
exit). Its output goes to a log file, which a failing caller can print (``.log``). Needs no web framework here."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

START_TIMEOUT_S = 90.0
"""Importing OpenEnv and building the env's tokenizer take seconds on a cold 2-core machine."""
STOP_TIMEOUT_S = 20.0


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the kernel's choice)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Spawned:
    """One running server process: ``url``, ``port``, ``proc`` (its ``pid``), ``log`` (its output so far)."""

    def __init__(self, proc: subprocess.Popen, port: int, log_path: Path, host: str = "127.0.0.1") -> None:
        self.proc, self.port, self.log_path = proc, port, log_path
        self.url = f"http://{host}:{port}"

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def get(self, path: str) -> Any:
        """``GET path`` as JSON."""
        with urllib.request.urlopen(self.url + path, timeout=30) as response:
            return json.loads(response.read())

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        """Stop the server by its pid; its exit status (negative: the signal that ended it)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(STOP_TIMEOUT_S)
        return self.proc.returncode


def spawn_command(command: Sequence[str], *, log_path: Path, env: Mapping[str, str] | None = None,
                  host: str = "127.0.0.1", start_timeout_s: float = START_TIMEOUT_S) -> Spawned:
    """Start ``command + [port]`` at a free port and wait until it answers ``GET /health``; its output goes to
    ``log_path``. A process that exits or does not answer in time raises ``RuntimeError`` with its log; on any
    error while waiting (Ctrl-C included) the process is stopped first."""
    port = free_port(host)
    with open(log_path, "w") as log:
        proc = subprocess.Popen([*command, str(port)], stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
    spawned = Spawned(proc, port, Path(log_path), host)
    deadline = time.monotonic() + start_timeout_s
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{log_path.stem} exited with {proc.returncode} before answering:\n{spawned.log}")
            try:
                spawned.get("/health")
                return spawned
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"the server did not answer /health within {start_timeout_s:g} s:\n{spawned.log}")
    except BaseException:  # a failed start, or Ctrl-C while waiting: the process never outlives its caller
        spawned.stop(signal.SIGKILL)
        raise


def spawn(env_id: str, *flags: str, log_path: Path, make_kwargs: Mapping[str, Any] | None = None,
          env: Mapping[str, str] | None = None, host: str = "127.0.0.1") -> Spawned:
    """``llm-envs serve env_id --host host [--make-kwargs JSON] flags... --port P`` in a process of its own, at a
    free port, answering once this returns."""
    command = [sys.executable, "-m", "baselines.infra.cli", "serve", env_id, "--host", host,
               *(["--make-kwargs", json.dumps(dict(make_kwargs))] if make_kwargs else []), *flags, "--port"]
    return spawn_command(command, log_path=log_path, env=env, host=host)
