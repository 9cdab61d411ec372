"""Any registered env served over OpenEnv (docs/serving.md), and the remote env that talks to it.

``create_app(env_id, **make_kwargs)`` is the OpenEnv FastAPI app of one id (:mod:`llm_envs.serve.server`);
``serve(env_id, ...)`` runs it with uvicorn, stopping cleanly on SIGTERM; ``llm-envs serve ID`` is the command line.
The client side is :func:`llm_envs.remote.connect`. The server needs the ``serve`` extra
(``pip install 'llm-envs[serve]'``: OpenEnv, pinned); nothing here is imported by ``import llm_envs``.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

MISSING_EXTRA = ("serving needs the 'serve' extra: pip install 'llm-envs[serve]' (OpenEnv {version} and uvicorn); "
                 "missing: {name}")
OPENENV_VERSION = "0.10.0"
"""The OpenEnv release the server is built and tested on (pinned in pyproject's ``serve`` extra)."""


def _require_serving() -> None:
    try:
        import openenv  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as err:
        raise ImportError(MISSING_EXTRA.format(version=OPENENV_VERSION, name=err.name)) from err


def create_app(env_id: str, **kwargs: Any) -> Any:
    """The OpenEnv app of ``env_id`` (:func:`llm_envs.serve.server.create_app`: the arguments and what they do)."""
    _require_serving()
    from llm_envs.serve.server import create_app as _create_app

    return _create_app(env_id, **kwargs)


def _server(env_id: str, *, host: str, port: int, imports: Sequence[str], log_level: str, announce: bool,
            **kwargs: Any) -> Any:
    """The uvicorn server of ``env_id``'s app, its first SIGTERM draining (:func:`serve`)."""
    _require_serving()
    import importlib

    import uvicorn

    for name in imports:
        importlib.import_module(name)
    app = create_app(env_id, **kwargs)
    server_state = app.state.llm_env_server
    if announce:
        print(f"llm-envs: serving {env_id} on http://{host}:{port} (WebSocket /ws; Ctrl-C or SIGTERM stops it)",
              file=sys.stderr, flush=True)
    max_bytes = server_state.max_message_bytes

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if server_state.draining or sig != signal.SIGTERM:
                super().handle_exit(sig, frame)
                return
            server_state.begin_drain()
            logging.getLogger("llm_envs.serve").warning("SIGTERM: draining %d request(s) in flight",
                                                        server_state.inflight())

            def finish() -> None:
                deadline = time.monotonic() + server_state.drain_timeout_s
                while server_state.inflight() and time.monotonic() < deadline:
                    time.sleep(0.02)
                time.sleep(0.05)  # the last answers leave the socket
                super(_Server, self).handle_exit(sig, frame)

            threading.Thread(target=finish, daemon=True).start()

    # The socket layer's own limit sits above the app's, so an oversized message is answered by the app (the
    # connection stays) unless it is larger still.
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, ws_max_size=max(16 * max_bytes, 1 << 24),
                            ws="websockets-sansio", timeout_graceful_shutdown=5)
    return _Server(config)


def serve(env_id: str, *, host: str = "127.0.0.1", port: int = 8000, imports: Sequence[str] = (),
          log_level: str = "warning", announce: bool = False, **kwargs: Any) -> None:
    """Serve ``env_id`` with uvicorn until SIGTERM or SIGINT.

    On the first SIGTERM the server drains: new resets and steps get ``SHUTTING_DOWN``, the steps in flight finish
    and are answered (for up to ``drain_timeout_s``), then uvicorn closes the sockets and exits. ``imports``
    are modules imported first (a module that registers tasks of your own with ``llm_envs.register``);
    ``announce`` prints where it listens (on stderr) once the app is built.
    ``kwargs``: :func:`create_app`'s (``max_sessions=``, ``resume_timeout_s=``, make kwargs, ...).
    """
    _server(env_id, host=host, port=port, imports=imports, log_level=log_level, announce=announce, **kwargs).run()


class Background:
    """A server running in a thread of this process (:func:`background`): ``url``, ``port`` and ``close()``."""

    def __init__(self, server: Any, thread: threading.Thread, host: str, port: int) -> None:
        self._server, self._thread = server, thread
        self.host, self.port = host, port
        self.url = f"http://{host}:{port}"

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop the server: its sockets close, its sessions and their envs are freed."""
        self._server.should_exit = True
        self._thread.join(timeout_s)

    def __enter__(self) -> Background:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def background(env_id: str, *, host: str = "127.0.0.1", port: int = 0, start_timeout_s: float = 60.0,
               **kwargs: Any) -> Background:
    """Serve ``env_id`` from a thread of this process (a notebook, a test, an example): returns once it listens.
    ``port=0`` takes a free port (``.port`` says which). Generated code still runs in the sandbox's processes.
    ``kwargs``: :func:`serve`'s. Stop it with ``.close()`` or a ``with`` block."""
    if port == 0:
        from llm_envs.serve.process import free_port

        port = free_port(host)
    server = _server(env_id, host=host, port=port, imports=kwargs.pop("imports", ()),
                     log_level=kwargs.pop("log_level", "warning"), announce=False, **kwargs)
    thread = threading.Thread(target=server.run, name=f"llm-envs serve {env_id}", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError(f"The server of {env_id} stopped before it listened on {host}:{port} (see its log).")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise TimeoutError(f"The server of {env_id} did not listen on {host}:{port} within {start_timeout_s:g} s.")
        time.sleep(0.02)
    return Background(server, thread, host, port)


__all__ = ["OPENENV_VERSION", "Background", "background", "create_app", "serve"]
