"""Serving over OpenEnv under load: steps a second, a step's latency and the server's memory at 1, 16 and 64
concurrent sessions, against the same steps in-process and a bare WebSocket echo; then a fault run with
dropped connections. Prints one JSON object (the last line of stdout).

    python bench/serve.py [--sessions 1 16 64] [--seconds 8] [--episodes 1000] [--drop-share 0.2]
                          [--load "nothing else running"] [--output bench/measured/serve.json] [--quick]

* Envs: ``writing/xsum-v0`` (parallel, both agents' answers as text) and ``coding/humaneval-v0`` (the helper's
  ``aux`` and the problem's canonical solution as main's answer, each program tagged with a comment unique to its
  episode so that the reward's score cache never answers: the sandbox runs every step's program). Each episode
  pins its problem (``task_index``) and its seed, so its actions and rewards are known in advance.
* Served: one ``llm-envs serve ID`` process per env on 127.0.0.1 (a free port), the session counts run on it in
  turn (a count's sessions are closed before the next count opens its own). The client is one asyncio process,
  one coroutine and one WebSocket session (``websockets``' asyncio client) per session: every session first plays
  one untimed episode, then whole episodes (reset + steps) until ``--episodes`` or ``--seconds`` is reached (the
  episode under way is finished). A step's latency is the client's: the request's ``json.dumps`` to the answer's
  ``json.loads``. ``steps_per_s``: steps over the timed phase's wall time (resets included, as in-process).
* ``server_peak_rss_mb``: the server process's VmHWM after the count's run (so the peak over the counts so far;
  they run in increasing order); ``sandbox_peak_rss_mb``: the sum of its child processes' VmHWM (the sandbox's
  fork servers alive at that moment, ``sandbox_processes`` of them; an upper bound, shared pages count in each).
* In-process: the same env, episodes and actions through ``llm_envs.make(ID).reset/step`` in this process, timed
  the same way: ``steps_per_s`` and the env's own step time (``step_p50_ms``). Overhead of serving a step at p50
  = the served p50 at one session - the env's own p50. Targets (reported, never asserted): an overhead of at most
  2 ms at p50, and 16 sessions of the writing env reaching at least half the in-process step rate.
* The limit: a bare WebSocket echo server (starlette under uvicorn with the same WebSocket implementation as the
  real server, in its own process) answering each reset and step request with a recorded answer of the real
  server, so every message has its real size; the same client loop and session counts. ``fraction_of_limit``:
  served steps a second over the echo's.
* Fault run: the writing env (``--fault-env``) with two turns (so that a connection can drop between steps too),
  ``--drop-share`` of the episodes dropping their connection once (the socket aborted without a close frame: after
  the reset's answer, between steps, with a reset or with a step in flight), then reconnecting to
  ``/ws?session_id=`` and resending the pending request with its ``episode_id`` / ``step_index``. Episodes
  started, finished and lost are counted, and every finished episode's rewards are compared with the same episode
  played in-process without drops; ``no_episode_lost`` comes from those counts.

Every server this bench starts listens on 127.0.0.1 only and is stopped by its pid when the bench ends, on an
error or on Ctrl-C too.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import os
import platform
import random
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from processes import busy_processes, children_hwm_mb, commit, vm_hwm_mb  # noqa: E402
from procgen import cpu_info  # noqa: E402

import llm_envs  # noqa: E402
from llm_envs.serve.process import Spawned, spawn, spawn_command  # noqa: E402

ENVS = ("writing/xsum-v0", "coding/humaneval-v0")
FAULT_ENV = "writing/xsum-v0"
FAULT_TURNS = 2
FAULT_SESSIONS = 16
OVERHEAD_TARGET_MS = 2.0
HALF_RATE_SESSIONS = 16
DROP_KINDS = ("after_reset", "reset_in_flight", "step_in_flight", "between_steps")
RESUME_WITHIN_S = 30.0
ANSWER_TIMEOUT_S = 120.0
AUX = "def aux(values):\n    return values  # {tag}\n"
ECHO_SERVER = """
import json, sys, uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocketDisconnect

