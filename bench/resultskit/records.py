"""The records of docs/results.md's comparisons (``comparisons.py``: their methods, settings and
commands): the record one method's run with one seed leaves (``<out>/<comparison>/<method>__s<seed>.json``),
run, written, claimed by a sitting, loaded and listed when missing; the learning rate a sweep chose.
``bench/results.py`` is the command line; ``bench/resultskit/page.py`` turns the records into the page's
figures and tables."""


import contextlib
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from .comparisons import (
    COMPARISONS,
    FIXED_RATE,
    LAST,
    ROOT,
    SEEDS_WANTED,
    SWEEPS,
    Method,
    command_of,
    flags_of,
    method,
    run_name,
    sweep_name,
)
from .resume import LEGS, code_of, leg, newest_checkpoint_step, read_legs, resumable, totals


# ------------------------------------------------------------------------------------------ records
def record_path(out: Path, comparison: str, name: str, seed: int) -> Path:
    return out / comparison / f"{name}__s{seed}.json"




def run_paths(comparison: str, m: Method, seed: int, runs_dir: Path) -> tuple[Path | None, Path]:
    """A record's run directory (None for an ``llm-envs eval``, which writes none) and its log."""
    name = run_name(comparison, m, seed)
    return (None if m.learner == "eval" else runs_dir / name), runs_dir / "logs" / f"{name}.log"


