"""A real ``llm-envs serve`` server for a test: a uvicorn process listening on 127.0.0.1 at a free port, started
with the given id and flags, waited for (``GET /health``) and stopped by its process id when the test ends
(SIGTERM, then SIGKILL if it does not exit). Its output goes to a log file that a failing test prints."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

START_TIMEOUT_S = 90.0
"""Importing OpenEnv and building the env's tokenizer take seconds on a cold 2-core machine."""
STOP_TIMEOUT_S = 20.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """One running server: ``url``, ``port``, ``proc`` (its ``pid``), ``log`` (its output so far)."""

    def __init__(self, proc: subprocess.Popen, port: int, log_path: Path) -> None:
        self.proc, self.port, self.log_path = proc, port, log_path
        self.url = f"http://127.0.0.1:{port}"

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=30) as response:
            return json.loads(response.read())

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Stop the server by its pid; its exit status (negative: the signal that ended it)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(STOP_TIMEOUT_S)
        return self.proc.returncode


def start_server(env_id: str, *args: str, log_dir: Path, env: dict[str, str] | None = None,
                 make_kwargs: dict[str, Any] | None = None) -> Served:
    """Start ``llm-envs serve env_id --port P args...`` on 127.0.0.1 and wait until it answers ``/health``."""
    port = free_port()
    log_path = log_dir / f"server-{port}.log"
    command = [sys.executable, "-m", "baselines.infra.cli", "serve", env_id, "--host", "127.0.0.1", "--port", str(port),
               *(["--make-kwargs", json.dumps(make_kwargs)] if make_kwargs else []), *args]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})
    served = Served(proc, port, log_path)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before answering:\n{served.log}")
        try:
            served.get("/health")
            return served
        except OSError:
            time.sleep(0.1)
    served.stop(signal.SIGKILL)
    raise RuntimeError(f"the server did not answer /health within {START_TIMEOUT_S:g} s:\n{served.log}")


@contextlib.contextmanager
def running(env_id: str, *args: str, log_dir: Path, **kwargs: Any) -> Iterator[Served]:
    """:func:`start_server` for a ``with`` block; the server is stopped (by its pid) however the block ends."""
    served = start_server(env_id, *args, log_dir=log_dir, **kwargs)
    try:
        yield served
    finally:
        served.stop()


def import_path_env(paths: Sequence[Path]) -> dict[str, str]:
    """An environment whose PYTHONPATH adds ``paths`` (a module of the test's own for ``--import``)."""
    extra = os.pathsep.join(str(p) for p in paths)
    current = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": extra if not current else extra + os.pathsep + current}