async def health(request):
    return JSONResponse({"status": "healthy"})

async def echo(websocket):
    await websocket.accept()
    replies = {}
    try:
        while True:
            text = await websocket.receive_text()
            if text.startswith('{"type":"setup"'):
                replies = json.loads(text)["data"]
            elif text.startswith('{"type":"close"'):
                break
            else:
                await websocket.send_text(replies["reset" if text.startswith('{"type":"reset"') else "step"])
    except WebSocketDisconnect:
        pass

app = Starlette(routes=[Route("/health", health), WebSocketRoute("/ws", echo)])
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", ws="websockets-sansio",
            ws_max_size=1 << 24)
"""
"""The limit's server: what the real one does on a WebSocket minus the env, the models and JSON parsing."""


# ------------------------------------------------------------------------------------------------ episodes
@dataclass(frozen=True)
class Episode:
    """One seeded episode: its problem, seed and every step's actions (the same at every turn)."""

    episode_id: str
    seed: int
    task_index: int
    actions: dict[str, str]


def actions_of(env_id: str, problem: dict[str, Any], tag: str) -> dict[str, str]:
    """The agents' answers to ``problem``: summaries cut from the article, or an ``aux`` and the entry point's
    ``def`` line with the canonical solution (``tag``: a comment that makes each program unique, so that it
    really runs)."""
    if env_id.startswith("writing/"):
        words = problem["source"].split()
        return {"brief": " ".join(words[:24]) + ".", "detailed": " ".join(words[:90]) + "."}
    name = re.escape(problem["entry_point"])
    head = re.search(rf"^def\s+{name}\s*\(.*?\)\s*(->[^:]*)?:", problem["prompt"], re.DOTALL | re.MULTILINE)
    program = head.group(0) + "\n" + problem["canonical_solution"].rstrip() + f"\n# episode {tag}\n"
    return {"helper": AUX.format(tag=tag), "main": program}


class Plan:
    """The episodes of a run: session ``j``'s ``e``-th episode is the same wherever it is played."""

    def __init__(self, env_id: str, run: str) -> None:
        self.env_id, self.run = env_id, run
        env = llm_envs.make(env_id)
        self.problems = env.task.problems("train")
        # The problems whose answers fit max_new_tokens (a few canonical solutions are longer).
        self.indices = [i for i in range(len(self.problems))
                        if all(len(env.tokenizer_of(agent).encode(text, add_special_tokens=False)) <= env.max_new_tokens
                               for agent, text in actions_of(env_id, self.problems[i], "x" * 24).items())]

    def __call__(self, session: int, index: int) -> Episode:
        task_index = self.indices[(session * 37 + index * 11) % len(self.indices)]
        tag = f"{self.run}-{session}-{index}"
        return Episode(tag, 1_000 * session + index, task_index,
                       actions_of(self.env_id, self.problems[task_index], tag))


# ------------------------------------------------------------------------------------------------ servers
RUNNING: list[Spawned] = []
"""Every server this bench started, stopped by its pid at the end whatever happens."""


def start(command: list[str], name: str, log_dir: Path) -> Spawned:
    """Start a server process listening on 127.0.0.1 at a free port (its port last on its command line) and wait
    for its ``/health``."""
    served = spawn_command(command, log_path=log_dir / f"{name}.log")
    RUNNING.append(served)
    return served


def start_env_server(env_id: str, log_dir: Path, make_kwargs: dict[str, Any] | None = None) -> Spawned:
    served = spawn(env_id, "--max-sessions", "64", log_path=log_dir / f"{env_id.replace('/', '-')}.log",
                   make_kwargs=make_kwargs)
    RUNNING.append(served)
    return served


