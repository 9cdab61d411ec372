"""Several replicas behind one address (docs/serving.md): deploy/nginx-replicas.conf in front of two real
`llm-envs serve --replica` processes. New sessions spread over both; a dropped connection resumes through the proxy
on the replica that holds its session (the id's prefix), and every episode ends as the same episode played locally."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("openenv", reason="the server needs the 'serve' extra: pip install -e '.[serve]'")
from serving import free_port, start_server

ROOT = Path(__file__).resolve().parents[1]
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
pytestmark = pytest.mark.skipif(
    NGINX is None and os.environ.get("CI", "").lower() != "true",
    reason="needs nginx: apt-get install nginx-light (.ci/run installs it)")
KWARGS = {"max_new_tokens": 16, "num_turns": 2}
ACTIONS = {"brief": "A short summary of it.", "detailed": "A longer summary of the article, with more detail."}


def _wait_port(port: int, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"nginx exited with {proc.returncode}:\n{log.read_text(errors='replace')}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError("nginx did not listen within 30 s")


def test_sessions_spread_over_replicas_and_resume_on_their_own(tmp_path):
    import llm_envs
    import llm_envs.remote

    assert NGINX is not None, "nginx is missing: apt-get install nginx-light (.ci/run installs it)"
    replicas = [start_server("writing/xsum-v0", "--replica", name, log_dir=tmp_path, make_kwargs=KWARGS)
                for name in ("r1", "r2")]
    nginx = None
    try:
        front = free_port()
        conf = (ROOT / "deploy" / "nginx-replicas.conf").read_text()
        conf = conf.replace("127.0.0.1:8001", f"127.0.0.1:{replicas[0].port}")
        conf = conf.replace("127.0.0.1:8002", f"127.0.0.1:{replicas[1].port}")
        conf = conf.replace("listen 127.0.0.1:8000", f"listen 127.0.0.1:{front}")
        prefix = tmp_path / "nginx"
        (prefix / "logs").mkdir(parents=True)
        (prefix / "nginx.conf").write_text(conf)
        log = prefix / "out.log"
        with open(log, "w") as out:
            nginx = subprocess.Popen([NGINX, "-p", str(prefix), "-c", str(prefix / "nginx.conf")], stdout=out,
                                     stderr=subprocess.STDOUT)
        _wait_port(front, nginx, log)

        envs = [llm_envs.remote.connect(f"http://127.0.0.1:{front}") for _ in range(4)]
        for seed, env in enumerate(envs):
            env.reset(seed=seed)
        assert {env.session_id.split("-")[0] for env in envs} == {"r1", "r2"}  # both replicas hold sessions
        for seed, env in enumerate(envs):
            local = llm_envs.make("writing/xsum-v0", **KWARGS)
            local.reset(seed=seed)
            for _ in range(2):
                env.drop_connection()  # a network fault between the trainer and the proxy
                got = env.step(ACTIONS)
                want = local.step(ACTIONS)
                assert got[1] == want[1] and got[4] == want[4]
            assert env.history[-1].reward == local.history[-1].reward
            env.close()
    finally:
        if nginx is not None and nginx.poll() is None:
            os.kill(nginx.pid, signal.SIGTERM)
            nginx.wait(20)
        for served in replicas:
            served.stop()
