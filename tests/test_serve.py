"""The OpenEnv server (llm_envs/serve, docs/serving.md) as a real uvicorn process on 127.0.0.1: OpenEnv's routes and
its own validator, bad input (each kind gets a clear error and leaves the session and the server working), sessions
that survive a dropped connection (resume, exactly-once resends, takeover, expiry), capacity, idle sockets, SIGTERM
with a step in flight, and hostile generated code (it runs in the sandbox, never in the server)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("openenv", reason="the server needs the 'serve' extra: pip install -e '.[serve]'")
from serving import import_path_env, running, start_server
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

XSUM_KWARGS = {"max_new_tokens": 16, "num_turns": 2}
GOOD = {"brief": "A short summary of it.", "detailed": "A longer summary of the article, with more detail."}


class Socket:
    """A raw OpenEnv WebSocket: send a message, read the answer."""

    def __init__(self, url: str, query: str = "") -> None:
        self.ws = connect(url.replace("http", "ws") + "/ws" + query, max_size=None, legacy=True)

    def ask(self, kind: str, data: dict | None = None) -> dict:
        self.ws.send(json.dumps({"type": kind, "data": data or {}}))
        return json.loads(self.ws.recv(timeout=30))

    def raw(self, text: str | bytes) -> dict:
        self.ws.send(text)
        return json.loads(self.ws.recv(timeout=30))

    def drop(self) -> None:
        """Close the TCP connection without the protocol's close message (a network fault, as the server sees it)."""
        self.ws.socket.close()

    def close(self) -> None:
        try:
            self.ws.send(json.dumps({"type": "close"}))
        finally:
            self.ws.close()


def observation(answer: dict) -> dict:
    assert answer["type"] == "observation", answer
    return answer["data"]["observation"]


def error(answer: dict, code: str, error_type: str | None = None) -> str:
    assert answer["type"] == "error", answer
    assert answer["data"]["code"] == code, answer
    if error_type is not None:
        assert answer["data"].get("error_type") == error_type, answer
    return answer["data"]["message"]