TRACEBACKS: dict[str, int] = {}
"""Tracebacks each stopped server wrote to its log (a server that misbehaved under load)."""


def stop(served: Spawned, name: str | None = None) -> None:
    served.stop()
    if served in RUNNING:
        RUNNING.remove(served)
    if name is not None:
        TRACEBACKS[name] = served.log.count("Traceback (most recent call last)")


def stop_all() -> None:
    for served in list(RUNNING):
        try:
            stop(served)
        except Exception as err:  # stop the others anyway
            print(f"could not stop the server of pid {served.proc.pid}: {err}", file=sys.stderr)


# ------------------------------------------------------------------------------------------------ the client
class Conn:
    """One session's WebSocket: requests, the abrupt drop of a fault, and the resume after it."""

    def __init__(self, url: str) -> None:
        self.url, self.ws, self.session_id = url, None, None
        self.reconnects = 0

    async def _open(self) -> None:
        from websockets.asyncio.client import connect

        url = self.url + "/ws" + (f"?session_id={self.session_id}" if self.session_id else "")
        self.ws = await connect(url, max_size=None, compression=None, proxy=None, ping_interval=None,
                                open_timeout=ANSWER_TIMEOUT_S)

    def abort(self) -> None:
        """Drop the connection as a network fault does: the socket closed, no close frame."""
        if self.ws is not None:
            self.ws.transport.abort()
        self.ws = None

    async def request(self, message: dict[str, Any], drop: bool = False) -> tuple[dict[str, Any], str]:
        """Send ``message``; its answer (parsed and raw). ``drop``: abort the socket right after sending, then
        resume the session and resend. A dropped connection is resumed and the request resent."""
        from websockets.exceptions import ConnectionClosed, InvalidHandshake

        text = json.dumps(message, separators=(",", ":"))
        deadline = None
        while True:
            try:
                if self.ws is None:
                    await self._open()
                await self.ws.send(text)
                if drop:
                    drop = False
                    self.abort()
                    self.reconnects += 1
                    continue
                raw = await asyncio.wait_for(self.ws.recv(), ANSWER_TIMEOUT_S)
                return json.loads(raw), raw
            except TimeoutError as err:  # an OSError too, but no dropped connection: the server is stuck
                raise TimeoutError(f"no answer to {message['type']!r} within {ANSWER_TIMEOUT_S:g} s") from err
            except (ConnectionClosed, InvalidHandshake, OSError) as err:
                if self.session_id is None:
                    raise
                self.ws = None
                deadline = deadline or time.monotonic() + RESUME_WITHIN_S
                if time.monotonic() > deadline:
                    raise ConnectionError(f"could not resume session {self.session_id}: {err}") from err
                self.reconnects += 1
                await asyncio.sleep(0.01)

    async def close(self) -> None:
        if self.ws is not None:
            try:
                await self.ws.send('{"type":"close"}')
                await self.ws.close()
            except Exception:
                pass
        self.ws = None


@dataclass
class Tally:
    """What a run's sessions did."""

    steps: int = 0
    step_s: list[float] = field(default_factory=list)
    reset_s: list[float] = field(default_factory=list)
    started: int = 0
    finished: int = 0
    dropped: int = 0
    errors: list[str] = field(default_factory=list)
    rewards: dict[str, list[Any]] = field(default_factory=dict)  # episode_id -> [(team, {agent: r}) per step]
    raw: dict[str, str] = field(default_factory=dict)  # the first reset's and step's answers, as sent

    def error(self, text: str) -> None:
        if len(self.errors) < 20:
            self.errors.append(text[:300])


def drop_kind(episode: Episode, share: float) -> str | None:
    """Whether (and where) ``episode``'s connection drops: a seeded draw, so that reruns drop the same ones.
    (A session's untimed first episode never drops: its reset's answer gives the session id to resume.)"""
    rng = random.Random(episode.episode_id)
    if share <= 0 or rng.random() >= share:
        return None
    return rng.choice(DROP_KINDS)


