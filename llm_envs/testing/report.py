"""What :func:`llm_envs.testing.check_env` hands back: the report of every check, and the error of one
that failed."""

from __future__ import annotations

import dataclasses


class CheckSkipped(Exception):
    """A check that does not apply to this env; the message says why."""


class EnvCheckError(AssertionError):
    """A property of the env contract does not hold.

    Attributes: ``check`` (the property's name, one of :data:`CHECKS`), ``detail`` (what was seen),
    ``agent`` and ``problem`` (where, when known: ``"train[3] {...}"``), ``turn``, ``hint`` (how to fix
    the usual causes), ``subject`` (the id or class checked) and ``report`` (the whole
    :class:`CheckReport`, when raised by :func:`check_env`).
    """

    def __init__(self, check: str, detail: str, *, agent: str | None = None, problem: str | None = None,
                 turn: int | None = None, hint: str | None = None) -> None:
        super().__init__(detail)
        self.check, self.detail, self.agent, self.problem, self.turn = check, detail, agent, problem, turn
        self.hint = hint
        self.subject: str | None = None
        self.report: CheckReport | None = None

    def __str__(self) -> str:
        where = [f"agent {self.agent!r}"] if self.agent is not None else []
        if self.problem is not None:
            where.append(f"problem {self.problem}")
        if self.turn is not None:
            where.append(f"turn {self.turn}")
        head = f"check_env({self.subject!r}): " if self.subject else ""
        text = f"{head}{self.check} failed" + (f" ({', '.join(where)})" if where else "") + f": {self.detail}"
        if self.hint:
            text += f"\nHow to fix: {self.hint}"
        others = [name for name in self.report.failed if name != self.check] if self.report else []
        if others:
            text += f"\nAlso failed: {', '.join(others)} (the error's .report has each)."
        return text


@dataclasses.dataclass
class CheckReport:
    """What :func:`check_env` checked: ``passed`` ({check: seconds}), ``skipped`` ({check: why}),
    ``failed`` ({check: EnvCheckError}), ``notes`` ({check: parts of it that did not apply}) and ``what``
    ({check: what it checks}). ``str(report)`` is a table in the order the checks ran; ``report.ok`` is
    True when nothing failed."""

    subject: str
    what: dict[str, str] = dataclasses.field(default_factory=dict)
    passed: dict[str, float] = dataclasses.field(default_factory=dict)
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)
    failed: dict[str, EnvCheckError] = dataclasses.field(default_factory=dict)
    notes: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def seconds(self) -> float:
        return sum(self.passed.values())

    def __str__(self) -> str:
        lines = [f"check_env({self.subject!r}): {len(self.passed)} passed, {len(self.skipped)} skipped, "
                 f"{len(self.failed)} failed"]
        for name in self.what:
            if name in self.passed:
                lines.append(f"  PASS  {name:<22} {self.passed[name]:5.2f}s  {self.what[name]}")
                lines += [f"        {'':<22}        (not: {note})" for note in self.notes.get(name, [])]
            elif name in self.skipped:
                lines.append(f"  SKIP  {name:<22}         {self.skipped[name]}")
            elif name in self.failed:
                lines.append(f"  FAIL  {name:<22}         {self.failed[name].detail.splitlines()[0]}")
        return "\n".join(lines)
