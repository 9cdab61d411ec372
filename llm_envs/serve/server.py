"""The OpenEnv server of one registered env: OpenEnv's own app (``HTTPEnvServer``: ``/health``, ``/schema``,
``/metadata``, ``/reset``, ``/step``, ``/mcp``, the task API) with its WebSocket route made to keep a session whose
connection dropped, so that the client can resume the episode (docs/serving.md).

What is OpenEnv's and what is ours:

======================  =================================================================================
OpenEnv 0.10            one env per session on ``WS /ws``; ``/ws?session_id=`` attaches a socket to a live
                        session; ``max_concurrent_envs`` and its capacity error; the task API
                        (``/{name}/splits|tasks|num_tasks|task|task_range``); the messages ``reset``,
                        ``step``, ``state``, ``close`` and their answers ``observation``, ``state``, ``error``
ours                    a session outlives its socket: a dropped connection leaves it *detached* for
                        ``resume_timeout_s`` (then it is closed), and ``/ws?session_id=`` (or
                        ``?episode_id=``) resumes it, the newest socket taking over; a step carries its
                        ``step_index`` and a reset its ``episode_id``, so a request resent after a drop is
                        answered from the one it repeats, never applied twice; SIGTERM drains (steps in
                        flight finish and are answered, new ones are refused with ``SHUTTING_DOWN``);
                        messages over ``max_message_bytes`` and idle sockets get an error, not a crash;
                        ``observe`` and ``fork`` messages (any agent's observation under the sequential
                        protocol; a copy of the session, for ``copy.deepcopy`` and pickling of the
                        remote env); ``GET /state?session_id=`` (a session's state) and
                        ``GET /llm-envs/spec`` (what a client rebuilds the spaces from)
======================  =================================================================================

Generated code never runs in this process: the code envs hand it to the sandbox's pool of fork servers
(:mod:`llm_envs.sandbox`), one short-lived process per program, taken for the program's run and given back.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import os
import re
import threading
import time
from typing import Any

from fastapi import FastAPI, HTTPException, Request, WebSocket
from fastapi.responses import JSONResponse
from openenv.core.env_server.exceptions import EnvironmentFactoryError, SessionCapacityError
from openenv.core.env_server.http_server import HTTPEnvServer
from openenv.core.env_server.types import (
    ConcurrencyConfig,
    WSErrorCode,
)
from pydantic import ValidationError
from starlette.websockets import WebSocketDisconnect, WebSocketState

import llm_envs
from llm_envs.serve.env import MultiAgentAction, MultiAgentObservation, MultiAgentState, ServedEnv, serialize
from llm_envs.serve.wire import ERROR_TYPES, WIRE_VERSION, env_spec, json_value

log = logging.getLogger("llm_envs.serve")

DEFAULT_MAX_SESSIONS = 64
DEFAULT_RESUME_TIMEOUT_S = 60.0
"""How long a session whose connection dropped waits for its client to resume it."""
DEFAULT_IDLE_TIMEOUT_S = 900.0
"""How long a connected socket may stay silent before its session is closed (a trainer generating for minutes
stays well inside it)."""
DEFAULT_MAX_MESSAGE_BYTES = 1 << 20
"""The longest message the server reads; a longer one gets ``MESSAGE_TOO_LARGE`` (the session is unchanged)."""
DEFAULT_DRAIN_TIMEOUT_S = 30.0
DEFAULT_MAX_CONCURRENT_STEPS = 2 * (os.cpu_count() or 1)
"""Resets and steps that run at once, whatever the number of sessions: a code env's step runs programs in the
sandbox, one fork server each, so without a cap 64 sessions would run 64 programs (and keep 64 servers) on 2 cores.
Twice the cores keeps them busy while programs wait on their pipes; the others queue in order."""
"""How long SIGTERM waits for steps in flight before the server stops anyway."""
SPEC_ROUTE = "/llm-envs/spec"

# Error codes beyond OpenEnv's WSErrorCode (strings on the wire, as OpenEnv's are).
SHUTTING_DOWN = "SHUTTING_DOWN"
MESSAGE_TOO_LARGE = "MESSAGE_TOO_LARGE"
IDLE_TIMEOUT = "IDLE_TIMEOUT"
UNKNOWN_SESSION = "UNKNOWN_SESSION"


# ------------------------------------------------------------------------------------------------ the server
class _Session:
    """What the server keeps of a session beyond OpenEnv's registry: its socket, when it was detached, and the
    lock that serialises its messages across sockets."""

    __slots__ = ("detached_at", "lock", "socket")

    def __init__(self) -> None:
        self.socket: WebSocket | None = None
        self.detached_at: float | None = None
        self.lock = asyncio.Lock()


class LLMEnvServer(HTTPEnvServer):
    """OpenEnv's ``HTTPEnvServer`` with sessions that survive their socket (the module docstring)."""

    def __init__(self, env_id: str, make_kwargs: dict[str, Any], *, max_sessions: int = DEFAULT_MAX_SESSIONS,
                 resume_timeout_s: float = DEFAULT_RESUME_TIMEOUT_S, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S, replica: str | None = None,
                 max_concurrent_steps: int = DEFAULT_MAX_CONCURRENT_STEPS) -> None:
        if replica is not None and not re.fullmatch(r"[A-Za-z0-9_]{1,32}", replica):
            raise ValueError(f"replica must be 1-32 letters, digits or underscores, got {replica!r}.")
        for name, value in (("resume_timeout_s", resume_timeout_s), ("idle_timeout_s", idle_timeout_s),
                            ("drain_timeout_s", drain_timeout_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}.")
        for name, value in (("max_sessions", max_sessions), ("max_message_bytes", max_message_bytes),
                            ("max_concurrent_steps", max_concurrent_steps)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
        self.probe = ServedEnv(env_id, make_kwargs)  # an unknown id or a bad kwarg fails here, before serving
        self.spec = {**env_spec(self.probe.env), "make_kwargs": json_value(make_kwargs)}
        super().__init__(
            functools.partial(ServedEnv, env_id, dict(make_kwargs)),
            MultiAgentAction,
            MultiAgentObservation,
            concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_sessions, session_timeout=None),
            env_name=env_id.replace("/", "-"),
            state_cls=MultiAgentState,
        )
        self.env_id = env_id
        self.replica = replica
        self.resume_timeout_s = float(resume_timeout_s)
        self.idle_timeout_s = float(idle_timeout_s)
        self.max_message_bytes = max_message_bytes
        self.drain_timeout_s = float(drain_timeout_s)
        self._extra: dict[str, _Session] = {}
        self._inflight = 0
        self._inflight_lock = threading.Lock()
        self.draining = False
        self._reaper: asyncio.Task | None = None
        self.max_concurrent_steps = max_concurrent_steps
        self._step_slots = asyncio.Semaphore(max_concurrent_steps)

    # -------------------------------------------------------------------------------- sessions
    async def _new_session(self, copy_of: ServedEnv | None = None) -> tuple[str, ServedEnv]:
        """A session from OpenEnv's own ``_create_session`` (its capacity check, executor and records), named with
        the replica's prefix; for a fork, the session's env is then the copy (the fresh env it was made with is
        closed: a ``make`` of a cached env costs under a millisecond)."""
        session_id, env = await self._create_session()
        if self.replica is not None:
            session_id = await self._rename_session(session_id, f"{self.replica}-{session_id}")
        if copy_of is not None:
            env.close()
            env = self._sessions[session_id] = copy_of
        env.session_id = session_id
        if env._last is not None:
            env._last = env._last.model_copy(update={"session_id": session_id,
                                                      "metadata": {**env._last.metadata, "session_id": session_id}})
        self._extra[session_id] = _Session()
        return session_id, env

    async def _rename_session(self, old: str, new: str) -> str:
        """Move OpenEnv's records of a session to another id (the replica's prefix: docs/serving.md, replicas)."""
        async with self._session_lock:
            for table in (self._sessions, self._session_executors, self._session_stacks, self._session_info):
                if old in table:
                    table[new] = table.pop(old)
            if new in self._session_info:
                self._session_info[new].session_id = new
        return new

    def find_session(self, session_id: str | None = None, episode_id: str | None = None) -> str:
        """The live session of ``session_id`` or holding the episode ``episode_id``; KeyError if none."""
        if session_id is not None:
            if session_id in self._extra and self._sessions.get(session_id) is not None:
                return session_id
            raise KeyError(f"Unknown session_id {session_id!r}: it was closed, expired (a dropped connection is kept "
                           f"{self.resume_timeout_s:g} s) or never existed.")
        for sid, env in self._sessions.items():
            if env is not None and sid in self._extra and env.episode_id == episode_id:
                return sid
        raise KeyError(f"No session holds episode_id {episode_id!r}: it was closed, expired or never existed.")

    async def close_session(self, session_id: str) -> None:
        self._extra.pop(session_id, None)
        await self._destroy_session(session_id)

    async def _reap(self) -> None:
        interval = min(1.0, self.resume_timeout_s / 4)
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            expired = [sid for sid, s in list(self._extra.items()) if s.socket is None
                       and s.detached_at is not None and now - s.detached_at > self.resume_timeout_s]
            for sid in expired:
                log.info("session %s expired (detached for over %g s)", sid, self.resume_timeout_s)
                await self.close_session(sid)

    # -------------------------------------------------------------------------------- draining (SIGTERM)
    def begin_drain(self) -> None:
        """Refuse new resets and steps from now on; the ones in flight finish and are answered."""
        self.draining = True

    def inflight(self) -> int:
        return self._inflight

    # -------------------------------------------------------------------------------- routes
    def register(self, app: FastAPI) -> None:
        self.register_routes(app)
        # OpenEnv's /ws and /state are replaced by ours (same messages; sessions that outlive their socket).
        app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) not in ("/ws", "/state")]

        async def start_reaper() -> None:
            self._reaper = asyncio.create_task(self._reap())

        async def stop() -> None:
            if self._reaper is not None:
                self._reaper.cancel()
            for sid in list(self._extra):
                await self.close_session(sid)

        app.router.on_startup.append(start_reaper)
        app.router.on_shutdown.append(stop)

        @app.get(SPEC_ROUTE, tags=["Environment Info"], summary="What a client rebuilds the env's spaces from")
        async def spec() -> dict[str, Any]:
            return {**self.spec, "max_sessions": self._max_concurrent_envs, "replica": self.replica,
                "max_concurrent_steps": self.max_concurrent_steps,
                    "resume_timeout_s": self.resume_timeout_s, "max_message_bytes": self.max_message_bytes}

        @app.get("/state", response_model=MultiAgentState, tags=["State Management"],
                 summary="A session's state (?session_id= or ?episode_id=), else a fresh env's")
        async def state(session_id: str | None = None, episode_id: str | None = None) -> MultiAgentState:
            if session_id is None and episode_id is None:
                return self.probe.state.model_copy(update={"session_id": None})
            try:
                sid = self.find_session(session_id, episode_id)
            except KeyError as err:
                raise HTTPException(status_code=404, detail=err.args[0]) from err
            env = self._sessions[sid]
            async with self._extra[sid].lock:
                return await self._run_in_session_executor(sid, lambda: env.state)

        @app.websocket("/ws")
        async def ws(websocket: WebSocket) -> None:
            await self._serve_socket(websocket)

        @app.exception_handler(ValidationError)
        async def validation_error(request: Request, err: ValidationError) -> JSONResponse:
            return JSONResponse(status_code=422, content={"detail": json_value(err.errors())})

        for kind in (KeyError, ValueError, TypeError, RuntimeError, IndexError):
            app.add_exception_handler(kind, _env_error_response)

    # -------------------------------------------------------------------------------- the socket
    async def _serve_socket(self, websocket: WebSocket) -> None:
        await websocket.accept()
        sid: str | None = None
        keep = True  # a dropped connection keeps its session; an explicit close or a fatal error does not
        try:
            if self.draining:
                await _send(websocket, _error("The server is shutting down; connect to another replica.",
                                              SHUTTING_DOWN))
                return
            wanted_session = websocket.query_params.get("session_id")
            wanted_episode = websocket.query_params.get("episode_id")
            if wanted_session is not None or wanted_episode is not None:
                try:
                    sid = self.find_session(wanted_session, wanted_episode)
                except KeyError as err:
                    await _send(websocket, _error(err.args[0], UNKNOWN_SESSION))
                    return
                extra = self._extra[sid]
                old = extra.socket
                extra.socket, extra.detached_at = websocket, None
                if old is not None and old is not websocket:
                    # The newest socket takes over (the old one is usually half-open after a network fault).
                    await _close_quietly(old, code=4000, reason="taken over by a resumed connection")
                log.info("session %s resumed", sid)
            else:
                try:
                    sid, _ = await self._new_session()
                except SessionCapacityError as err:
                    await _send(websocket, _error(str(err), WSErrorCode.CAPACITY_REACHED.value,
                                                  active_sessions=err.active_sessions, max_sessions=err.max_sessions))
                    return
                except EnvironmentFactoryError as err:
                    await _send(websocket, _error(str(err), WSErrorCode.FACTORY_ERROR.value))
                    return
                self._extra[sid].socket = websocket
            self._session_websocket_attachments.add(sid)
            self._update_session_activity(sid)
            keep = await self._message_loop(websocket, sid)
        except WebSocketDisconnect:
            keep = True
        finally:
            if sid is not None and sid in self._extra:
                extra = self._extra[sid]
                if extra.socket is websocket:
                    extra.socket = None
                    self._session_websocket_attachments.discard(sid)
                    if keep:
                        extra.detached_at = time.monotonic()
                        log.info("session %s detached; kept %g s for a resume", sid, self.resume_timeout_s)
                    else:
                        await self.close_session(sid)
            await _close_quietly(websocket)

    async def _message_loop(self, websocket: WebSocket, sid: str) -> bool:
        """Answer messages until the socket drops (True: keep the session) or the client closes it (False)."""
        while True:
            try:
                message = await asyncio.wait_for(websocket.receive(), timeout=self.idle_timeout_s)
            except asyncio.TimeoutError:
                await _send(websocket, _error(f"No message for {self.idle_timeout_s:g} s: the session is closed.",
                                              IDLE_TIMEOUT))
                return False
            if message["type"] == "websocket.disconnect":
                return True
            raw = message.get("text")
            if raw is None:
                data = message.get("bytes") or b""
                if len(data) > self.max_message_bytes:
                    await _send(websocket, _too_large(len(data), self.max_message_bytes))
                    continue
                try:
                    raw = data.decode("utf-8")
                except UnicodeDecodeError:
                    await _send(websocket, _error("A binary message must be UTF-8 JSON.",
                                                  WSErrorCode.INVALID_JSON.value))
                    continue
            if len(raw) > self.max_message_bytes:
                await _send(websocket, _too_large(len(raw), self.max_message_bytes))
                continue
            try:
                msg = json.loads(raw)
            except ValueError as err:
                await _send(websocket, _error(f"Invalid JSON: {err}", WSErrorCode.INVALID_JSON.value))
                continue
            if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
                await _send(websocket, _error('A message is a JSON object {"type": ..., "data": {...}}.',
                                              WSErrorCode.VALIDATION_ERROR.value))
                continue
            kind = msg["type"]
            if kind == "close":
                return False
            data = msg.get("data", {})
            if not isinstance(data, dict):
                await _send(websocket, _error(f"'data' must be a JSON object, got {type(data).__name__}.",
                                              WSErrorCode.VALIDATION_ERROR.value))
                continue
            reply = await self._answer(sid, kind, data)
            self._update_session_activity(sid, increment_step=kind == "step")
            try:
                await _send(websocket, reply)
            except (WebSocketDisconnect, RuntimeError):
                return True  # the answer is kept (the step's replay) for the resumed connection

    async def _answer(self, sid: str, kind: str, data: dict[str, Any]) -> dict[str, Any]:
        env: ServedEnv = self._sessions[sid]
        extra = self._extra[sid]
        if kind in ("reset", "step", "fork") and self.draining:
            return _error("The server is shutting down: this request was not applied.", SHUTTING_DOWN)
        with self._inflight_lock:
            self._inflight += 1
        try:
            async with extra.lock:
                if kind == "reset":
                    async with self._step_slots:
                        obs = await self._run_in_session_executor(sid, env.reset, **data)
                    return {"type": "observation", "data": serialize(obs)}
                if kind == "step":
                    action = MultiAgentAction.model_validate(data)
                    async with self._step_slots:
                        obs = await self._run_in_session_executor(sid, env.step, action)
                    return {"type": "observation", "data": serialize(obs)}
                if kind == "state":
                    state = await self._run_in_session_executor(sid, lambda: env.state)
                    return {"type": "state", "data": state.model_dump()}
                if kind == "observe":
                    if set(data) != {"agent"}:
                        raise TypeError(f"observe takes {{'agent': name}}, got keys {sorted(data)}.")
                    wire = await self._run_in_session_executor(sid, env.observe, data["agent"])
                    return {"type": "observation", "data": {"agent": data["agent"], "observation": wire}}
                if kind == "check":
                    if set(data) != {"agent", "action"}:
                        raise TypeError(f"check takes {{'agent': name, 'action': ...}}, got keys {sorted(data)}.")
                    await self._run_in_session_executor(sid, env.check, data["agent"], data["action"])
                    return {"type": "check", "data": {"agent": data["agent"], "ok": True}}
                if kind == "fork":
                    copy_env = await self._run_in_session_executor(sid, env.fork)
                    new_sid, _ = await self._new_session(copy_env)
                    self._extra[new_sid].detached_at = time.monotonic()  # resumable, reaped if never attached
                    return {"type": "fork", "data": {"session_id": new_sid}}
                return _error(f"Unknown message type {kind!r}; the types are reset, step, state, observe, check, fork, "
                              "close.", WSErrorCode.UNKNOWN_TYPE.value)
        except ValidationError as err:
            return _error(f"Invalid {kind} message: {_validation_text(err)}", WSErrorCode.VALIDATION_ERROR.value,
                          errors=json_value(err.errors(include_url=False, include_context=False)))
        except SessionCapacityError as err:
            return _error(str(err), WSErrorCode.CAPACITY_REACHED.value)
        except Exception as err:  # the env's own errors: reported, the session unchanged (the env's contract)
            kind_name = type(err).__name__
            text = err.args[0] if isinstance(err, KeyError) and len(err.args) == 1 else str(err)
            if kind_name not in ERROR_TYPES:
                log.exception("session %s: %s failed", sid, kind)
            return _error(str(text), WSErrorCode.EXECUTION_ERROR.value, error_type=kind_name)
        finally:
            with self._inflight_lock:
                self._inflight -= 1