async def play(conn: Conn, episode: Episode, turns: int, tally: Tally, drop: str | None = None,
               check: bool = True) -> None:
    """One whole episode: reset, then a step a turn until done; counted, timed and checked."""
    tally.started += 1
    if drop is not None:
        tally.dropped += 1
    start = time.perf_counter()
    answer, raw = await conn.request({"type": "reset", "data": {"seed": episode.seed, "task_index": episode.task_index,
                                                                "episode_id": episode.episode_id}},
                                     drop=drop == "reset_in_flight")
    tally.reset_s.append(time.perf_counter() - start)
    tally.raw.setdefault("reset", raw)
    if answer.get("type") != "observation":
        tally.error(f"reset of {episode.episode_id}: {answer}")
        return
    if conn.session_id is None:
        conn.session_id = answer["data"]["observation"]["session_id"]
    if drop == "after_reset":
        conn.abort()
        conn.reconnects += 1
    rewards = []
    for k in range(turns):
        if drop == "between_steps" and k == 1:
            conn.abort()
            conn.reconnects += 1
        in_flight = drop == "step_in_flight" and k == turns - 1
        start = time.perf_counter()
        answer, raw = await conn.request({"type": "step", "data": {"actions": episode.actions, "step_index": k}},
                                         drop=in_flight)
        tally.step_s.append(time.perf_counter() - start)
        tally.steps += 1
        tally.raw.setdefault("step", raw)
        data = answer.get("data", {})
        if answer.get("type") != "observation":
            tally.error(f"step {k} of {episode.episode_id}: {answer}")
            return
        if check and (data["observation"]["step_count"] != k + 1 or data["observation"]["episode_id"]
                      != episode.episode_id):
            tally.error(f"step {k} of {episode.episode_id} answered step_count {data['observation']['step_count']} "
                        f"of episode {data['observation']['episode_id']}")
            return
        rewards.append((data["reward"], data["observation"]["rewards"]))
        if data["done"]:
            break
    if check and not data["done"]:
        tally.error(f"{episode.episode_id} was not done after {turns} steps")
        return
    tally.finished += 1
    tally.rewards[episode.episode_id] = rewards


async def drive(url: str, sessions: int, plan: Plan, turns: int, seconds: float, episodes: int,
                drop_share: float = 0.0, echo: dict[str, str] | None = None) -> dict[str, Any]:
    """``sessions`` concurrent sessions: one untimed episode each, then whole episodes until ``episodes`` each or
    ``seconds`` (the episode under way is finished). ``echo``: the echo server's replies (the limit's run)."""
    warm, tally = Tally(), Tally()
    conns = [Conn(url) for _ in range(sessions)]

    async def warm_up(j: int) -> None:
        conn = conns[j]
        if echo is not None:
            conn.session_id = "echo"
            await conn._open()
            await conn.ws.send(json.dumps({"type": "setup", "data": echo}, separators=(",", ":")))
        await play(conn, plan(j, 10_000_000), turns, warm, check=echo is None)

    async def session(j: int, deadline: float) -> None:
        conn = conns[j]
        for e in range(episodes):
            if time.perf_counter() >= deadline:
                break
            episode = plan(j, e)
            try:
                await play(conn, episode, turns, tally, drop_kind(episode, drop_share),
                           check=echo is None)
            except Exception as err:  # the session's connection is gone for good: its episode is lost
                tally.error(f"session {j} at {episode.episode_id}: {type(err).__name__}: {err}")
                return

    try:
        await asyncio.gather(*(warm_up(j) for j in range(sessions)))
        if warm.errors:
            raise RuntimeError(f"the warm-up failed: {warm.errors[:3]}")
        start = time.perf_counter()
        await asyncio.gather(*(session(j, start + seconds) for j in range(sessions)))
        wall = time.perf_counter() - start
    finally:
        await asyncio.gather(*(c.close() for c in conns))
    tally.raw = warm.raw
    return {"tally": tally, "wall_s": wall, "reconnects": sum(c.reconnects for c in conns)}


