"""A real ``llm-envs serve`` server for a test (:mod:`llm_envs.serve.process`): a uvicorn process listening on
127.0.0.1 at a free port, started with the given id and flags, waited for (``GET /health``) and stopped by its
process id when the test ends (SIGTERM, then SIGKILL if it does not exit). Its output goes to a log file that a
failing test prints."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from llm_envs.serve.process import START_TIMEOUT_S as START_TIMEOUT_S
from llm_envs.serve.process import Spawned, free_port, spawn

Served = Spawned
"""One running server: ``url``, ``port``, ``proc`` (its ``pid``), ``log``, ``get(path)``, ``stop()``."""

__all__ = ["START_TIMEOUT_S", "Served", "free_port", "import_path_env", "running", "start_server"]


def start_server(env_id: str, *args: str, log_dir: Path, env: dict[str, str] | None = None,
                 make_kwargs: dict[str, Any] | None = None) -> Served:
    """Start ``llm-envs serve env_id --port P args...`` on 127.0.0.1 and wait until it answers ``/health``."""
    log_path = log_dir / f"server-{env_id.replace('/', '-')}-{os.urandom(3).hex()}.log"
    return spawn(env_id, *args, log_path=log_path, make_kwargs=make_kwargs, env=env)


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