@pytest.fixture(scope="module")
def xsum(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("serve-xsum")
    with running("writing/xsum-v0", "--max-message-bytes", "65536", "--resume-timeout-s", "30",
                 log_dir=log_dir, make_kwargs=XSUM_KWARGS) as served:
        yield served


# ------------------------------------------------------------------------------------------------ OpenEnv's routes
def test_openenv_routes_answer(xsum):
    assert xsum.get("/health") == {"status": "healthy"}
    metadata = xsum.get("/metadata")
    assert metadata["name"] == "writing/xsum-v0" and "brief" in metadata["description"]
    schema = xsum.get("/schema")
    assert "actions" in schema["action"]["properties"] and "observations" in schema["observation"]["properties"]
    assert "global_state" in schema["state"]["properties"]
    state = xsum.get("/state")
    assert state["started"] is False and state["env_id"] == "writing/xsum-v0"
    spec = xsum.get("/llm-envs/spec")
    assert spec["possible_agents"] == ["brief", "detailed"] and spec["max_new_tokens"] == 16
    assert spec["agents"]["brief"]["vocab_size"] == 49152
    assert xsum.get("/writing-xsum-v0/splits") == [{"name": "train", "type": "train"},
                                                    {"name": "eval", "type": "validation"}]


def test_task_api_counts_and_one_task(xsum):
    from serving import Served

    import llm_envs

    def post(served: Served, path: str, body: dict) -> dict:
        import urllib.request

        request = urllib.request.Request(served.url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    local = llm_envs.make("writing/xsum-v0", **XSUM_KWARGS)
    count = post(xsum, "/writing-xsum-v0/num_tasks", {"split": "eval"})
    assert count == {"num_tasks": len(local.task.problems("eval"))}
    task = post(xsum, "/writing-xsum-v0/task", {"split": "train", "index": 5})["task"]
    assert task["problem"]["source"] == local.task.problems("train")[5]["source"]


def test_openenv_validator_passes_against_the_running_server(xsum):
    """OpenEnv's own `openenv validate --url` (its CLI, as a user runs it) against the real server."""
    openenv_cli = Path(sys.executable).with_name("openenv")
    result = subprocess.run([str(openenv_cli), "validate", "--url", xsum.url, "--json", "--timeout", "30"],
                            capture_output=True, text=True, timeout=120)
    report = json.loads(result.stdout)
    failed = [c["id"] for c in report["criteria"] if not c["passed"]]
    assert result.returncode == 0 and report["passed"] and not failed, (failed, result.stderr[-2000:])
    assert report["mode"] == "simulation"


def test_manifest_parses_with_openenv_and_names_a_real_app():
    from openenv.validation.parsers.openenv_yaml import OpenEnvYamlParser

    root = Path(__file__).resolve().parents[1]
    manifest = OpenEnvYamlParser().parse(root)
    assert manifest.name == "llm-envs" and manifest.capabilities.task_api
    import yaml

    raw = yaml.safe_load((root / "openenv.yaml").read_text())
    from uvicorn.importer import import_from_string

    app = import_from_string(raw["app"])  # what `uvicorn llm_envs.serve.app:app` (the manifest's app) serves
    assert app.state.llm_env_server.env_id == "writing/xsum-v0"
    assert {"/ws", "/health", "/schema", "/metadata", "/state"} <= {getattr(r, "path", None) for r in app.routes}
    dockerfile = (root / "Dockerfile").read_text()
    assert "openenv==0.10.0" in dockerfile and "llm-envs serve" in dockerfile


@pytest.mark.parametrize(("argv", "expected"), [
    (["serve", "nope/x-v0"], "Unknown env id 'nope/x-v0'"),
    (["serve", "writing/xsum-v0", "--make-kwargs", "[1]"], "--make-kwargs must be a JSON object"),
    (["serve", "writing/xsum-v0", "--make-kwargs", "{bad"], "--make-kwargs must be a JSON object"),
    (["serve", "writing/xsum-v0", "--max-sessions", "0"], "max_sessions must be an integer >= 1, got 0"),
    (["serve", "writing/xsum-v0", "--resume-timeout-s", "-1"], "resume_timeout_s must be a positive number"),
    (["serve", "writing/xsum-v0", "--make-kwargs", '{"max_new_tokens": 0}'], "max_new_tokens must be an integer"),
])
def test_the_command_line_refuses_bad_input_in_one_line(argv, expected, capsys):
    from baselines.infra.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and err.count("\n") == 0 and "serving" not in err


# ------------------------------------------------------------------------------------------------ a whole episode
def test_episode_over_the_socket_matches_the_local_env(xsum):
    import llm_envs

    local = llm_envs.make("writing/xsum-v0", **XSUM_KWARGS)
    obs, _ = local.reset(seed=4)
    ws = Socket(xsum.url)
    try:
        first = observation(ws.ask("reset", {"seed": 4}))
        assert first["observations"]["brief"]["text"] == local.text("brief")
        mask = obs["brief"]["attention_mask"].astype(bool)
        assert first["observations"]["brief"]["token_ids"] == obs["brief"]["observation"][mask].tolist()
        for turn in range(2):
            answer = ws.ask("step", {"actions": GOOD, "step_index": turn})
            _, rewards, terms, _, infos = local.step(GOOD)
            got = observation(answer)
            assert got["rewards"] == rewards and got["infos"] == infos and got["terminations"] == terms
            assert answer["data"]["reward"] == pytest.approx(local.history[-1].reward)
        assert answer["data"]["done"] is True and got["agents"] == []
        state = ws.ask("state")["data"]
        assert state["step_count"] == 2 and len(state["history"]) == 2
        assert state["global_state"]["text"] == local.state_text()
    finally:
        ws.close()


# ------------------------------------------------------------------------------------------------ bad input
BAD_STEPS = [
    # (what, the step's data, the error code, the exception type the env raised)
    ("unknown agent", {"actions": {**GOOD, "ghost": "x"}}, "EXECUTION_ERROR", "KeyError"),
    ("missing agent", {"actions": {"brief": "x"}}, "EXECUTION_ERROR", "KeyError"),
    ("actions not a mapping", {"actions": "hello"}, "VALIDATION_ERROR", None),
    ("no actions", {}, "VALIDATION_ERROR", None),
    ("an unknown field", {"actions": GOOD, "extra": 1}, "VALIDATION_ERROR", None),
    ("a float action", {"actions": {**GOOD, "brief": 3.5}}, "EXECUTION_ERROR", "TypeError"),
    ("float token ids", {"actions": {**GOOD, "brief": [1.5, 2.0]}}, "EXECUTION_ERROR", "TypeError"),
    ("an object action", {"actions": {**GOOD, "brief": {"ids": [1]}}}, "EXECUTION_ERROR", "TypeError"),
    ("null for a live agent", {"actions": {**GOOD, "brief": None}}, "EXECUTION_ERROR", "TypeError"),
    ("token id above V-1", {"actions": {**GOOD, "brief": [1, 49152]}}, "EXECUTION_ERROR", "ValueError"),
    ("negative token id", {"actions": {**GOOD, "brief": [-1]}}, "EXECUTION_ERROR", "ValueError"),
    ("token id past int64", {"actions": {**GOOD, "brief": [2**70]}}, "EXECUTION_ERROR", "TypeError"),
    ("2-D token ids", {"actions": {**GOOD, "brief": [[1, 2], [3, 4]]}}, "EXECUTION_ERROR", "ValueError"),
    ("more ids than max_new_tokens", {"actions": {**GOOD, "brief": list(range(100, 117))}}, "EXECUTION_ERROR",
     "ValueError"),
    ("text longer than max_new_tokens", {"actions": {**GOOD, "brief": "word " * 400}}, "EXECUTION_ERROR",
     "ValueError"),
    ("a negative step_index", {"actions": GOOD, "step_index": -1}, "VALIDATION_ERROR", None),
    ("a step_index from the future", {"actions": GOOD, "step_index": 7}, "EXECUTION_ERROR", "ValueError"),
]


@pytest.mark.parametrize(("what", "data", "code", "error_type"), BAD_STEPS, ids=[b[0] for b in BAD_STEPS])
def test_a_bad_step_gets_a_clear_error_and_changes_nothing(xsum, what, data, code, error_type):
    ws = Socket(xsum.url)
    try:
        observation(ws.ask("reset", {"seed": 1}))
        before = ws.ask("state")["data"]
        message = error(ws.ask("step", data), code, error_type)
        assert message
        if what in ("unknown agent", "missing agent"):
            assert "ghost" in message or "detailed" in message
        if error_type == "ValueError" and "token" in what:
            assert "brief" in message  # names the agent
        assert ws.ask("state")["data"] == before  # nothing changed
        assert observation(ws.ask("step", {"actions": GOOD, "step_index": 0}))["step_count"] == 1  # still works
    finally:
        ws.close()


def test_bad_messages_get_clear_errors_on_a_working_socket(xsum):
    ws = Socket(xsum.url)
    try:
        assert "reset" in error(ws.ask("step", {"actions": GOOD}), "EXECUTION_ERROR", "RuntimeError")  # before reset
        assert "Invalid JSON" in error(ws.raw("{not json"), "INVALID_JSON")
        error(ws.raw("[1, 2]"), "VALIDATION_ERROR")
        error(ws.raw(json.dumps({"data": {}})), "VALIDATION_ERROR")  # no type
        error(ws.raw(json.dumps({"type": "step", "data": [1]})), "VALIDATION_ERROR")
        error(ws.ask("teleport"), "UNKNOWN_TYPE")
        error(ws.raw(b"\xff\xfe binary"), "INVALID_JSON")
        error(ws.ask("reset", {"seed": "zero"}), "EXECUTION_ERROR", "ValueError")
        error(ws.ask("reset", {"sed": 1}), "EXECUTION_ERROR", "TypeError")
        error(ws.ask("reset", {"task_index": 10**6}), "EXECUTION_ERROR", "ValueError")
        error(ws.ask("reset", {"split": "test"}), "EXECUTION_ERROR", "ValueError")
        huge = json.dumps({"type": "step", "data": {"actions": {"brief": "x" * 200_000, "detailed": "y"}}})
        assert "65536" in error(ws.raw(huge), "MESSAGE_TOO_LARGE")
        observation(ws.ask("reset", {"seed": 2}))
        for index in range(2):
            observation(ws.ask("step", {"actions": GOOD, "step_index": index}))
        assert "reset" in error(ws.ask("step", {"actions": GOOD}), "EXECUTION_ERROR", "RuntimeError")  # after the end
        observation(ws.ask("reset", {"seed": 3}))  # the same socket goes on
    finally:
        ws.close()
    assert xsum.get("/health") == {"status": "healthy"}
    assert "Traceback" not in xsum.log  # every error above was an answer, none a crash


def test_sequential_env_refuses_another_agents_action(tmp_path):
    with running("writing/xsum-sequential-v0", log_dir=tmp_path, make_kwargs={"max_new_tokens": 16}) as served:
        ws = Socket(served.url)
        try:
            first = observation(ws.ask("reset", {"seed": 0}))
            assert first["agent_selection"] == "brief" and list(first["observations"]) == ["brief"]
            before = ws.ask("state")["data"]
            message = error(ws.ask("step", {"actions": {"detailed": "Not my turn."}}), "EXECUTION_ERROR", "ValueError")
            assert "'brief'" in message and "'detailed'" in message
            error(ws.ask("step", {"actions": {"brief": "a", "detailed": "b"}}), "EXECUTION_ERROR", "KeyError")
            error(ws.ask("step", {"actions": {"nobody": "a"}}), "EXECUTION_ERROR", "KeyError")
            assert ws.ask("state")["data"] == before
            after = observation(ws.ask("step", {"actions": {"brief": GOOD["brief"]}}))
            assert after["agent_selection"] == "detailed"
            seen = ws.ask("observe", {"agent": "detailed"})["data"]["observation"]
            assert GOOD["brief"] in seen["text"]  # the later role sees the earlier role's response
        finally:
            ws.close()


# ------------------------------------------------------------------------------------------------ dropped connections
def test_a_dropped_connection_resumes_the_same_episode_and_a_resent_step_is_not_applied_twice(xsum):
    ws = Socket(xsum.url)
    first = observation(ws.ask("reset", {"seed": 5, "episode_id": "ep-5"}))
    session = first["session_id"]
    answer = ws.ask("step", {"actions": GOOD, "step_index": 0})
    ws.drop()
    time.sleep(0.2)
    again = Socket(xsum.url, f"?session_id={session}")
    try:
        state = again.ask("state")["data"]
        assert state["episode_id"] == "ep-5" and state["step_count"] == 1
        resent = again.ask("step", {"actions": GOOD, "step_index": 0})  # the answer was lost with the connection
        assert resent == answer
        assert again.ask("state")["data"]["step_count"] == 1
        last = observation(again.ask("step", {"actions": GOOD, "step_index": 1}))
        assert last["step_count"] == 2 and last["agents"] == []
        # A reset resent with its episode_id before the first step is answered from the reset it repeats.
        fresh = again.ask("reset", {"episode_id": "ep-6"})
        assert again.ask("reset", {"episode_id": "ep-6"}) == fresh
    finally:
        again.close()


def test_resume_by_episode_id_and_the_newest_socket_takes_over(xsum):
    ws = Socket(xsum.url)
    observation(ws.ask("reset", {"seed": 7, "episode_id": "ep-takeover"}))
    other = Socket(xsum.url, "?episode_id=ep-takeover")
    try:
        assert other.ask("state")["data"]["episode_id"] == "ep-takeover"
        with pytest.raises(ConnectionClosed) as closed:
            ws.ask("state")
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4000
        assert observation(other.ask("step", {"actions": GOOD}))["step_count"] == 1
    finally:
        other.close()
    lost = Socket(xsum.url, "?session_id=no-such-session")
    message = json.loads(lost.ws.recv(timeout=30))
    assert message["data"]["code"] == "UNKNOWN_SESSION" and "no-such-session" in message["data"]["message"]


def test_detached_sessions_expire_and_free_their_slot(tmp_path):
    with running("writing/xsum-v0", "--max-sessions", "1", "--resume-timeout-s", "1", log_dir=tmp_path,
                 make_kwargs={"max_new_tokens": 16}) as served:
        ws = Socket(served.url)
        session = observation(ws.ask("reset", {"seed": 0}))["session_id"]
        full = Socket(served.url)  # the one slot is taken
        message = json.loads(full.ws.recv(timeout=30))
        assert message["data"]["code"] == "CAPACITY_REACHED" and message["data"]["max_sessions"] == 1
        ws.drop()
        time.sleep(2.6)  # past the resume timeout, and the reaper's period
        gone = Socket(served.url, f"?session_id={session}")
        assert json.loads(gone.ws.recv(timeout=30))["data"]["code"] == "UNKNOWN_SESSION"
        new = Socket(served.url)  # the slot is free again
        try:
            assert observation(new.ask("reset", {"seed": 1}))["step_count"] == 0
        finally:
            new.close()
        closed_explicitly = Socket(served.url)  # a close message frees the slot at once
        closed_explicitly.close()
        time.sleep(0.2)
        again = Socket(served.url)
        try:
            observation(again.ask("reset", {"seed": 2}))
        finally:
            again.close()


def test_an_idle_socket_is_told_and_its_session_closed(tmp_path):
    with running("writing/xsum-v0", "--idle-timeout-s", "1", log_dir=tmp_path, make_kwargs={"max_new_tokens": 16}) \
            as served:
        ws = Socket(served.url)
        session = observation(ws.ask("reset", {"seed": 0}))["session_id"]
        message = json.loads(ws.ws.recv(timeout=10))
        assert message["data"]["code"] == "IDLE_TIMEOUT"
        time.sleep(0.2)
        gone = Socket(served.url, f"?session_id={session}")
        assert json.loads(gone.ws.recv(timeout=30))["data"]["code"] == "UNKNOWN_SESSION"


# ------------------------------------------------------------------------------------------------ SIGTERM
SLOW_TASK = '''
import time

import llm_envs
from llm_envs import TemplateTask


def _reward(problem, outputs):
    if "slow" in outputs["a"]:
        time.sleep(1.5)
    return float(bool(outputs["a"]))


def task():
    return TemplateTask(("a", "b"), [{"q": "one"}, {"q": "two"}], {"a": "Say {q}.", "b": "Say {q} too."}, _reward)


llm_envs.register("mine/slow-v0", task, max_new_tokens=8, max_prompt_tokens=96)
'''


def test_sigterm_finishes_the_step_in_flight_and_refuses_new_ones(tmp_path):
    (tmp_path / "slow_task.py").write_text(SLOW_TASK)
    served = start_server("mine/slow-v0", "--import", "slow_task", log_dir=tmp_path,
                          env=import_path_env([tmp_path]))
    try:
        ws = Socket(served.url)
        observation(ws.ask("reset", {"seed": 0}))
        late = Socket(served.url)
        observation(late.ask("reset", {"seed": 1}))
        answers: list[dict] = []
        step = threading.Thread(target=lambda: answers.append(ws.ask("step", {"actions": {"a": "slow", "b": "x"}})))
        step.start()
        time.sleep(0.5)  # the step is in its 1.5 s reward now
        served.proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        refused = late.ask("step", {"actions": {"a": "x", "b": "y"}})
        step.join(30)
        assert answers and observation(answers[0])["rewards"] == {"a": 1.0, "b": 1.0}  # finished and answered
        assert error(refused, "SHUTTING_DOWN")
        served.proc.wait(20)
        assert served.proc.returncode is not None
        assert "Traceback" not in served.log
    finally:
        served.stop(signal.SIGKILL)


# ------------------------------------------------------------------------------------------------ hostile code
HOSTILE = {
    "kills the server": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\ndef {name}(*a):\n    return 0\n",
    "exits early": "import sys\nsys.exit(0)\n",
    "loops forever": "while True:\n    pass\n",
    "reads the server's files": "print(open('/proc/1/environ').read())\ndef {name}(*a):\n    return 0\n",
}


def test_generated_code_runs_in_the_sandbox_not_the_server(tmp_path):
    import llm_envs

    local = llm_envs.make("coding/humaneval-v0", max_new_tokens=128)
    with running("coding/humaneval-v0", log_dir=tmp_path, make_kwargs={"max_new_tokens": 128}) as served:
        ws = Socket(served.url)
        try:
            pid_before = served.proc.pid
            for what, template in HOSTILE.items():
                first = observation(ws.ask("reset", {"seed": 0, "task_index": 0}))
                local.reset(seed=0, options={"task_index": 0})
                name = local.problem["entry_point"]
                code = template.replace("{name}", name)
                actions = {agent: code for agent in first["agents"]}
                got = observation(ws.ask("step", {"actions": actions}))
                infos = got["infos"][first["agents"][0]]
                assert infos["reward_tests"] == 0.0, what  # no test passed: no credit it did not earn
                assert infos == local.step(actions)[4][first["agents"][0]], what  # as the local env judges it
                assert served.proc.poll() is None and served.get("/health") == {"status": "healthy"}, what
            assert served.proc.pid == pid_before
        finally:
            ws.close()


# ------------------------------------------------------------------------------------------------ the step cap
def test_steps_run_at_most_max_concurrent_steps_at_once_whatever_the_sessions():
    """A code env's step runs programs: the cap bounds how many run at once (and how many sandbox servers exist),
    not the sessions. Four sessions step at once on a server capped at two; the task counts steps in its reward."""
    import llm_envs
    import llm_envs.remote
    import llm_envs.serve
    from llm_envs import TemplateTask

    running_now, seen = [0], [0]
    lock = threading.Lock()

    def reward(problem, outputs):
        with lock:
            running_now[0] += 1
            seen[0] = max(seen[0], running_now[0])
        time.sleep(0.3)
        with lock:
            running_now[0] -= 1
        return 1.0

    llm_envs.register("mine/counted-v0", lambda: TemplateTask(("a",), [{"q": "x"}], {"a": "Say {q}."}, reward),
                      max_new_tokens=8, max_prompt_tokens=64, replace=True)
    with llm_envs.serve.background("mine/counted-v0", max_concurrent_steps=2) as server:
        envs = [llm_envs.remote.connect(server.url) for _ in range(4)]
        for env in envs:
            env.reset(seed=0)
        results: list = []
        threads = [threading.Thread(target=lambda e=env: results.append(e.step({"a": "hi"})[1]["a"])) for env in envs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert results == [1.0] * 4
        assert 1 <= seen[0] <= 2
        for env in envs:
            env.close()
