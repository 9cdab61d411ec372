"""bench/serve.py --quick against real servers: the JSON it prints has every figure, finite, no episode was lost
(the fault run's dropped connections included), and every server it started is gone. No timing is asserted."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN_KEYS = {"env", "sessions", "steps", "wall_s", "steps_per_s", "p50_ms", "p99_ms", "reset_p50_ms", "episodes",
            "errors", "server_peak_rss_mb", "overhead_ms_p50", "ratio_to_in_process", "echo", "fraction_of_limit"}


def finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def descendants(pid: int) -> set[int]:
    """The pids of ``pid``'s children and theirs (from /proc, no psutil needed)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child)
    return out


def test_the_quick_bench_serves_every_episode(tmp_path: Path) -> None:
    output = tmp_path / "serve.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "serve.py"), "--quick", "--output", str(output)],
                          cwd=ROOT, capture_output=True, text=True, timeout=180,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    d = json.loads(last)
    assert json.loads(output.read_text(encoding="utf-8")) == d  # --output writes the printed line

    # The machine, as every bench reports it.
    assert {"cpu", "isa", "cores", "python", "dtype", "load", "measured"} <= d.keys()
    assert d["dtype"] == "n/a: no tensors" and {"when", "load", "commit"} <= d["measured"].keys()

    # Every (env, sessions) run, with its in-process and echo counterparts, finite.
    envs = {"writing/xsum-v0", "coding/humaneval-v0"}
    assert {(r["env"], r["sessions"]) for r in d["runs"]} == {(e, n) for e in envs for n in d["sessions"]}
    for r in d["runs"]:
        assert RUN_KEYS <= r.keys(), r
        assert r["steps"] > 0 and r["errors"] == 0, r
        assert r["episodes"]["lost"] == 0 and r["episodes"]["finished"] == r["episodes"]["started"] > 0, r
        for key in ("steps_per_s", "p50_ms", "p99_ms", "overhead_ms_p50", "ratio_to_in_process", "fraction_of_limit",
                    "server_peak_rss_mb"):
            assert finite(r[key]), (key, r)
        assert all(finite(r["echo"][k]) for k in ("steps_per_s", "p50_ms", "p99_ms")), r
    code = [r for r in d["runs"] if r["env"] == "coding/humaneval-v0"]
    assert all(r["sandbox_peak_rss_mb"] and r["sandbox_peak_rss_mb"] > 0 for r in code)  # programs really ran
    assert d["in_process"].keys() == envs
    assert all(finite(p["steps_per_s"]) and finite(p["step_p50_ms"]) for p in d["in_process"].values())
    assert all(finite(v) for sizes in d["message_bytes"].values() for v in sizes.values())

    # The targets are reported (true/false), not asserted.
    t = d["targets"]
    assert set(t["overhead_met"]) == envs and all(isinstance(v, bool) for v in t["overhead_met"].values())
    assert all(finite(v) for v in t["overhead_ms_p50"].values())
    assert "half_rate_met" in t

    # The fault run: connections dropped mid-episode and resumed; no episode lost, rewards as undisturbed.
    f = d["fault"]
    assert f["episodes_dropped"] > 0 and f["reconnects"] >= f["episodes_dropped"]
    assert f["episodes"]["started"] == f["episodes"]["finished"] > 0 and f["episodes"]["lost"] == 0
    assert f["rewards_compared"] == f["episodes"]["finished"] and f["rewards_mismatched"] == 0
    assert f["errors"] == 0 and f["no_episode_lost"] is True and d["no_episode_lost"] is True
    assert all(n == 0 for n in d["server_log_tracebacks"].values()), d["server_log_tracebacks"]


def test_ctrl_c_stops_the_servers_by_their_pid() -> None:
    """Interrupted while a server is up, the bench stops it (by its pid) before it exits; the servers it starts
    listen on 127.0.0.1 only."""
    bench = subprocess.Popen([sys.executable, str(ROOT / "bench" / "serve.py"), "--quick"], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        servers: set[int] = set()
        deadline = time.monotonic() + 90
        while not servers and time.monotonic() < deadline and bench.poll() is None:
            time.sleep(0.2)
            for pid in descendants(bench.pid):
                try:
                    command = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if b"serve" in command and b"baselines.infra.cli" in command:
                    assert command[command.index(b"--host") + 1] == b"127.0.0.1"
                    servers.add(pid)
        assert servers, "no server was started"
        os.kill(bench.pid, signal.SIGINT)
        _, err = bench.communicate(timeout=60)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    assert bench.returncode != 0 and "KeyboardInterrupt" in err
    assert not any((Path("/proc") / str(pid)).exists() for pid in servers), "a server outlived the bench"
