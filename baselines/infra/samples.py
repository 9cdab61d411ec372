"""Transcripts of what the agents wrote: ``<run>/samples.jsonl``, one JSON line per episode.

Every evaluation (before, during and after training) writes each eval episode; every
``samples_every``-th training iteration writes the first :data:`TRAIN_EPISODES` episodes of its
batch. A line::

    {"kind": "eval", "phase": "before", "iteration": 0, "split": "eval", "seed": 0, "task_index": 3,
     "episode": 3, "env": "writing/xsum-v0", "models": {"brief": "brief", "detailed": "detailed"},
     "turns": [{"prompts": {role: text}, "responses": {role: text}, "reward": 1.2,
                "components": {...}, "agent_rewards": {role: 1.2}, "feedback": {role: text}}],
     "reward": 1.2, "components": {...}, "return": 1.2}

``kind`` is ``eval`` or ``train``; ``phase`` (eval only) is ``before`` (iteration 0), ``after`` (the
last iteration) or ``during``; ``iteration`` is the step of the metrics line the episode belongs to
(the training batch of iteration ``i`` is step ``i + 1``); ``models`` says which model (adapter)
played each role (CORY's models swap roles); ``reward`` and ``components`` are the last turn's,
``return`` the sum over turns. Prompts are the text exactly as tokenized (chat template included).

With TensorBoard on, each write also goes to TensorBoard as text (``samples/eval``,
``samples/train``); with W&B, as a table of the same name.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

SAMPLES_FILE = "samples.jsonl"
TRAIN_EPISODES = 4
"""Episodes written from a logged training batch (the first ones: with MAGRPO, one problem's group)."""
KINDS = ("eval", "train")


def episode_records(
    envs: Sequence[Any],
    *,
    seeds: Sequence[int | None],
    options: Sequence[Mapping[str, Any]],
    models: Mapping[str, str] | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """One record per finished episode of ``envs`` (the envs of a vector env after a batch): the
    episode's turns as :meth:`~llm_envs.core.base.LLMEnvCore.transcript_turns` gives them, plus the
    reset ``seeds`` and ``options`` (``split``, ``task_index``) the batch was played with and which
    model played each role (``models``; default: each role its own adapter)."""
    n = len(envs) if limit is None else min(limit, len(envs))
    if len(seeds) < n or len(options) < n:
        raise ValueError(f"got {len(seeds)} seeds and {len(options)} options for {n} episodes")
    records = []
    for i, env in enumerate(envs[:n]):
        turns = [t for t in env.transcript_turns() if t["reward"] is not None]
        if not turns:
            raise ValueError(f"episode {i} has no finished turn: write samples after the batch is played")
        roles = list(env.possible_agents)
        records.append(
            {
                "split": options[i].get("split", "train"),
                "seed": None if seeds[i] is None else int(seeds[i]),
                "task_index": int(options[i]["task_index"]) if "task_index" in options[i] else None,
                "episode": i,
                "env": env.env_id,
                "models": {r: (models or {}).get(r, r) for r in roles},
                "turns": turns,
                "reward": turns[-1]["reward"],
                "components": turns[-1]["components"],
                "return": float(sum(t["reward"] for t in turns)),
            }
        )
    return records


def read_samples(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a samples JSONL (a run directory or the file). A torn last line (a killed run)
    is skipped; any other bad line raises with its line number."""
    path = Path(path)
    if path.is_dir():
        path = path / SAMPLES_FILE
    if not path.is_file():
        raise FileNotFoundError(f"samples file {str(path)!r} not found")
    lines = path.read_text(encoding="utf-8").splitlines()
    out = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines):
                break
            raise ValueError(f"{path}:{number} is not valid JSON: {err}") from err
        if not isinstance(record, dict) or not isinstance(record.get("iteration"), int) or "turns" not in record:
            raise ValueError(f"{path}:{number} is not a sample record: {line[:120]!r}")
        out.append(record)
    return out


class SampleWriter:
    """Appends records to ``run_dir/samples.jsonl`` and mirrors them to the run's TensorBoard / W&B
    through ``logger`` (a :class:`baselines.infra.metrics.MetricLogger`, optional).

    ``resume_step``: records of later iterations (written after the checkpoint a run resumes from)
    are dropped, as the metrics are; ``None`` starts the file afresh. ``train_every``: write training
    batches every this many iterations (0: never). ``num_iterations``: the run's last iteration
    (an evaluation there is the ``after`` one)."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        logger: Any = None,
        resume_step: int | None = None,
        train_every: int = 0,
        num_iterations: int,
    ) -> None:
        if isinstance(train_every, bool) or not isinstance(train_every, int) or train_every < 0:
            raise ValueError(f"train_every must be an int >= 0, got {train_every!r}")
        self.path = Path(run_dir) / SAMPLES_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.logger = logger
        self.train_every = train_every
        self.num_iterations = num_iterations
        if resume_step is None:
            self.path.unlink(missing_ok=True)
        elif self.path.exists():
            kept = [r for r in read_samples(self.path) if r["iteration"] <= resume_step]
            tmp = self.path.with_name(f".{self.path.name}.tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
            os.replace(tmp, self.path)

    def phase(self, iteration: int) -> str:
        """``before`` at iteration 0, ``after`` at the run's last iteration, else ``during``."""
        if iteration == 0:
            return "before"
        return "after" if iteration >= self.num_iterations else "during"

    def write_eval(self, iteration: int, records: Sequence[Mapping[str, Any]]) -> None:
        """An evaluation's episodes (``evaluate(..., episodes=records)``)."""
        self._write("eval", iteration, records, phase=self.phase(iteration))

    def wants_train(self, iteration: int) -> bool:
        """Whether the training batch of this iteration (its metrics step) is to be written."""
        return self.train_every > 0 and iteration % self.train_every == 0

    def write_train(
        self,
        iteration: int,
        envs: Sequence[Any],
        *,
        seeds: Sequence[int | None],
        options: Sequence[Mapping[str, Any]],
        models: Mapping[str, str] | None = None,
    ) -> None:
        """The first :data:`TRAIN_EPISODES` episodes of a training batch, when :meth:`wants_train`."""
        if self.wants_train(iteration):
            records = episode_records(envs, seeds=seeds, options=options, models=models, limit=TRAIN_EPISODES)
            self._write("train", iteration, records)

    def _write(self, kind: str, iteration: int, records: Sequence[Mapping[str, Any]], phase: str | None = None):
        if not records:
            return
        lines = [{"kind": kind, "phase": phase, "iteration": int(iteration), **r} for r in records]
        with open(self.path, "a", encoding="utf-8") as f:
            f.write("".join(json.dumps(line) + "\n" for line in lines))
        if self.logger is not None:
            self.logger.log_text(iteration, f"samples/{kind}", markdown(lines))
            columns, rows = table(lines)
            self.logger.log_table(iteration, f"samples/{kind}", columns, rows)


def _roles(records: Sequence[Mapping[str, Any]]) -> list[str]:
    roles: dict[str, None] = {}
    for r in records:
        roles.update(dict.fromkeys(r["models"]))
    return list(roles)


def table(records: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """Columns and rows of a W&B table: one row per episode, the last turn's prompt and response per
    role, the reward and its components (JSON)."""
    roles = _roles(records)
    columns = ["iteration", "kind", "phase", "task_index", "seed", "episode", "reward", "components"]
    columns += [f"{part}/{role}" for role in roles for part in ("model", "prompt", "response")]
    rows = []
    for r in records:
        last = r["turns"][-1]
        row = [r["iteration"], r["kind"], r["phase"], r["task_index"], r["seed"], r["episode"], r["reward"],
               json.dumps(r["components"])]
        for role in roles:
            row += [r["models"].get(role), last["prompts"].get(role), last["responses"].get(role)]
        rows.append(row)
    return columns, rows


def markdown(records: Sequence[Mapping[str, Any]]) -> str:
    """The records as Markdown (TensorBoard's text plugin): a heading per episode, its reward and
    components, then each role's response (the prompt is in samples.jsonl)."""
    parts = []
    for r in records:
        label = f"{r['kind']}" + (f" ({r['phase']})" if r.get("phase") else "")
        parts.append(
            f"### {label} · task {r['task_index']} · episode {r['episode']} · seed {r['seed']} · "
            f"reward {r['reward']:.3f}"
        )
        parts.append(", ".join(f"{k} {v:.3f}" for k, v in r["components"].items()))
        for t, turn in enumerate(r["turns"]):
            for role, text in turn["responses"].items():
                played = r["models"].get(role, role)
                who = role if played == role else f"{role} ({played})"
                heading = f"**{who}**" + (f", turn {t}" if len(r["turns"]) > 1 else "")
                quoted = "\n".join("    " + line for line in (text or "(empty)").splitlines()) or "    (empty)"
                parts.append(f"{heading}:\n\n{quoted}")
    return "\n\n".join(parts)
