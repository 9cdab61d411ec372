"""The sandbox: correct per-assertion results, and hostile programs contained with zero credit.

Every test runs on both paths: the fork server (where the host allows it) and the one process per
program fallback."""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from llm_envs import sandbox
from llm_envs.sandbox import (
    FORK_SERVER_ENV,
    NUM_UID_SLOTS,
    UNPRIVILEGED_UID_BASE,
    SandboxJob,
    SandboxLimits,
    api,
    isolation_report,
    pool,
    run_many,
    run_tests,
    split_tests,
)

FAST = SandboxLimits(timeout_s=5.0, test_timeout_s=1.0, cpu_time_s=4, memory_mb=256, max_processes=8,
                     max_file_mb=1, max_output_bytes=2048, max_timeouts=1)
TESTS = """
def check(candidate):
    assert candidate(1) == 2
    assert candidate(5) == 6
    assert candidate(-1) == 0
"""
GOOD = "def inc(x):\n    return x + 1\n"
PROJECT_ROOT = Path(__file__).resolve().parents[1]
PATHS = ("fork_server", "process_per_program")


@pytest.fixture(autouse=True, params=PATHS)
def sandbox_path(request, monkeypatch) -> str:
    """Run the test on one path: the fork server (where this host allows it) or the fallback."""
    if request.param == "fork_server":
        fast, reason = api._fork_server_status()
        if not fast and os.geteuid() == 0 and os.environ.get(FORK_SERVER_ENV) != "0":
            pytest.fail(f"the fork server should run here (root on Linux) but does not: {reason}")
        if not fast:
            pytest.skip(f"the fork server does not run on this host: {reason}")
    else:
        monkeypatch.setattr(api, "_fork_server_status", lambda: (False, "switched off by the test"))
    return request.param


def _server_pids() -> set[int]:
    """The idle fork servers and their launchers (long-lived by design, not leftovers of a run)."""
    return {pid for s in pool._idle_servers for pid in (s.server_pid, s.proc.pid if s.proc else None) if pid}


def _slot_uids() -> range:
    """The uids this process's runs get (as root)."""
    if os.geteuid() != 0:
        return range(0)
    first = UNPRIVILEGED_UID_BASE + (os.getpid() % 100_000) * NUM_UID_SLOTS
    return range(first, first + NUM_UID_SLOTS)


def _ours(pid: int) -> bool:
    """Whether ``pid`` descends from this test process, or was orphaned (a survivor whose parent exited):
    another test process's workers on the same machine are not this test's business."""
    me = os.getpid()
    for hop in range(64):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            return False
        if ppid == me or (hop == 0 and ppid <= 1):
            return True
        if ppid <= 1:
            return False
        pid = ppid
    return False