def _error(message: str, code: str, **extra: Any) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code, **extra}}


def _too_large(size: int, limit: int) -> dict[str, Any]:
    return _error(f"The message is {size} bytes, over the server's max_message_bytes={limit}; it was not read.",
                  MESSAGE_TOO_LARGE)


def _validation_text(err: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'message'}: {e['msg']}" for e in err.errors())


async def _send(websocket: WebSocket, payload: dict[str, Any]) -> None:
    await websocket.send_text(json.dumps(payload, allow_nan=False, separators=(",", ":")))


async def _close_quietly(websocket: WebSocket, code: int = 1000, reason: str = "") -> None:
    if websocket.client_state == WebSocketState.DISCONNECTED or websocket.application_state == \
            WebSocketState.DISCONNECTED:
        return
    try:
        await websocket.close(code=code, reason=reason)
    except (RuntimeError, WebSocketDisconnect):
        pass


async def _env_error_response(request: Request, err: Exception) -> JSONResponse:
    text = err.args[0] if isinstance(err, KeyError) and len(err.args) == 1 else str(err)
    return JSONResponse(status_code=400, content={"detail": str(text), "error_type": type(err).__name__})


def create_app(env_id: str, *, max_sessions: int = DEFAULT_MAX_SESSIONS,
               resume_timeout_s: float = DEFAULT_RESUME_TIMEOUT_S, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
               max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S,
               replica: str | None = None, max_concurrent_steps: int = DEFAULT_MAX_CONCURRENT_STEPS,
               **make_kwargs: Any) -> FastAPI:
    """The OpenEnv app serving ``llm_envs.make(env_id, **make_kwargs)``, one env per WebSocket session.

    Args:
        env_id: a registered id (``llm_envs.list_envs()``).
        max_sessions: sessions at once (connected or waiting for a resume); past it a new socket gets OpenEnv's
            ``CAPACITY_REACHED`` error.
        resume_timeout_s: how long a session whose connection dropped is kept for its client to resume it.
        idle_timeout_s: how long a connected socket may stay silent before its session is closed.
        max_message_bytes: the longest message read; a longer one gets ``MESSAGE_TOO_LARGE``.
        drain_timeout_s: on SIGTERM (:func:`serve`), how long steps in flight may take to finish.
        replica: this replica's name, the prefix of its session ids (``r1-...``), so that a proxy in front of
            several replicas sends a resumed connection (``/ws?session_id=r1-...``) to the replica that holds it.
        max_concurrent_steps: resets and steps that run at once (:data:`DEFAULT_MAX_CONCURRENT_STEPS`: twice the
            cores); the others wait their turn, so a code env runs that many programs at most.
        **make_kwargs: arguments of ``llm_envs.make`` (``protocol=``, ``max_new_tokens=``, ...).

    The app's ``state.llm_env_server`` is the :class:`LLMEnvServer`.
    """
    server = LLMEnvServer(env_id, make_kwargs, max_sessions=max_sessions, resume_timeout_s=resume_timeout_s,
                          idle_timeout_s=idle_timeout_s, max_message_bytes=max_message_bytes,
                          drain_timeout_s=drain_timeout_s, replica=replica, max_concurrent_steps=max_concurrent_steps)
    app = FastAPI(title=f"llm-envs: {env_id}", version=f"{llm_envs.__version__}+wire{WIRE_VERSION}",
                  description=f"The llm-envs env {env_id!r} served over OpenEnv: "
                              f"{server.probe.get_metadata().description}")
    server.register(app)
    app.state.llm_env_server = server
    return app
