"""Isolated execution of generated code, with per-assertion results the program cannot forge.

Model-written code is hostile. This module never ``exec``\\ s it in the caller's process. Each program
runs in a process of its own with resource limits, a scrubbed environment, its own PID, network,
mount and IPC namespaces and an unprivileged uid; it sees a minimal file tree (the standard library
read-only and a size-capped tmpfs scratch directory) instead of the host's files.

Two paths (``isolation_report()["path"]`` says which one runs):

* ``"fork_server"`` (root on Linux): one warm server process per pool slot has done the expensive
  set-up once (interpreter start, common imports, the network namespace and the hidden file-system
  view) and forks one short-lived child per program; the child makes its PID, mount and IPC
  namespaces, mounts its scratch, drops to the run's uid and limits, and runs the program. The
  server never runs program code; a server that dies or misbehaves is replaced.
* ``"process_per_program"`` (the fallback where the OS refuses the above): a fresh ``python -I -S``
  per program with the limits, the namespaces the OS allows and (as root) its own uid; the file
  system is not hidden and the disk is capped per file only.

See ``docs/sandbox.md`` for the threat model and the exact list of what is enforced on each path.

How a test is judged
--------------------
The tests (dataset code, trusted) run in the *caller*, in the pool thread that handles the program.
Inside them, ``candidate`` (the entry point) is a proxy: each call sends its arguments to the program's
process over a private pipe, that process calls the real function and sends back the return value
encoded as plain data (ints, floats, strings, lists, tuples, dicts, sets, ...; anything else comes
back as an opaque value that equals nothing). The assertion is evaluated by the caller on those
values. So the program controls only what its function returns, which is what is being tested: an
early ``exit(0)``, ``os._exit``, a redefined ``AssertionError``, patched builtins, an object whose
``__eq__`` always returns True, or printed "PASSED" markers cannot turn a failing assertion into a pass.

>>> from llm_envs.sandbox import run_tests
>>> program = "def add(a, b):\\n    return a + b\\n"
>>> tests = "def check(candidate):\\n    assert candidate(1, 2) == 3\\n    assert candidate(2, 2) == 5\\n"
>>> result = run_tests(program, tests, "add")
>>> result.passed, result.total, result.outcomes[1].message
(1, 2, 'expected 5, got 4')
"""

# The package, one file per concern: limits (limits and result types), suite (the trusted test code,
# compiled), wire (frames and values across the boundary), isolation (namespaces, uids, rlimits),
# pool (the fork servers), processes (one program's process), runner (one run, judged), api (the
# entry points); worker.py is the other side, run as a script. The `X as X` names are importable
# from here as they were before the split, outside the API of __all__.
from llm_envs.sandbox.api import FORK_SERVER_ENV, isolation_report, run_many, run_tests
from llm_envs.sandbox.isolation import NUM_UID_SLOTS as NUM_UID_SLOTS
from llm_envs.sandbox.isolation import UNPRIVILEGED_UID_BASE as UNPRIVILEGED_UID_BASE
from llm_envs.sandbox.limits import DEFAULT_LIMITS, ExecutionResult, SandboxJob, SandboxLimits, TestOutcome
from llm_envs.sandbox.limits import STATUSES as STATUSES
from llm_envs.sandbox.pool import MASKED_STDLIB_DIRS as MASKED_STDLIB_DIRS
from llm_envs.sandbox.pool import PRELOADED_MODULES as PRELOADED_MODULES
from llm_envs.sandbox.pool import PROGRAMS_PER_SERVER as PROGRAMS_PER_SERVER
from llm_envs.sandbox.pool import SERVER_TIMEOUT_S as SERVER_TIMEOUT_S
from llm_envs.sandbox.suite import AST_LOCK as AST_LOCK
from llm_envs.sandbox.suite import parse_python as parse_python
from llm_envs.sandbox.suite import split_tests
from llm_envs.sandbox.wire import PROGRAM_FILENAME as PROGRAM_FILENAME
from llm_envs.sandbox.wire import OpaqueValue as OpaqueValue
from llm_envs.sandbox.wire import ProgramError as ProgramError

__all__ = [
    "DEFAULT_LIMITS",
    "FORK_SERVER_ENV",
    "ExecutionResult",
    "SandboxJob",
    "SandboxLimits",
    "TestOutcome",
    "isolation_report",
    "run_many",
    "run_tests",
    "split_tests",
]