def ms(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (seconds), in ms (nearest rank)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return 1e3 * ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def rounded(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def summary(result: dict[str, Any]) -> dict[str, Any]:
    t: Tally = result["tally"]
    return {"steps": t.steps, "wall_s": round(result["wall_s"], 3),
            "steps_per_s": round(t.steps / result["wall_s"], 1),
            "p50_ms": round(ms(t.step_s, 0.5), 3), "p99_ms": round(ms(t.step_s, 0.99), 3),
            "reset_p50_ms": round(ms(t.reset_s, 0.5), 3),
            "episodes": {"started": t.started, "finished": t.finished, "lost": t.started - t.finished},
            "errors": len(t.errors), "first_errors": t.errors[:3]}


# ------------------------------------------------------------------------------------------------ in-process
def in_process(env_id: str, plan: Plan, turns: int, seconds: float, episodes: int,
               make_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The same episodes through ``llm_envs.make(...).reset/step`` in this process, timed the same way."""
    env = llm_envs.make(env_id, **(make_kwargs or {}))

    def one(episode: Episode, tally: Tally) -> None:
        start = time.perf_counter()
        env.reset(seed=episode.seed, options={"task_index": episode.task_index})
        tally.reset_s.append(time.perf_counter() - start)
        for _ in range(turns):
            start = time.perf_counter()
            env.step(episode.actions)
            tally.step_s.append(time.perf_counter() - start)
            tally.steps += 1
            if not env.agents:
                break

    one(plan(0, 10_000_000), Tally())  # warm-up: the tokenizer, the sandbox's fork servers
    tally = Tally()
    start = time.perf_counter()
    for e in range(episodes):
        if time.perf_counter() >= start + seconds:
            break
        one(plan(0, e), tally)
    wall = time.perf_counter() - start
    return {"steps": tally.steps, "wall_s": round(wall, 3), "steps_per_s": round(tally.steps / wall, 1),
            "step_p50_ms": round(ms(tally.step_s, 0.5), 3), "step_p99_ms": round(ms(tally.step_s, 0.99), 3),
            "reset_p50_ms": round(ms(tally.reset_s, 0.5), 3)}


def reference_rewards(env_id: str, episodes: list[Episode], turns: int,
                      make_kwargs: dict[str, Any]) -> dict[str, list[Any]]:
    """Each episode's rewards played in-process without drops: [(team, {agent: reward}) per step]."""
    env = llm_envs.make(env_id, **make_kwargs)
    out = {}
    for episode in episodes:
        env.reset(seed=episode.seed, options={"task_index": episode.task_index})
        steps = []
        for _ in range(turns):
            _, rewards, _, _, _ = env.step(episode.actions)
            steps.append((float(env.history[-1].reward), {a: float(r) for a, r in rewards.items()}))
            if not env.agents:
                break
        out[episode.episode_id] = steps
    return out


# ------------------------------------------------------------------------------------------------ the bench
def bench(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    started_at = time.perf_counter()
    when = datetime.datetime.now(datetime.timezone.utc)
    load_start = os.getloadavg()
    others = busy_processes({os.getpid()})
    out: dict[str, Any] = {"envs": list(ENVS), "sessions": args.sessions, "seconds": args.seconds,
                           "episodes_per_session": args.episodes, "quick": args.quick}
    runs, processes, limits, sizes, raws = [], {}, {}, {}, {}
    turns_of = {env_id: llm_envs.make(env_id).num_turns for env_id in ENVS}

    for env_id in ENVS:
        plan = Plan(env_id, "served")
        served = start_env_server(env_id, log_dir)
        try:
            url = f"ws://127.0.0.1:{served.port}"
            for n in args.sessions:
                result = asyncio.run(drive(url, n, plan, turns_of[env_id], args.seconds, args.episodes))
                raws.setdefault(env_id, result["tally"].raw)
                children_mb, children = children_hwm_mb(served.proc.pid)
                runs.append({"env": env_id, "sessions": n, **summary(result),
                             "server_peak_rss_mb": rounded(vm_hwm_mb(served.proc.pid)),
                             "sandbox_peak_rss_mb": rounded(children_mb), "sandbox_processes": children})
        finally:
            stop(served, env_id)
        processes[env_id] = in_process(env_id, Plan(env_id, "in-process"), turns_of[env_id], args.seconds,
                                       args.episodes)
        first = plan(0, 0)
        sizes[env_id] = {
            "reset_request": len(json.dumps({"type": "reset", "data": {
                "seed": first.seed, "task_index": first.task_index, "episode_id": first.episode_id}},
                separators=(",", ":"))),
            "step_request": len(json.dumps({"type": "step", "data": {"actions": first.actions, "step_index": 0}},
                                           separators=(",", ":"))),
            "reset_answer": len(raws[env_id]["reset"]), "step_answer": len(raws[env_id]["step"])}

    echo = start([sys.executable, "-c", ECHO_SERVER], "echo", log_dir)
    try:
        for env_id in ENVS:
            for n in args.sessions:
                result = asyncio.run(drive(f"ws://127.0.0.1:{echo.port}", n, Plan(env_id, "echo"), turns_of[env_id],
                                           args.echo_seconds, args.episodes, echo=raws[env_id]))
                limits[(env_id, n)] = summary(result)
    finally:
        stop(echo, "echo")

    for run in runs:
        own = processes[run["env"]]
        limit = limits[(run["env"], run["sessions"])]
        run["overhead_ms_p50"] = round(run["p50_ms"] - own["step_p50_ms"], 3)
        run["ratio_to_in_process"] = round(run["steps_per_s"] / own["steps_per_s"], 3)
        run["echo"] = {k: limit[k] for k in ("steps_per_s", "p50_ms", "p99_ms", "steps")}
        run["fraction_of_limit"] = round(run["steps_per_s"] / limit["steps_per_s"], 3)

    # The fault run: dropped connections, resumed; every episode's rewards against the same episode undisturbed.
    fault_kwargs = {"num_turns": FAULT_TURNS}
    plan = Plan(args.fault_env, "fault")
    served = start_env_server(args.fault_env, log_dir, fault_kwargs)
    try:
        result = asyncio.run(drive(f"ws://127.0.0.1:{served.port}", args.fault_sessions, plan, FAULT_TURNS,
                                   args.seconds, args.fault_episodes, drop_share=args.drop_share))
    finally:
        stop(served, "fault")
    tally: Tally = result["tally"]
    played = [plan(j, e) for j in range(args.fault_sessions) for e in range(args.fault_episodes)]
    reference = reference_rewards(args.fault_env, [p for p in played if p.episode_id in tally.rewards], FAULT_TURNS,
                                  fault_kwargs)
    mismatched = sorted(eid for eid, got in tally.rewards.items()
                        if [(team, dict(agents)) for team, agents in got] != reference[eid])
    lost = tally.started - tally.finished
    out["fault"] = {"env": args.fault_env, "make_kwargs": fault_kwargs, "sessions": args.fault_sessions,
                    "drop_share": args.drop_share, "drop_kinds": list(DROP_KINDS), **summary(result),
                    "episodes_dropped": tally.dropped, "reconnects": result["reconnects"],
                    "rewards_compared": len(reference), "rewards_mismatched": len(mismatched),
                    "first_mismatched": mismatched[:3],
                    "no_episode_lost": lost == 0 and tally.finished == tally.started and not mismatched
                                       and not tally.errors}

    overhead = {env_id: next(r["overhead_ms_p50"] for r in runs if r["env"] == env_id and r["sessions"] == 1)
                for env_id in ENVS} if 1 in args.sessions else {}
    half = next((r["ratio_to_in_process"] for r in runs
                 if r["env"] == "writing/xsum-v0" and r["sessions"] == HALF_RATE_SESSIONS), None)
    out["runs"] = runs
    out["in_process"] = processes
    out["message_bytes"] = sizes
    out["targets"] = {
        "overhead_target_ms": OVERHEAD_TARGET_MS,
        "overhead_ms_p50": overhead,
        "overhead_met": {env_id: value <= OVERHEAD_TARGET_MS for env_id, value in overhead.items()},
        "half_rate_sessions": HALF_RATE_SESSIONS,
        "half_rate_ratio": half,
        "half_rate_met": None if half is None else half >= 0.5,
    }
    out["server_log_tracebacks"] = dict(TRACEBACKS)
    out["no_episode_lost"] = out["fault"]["no_episode_lost"] and all(r["episodes"]["lost"] == 0 for r in runs)
    out.update({"cores": os.cpu_count(), "python": platform.python_version(), **cpu_info(),
                "dtype": "n/a: no tensors"})
    load = {"note": args.load, "loadavg_start": [round(x, 2) for x in load_start],
            "loadavg_end": [round(x, 2) for x in os.getloadavg()], "busy_at_start": others}
    out["load"] = load
    out["runtime_s"] = round(time.perf_counter() - started_at, 1)
    out["measured"] = {"when": when.strftime("%Y-%m-%d %H:%M UTC"), "commit": commit(),
                       "load": f"{args.load}; load average {load_start[0]:.2f} at the start, "
                               f"{load['loadavg_end'][0]:.2f} at the end"}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 16, 64], help="concurrent sessions (<= 64)")
    parser.add_argument("--seconds", type=float, default=8.0, help="timed phase of each run (and in-process)")
    parser.add_argument("--echo-seconds", type=float, default=3.0, help="timed phase of each echo run")
    parser.add_argument("--episodes", type=int, default=1000, help="at most this many timed episodes a session")
    parser.add_argument("--drop-share", type=float, default=0.2, help="fault run: the share of episodes dropped")
    parser.add_argument("--fault-env", choices=ENVS, default=FAULT_ENV, help="fault run: the env (two turns)")
    parser.add_argument("--fault-sessions", type=int, default=FAULT_SESSIONS)
    parser.add_argument("--fault-episodes", type=int, default=25, help="fault run: episodes a session")
    parser.add_argument("--load", default="unknown", help="what else was running (kept in the JSON)")
    parser.add_argument("--output", type=Path, help="also write the JSON here")
    parser.add_argument("--quick", action="store_true", help="tiny counts (a test): sessions 1 4, 1 s runs")
    args = parser.parse_args(argv)
    if args.quick:
        args.sessions, args.seconds, args.echo_seconds, args.episodes = [1, 4], 1.0, 0.5, 20
        args.fault_sessions, args.fault_episodes, args.drop_share = 4, 6, 0.5
    args.sessions = sorted(set(args.sessions))
    if not all(1 <= n <= 64 for n in args.sessions):
        parser.error(f"--sessions must be between 1 and 64 (the server's --max-sessions), got {args.sessions}")
    for name in ("seconds", "echo_seconds"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0")
    for name in ("episodes", "fault_sessions", "fault_episodes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if not 0 <= args.drop_share <= 1:
        parser.error("--drop-share must be in [0, 1]")

    def terminate(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, terminate)
    import tempfile

    try:
        with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
            try:
                out = bench(args, Path(tmp))
            except BaseException:
                for served in RUNNING:
                    sys.stderr.write(f"--- log of the server of pid {served.proc.pid}:\n{served.log[-4000:]}\n")
                raise
            finally:
                stop_all()
    finally:
        signal.signal(signal.SIGTERM, previous)
    line = json.dumps(out, allow_nan=True)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(line + "\n", encoding="utf-8")
    print(line)
    return out


if __name__ == "__main__":
    main()
