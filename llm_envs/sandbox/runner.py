"""One run: a program's process (restarted when it dies) against the statements of its test suite,
each judged in the caller."""

from __future__ import annotations

import builtins
import os
import shutil
import tempfile
import time
from typing import Any

from llm_envs.sandbox.isolation import _acquire_uid, _path_flags, _release_uid
from llm_envs.sandbox.limits import ExecutionResult, SandboxJob, TestOutcome
from llm_envs.sandbox.pool import _ForkServer, _give_back_server, _ServerGone, _take_server
from llm_envs.sandbox.processes import _ForkedWorker, _Worker
from llm_envs.sandbox.suite import _compile_globals, _parse_suite, _Statement, _Suite
from llm_envs.sandbox.wire import ProgramError, _WorkerGone


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _TestTimeout(Exception):
    def __init__(self, message: str, outcome: str | None = None) -> None:
        super().__init__(message)
        self.outcome = outcome
        """What the test's outcome says, when not "no result within ``test_timeout_s``"."""


class _Runner:
    """Runs one program against one test suite; the caller side of the sandbox."""

    def __init__(self, job: SandboxJob, fast: bool, server: _ForkServer | None = None) -> None:
        self.job = job
        self.limits = job.limits
        self.fast = fast
        self.server = server
        self.worker: _Worker | _ForkedWorker | None = None
        self.restarts = 0
        self.load_error: str | None = None
        self.load_timeout: _TestTimeout | None = None
        self.deadline = 0.0
        self.test_deadline = 0.0
        self.crashed = False
        self.uid: int | None = None
        self.scratch = ""
        self.capture: tuple[int, int] | None = None

    def _candidate(self, *args: Any, **kwargs: Any) -> Any:
        if self.worker is None:
            self._start_worker()
        assert self.worker is not None
        try:
            return self.worker.call(self.job.entry_point, args, kwargs, min(self.deadline, self.test_deadline))
        except _WorkerGone as gone:
            self.worker.kill()
            self.worker = None
            if gone.kind == "timeout":
                raise _TestTimeout(str(gone), gone.outcome) from None
            self.crashed = True
            raise ProgramError(str(gone)) from None

    def _new_worker(self) -> _Worker | _ForkedWorker:
        peer = self.job.peer or None
        if not self.fast:
            return _Worker(self.limits, self.scratch, self.uid, peer)
        assert self.uid is not None and self.capture is not None
        for attempt in range(2):  # a server found dead is replaced once, before the program starts
            if self.server is None or self.server.dead:
                self.server = _take_server()
            try:
                return _ForkedWorker(self.server, self.limits, self.uid, *self.capture, peer)
            except _ServerGone as gone:
                if attempt:
                    raise _WorkerGone("crashed", f"the sandbox failed: {gone}") from None
        raise AssertionError("unreachable")

    def _start_worker(self) -> None:
        if self.load_error is not None:
            raise ProgramError(f"the program failed to load: {self.load_error}")
        if self.load_timeout is not None:
            # Its top level ran out of time once: it would again, and a retry is no restart to count.
            raise _TestTimeout(str(self.load_timeout), self.load_timeout.outcome)
        if self.restarts > self.limits.max_restarts:
            raise ProgramError("the program's process died too often")
        self.restarts += 1
        try:
            self.worker = self._new_worker()
            error = self.worker.start(self.job.program, min(self.deadline, self.test_deadline), self.job.prelude)
        except _WorkerGone as gone:
            if self.worker is not None:
                self.worker.kill()
                self.worker = None
            if gone.kind == "timeout":
                self.load_timeout = _TestTimeout(f"loading the program: {gone}", gone.outcome)
                raise self.load_timeout from None
            self.crashed = True
            raise ProgramError(f"loading the program: {gone}") from None
        if error is not None:
            self.load_error = error
            self.worker.kill()
            self.worker = None
            raise ProgramError(f"the program failed to load: {error}")

    def _judge(self, statement: _Statement, namespace: dict) -> TestOutcome:
        try:
            if statement.compare is not None:
                left_code, right_code, (op, symbol), left_is_actual = statement.compare
                left = eval(left_code, namespace)
                right = eval(right_code, namespace)
                if op(left, right):
                    return TestOutcome(statement.source, "passed")
                if symbol == "==":
                    actual, expected = (left, right) if left_is_actual else (right, left)
                    return TestOutcome(statement.source, "failed", f"expected {_short(expected)}, got {_short(actual)}")
                return TestOutcome(statement.source, "failed", f"{_short(left)} {symbol} {_short(right)} is false")
            exec(statement.code, namespace)
        except _TestTimeout as err:
            return TestOutcome(statement.source, "timeout",
                               err.outcome or f"no result within {self.limits.test_timeout_s:g} s")
        except AssertionError as err:
            return TestOutcome(statement.source, "failed", str(err)[:300] or "assertion failed")
        except ProgramError as err:
            return TestOutcome(statement.source, "error", str(err))
        except Exception as err:  # the test itself raised on the program's values (TypeError, ...)
            return TestOutcome(statement.source, "error", f"{type(err).__name__}: {str(err)[:300]}")
        return TestOutcome(statement.source, "passed")

    def run(self) -> ExecutionResult:
        start = time.monotonic()
        self.deadline = start + self.limits.timeout_s
        suite = _parse_suite(self.job.tests)
        self.uid = _acquire_uid()
        try:
            if self.fast:
                self.capture = (os.memfd_create("llm-envs-sandbox-stdout"), os.memfd_create("llm-envs-sandbox-stderr"))
            else:
                self.scratch = tempfile.mkdtemp(prefix="llm-envs-sandbox-")
                if self.uid is not None:
                    os.chown(self.scratch, self.uid, self.uid)
                os.chmod(self.scratch, 0o700)
            outcomes = self._run_suite(suite)
            stdout, stderr = self._read_capture(0), self._read_capture(1)
        finally:
            if self.worker is not None:
                self.worker.kill()
                self.worker = None
            if self.server is not None:
                _give_back_server(self.server)
                self.server = None
            if self.capture is not None:
                for fd in self.capture:
                    os.close(fd)
            if self.scratch:
                shutil.rmtree(self.scratch, ignore_errors=True)
            _release_uid(self.uid)
        statuses = {o.status for o in outcomes}
        if not outcomes:
            reason = "no_tests"
        elif self.load_error is not None:
            reason = "load_error"
        elif "timeout" in statuses or time.monotonic() > self.deadline:
            reason = "timeout"
        elif self.crashed:
            reason = "crashed"
        else:
            reason = "ok"
        return ExecutionResult(tuple(outcomes), self.load_error, reason, stdout, stderr, time.monotonic() - start,
                               "fork_server" if self.fast else "process_per_program", **_path_flags(self.fast))

    def _run_suite(self, suite: _Suite) -> list[TestOutcome]:
        namespace: dict[str, Any] = {"__builtins__": builtins, "__name__": "__tests__"}
        if self.job.test_globals:
            exec(_compile_globals(self.job.test_globals), namespace)
        for code in suite.preamble:
            exec(code, namespace)
        # HumanEval tests sometimes call the entry point by its own name (HumanEval/33).
        namespace[self.job.entry_point] = self._candidate
        namespace[suite.param] = self._candidate
        outcomes: list[TestOutcome] = []
        timeouts = 0
        self.test_deadline = self.deadline
        try:
            self._start_worker()
        except (_TestTimeout, ProgramError):
            pass  # reported on the first test
        for statement in suite.statements:
            now = time.monotonic()
            stop = None
            if self.load_error is not None:
                stop = f"the program failed to load: {self.load_error}"
            elif timeouts >= self.limits.max_timeouts:
                stop = f"skipped after {timeouts} timed-out tests"
            elif now >= self.deadline:
                stop = f"the program's time budget of {self.limits.timeout_s:g} s is spent"
            if stop is not None:
                if statement.is_test:
                    outcomes.append(TestOutcome(statement.source, "not_run", stop))
                continue
            self.test_deadline = now + self.limits.test_timeout_s
            outcome = self._judge(statement, namespace)
            timeouts += outcome.status == "timeout"
            if statement.is_test:
                outcomes.append(outcome)
        return outcomes

    def _read_capture(self, stream: int) -> str:
        try:
            if self.capture is not None:
                data = os.pread(self.capture[stream], self.limits.max_output_bytes, 0)
            else:
                with open(os.path.join(self.scratch, (".stdout", ".stderr")[stream]), "rb") as handle:
                    data = handle.read(self.limits.max_output_bytes)
        except OSError:
            return ""
        return data.decode("utf-8", "replace")
