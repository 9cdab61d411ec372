"""The client's side of a served env's WebSocket (:mod:`llm_envs.remote` builds its envs on it): one session's
socket, reconnected to the same session after a drop with the request resent, the server's errors raised as the
env's own exception types, and the plain HTTP reads (the spec, OpenEnv's task API). Needs ``websockets`` only."""

from __future__ import annotations

import builtins
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from llm_envs.serve.wire import ERROR_TYPES

RECONNECT_BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0)


class RemoteEnvError(RuntimeError):
    """An error the server reported that is not the env's own (capacity, shutdown, an expired session, a message
    the server could not read); ``code`` is the server's error code."""

    def __init__(self, message: str, code: str | None = None, data: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.data = dict(data or {})


class ConnectionLost(RemoteEnvError, ConnectionError):
    """The connection dropped and the session could not be resumed within ``resume_timeout_s``."""


def http_base(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    if scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"url must be http(s)://host:port (or ws(s)://), got {url!r}.")
    return f"{scheme}://{parts.netloc}{parts.path.rstrip('/').removesuffix('/ws')}"


def get_json(url: str, timeout_s: float, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace")
        raise RemoteEnvError(f"{url} answered {err.code}: {detail}", code=str(err.code)) from err
    except (urllib.error.URLError, OSError) as err:
        raise ConnectionLost(f"Cannot reach {url}: {err}. Is `llm-envs serve ID` running there?") from err


class Channel:
    """One session's WebSocket, reconnected to the same session after a drop."""

    def __init__(self, base: str, *, session_id: str | None, timeout_s: float, resume_timeout_s: float) -> None:
        self.base = base
        self.session_id = session_id
        self.timeout_s = timeout_s
        self.resume_timeout_s = resume_timeout_s
        self._ws: Any = None
        self.reconnects = 0

    def _ws_url(self) -> str:
        ws = "wss" if self.base.startswith("https") else "ws"
        url = f"{ws}://{self.base.split('://', 1)[1]}/ws"
        return url if self.session_id is None else f"{url}?session_id={urllib.parse.quote(self.session_id)}"

    def _open(self) -> None:
        from websockets.sync.client import connect

        kwargs = {"open_timeout": self.timeout_s, "max_size": None, "compression": None}
        try:  # a socket held across calls: websockets 17.1+ warns unless it is told so (legacy=True)
            self._ws = connect(self._ws_url(), legacy=True, **kwargs)
        except TypeError:  # 17.0 has no such flag, nor the warning
            self._ws = connect(self._ws_url(), **kwargs)

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send one message, return the answer's ``data``; reconnect and resend after a dropped connection."""
        from websockets.exceptions import ConnectionClosed

        text = json.dumps(message, allow_nan=False)
        deadline: float | None = None
        attempt = 0
        while True:
            try:
                if self._ws is None:
                    self._open()
                self._ws.send(text)
                answer = json.loads(self._ws.recv(timeout=self.timeout_s))
                break
            except (ConnectionClosed, OSError) as err:
                self._drop()
                if isinstance(err, TimeoutError):
                    raise ConnectionLost(f"No answer to {message['type']!r} within {self.timeout_s:g} s.") from err
                now = time.monotonic()
                deadline = deadline or now + self.resume_timeout_s
                if now >= deadline:
                    raise ConnectionLost(
                        f"Lost the connection to {self.base} and could not resume session {self.session_id} within "
                        f"{self.resume_timeout_s:g} s: {err}") from err
                time.sleep(RECONNECT_BACKOFF_S[min(attempt, len(RECONNECT_BACKOFF_S) - 1)])
                attempt += 1
                self.reconnects += 1
        kind, data = answer.get("type"), answer.get("data", {})
        if kind == "error":
            code = data.get("code")
            text = data.get("message", "")
            error_type = data.get("error_type")
            if code in ("UNKNOWN_SESSION", "CAPACITY_REACHED", "SHUTTING_DOWN", "IDLE_TIMEOUT", "FACTORY_ERROR"):
                self._drop()
            if error_type in ERROR_TYPES:
                raise getattr(builtins, error_type)(text)
            raise RemoteEnvError(f"{text} ({code})", code=code, data=data)
        return data

    def drop_connection(self) -> None:
        """Close the socket without closing the session (what a network fault does): the next request resumes."""
        if self._ws is not None:
            self._ws.close(code=4001, reason="client dropped the connection")
        self._ws = None

    def _drop(self) -> None:
        if self._ws is not None:
            try:
                self._ws.close()
            except Exception:
                pass
        self._ws = None

    def close(self) -> None:
        """Close the session on the server (its env is freed) and the socket. A session this channel holds but never
        attached to (a copy's fork) is attached first, so that it does not wait out its resume timeout. A request
        after it starts a new session (a reset first, as for a new env)."""
        if self._ws is None and self.session_id is not None:
            try:
                self._open()
            except Exception:
                self.session_id = None
                return
        if self._ws is not None:
            try:
                self._ws.send(json.dumps({"type": "close"}))
            except Exception:
                pass
            self._drop()
        self.session_id = None