def git_commit() -> str | None:
    """The commit checked out when this process started (records keep the code they ran, not a later HEAD)."""
    if _COMMIT:
        return _COMMIT[0]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
        diff = subprocess.run(["git", "diff", "HEAD", "--no-color"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        head, dirty, diff = None, "", ""
    _COMMIT.append(f"{head}+dirty" if head and dirty else head)
    _DIFF.append(diff)
    return _COMMIT[0]


_COMMIT: list[str | None] = []
_DIFF: list[str] = []
"""The uncommitted change to tracked files when this process started ("" on a clean tree): a
``+dirty`` record stores it (``diff``), so what it ran can be rebuilt from its commit."""


def run_cli(argv: Sequence[str], log: Path) -> tuple[int, str]:
    """``llm-envs ARGV`` in this process, its stdout and stderr appended to ``log``; (status, stdout)."""
    from baselines.infra import cli

    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(f"\n$ llm-envs {shlex.join(argv)}\n")
        fh.flush()
        captured = _Tee(fh)
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(fh):
            status = cli.main(list(argv))
    return status, captured.text()


class _Tee:
    """A stdout that writes to a log file and keeps the text."""

    def __init__(self, fh: Any) -> None:
        self.fh, self.parts = fh, []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return self.fh.write(text)

    def flush(self) -> None:
        self.fh.flush()

    def text(self) -> str:
        return "".join(self.parts)


def curve_of(rows: list[dict[str, float]], keys: Sequence[str]) -> dict[str, list[float]]:
    """Per-iteration series of ``keys`` (missing values as NaN) from a run's metrics rows."""
    per_iteration = [r for r in rows if "charts/iteration" in r]
    out: dict[str, list[float]] = {"iteration": [float(r["charts/iteration"]) for r in per_iteration]}
    for key in keys:
        out[key] = [float(r.get(key, math.nan)) for r in per_iteration]
    return out


def eval_of(rows: list[dict[str, float]], first: bool, prefix: str = "eval/") -> dict[str, float]:
    """The first or last evaluation's ``<prefix>*`` metrics (``val/``: the held-out train articles)."""
    evals = [r for r in rows if f"{prefix}total" in r]
    if not evals:
        return {}
    row = evals[0] if first else evals[-1]
    return {k.removeprefix(prefix): v for k, v in row.items() if k.startswith(prefix)}


def curve_keys(m: Method, rows: list[dict[str, float]]) -> list[str]:
    if m.learner in ("magrpo", "madpo", "marlhf"):
        keys = sorted({k for r in rows for k in r if k.startswith(("reward/", "pref/", "losses/dpo"))})
        return [*keys, "charts/s_per_iteration"]
    per_model = ("task_reward", "env_reward", "kl", "kl_coef", "combined", "role")
    return [f"agent_{model}/{k}" for model in m.models for k in per_model] + ["charts/s_per_iteration"]


def make_record(comparison: str, m: Method, seed: int, argv: list[str], stdout: str, wall_s: float,
                quick: bool, run_dir: Path | None, load: tuple[float, float], cpu_s: float) -> dict[str, Any]:
    from baselines.infra.metrics import read_metrics

    record: dict[str, Any] = {
        "comparison": comparison, "method": m.name, "label": m.label, "seed": seed, "learner": m.learner,
        "env": m.env, "quick": quick, "command": "llm-envs " + shlex.join(argv),
        "flags": flags_of(m, comparison, quick), "wall_s": round(wall_s, 1), "cpu_s": round(cpu_s, 1),
        "load_average_1min": {"start": load[0], "end": load[1]}, "commit": git_commit(),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "machine": run_machine(argv),
    }
    record["episodes"] = episodes_of(record["flags"], seed)
    if _DIFF and _DIFF[0]:  # a dirty tree: the record keeps the uncommitted change it ran with
        record["diff"] = _DIFF[0]
    if m.learner == "eval":
        result = json.loads(stdout[stdout.index("{"):])  # `llm-envs eval` prints one JSON object
        record["eval"] = {k.removeprefix("eval/"): v for k, v in result.items() if k.startswith("eval/")}
        record["eval_before"] = record["eval"]
        record["curve"] = {}
        return record
    assert run_dir is not None
    rows = read_metrics(run_dir / "metrics.jsonl")
    record["run_dir"] = str(run_dir)
    record["curve"] = curve_of(rows, curve_keys(m, rows))
    record["eval_before"] = eval_of(rows, first=True)
    record["eval"] = eval_of(rows, first=False)
    record["validation"] = eval_of(rows, first=False, prefix="val/")
    if m.models:
        record["final"] = {
            model: {k: _mean(record["curve"][f"agent_{model}/{k}"][-LAST:]) for k in ("task_reward", "kl", "combined")}
            for model in m.models
        }
    return record


def episodes_of(flags: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """What decides the episodes a record's evaluations play (before and after training): the eval split's
    first ``problems`` problems, the sampling seed and settings, the source texts' cut. Two records whose
    ``episodes`` differ are never paired (``significance.premise``); the sampler a commit used is read from
    the record's ``commit``."""
    keys = ("num-eval-problems", "eval-greedy", "temperature", "top-p", "top-k", "max-new-tokens", "max-source-words",
            "num-turns")
    return {"split": "eval", "first": 0, "seed": seed, **{k: flags[k] for k in keys if k in flags}}


def run_machine(argv: Sequence[str]) -> dict[str, Any]:
    """The CPU, its ISA flags, any kernel restriction and the dtype a record's run used (``auto``: what
    ``resolve_dtype`` picks here), with the run's own ``--threads``: results move with the kernels."""
    from agents.models import machine_description

    machine = machine_description(argv[argv.index("--dtype") + 1] if "--dtype" in argv else "auto")
    if "--threads" in argv:
        machine["threads"] = int(argv[argv.index("--threads") + 1])
    machine["host"] = host_id()
    return machine


def host_id() -> str:
    """A stable identifier of this host that names nothing about it: the first 12 hex digits of the
    SHA-256 of ``/etc/machine-id`` (else of the host name), so records tell machines of one CPU kind apart."""
    import hashlib
    import socket

    try:
        ident = Path("/etc/machine-id").read_text(encoding="utf-8").strip()
    except OSError:
        ident = ""
    return hashlib.sha256((ident or socket.gethostname()).encode()).hexdigest()[:12]


def machine_label(record: Mapping[str, Any]) -> str:
    """``CPU model (isa flags), dtype, host`` of a record; ``unknown`` for records written before runs named
    it (never counted as a machine: ``provenance.provenance`` counts them apart)."""
    machine = record.get("machine")
    if not machine:
        return "unknown"
    return f"{machine['cpu']} ({' '.join(machine['isa'])}), {machine['dtype']}, host {machine.get('host', 'unknown')}"


def _mean(values: Sequence[float]) -> float:
    """The mean; NaN when any value is not finite (a failed iteration is not averaged away)."""
    if not values or not all(math.isfinite(v) for v in values):
        return math.nan
    return sum(values) / len(values)


def run_records(comparison: str, *, seeds: Sequence[int], methods: Sequence[str] | None, quick: bool, out: Path,
                runs_dir: Path, model: str | None, threads: int | None) -> dict[str, Any]:
    """Run every missing record of ``comparison`` for ``seeds`` (and ``methods``, default all), writing
    each as it finishes; returns what was done."""
    chosen = [method(comparison, n) for n in methods] if methods else list(COMPARISONS[comparison])
    git_commit()  # the code this process runs
    done, skipped, failed = [], [], []
    for seed in seeds:
        for m in chosen:
            path = record_path(out, m.reuse or comparison, m.name, seed)
            if path.is_file():
                skipped.append(path.name)
                continue
            if comparison in SWEEPS and m.learner != "eval":
                rate = chosen_rate(out, m.name, comparison)
                if rate is None:
                    skipped.append(f"{path.name} (its learning-rate sweep is not complete)")
                    continue
                if m.name in SWEEPS[comparison][1] and seed == 0:  # the sweep's record at the chosen rate
                    copy_sweep_record(out, m.name, rate, path, comparison)
                    done.append({"record": path.name, "copied_from": sweep_name(m.name, rate)})
                    continue
                m = replace(m, flags={**m.flags, "learning-rate": rate})
            source = m.reuse or comparison
            run_dir, log = run_paths(source, m, seed, runs_dir)
            details: dict[str, Any] = {"log": str(log.resolve())}
            if run_dir is not None:
                details.update(run_dir=str(run_dir.resolve()),
                               num_iterations=flags_of(m, source, quick).get("num-iterations"))
            with claimed(path, details) as mine:
                if not mine:  # another sitting runs it now: leave its run directory alone
                    skipped.append(f"{path.name} (running in process {running_pid(path)})")
                    continue
                print(json.dumps({"started": path.name, **details}), flush=True)
                outcome = _run_record(source, m, seed, path, quick=quick, runs_dir=runs_dir, model=model,
                                      threads=threads)
            if "status" in outcome:
                failed.append(outcome)
            else:
                done.append(outcome)
                print(json.dumps(outcome), flush=True)
    return {"comparison": comparison, "done": done, "skipped": skipped, "failed": failed}


def _run_record(comparison: str, m: Method, seed: int, path: Path, *, quick: bool, runs_dir: Path,
                model: str | None, threads: int | None) -> dict[str, Any]:
    """Run one record's command and write the record; ``{"record", "status"}`` if the run failed. A
    training run an earlier sitting left with a checkpoint continues from it (``resume``)."""
    argv = command_of(m, comparison, seed, quick=quick, runs_dir=runs_dir, model=model, threads=threads)
    run_dir, log = run_paths(comparison, m, seed, runs_dir)
    command, code, host = shlex.join(argv), code_of(git_commit(), _DIFF[0] if _DIFF else ""), host_id()
    from_step = None if run_dir is None else resumable(run_dir, command, code, host)
    if run_dir is not None and run_dir.exists() and from_step is None:
        shutil.rmtree(run_dir)  # an interrupted run without a checkpoint of this command and code: start it again
    load_start = os.getloadavg()[0]
    t0, c0 = time.perf_counter(), time.process_time()
    if run_dir is None:
        status, stdout = run_cli(argv, log)
        legs = None
    else:
        with leg(run_dir, command=command, code=code, host=host, from_step=from_step or 0) as legs:
            status, stdout = run_cli([*argv, "--resume"] if from_step else argv, log)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if status != 0:
        if run_dir is not None and from_step:
            (run_dir / LEGS).unlink(missing_ok=True)  # a resume that fails: the next sitting starts afresh
        return {"record": path.name, "status": status, **({"resumed_from": from_step} if from_step else {})}
    record = make_record(comparison, m, seed, argv, stdout, wall, quick, run_dir,
                         (load_start, os.getloadavg()[0]), cpu)
    if legs:
        record.update(totals(legs))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    done = {"record": path.name, "wall_s": record["wall_s"], "eval_total": record["eval"].get("total")}
    return {**done, "resumed_from": from_step} if from_step else done


def sweep_records(out: Path, name: str, comparison: str = "methods") -> dict[float, dict[str, Any] | None]:
    """Learning rate -> the sweep's record of method ``name`` of ``comparison`` at that rate (None while
    missing)."""
    sweep, rates = SWEEPS[comparison]
    found: dict[float, dict[str, Any] | None] = {}
    for rate in rates[name]:
        path = record_path(out, sweep, sweep_name(name, rate), 0)
        found[rate] = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    return found


def chosen_rate(out: Path, name: str, comparison: str = "methods") -> float | None:
    """The learning rate of method ``name`` in ``comparison`` (one of :data:`SWEEPS`): its sweep's best
    ``val/total`` (the held-out train problems; the first rate of the list on a tie), None until every
    sweep record exists; :data:`FIXED_RATE` for a method without a sweep."""
    rates = SWEEPS[comparison][1]
    if name not in rates:
        return FIXED_RATE
    records = sweep_records(out, name, comparison)
    if any(r is None for r in records.values()):
        return None
    scores = {rate: r["validation"].get("total", -math.inf) for rate, r in records.items() if r is not None}
    return max(scores, key=lambda rate: (scores[rate], -rates[name].index(rate)))


def grid_edge(out: Path, name: str, comparison: str = "methods") -> str | None:
    """``lower`` or ``upper`` when method ``name`` of ``comparison`` chose the lowest or the highest rate of
    its grid (:data:`SWEEPS`): the best rate may lie beyond it, and only a run outside the grid could say;
    None when it chose a rate inside its grid, has no sweep, or its sweep is not complete. The same rule
    for every method."""
    rates = SWEEPS[comparison][1].get(name) if comparison in SWEEPS else None
    chosen = chosen_rate(out, name, comparison) if rates else None
    if chosen is None or not rates or len(rates) < 2:
        return None
    return "lower" if chosen == min(rates) else ("upper" if chosen == max(rates) else None)


def edge_note(out: Path, name: str, comparison: str = "methods") -> str | None:
    """The sentence a reading of a row chosen at its grid's edge carries (:func:`grid_edge`), else None."""
    edge = grid_edge(out, name, comparison)
    if edge is None:
        return None
    rates = SWEEPS[comparison][1][name]
    return (f"its rate {chosen_rate(out, name, comparison):g} is at the {edge} edge of its grid "
            f"({', '.join(f'{r:g}' for r in rates)}): the best rate may lie beyond it")


def copy_sweep_record(out: Path, name: str, rate: float, path: Path, comparison: str = "methods") -> None:
    """Seed 0 of a swept method of ``comparison``: the sweep's record at the chosen ``rate`` (the same
    run, not run twice), renamed, with ``copied_from`` naming the sweep record."""
    sweep = SWEEPS[comparison][0]
    source = record_path(out, sweep, sweep_name(name, rate), 0)
    record = json.loads(source.read_text(encoding="utf-8"))
    record.update({"comparison": comparison, "method": name, "label": method(comparison, name).label,
                   "copied_from": f"{sweep}/{source.name}"})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def running_pid(record: Path) -> int | None:
    """The pid in ``record``'s ``.running`` marker, if it names a live process other than this one."""
    try:
        pid = int(record.with_suffix(".running").read_text(encoding="utf-8").split("\n", 1)[0].strip())
    except (OSError, ValueError):
        return None
    if pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, someone else's
    return pid


def running_records(out: Path, comparison: str) -> dict[str, dict[str, Any]]:
    """The records of ``comparison`` that a live process is running now: record -> its ``pid``, ``log``
    and, for a training run, the last ``iteration`` its metrics logged (0 before the first) ``of`` its
    iterations, and once iterations have run, ``eta_s``: the iterations left at the median pace of the
    last three (``charts/s_per_iteration``; the evaluation after training not counted)."""
    folder = out / comparison
    found: dict[str, dict[str, Any]] = {}
    for marker in sorted(folder.glob("*.running")) if folder.is_dir() else ():
        record = marker.with_suffix(".json")
        pid = running_pid(record)
        if pid is None:
            continue
        try:
            details = json.loads(marker.read_text(encoding="utf-8").split("\n", 1)[1] or "{}")
        except (OSError, IndexError, ValueError):
            details = {}  # a marker of the pid alone (written before markers held details)
        entry: dict[str, Any] = {"pid": pid}
        if "log" in details:
            entry["log"] = details["log"]
        if details.get("run_dir"):
            metrics = Path(details["run_dir"]) / "metrics.jsonl"
            entry.update(iteration=_last_step(metrics), of=details.get("num_iterations"))
            pace = _pace(metrics)
            if pace is not None and isinstance(entry["of"], int):
                entry["eta_s"] = round(max(entry["of"] - entry["iteration"], 0) * pace)
        found[record.name] = entry
    return found


def resumable_records(out: Path, comparison: str, runs_dir: Path) -> dict[str, dict[str, Any]]:
    """The missing records of ``comparison`` that no live process runs and whose run directory an earlier
    sitting left with a checkpoint: record -> the ``step`` a ``run`` would continue from and the ``legs``
    so far (``resume``: it continues only on the same command, code and host)."""
    found: dict[str, dict[str, Any]] = {}
    for name, seeds in missing_records(out, comparison).items():
        m = method(comparison, name)
        for seed in seeds:
            path = record_path(out, m.reuse or comparison, name, seed)
            run_dir, _ = run_paths(m.reuse or comparison, m, seed, runs_dir)
            legs = [] if run_dir is None or running_pid(path) is not None else read_legs(run_dir)
            step = newest_checkpoint_step(run_dir) if legs else None
            if step is not None:
                found[path.name] = {"step": step, "legs": len(legs), "run_dir": str(run_dir)}
    return found


def _pace(metrics: Path) -> float | None:
    """The median ``charts/s_per_iteration`` of a metrics file's last three iterations that logged it."""
    try:
        lines = metrics.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    paces: list[float] = []
    for line in reversed(lines):
        try:
            paces.append(float(json.loads(line)["charts/s_per_iteration"]))
        except (ValueError, KeyError, TypeError):
            continue
        if len(paces) == 3:
            break
    return statistics.median(paces) if paces else None


def _last_step(metrics: Path) -> int:
    """The ``step`` of a metrics file's last complete line (0 when there is none yet)."""
    try:
        lines = metrics.read_text(encoding="utf-8").splitlines()
    except OSError:
        return 0
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            continue  # a line being written, or not a step's
    return 0


@contextlib.contextmanager
def claimed(record: Path, details: Mapping[str, Any] | None = None) -> Iterator[bool]:
    """Hold ``record`` while it runs: ``<record>.running`` names this process (its first line, then
    ``details`` as one JSON line: the log, the run directory, the iterations), so a second ``run``
    (another sitting, in parallel) skips the record instead of starting it again and wiping this run's
    directory, and ``status`` can say how far it is. A marker whose process is gone is taken over.
    Yields whether this process holds it."""
    marker = record.with_suffix(".running")
    marker.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            if running_pid(record) is not None:
                yield False
                return
            marker.unlink(missing_ok=True)  # left by a process that died
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(f"{os.getpid()}\n{json.dumps(dict(details or {}))}\n")
        try:
            yield True
        finally:
            marker.unlink(missing_ok=True)
        return
    yield False


def load_records(out: Path, comparison: str) -> list[dict[str, Any]]:
    folder = out / comparison
    paths = sorted(folder.glob("*__s*.json")) if folder.is_dir() else []
    records = [json.loads(p.read_text(encoding="utf-8")) for p in paths]
    records = [r for r in records if r.get("comparison") == comparison]
    for m in COMPARISONS.get(comparison, ()):
        if m.reuse:  # the same runs as another comparison's: read from there
            records += [{**r, "comparison": comparison, "label": m.label, "reused_from": m.reuse}
                        for r in load_records(out, m.reuse) if r["method"] == m.name]
    return records


def missing_records(out: Path, comparison: str, quick: bool = False) -> dict[str, list[int]]:
    """Method -> seeds whose record the page still needs."""
    wanted = {m: (0,) for m in SEEDS_WANTED[comparison]} if quick else SEEDS_WANTED[comparison]
    return {
        name: missing
        for name, seeds in wanted.items()
        if (missing := [s for s in seeds
                        if not record_path(out, method(comparison, name).reuse or comparison, name, s).is_file()])
    }


def completion_commands(comparison: str, missing: Mapping[str, list[int]]) -> list[str]:
    """One command per distinct seed list that completes the missing records."""
    by_seeds: dict[tuple[int, ...], list[str]] = {}
    for name, seeds in missing.items():
        by_seeds.setdefault(tuple(seeds), []).append(name)
    return [
        f"python bench/results.py run {comparison} --seeds {' '.join(map(str, seeds))} --methods {' '.join(names)}"
        for seeds, names in by_seeds.items()
    ]


