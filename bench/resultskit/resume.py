"""A record's training run across sittings: the legs of one run, and whether its directory can be resumed.

A coding run costs from half an hour to hours of one core, and a sitting can end in the middle of one.
Every training run of ``bench/results.py`` writes a checkpoint each iteration (``RUN_FLAGS``), and the
process running it keeps ``<run_dir>/legs.json`` up to date: one entry per leg (a process that ran part
of the run), with the command, the commit (and the hash of an uncommitted diff), the host, the step it
started from and the wall and CPU seconds it has used so far, rewritten every ``HEARTBEAT_S`` seconds
while it runs. A later ``run`` of the same record continues the directory with ``--resume`` when every
leg there ran this same command on this same code and host and a checkpoint exists; otherwise it starts
the run again from nothing. A resumed run is the uninterrupted run (the learners' resume restores the
weights, the optimizers and every RNG: ``tests/test_interrupt.py``), and its record says so: ``legs``
lists each leg, and ``wall_s`` and ``cpu_s`` are the legs' sums, so the seconds an interruption wasted
(the iterations after the last checkpoint, run again) are counted, not hidden.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

LEGS = "legs.json"
HEARTBEAT_S = 30.0
"""How often a running leg rewrites its entry (at most this much of a killed leg's time goes uncounted)."""


def code_of(commit: str | None, diff: str) -> str:
    """The code a leg ran: its commit, and for a dirty tree the SHA-256 of the diff it ran with."""
    return f"{commit}:{hashlib.sha256(diff.encode()).hexdigest()[:16]}" if diff else str(commit)


def read_legs(run_dir: Path) -> list[dict[str, Any]]:
    """The legs written in ``run_dir`` ([] when there are none or the file does not read as a list)."""
    try:
        legs = json.loads((run_dir / LEGS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return legs if isinstance(legs, list) and all(isinstance(leg, dict) for leg in legs) else []


def newest_checkpoint_step(run_dir: Path) -> int | None:
    """The step of the newest ``checkpoints/step_NNNNNN`` directory (None when there is none)."""
    steps = []
    for path in (run_dir / "checkpoints").glob("step_*") if (run_dir / "checkpoints").is_dir() else ():
        with contextlib.suppress(ValueError):
            steps.append(int(path.name.removeprefix("step_")))
    return max(steps) if steps else None


def resumable(run_dir: Path, command: str, code: str, host: str) -> int | None:
    """The step ``run_dir`` can be resumed from by ``command``: its newest checkpoint's, when every leg
    written there ran this command on this code and host; None when the run must start again."""
    legs = read_legs(run_dir)
    if not legs or any((leg.get("command"), leg.get("code"), leg.get("host")) != (command, code, host) for leg in legs):
        return None
    return newest_checkpoint_step(run_dir)


def _write(run_dir: Path, legs: Sequence[Mapping[str, Any]]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / f"{LEGS}.tmp"
    tmp.write_text(json.dumps(list(legs), indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, run_dir / LEGS)


@contextlib.contextmanager
def leg(run_dir: Path, *, command: str, code: str, host: str, from_step: int) -> Iterator[list[dict[str, Any]]]:
    """Run one leg of ``run_dir``'s run: its entry is appended to the legs already there and rewritten
    every :data:`HEARTBEAT_S` seconds and at the end. Yields the list of legs, this one last (final once
    the block exits)."""
    legs = read_legs(run_dir) if from_step else []
    entry: dict[str, Any] = {"command": command, "code": code, "host": host, "from_step": from_step,
                             "started": time.strftime("%Y-%m-%d %H:%M:%S %z"), "load_start": os.getloadavg()[0],
                             "wall_s": 0.0, "cpu_s": 0.0}
    legs.append(entry)
    t0, c0 = time.perf_counter(), time.process_time()
    stop = threading.Event()

    def update() -> None:  # never two at once: the heartbeat starts after the first and is joined before the last
        entry.update(wall_s=round(time.perf_counter() - t0, 1), cpu_s=round(time.process_time() - c0, 1),
                     load_end=os.getloadavg()[0], last_seen=time.strftime("%Y-%m-%d %H:%M:%S %z"))
        _write(run_dir, legs)

    def beat() -> None:
        while not stop.wait(HEARTBEAT_S):
            update()

    update()
    thread = threading.Thread(target=beat, name="results-leg-heartbeat", daemon=True)
    thread.start()
    try:
        yield legs
    finally:
        stop.set()
        thread.join()
        if run_dir.exists():  # the run may have failed before making it
            update()


def totals(legs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A record's times from its legs: ``wall_s`` and ``cpu_s`` summed, the load average at the first
    leg's start and the last one's end, and ``legs`` (each leg's step, seconds and dates) when there
    were several."""
    out: dict[str, Any] = {
        "wall_s": round(sum(leg["wall_s"] for leg in legs), 1),
        "cpu_s": round(sum(leg["cpu_s"] for leg in legs), 1),
        "load_average_1min": {"start": legs[0]["load_start"], "end": legs[-1].get("load_end", legs[-1]["load_start"])},
    }
    if len(legs) > 1:
        out["legs"] = [{k: leg[k] for k in ("from_step", "wall_s", "cpu_s", "started", "last_seen") if k in leg}
                       for leg in legs]
    return out
