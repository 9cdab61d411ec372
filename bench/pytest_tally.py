"""Run a pytest command (``make test-gpu``, ``python -m pytest ...``) and print its tally as one JSON line: passed,
failed, errors and skipped counts, the failing tests' ids, the skips' reasons, the exit status and the seconds,
with the machine (CPU, and the GPU when there is one). scripts/gpu_window.sh keeps it as the window's
``test_gpu`` figure.

    python bench/pytest_tally.py [--limit SECONDS] -- make test-gpu GPU_PY=python3 GPU_WORKERS=8

The tally is read from a JUnit XML report that the command's pytest writes (``PYTEST_ADDOPTS`` gets
``--junitxml``, so any pytest the command starts writes it). With ``--limit`` the command is interrupted
(SIGINT, as Ctrl-C: pytest stops and still writes the report of the tests that ran) when it runs longer, then
killed 20 s later; the tally says it was interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def test_id(case: ET.Element) -> str:
    """A JUnit test case's pytest id, ``tests/test_x.py::test_name`` (``Class::`` kept).

    >>> test_id(ET.fromstring('<testcase classname="tests.test_x.TestA" name="test_b[1]" file="tests/test_x.py"/>'))
    'tests/test_x.py::TestA::test_b[1]'
    >>> test_id(ET.fromstring('<testcase classname="tests.test_x" name="test_c"/>'))
    'tests/test_x.py::test_c'
    """
    classname, name = case.get("classname", ""), case.get("name", "")
    file = case.get("file")
    if file:
        module = file.removesuffix(".py").replace("/", ".")
        inner = classname.removeprefix(module).lstrip(".")
        return "::".join(part for part in (file, inner, name) if part)
    return f"{classname.replace('.', '/')}.py::{name}"


def tally(report: Path) -> dict[str, Any]:
    """Counts, failing ids and skip reasons of a JUnit XML report (every test suite in it; a test interrupted
    before its outcome is not counted).

    >>> import tempfile
    >>> xml = ('<testsuites><testsuite><testcase classname="tests.test_a" name="test_ok"/>'
    ...        '<testcase classname="tests.test_a" name="test_bad"><failure message="x"/></testcase>'
    ...        '<testcase classname="tests.test_b" name="test_two"><skipped message="two GPUs"/></testcase>'
    ...        '<testcase classname="tests.test_b" name="test_set_up"><error message="y"/></testcase>'
    ...        '<testcase time="0.000"/></testsuite></testsuites>')
    >>> path = Path(tempfile.mkdtemp()) / "report.xml"
    >>> _ = path.write_text(xml)
    >>> t = tally(path)
    >>> t["passed"], t["failed"], t["errors"], t["skipped"], t["failing"], t["skip_reasons"]
    (1, 1, 1, 1, ['tests/test_a.py::test_bad', 'tests/test_b.py::test_set_up'], {'two GPUs': 1})
    """
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failing: list[str] = []
    reasons: dict[str, int] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        if not case.get("name"):
            continue  # the test an interrupt stopped: pytest writes an empty record of it
        outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), None)
        if outcome is None:
            counts["passed"] += 1
        elif outcome == "skipped":
            counts["skipped"] += 1
            reason = " ".join((case.find("skipped").get("message") or "").split())[:200]
            reasons[reason] = reasons.get(reason, 0) + 1
        else:
            counts["failed" if outcome == "failure" else "errors"] += 1
            failing.append(test_id(case))
    return {**counts, "failing": sorted(set(failing)), "skip_reasons": reasons}


def run(command: list[str], report: Path, limit: float | None) -> tuple[int, bool]:
    """Run ``command`` (its output passed through) with pytest told to write ``report``; (exit status,
    interrupted)."""
    env = dict(os.environ)
    env["PYTEST_ADDOPTS"] = f"{env.get('PYTEST_ADDOPTS', '')} --junitxml={report} -o junit_family=xunit1".strip()
    process = subprocess.Popen(command, env=env, start_new_session=True)

    def stop(signum: int, frame: object) -> None:  # killed from outside (the window's `timeout`): no orphans
        os.killpg(process.pid, signal.SIGKILL)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        return process.wait(timeout=limit), False
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGINT)
        try:
            return process.wait(timeout=20), True
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            return process.wait(), True


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (tests/test_gpu_window.py parses the window's command lines with it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=float, default=None, help="seconds before the command is interrupted")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the pytest command, after --")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the pytest command after --")
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        start = time.perf_counter()
        status, interrupted = run(command, report, args.limit)
        seconds = time.perf_counter() - start
        counts = tally(report) if report.is_file() else {"report": "none written (pytest did not finish a session)"}
    import torch

    from agents.models import device_description, machine_description

    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(json.dumps({
        "bench": "pytest_tally", "command": shlex.join(command), "rc": status, "interrupted": interrupted,
        "seconds": round(seconds, 1), **counts, "device": device,
        "machine": {**machine_description(None), **device_description(device)},
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