def _own_sandbox_processes() -> list[int]:
    """Live processes started by this test process's sandbox runs, the fork servers excepted."""
    uids = set(_slot_uids())
    servers = _server_pids()
    # This checkout's worker only: other checkouts' runs on the same machine are not this test's business.
    worker = os.path.join(os.path.dirname(os.path.abspath(sandbox.__file__)), "worker.py").encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) in servers:
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as fh:
                cmdline = fh.read()
            with open(f"/proc/{entry.name}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
            uid = entry.stat().st_uid
        except OSError:
            continue
        if state != "Z" and (uid in uids or (worker in cmdline and uid == os.getuid() and _ours(int(entry.name)))):
            found.append(int(entry.name))
    return found


def _run(program: str, tests: str = TESTS, entry_point: str = "inc", **kwargs):
    start = time.monotonic()
    result = run_tests(program, tests, entry_point, limits=kwargs.pop("limits", FAST), **kwargs)
    elapsed = time.monotonic() - start
    assert elapsed < FAST.timeout_s + 5, f"the caller waited {elapsed:.1f} s"
    deadline = time.monotonic() + 3
    while _own_sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _own_sandbox_processes() == [], "a sandboxed process survived its run"
    return result


def test_correct_program_passes_every_assertion():
    result = _run(GOOD)
    assert (result.passed, result.total, result.reason) == (3, 3, "ok")
    assert result.all_passed and result.fraction == 1.0


def test_failed_assertions_report_expected_and_actual():
    result = _run("def inc(x):\n    return x + 2 if x > 0 else x + 1\n")
    assert [o.status for o in result.outcomes] == ["failed", "failed", "passed"]
    assert result.outcomes[0].message == "expected 2, got 3"


def test_exceptions_in_the_program_are_errors_with_their_type():
    result = _run("def inc(x):\n    return {}[x]\n")
    assert {o.status for o in result.outcomes} == {"error"}
    assert result.outcomes[0].message.startswith("KeyError")


def test_split_tests_counts_assertions_on_the_candidate_including_loops():
    tests = (
        "def check(candidate):\n    import math\n    assert True, 'debug'\n    assert candidate(1) == 2\n"
        "    for i in range(3):\n        assert candidate(i) == i + 1\n"
    )
    assert split_tests(tests) == [
        "assert candidate(1) == 2",
        "for i in range(3):\n        assert candidate(i) == i + 1",
    ]
    assert _run(GOOD, tests).passed == 2


def test_plain_data_round_trips_through_the_channel():
    program = ("def inc(x):\n    return [x, (x, 'a'), {x: {1.5, -2}}, frozenset([x]), b'\\x00', None, True,"
               " 10**400, float('inf'), 1+2j]\n")
    tests = ("def check(candidate):\n    assert candidate(3) == [3, (3, 'a'), {3: {1.5, -2}}, frozenset([3]),"
             " b'\\x00', None, True, 10**400, float('inf'), 1+2j]\n")
    assert _run(program, tests).all_passed


def test_test_globals_run_next_to_the_tests():
    tests = "def check(candidate):\n    assert helper(candidate(1)) == 4\n"
    assert _run(GOOD, tests, test_globals="def helper(v):\n    return v * 2\n").all_passed


def test_load_errors_fail_every_assertion_with_the_reason():
    result = _run("def inc(x, y=undefined_name):\n    return x + 1\n")
    assert result.reason == "load_error" and "NameError" in result.load_error
    assert {o.status for o in result.outcomes} == {"not_run"} and result.passed == 0


def test_run_many_keeps_order_and_runs_concurrently():
    jobs = [SandboxJob(GOOD if i % 2 == 0 else "def inc(x):\n    return x\n", TESTS, "inc", limits=FAST)
            for i in range(6)]
    results = run_many(jobs)
    assert [r.passed for r in results] == [3, 0, 3, 0, 3, 0]


def test_bad_arguments_fail_clearly():
    with pytest.raises(ValueError, match="entry_point must be a Python identifier, got 'not valid'"):
        run_tests(GOOD, TESTS, "not valid")
    with pytest.raises(ValueError, match="defines no `check"):
        run_tests(GOOD, "assert 1", "inc")
    with pytest.raises(ValueError, match="timeout_s must be a positive finite number, got -1"):
        SandboxLimits(timeout_s=-1)
    with pytest.raises(ValueError, match="memory_mb must be a positive int, got 0"):
        SandboxLimits(memory_mb=0)
    with pytest.raises(TypeError, match=r"jobs\[0\] must be a SandboxJob"):
        run_many(["x", "y"])


# -- hostile programs: each is contained, scores zero, and leaves the caller unharmed -----------------


def test_infinite_loop_times_out_and_later_tests_are_not_run():
    result = _run("def inc(x):\n    while True:\n        pass\n")
    assert result.passed == 0 and result.reason == "timeout"
    assert result.outcomes[0].status == "timeout"
    limits = SandboxLimits(timeout_s=5.0, test_timeout_s=0.5, max_timeouts=2)
    result = _run("def inc(x):\n    while True:\n        pass\n", limits=limits)
    assert [o.status for o in result.outcomes] == ["timeout", "timeout", "not_run"]
    assert result.outcomes[2].message == "skipped after 2 timed-out tests"


def test_the_cpu_time_limit_is_a_timeout_not_a_crash():
    # The kernel kills the program with SIGXCPU at `cpu_time_s`, here long before the wall-clock limits:
    # at load time and inside a call. (With equal limits the two race; either way it is a timeout.)
    limits = SandboxLimits(timeout_s=8.0, test_timeout_s=8.0, cpu_time_s=1, max_timeouts=1, max_restarts=0)
    for program in ("while True:\n    pass\n", "def inc(x):\n    while True:\n        pass\n"):
        start = time.monotonic()
        result = _run(program, limits=limits)
        assert time.monotonic() - start < 6.0, "killed by the CPU limit, not the wall clock"
        assert result.reason == "timeout", result
        assert result.outcomes[0].status == "timeout", result.outcomes[0]
        assert result.outcomes[0].message == "CPU time limit of 1 s reached"
        assert [o.status for o in result.outcomes[1:]] == ["not_run", "not_run"]


def test_fork_bomb_is_contained():
    program = (
        "import os\ndef inc(x):\n    while True:\n        try:\n            os.fork()\n"
        "        except OSError:\n            pass\n"
    )
    result = _run(program)
    assert result.passed == 0


def test_memory_bomb_is_contained():
    program = "def inc(x):\n    blocks = []\n    while True:\n        blocks.append(bytearray(50 * 2**20))\n"
    result = _run(program, limits=SandboxLimits(timeout_s=5.0, test_timeout_s=2.0, memory_mb=128, max_timeouts=1))
    assert result.passed == 0
    errors = [o.message for o in result.outcomes if o.status == "error"]
    assert all("MemoryError" in m or "killed" in m for m in errors)
    assert {o.status for o in result.outcomes} <= {"error", "timeout", "not_run"}


def test_printing_a_gigabyte_is_capped():
    program = (
        "def inc(x):\n    chunk = 'y' * 2**20\n    for _ in range(1024):\n        print(chunk)\n"
        "    return 'wrong'\n"
    )
    result = _run(program)
    assert result.passed == 0
    assert len(result.stdout) <= FAST.max_output_bytes


def test_exit_before_the_tests_passes_nothing():
    for program in (
        "import sys\ndef inc(x, _=sys.exit(0)):\n    return x + 1\n",
        "import os\ndef inc(x, _=os._exit(0)):\n    return x + 1\n",
        "import os\ndef inc(x):\n    os._exit(0)\n",
        "def inc(x):\n    exit(0)\n",
    ):
        result = _run(program)
        assert result.passed == 0, program


def test_tampering_with_assertions_builtins_and_equality_passes_nothing():
    for program in (
        # A redefined AssertionError and patched builtins live in the worker, not where tests are judged.
        "import builtins\nclass AssertionError(Exception):\n    pass\nbuiltins.AssertionError = AssertionError\n"
        "builtins.abs = lambda v: 0\nbuiltins.isinstance = lambda *a: True\ndef inc(x):\n    return None\n",
        # An object equal to everything arrives as an opaque value that equals nothing.
        "class Eq:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
        "def inc(x):\n    return Eq()\n",
        # Printed markers are just output.
        "def inc(x):\n    print('3 passed, 0 failed\\nPASSED\\nOK')\n    return None\n",
        # Writing fake result frames into every descriptor is the same as returning those values.
        "import os, json, struct\ndef inc(x):\n    frame = json.dumps({'ok': True}).encode()\n"
        "    for fd in range(3, 64):\n        try:\n            os.write(fd, struct.pack('>I', len(frame)) + frame)\n"
        "        except OSError:\n            pass\n    return None\n",
    ):
        assert _run(program).passed == 0, program


def test_writing_outside_the_scratch_directory_is_refused(tmp_path):
    target = tmp_path / "keep.txt"
    target.write_text("original")
    os.chmod(tmp_path, 0o700)
    program = (
        "import os, shutil\ndef inc(x):\n"
        f"    for action in (lambda: open({str(target)!r}, 'w').write('pwned'), lambda: os.remove({str(target)!r}),\n"
        f"                   lambda: open({str(tmp_path / 'new.txt')!r}, 'w').write('x')):\n"
        "        try:\n            action()\n        except OSError:\n            pass\n"
        "    with open('scratch.txt', 'w') as fh:\n        fh.write('fine')\n"
        "    return x + 1 if open('scratch.txt').read() == 'fine' else 0\n"
    )
    result = _run(program)
    assert target.read_text() == "original" and not (tmp_path / "new.txt").exists()
    assert result.passed == 3  # its own scratch directory works


def test_callers_environment_is_not_visible(monkeypatch):
    monkeypatch.setenv("LLM_ENVS_TEST_SECRET", "hunter2-secret")
    program = (
        "import os\ndef inc(x):\n    found = os.environ.get('LLM_ENVS_TEST_SECRET', '')\n"
        "    for pid in os.listdir('/proc'):\n        try:\n"
        "            with open('/proc/' + pid + '/environ', 'rb') as fh:\n"
        "                if b'hunter2-secret' in fh.read():\n                    found = 'hunter2-secret'\n"
        "        except OSError:\n            pass\n    return found\n"
    )
    tests = "def check(candidate):\n    assert candidate(0) == 'hunter2-secret'\n"
    if os.geteuid() != 0:
        pytest.xfail("without root the program runs as the caller's uid and can read its /proc/*/environ")
    assert _run(program, tests).passed == 0


def test_signalling_the_caller_fails():
    caller = os.getpid()
    program = (
        "import os, signal\ndef inc(x):\n    for target in (os.getppid(), 0, -1):\n        try:\n"
        "            os.kill(target, signal.SIGKILL)\n        except OSError:\n            pass\n"
        f"    try:\n        os.kill({caller}, signal.SIGTERM)\n    except OSError:\n        return x\n"
        "    return x + 1\n"
    )
    result = _run(program)
    assert os.getpid() == caller  # the caller is still here
    assert result.passed == 0  # the signal to the caller's pid was never delivered


def test_child_process_left_sleeping_does_not_survive():
    program = (
        "import os, time\ndef inc(x):\n    if os.fork() == 0:\n        os.setsid()\n"
        "        time.sleep(60)\n        os._exit(0)\n    return x + 1\n"
    )
    result = _run(program)  # _run asserts that no sandboxed process is left
    assert result.passed == 3


def test_network_is_isolated_when_the_host_allows_it():
    program = "import socket\ndef inc(x):\n    return sorted(name for _, name in socket.if_nameindex())\n"
    tests = "def check(candidate):\n    assert candidate(0) == ['lo']\n"
    result = _run(program, tests)
    assert result.network_isolated == isolation_report()["network_isolated"]
    assert result.all_passed == result.network_isolated


def test_caller_signal_handlers_and_state_are_untouched():
    before = signal.getsignal(signal.SIGINT)
    _run("import signal\ndef inc(x):\n    signal.signal(signal.SIGINT, signal.SIG_IGN)\n    return x + 1\n")
    assert signal.getsignal(signal.SIGINT) == before


# -- the file system, the disk, and what one program could leave for the next --------------------


def test_files_outside_the_scratch_directory_are_hidden(sandbox_path, tmp_path):
    mine = tmp_path / "secret.txt"
    mine.write_text("secret")
    os.chmod(tmp_path, 0o755)
    secrets = [str(PROJECT_ROOT / "pyproject.toml"), "/etc/passwd", "/etc/hostname", str(mine),
               str(Path(sandbox.__file__).resolve())]
    program = (
        "import os\ndef inc(x):\n    seen = {}\n"
        f"    for path in {secrets!r}:\n"
        "        try:\n            seen[path] = open(path).read(14)\n"
        "        except OSError as err:\n            seen[path] = type(err).__name__\n"
        "    site = os.path.join(os.path.dirname(os.__file__), 'site-packages')\n"
        "    installed = os.listdir(site) if os.path.isdir(site) else []  # masked by an empty mount\n"
        "    return sorted(os.listdir('/')), seen, os.getcwd(), installed\n"
    )
    assert isolation_report()["filesystem_hidden"] == (sandbox_path == "fork_server")
    if sandbox_path == "fork_server":
        # The whole tree: device nodes, the standard library's path (read-only), the scratch directory.
        expected = (sorted({"dev", "tmp", sandbox.isolation._stdlib_dir().strip("/").split("/")[0]}),
                    dict.fromkeys(secrets, "FileNotFoundError"), "/tmp", [])
        tests = f"def check(candidate):\n    assert candidate(0) == {expected!r}\n"
    else:  # the fallback does not hide the file system, and the report says so
        tests = f"def check(candidate):\n    assert candidate(0)[1][{secrets[0]!r}] == '[build-system]'\n"
    result = _run(program, tests)
    assert result.all_passed, result.outcomes[0].message
    assert result.filesystem_hidden == (sandbox_path == "fork_server")


DISK_TESTS = "def check(candidate):\n    assert candidate(0) == {expected!r}\n"
FILL_THE_DISK = """
import errno
def inc(x):
    written = 0
    try:
        with open('big', 'wb') as fh:
            for _ in range(100):
                fh.write(b'x' * 2**20)
                fh.flush()
                written += 1
    except OSError as err:
        return errno.errorcode[err.errno], written <= {cap}
    return 'no error', written
"""
MANY_FILES = """
import errno
def inc(x):
    for i in range(1000):
        try:
            open(f'f{i}', 'w').close()
        except OSError as err:
            return errno.errorcode[err.errno], i < 32
    return 'no error', 1000
"""


def test_filling_the_disk_is_an_error_not_a_crash(sandbox_path):
    unhandled = "def inc(x):\n    open('big', 'wb').write(b'x' * 100 * 2**20)\n    return x + 1\n"
    if sandbox_path == "fork_server":
        limits = SandboxLimits(timeout_s=10.0, test_timeout_s=5.0, max_disk_mb=4, max_disk_files=32, max_file_mb=64)
        assert _run(FILL_THE_DISK.format(cap=4), DISK_TESTS.format(expected=("ENOSPC", True)), limits=limits).all_passed
        assert _run(MANY_FILES, DISK_TESTS.format(expected=("ENOSPC", True)), limits=limits).all_passed
        message = "No space left on device"
    else:  # only each file is capped (max_file_mb)
        limits = SandboxLimits(timeout_s=10.0, test_timeout_s=5.0, max_file_mb=2)
        assert _run(FILL_THE_DISK.format(cap=2), DISK_TESTS.format(expected=("EFBIG", True)), limits=limits).all_passed
        message = "File too large"
    result = _run(unhandled, limits=limits)
    assert {o.status for o in result.outcomes} == {"error"} and result.reason == "ok"
    assert message in result.outcomes[0].message


LEAVE_SOMETHING_BEHIND = """
import ctypes, os, socket, time
def inc(x):
    open('note.txt', 'w').write('from the last program')
    libc = ctypes.CDLL(None, use_errno=True)
    shm = libc.shmget(0x5EED, 4096, 0o1666)  # IPC_CREAT | 0666: a System V segment outlives its creator
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind('\\0llm-envs-sandbox-test')
    listener.listen()
    child = os.fork()
    if child == 0:
        os.setsid()
        time.sleep(60)
        os._exit(0)
    os.write(1, str(child).encode())
    return [child, shm]
"""
LOOK_FOR_IT = """
import ctypes, os, socket
def inc(leftover):
    found = [name for name in os.listdir('.') if not name.startswith('.')]  # the fallback's own files
    try:
        os.kill(leftover, 0)
        found.append('process')
    except OSError:
        pass
    if ctypes.CDLL(None, use_errno=True).shmget(0x5EED, 0, 0) != -1:
        found.append('shm')
    try:
        socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).connect('\\0llm-envs-sandbox-test')
        found.append('socket')
    except OSError:
        pass
    return found
"""


def test_nothing_a_program_leaves_behind_reaches_the_next_one(sandbox_path):
    first = _run(LEAVE_SOMETHING_BEHIND, "def check(candidate):\n    assert candidate(0)[1] != -1\n")
    assert first.all_passed, first.outcomes[0].message  # it did create the System V segment
    child = int(first.stdout) if first.stdout else 2
    second = _run(LOOK_FOR_IT, f"def check(candidate):\n    assert candidate({child}) == []\n")
    assert second.all_passed, second.outcomes[0].message


CORRUPT_THE_INTERPRETER = """
import builtins, json, math, os, random, sys, typing
def inc(x):
    builtins.len = lambda value: 0
    math.sqrt = lambda value: -1.0
    json.dumps = lambda *args, **kwargs: '{"ok": ["i", "0x7"]}'
    typing.List = None
    random.seed(0)
    sys.setrecursionlimit(40)
    os.environ['LLM_ENVS_LEFT_BEHIND'] = '1'
    for module in list(sys.modules.values()):
        for name in ('encode', 'write_frame', 'serve_program'):
            if hasattr(module, name):
                setattr(module, name, None)
    sys.modules['__main__'].__dict__.clear()
    return x + 1
"""
USE_THE_INTERPRETER = """
import json, math, os, random
from typing import List
def inc(x):
    values: List[int] = [x, x + 1]
    return [len(values), math.sqrt(16.0), json.dumps({'a': x}), os.environ.get('LLM_ENVS_LEFT_BEHIND'),
            random.random() != random.Random(0).random()]
"""


def test_a_program_that_corrupts_its_interpreter_does_not_affect_the_next(sandbox_path):
    servers = _server_pids()
    broken = _run(CORRUPT_THE_INTERPRETER)  # it breaks its own result channel too
    assert broken.passed == 0 and broken.reason == "crashed"
    tests = "def check(candidate):\n    assert candidate(1) == [2, 4.0, '{\"a\": 1}', None, True]\n"
    for _ in range(3):
        result = _run(USE_THE_INTERPRETER, tests)
        assert result.all_passed, result.outcomes[0].message
    if sandbox_path == "fork_server":
        assert _server_pids() == servers  # the same warm servers ran all of them


@pytest.mark.parametrize("sandbox_path", ["fork_server"], indirect=True)
def test_a_dead_fork_server_is_replaced(sandbox_path):
    _run(GOOD)
    victim = pool._idle_servers[-1]
    os.kill(victim.server_pid, signal.SIGKILL)
    assert _run(GOOD).all_passed
    assert victim.dead and victim.server_pid not in _server_pids()
    # A server killed while a program runs: that test fails, the caller neither hangs nor crashes.
    busy = list(pool._idle_servers)

    def kill_the_server_once_a_program_runs() -> None:
        """Kill the server whose program has been running for a second (loaded, inside the call)."""
        seen: dict[str, float] = {}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for server in busy:
                try:
                    with open(f"/proc/{server.server_pid}/task/{server.server_pid}/children") as fh:
                        child = fh.read().strip()
                except OSError:  # a server that is gone already
                    continue
                if child and time.monotonic() - seen.setdefault(child, time.monotonic()) > 1.0:
                    os.kill(server.server_pid, signal.SIGKILL)
                    return
            time.sleep(0.01)

    killer = threading.Thread(target=kill_the_server_once_a_program_runs)
    killer.start()
    program = "import time\ndef inc(x):\n    if x == 1:\n        time.sleep(5)\n    return x + 1\n"
    limits = SandboxLimits(timeout_s=20.0, test_timeout_s=10.0)
    result = _run(program, "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(2) == 3\n",
                  limits=limits)
    killer.join()
    assert [o.status for o in result.outcomes] == ["error", "passed"], result.outcomes
    assert result.duration_s < 5  # the caller noticed at once, it did not wait for the sleep
    assert _run(GOOD).all_passed


@pytest.mark.parametrize("sandbox_path", ["fork_server", pytest.param("process_per_program", marks=pytest.mark.slow)],
                         indirect=True)
def test_a_thousand_programs_leak_no_process_fd_mount_or_directory(sandbox_path):
    """No process, descriptor, mount or scratch directory outlives its program, a third of which fork. The
    fallback path starts a Python per program (~40 ms each): 300 of them show a leak of one thing per
    program (or per forking program) as plainly as 1000 would, at a third of the time."""
    count = 1000 if sandbox_path == "fork_server" else 300
    scratch = os.path.join(tempfile.gettempdir(), "llm-envs-sandbox-")
    owners = {os.getuid()} | set(_slot_uids())  # the temporary directory is shared with other processes

    def leftovers() -> tuple:
        mounts = sorted(len(open(f"/proc/{pid}/mountinfo").read().splitlines())
                        for pid in (s.server_pid for s in pool._idle_servers))
        dirs = sorted(e.name for e in os.scandir(tempfile.gettempdir())
                      if e.path.startswith(scratch) and e.stat().st_uid in owners)
        return len(os.listdir("/proc/self/fd")), mounts, dirs

    jobs = [SandboxJob(GOOD if i % 3 else "import os\ndef inc(x):\n    os.fork()\n    return x\n", TESTS, "inc",
                       limits=FAST) for i in range(count)]
    run_many(jobs[:8])
    before = leftovers()
    results = run_many(jobs)
    assert [r.passed for r in results] == [0 if i % 3 == 0 else 3 for i in range(count)]
    deadline = time.monotonic() + 3
    while _own_sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _own_sandbox_processes() == []
    assert leftovers() == before


def test_the_report_names_the_path_that_ran(sandbox_path, monkeypatch):
    report = isolation_report()
    result = _run(GOOD)
    assert report["path"] == result.path == sandbox_path
    if sandbox_path == "fork_server":
        assert report["fallback_reason"] == ""
        assert all(report[flag] for flag in ("network_isolated", "pid_namespace", "filesystem_hidden", "disk_capped",
                                             "privileges_dropped"))
    monkeypatch.setenv(FORK_SERVER_ENV, "0")
    assert api._probe_fork_server() == (False, f"switched off by {FORK_SERVER_ENV}=0")


def test_bad_disk_limits_fail_clearly():
    with pytest.raises(ValueError, match="max_disk_mb must be a positive int, got 0"):
        SandboxLimits(max_disk_mb=0)
    with pytest.raises(ValueError, match=r"max_disk_files must be a positive int, got 1\.5"):
        SandboxLimits(max_disk_files=1.5)




def test_a_forked_caller_makes_its_own_pool_and_servers(sandbox_path):
    assert run_many([SandboxJob(GOOD, TESTS, "inc", limits=FAST)] * 3)[0].all_passed  # pool and servers exist
    parents = _server_pids()
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # a data-loader worker, say
        try:
            results = run_many([SandboxJob(GOOD, TESTS, "inc", limits=FAST)] * 3)
            report = f"{sum(r.passed for r in results)} {sorted(_server_pids() & parents)}"
            os.write(write_end, report.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    report = os.read(read_end, 1000).decode()
    os.close(read_end)
    os.waitpid(child, 0)
    assert report == "9 []"  # all passed, on servers of its own
    assert _server_pids() == parents and _run(GOOD).all_passed


@pytest.mark.parametrize("sandbox_path", ["fork_server"], indirect=True)
def test_a_fork_server_that_cannot_start_says_why_and_the_probe_falls_back(sandbox_path, monkeypatch):
    monkeypatch.setattr(pool, "_stdlib_dir", lambda: "/nonexistent/python3")
    with pytest.raises(OSError, match="fork server did not start: binding the standard library: No such file"):
        pool._ForkServer()
    fast, reason = api._probe_fork_server()
    assert not fast and "binding the standard library" in reason


# A driver (trusted-side code, sandboxed) calling its peer (untrusted) across processes: ClassEval's layout.
DRIVER = """
def __sandbox_object__(tag, rest):
    return ("opaque", rest[0]) if tag == "o" else None


def call(name, *args):
    if name == "dumpable":  # 0: no process of its uid (its peer's) may ptrace it
        import ctypes
        return ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)
    if name == "imports_from_the_scratch":  # the scratch is the peer's too: nothing may be imported from it
        import os
        import sys
        return [p for p in sys.path if os.path.realpath(p).startswith(os.path.realpath(os.getcwd()))]
    return list(__sandbox_relay__(name, args, {}))
"""
PEER = """
import datetime


class Thing:
    def __eq__(self, other):
        return True


def add(a, b):
    return a + b


def thing():
    return Thing()


def today():
    return datetime.date(2024, 2, 29)


def exits():
    import os
    os._exit(3)


def hangs():
    while True:
        pass


def attach():
    import ctypes
    import os
    libc = ctypes.CDLL(None, use_errno=True)
    return [pid for pid in range(1, 128) if pid != os.getpid() and libc.ptrace(16, pid, 0, 0) == 0]
"""
PEER_TESTS = """
import datetime


def check(candidate):
    assert candidate("add", 1, 2) == ["ok", 3]
    assert candidate("add", 1, "x")[:2] == ["raised", "TypeError"]
    assert candidate("thing") == ["ok", ("opaque", "Thing")]
    assert candidate("today") == ["ok", datetime.date(2024, 2, 29)]
    assert candidate("exits") == ["ok", None]
    assert candidate("add", 2, 2) == ["ok", 4]
    assert candidate("hangs") == ["ok", None]
    assert candidate("add", 2, 3) == ["ok", 5]
    assert candidate("attach") == ["ok", []]
    assert candidate("dumpable") == 0
    assert candidate("imports_from_the_scratch") == []
"""


def test_a_driver_calls_its_peer_and_the_peers_failures_are_its_tests():
    result = _run(DRIVER, PEER_TESTS, "call", peer=PEER, limits=replace(FAST, max_timeouts=2))
    statuses = [o.status for o in result.outcomes]
    assert statuses == ["passed"] * 4 + ["error", "passed", "timeout"] + ["passed"] * 4, result.outcomes
    assert result.outcomes[4].message == "the program's process exited with status 3"  # the peer's, not the driver's
    assert result.load_error is None


def test_a_peer_that_fails_to_load_fails_every_test_and_a_driver_error_is_named():
    result = _run(DRIVER, PEER_TESTS, "call", peer="def add(a, b):\n    return a +\n")
    assert result.reason == "load_error" and result.load_error.startswith("SyntaxError (line 2)")
    assert {o.status for o in result.outcomes} == {"not_run"}
    result = _run(DRIVER + "\nimport no_such_module\n", PEER_TESTS, "call", peer=PEER)
    assert result.load_error.startswith("(the driver) ModuleNotFoundError")
    result = _run(DRIVER, PEER_TESTS, "call", peer="import os\nos._exit(0)\n")
    assert result.passed == 0 and "the program's process exited with status 0" in result.outcomes[0].message
