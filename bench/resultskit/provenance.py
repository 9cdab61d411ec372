"""Where a section's runs came from, computed from their records: each run once (a reused record or a
sweep record copied as seed 0 counts once), the CPU kinds, hosts, threads and dtype, the sampler of each
commit (derived from git and kept beside the records), the flags the records share, and the page's note
on the sampler change."""

import functools
import json
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .comparisons import ROOT
from .values import Record, ev, ms


def run_source(r: Record) -> str:
    """The file a record's run wrote: reused records and the seed-0 copies of sweep records name the
    run they are, so a run counts once however many sections show it."""
    if r.get("copied_from"):
        return r["copied_from"]
    return f"{r.get('reused_from', r['comparison'])}/{r['method']}__s{r['seed']}.json"


def distinct_runs(records: Iterable[Record]) -> dict[str, Record]:
    """Run file -> its record, each run once."""
    runs: dict[str, Record] = {}
    for r in records:
        runs.setdefault(run_source(r), r)
    return runs


COUNTER_DRAW = "5792c26"


"""The commit that brought the counter-based draw (exponential race over counter-based random numbers;
docs/agents.md "The rollout engine"): a record whose commit descends from it sampled with that draw,
one before it with per-row ``torch.Generator``s and an inverse CDF."""


SAMPLERS = "samplers.json"


"""Beside the records: the sampler of each commit they name, as derived from git (``git merge-base
--is-ancestor``), kept so the page renders the same where the history is not at hand (a shallow clone)."""


def commit_of(r: Record) -> str | None:
    commit = r.get("commit")
    return commit.removesuffix("+dirty") if commit else None


@functools.cache
def _known_samplers(out: Path) -> dict[str, str]:
    try:
        return dict(json.loads((out / SAMPLERS).read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return {}


def sampler_of(commit: str | None, out: Path) -> str:
    """``counter-based`` (the commit descends from :data:`COUNTER_DRAW`), ``earlier`` (it does not) or
    ``unknown`` (no commit, or one git does not know); cached in ``out``'s :data:`SAMPLERS`."""
    if not commit:
        return "unknown"
    known = _known_samplers(out)
    if commit not in known:
        try:
            found = subprocess.run(["git", "merge-base", "--is-ancestor", COUNTER_DRAW, commit], cwd=ROOT,
                                   capture_output=True).returncode
        except OSError:
            return "unknown"
        if found not in (0, 1):  # 128: a commit this clone does not have
            return "unknown"
        known[commit] = "counter-based" if found == 0 else "earlier"
    return known[commit]


def save_samplers(out: Path) -> None:
    """Write the samplers derived so far beside the records (``render`` does, so the page renders the
    same without git history)."""
    known = _known_samplers(out)
    if known:
        (out / SAMPLERS).write_text(json.dumps(dict(sorted(known.items())), indent=1) + "\n", encoding="utf-8")


def cpu_kind(r: Record) -> str | None:
    """``CPU model (ISA flags)`` of the record's run; None when the record does not name its machine."""
    machine = r.get("machine") or {}
    if not machine.get("cpu") or machine.get("isa") is None:
        return None
    return f"{machine['cpu']} ({' '.join(machine['isa'])})"


def _field(r: Record, key: str) -> str | None:
    value = (r.get("machine") or {}).get(key)
    return None if value is None else str(value)


def _tally(values: Sequence[str | None], noun: str) -> str:
    """``one CPU kind: X`` / ``2 CPU kinds: X (3), Y (2)``, with the records that name none as unknown."""
    known = [v for v in values if v is not None]
    unknown = len(values) - len(known)
    counts: dict[str, int] = {}
    for v in known:
        counts[v] = counts.get(v, 0) + 1
    if not counts:
        return f"{noun} unknown (none of the {len(values)} runs recorded it)"
    if len(counts) == 1 and not unknown:
        return f"one {noun}, {next(iter(counts))}"
    text = f"{len(counts)} {noun}{'s' if len(counts) > 1 else ''}: " + ", ".join(
        f"{k} ({n} runs)" for k, n in sorted(counts.items()))
    return text + (f", unknown ({unknown} runs did not record it)" if unknown else "")


def provenance(records: Sequence[Record], out: Path) -> str:
    """Where and how a section's runs ran, each run once: CPU kinds, hosts, dtype, threads, the sampler
    (from each commit), commits and uncommitted changes; what a record does not name is unknown."""
    runs = list(distinct_runs(records).values())
    samplers: dict[str, list[str]] = {}
    for r in runs:
        samplers.setdefault(sampler_of(commit_of(r), out), []).append(f"{r['method']}__s{r['seed']}")
    sampler = "; ".join(f"{name} ({len(names)} runs)" for name, names in sorted(samplers.items()))
    dirty = [r for r in runs if (r.get("commit") or "").endswith("+dirty")]
    with_diff = sum(1 for r in dirty if r.get("diff"))
    commits = {commit_of(r) for r in runs if commit_of(r)}
    lines = [
        f"**Provenance** ({len(runs)} distinct runs): {_tally([cpu_kind(r) for r in runs], 'CPU kind')}; "
        f"{_tally([_field(r, 'host') for r in runs], 'host')}; {_tally([_field(r, 'dtype') for r in runs], 'dtype')}; "
        f"{_tally([_field(r, 'threads') for r in runs], 'thread count')}.",
        f"Sampler, from each record's commit ({COUNTER_DRAW}, the counter-based draw, an ancestor or not): {sampler}. "
        f"{len(commits)} commits; {len(dirty)} runs on a tree with uncommitted changes"
        + (f" ({with_diff} store their diff)." if dirty else "."),
    ]
    if len(samplers) > 1:
        lines.append("Runs with different samplers draw different samples from the same seed: "
                     "compare them by their spread over seeds, not seed by seed.")
    return " ".join(lines)


SHOWN_FLAGS = ("max-source-words", "num-problems", "num-generations", "max-new-tokens", "num-iterations",
               "learning-rate", "lora-rank", "lora-alpha", "normalize-std", "temperature", "top-p", "top-k",
               "num-eval-problems", "eval-greedy", "num-validation-problems", "batch-size", "minibatch-size",
               "num-ppo-epochs", "min-new-tokens", "init-kl-coef", "adaptive-kl", "kl-target", "kl-horizon",
               "swap-every", "num-turns", "centralized", "prefill", "num-prompts", "num-candidates",
               "pairs-per-prompt", "batch-pairs", "iterative", "comparator", "replay")


def _flag(name: str, v: Any) -> str:
    return f"`--{name}`" if v is True else (f"`--no-{name}`" if v is False else f"`--{name} {v}`")


def settings(records: Sequence[Record]) -> str:
    """The flags every record of a section ran with, and each method's own, read from the records (not
    from the code's settings, which a later commit may have changed)."""
    if not records:
        return "No record yet."
    runs = [r for r in records if r.get("flags")]
    if not runs:
        return "**Flags**: no record names its flags."
    shared = {k: v for k, v in runs[0]["flags"].items()
              if k in SHOWN_FLAGS and all(r["flags"].get(k, object()) == v for r in runs)}
    lines = [f"**Flags every record ran with** (their `flags`): {', '.join(_flag(k, v) for k, v in shared.items())}."]
    names = list(dict.fromkeys(r["method"] for r in runs))
    own = []
    for name in names:
        mine = [r for r in runs if r["method"] == name]
        flags = {k: v for k, v in mine[0]["flags"].items()
                 if k in SHOWN_FLAGS and k not in shared and all(r["flags"].get(k, object()) == v for r in mine)}
        if flags:
            own.append(f"{mine[0]['label']}: {', '.join(_flag(k, v) for k, v in flags.items())}")
    if own:
        lines.append("Each method's own: " + "; ".join(own) + ".")
    untrained = [r for r in records if not r.get("flags")]
    if untrained:
        lines.append(f"{len(untrained)} records name no flags.")
    return " ".join(lines)


def sampling_note(records: Sequence[Record], out: Path) -> str:
    """Which sampler each section's runs used, from their commits; and what the change did to the one
    figure that can show it, the untrained pair's eval before training on the same eval articles."""
    per: dict[str, dict[str, int]] = {}
    for comparison in dict.fromkeys(r["comparison"] for r in records):
        for r in distinct_runs(x for x in records if x["comparison"] == comparison).values():
            counts = per.setdefault(comparison, {})
            kind = sampler_of(commit_of(r), out)
            counts[kind] = counts.get(kind, 0) + 1
    text = (f"*Sampling changed at commit {COUNTER_DRAW} (counter-based random numbers and an exponential-race draw, "
            "docs/agents.md \"The rollout engine\"); a run at a later commit draws other samples from the same seed. "
            "The sampler of each run, from its commit: "
            + "; ".join(f"`{c}` " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
                        for c, counts in per.items())
            + ".")
    old = [r for r in records if r["comparison"] == "magrpo" and r["method"] == "untrained-parallel"]
    new = [r for r in records if r["comparison"] == "methods" and r["method"] == "magrpo"]
    kinds = {sampler_of(commit_of(r), out) for r in old}, {sampler_of(commit_of(r), out) for r in new}
    if old and new and kinds[0] != kinds[1] and len(kinds[0]) == len(kinds[1]) == 1:
        text += (f" The untrained pair on the same eval articles and seeds scores {ms([ev()(r) for r in old])} with "
                 f"the "
                 f"{next(iter(kinds[0]))} draw (section 1) and {ms([ev(split='eval_before')(r) for r in new])} with "
                 f"the "
                 f"{next(iter(kinds[1]))} one (section 4's eval before training).")
    return text + "*"


def _machine(r: Record) -> str:
    machine = r.get("machine") or {}
    return str(machine["cpu"]) if machine.get("cpu") else "a machine its record does not name"


def row_note(records: Sequence[Record]) -> str | None:
    """What a reading that rests on one row's records must name, from the records alone: the machines its
    seeds ran on when they are more than one (a record that names none counts apart: it is not known to be
    the same), the commits when its seeds ran at more than one (another commit may sample or compute
    otherwise from the same seed), and the seeds run on an uncommitted tree (``+dirty``: the code is not a
    commit; whether the record keeps its diff). None when the row's seeds share one named machine and commit.

    >>> import textwrap
    >>> note = row_note([{"seed": 0, "commit": "a"}, {"seed": 1, "commit": "b+dirty", "machine": {"cpu": "Xeon"}}])
    >>> print(textwrap.fill(note, 104))
    seeds ran on 2 machines: Xeon (seed 1), a machine its record does not name (seed 0); seeds ran at 2
    commits: a (seed 0), b (seed 1); seed 1 on an uncommitted tree (b+dirty, its diff not kept)
    >>> row_note([{"seed": 0, "commit": "a", "machine": {"cpu": "EPYC"}}]) is None
    True
    """
    groups: dict[str, list[int]] = {}
    for r in sorted(records, key=lambda r: r["seed"]):
        groups.setdefault(_machine(r), []).append(r["seed"])
    dirty = [r for r in sorted(records, key=lambda r: r["seed"]) if (r.get("commit") or "").endswith("+dirty")]
    parts = []
    if len(groups) > 1:
        known = sorted(groups.items(), key=lambda kv: kv[0].startswith("a machine its record"))
        parts.append(f"seeds ran on {len(groups)} machines: "
                     + ", ".join(f"{name} ({_seed_list(s)})" for name, s in known))
    commits_of: dict[str, list[int]] = {}
    for r in sorted(records, key=lambda r: r["seed"]):
        if r.get("commit"):
            commits_of.setdefault(r["commit"].removesuffix("+dirty")[:7], []).append(r["seed"])
    if len(commits_of) > 1:
        parts.append(f"seeds ran at {len(commits_of)} commits: "
                     + ", ".join(f"{c} ({_seed_list(s)})" for c, s in commits_of.items()))
    if dirty:
        commits = sorted({r["commit"].removesuffix("+dirty")[:8] + "+dirty" for r in dirty})
        kept = sum(1 for r in dirty if r.get("diff"))
        diff = "its diff kept" if kept == len(dirty) else ("its diff not kept" if not kept else
                                                           f"{kept} of {len(dirty)} keep their diff")
        where = "" if len(groups) > 1 else f", on {next(iter(groups))}"
        parts.append(f"{_seed_list([r['seed'] for r in dirty])} on an uncommitted tree ({', '.join(commits)}, "
                     f"{diff}){where}")
    return "; ".join(parts) or None


def _seed_list(seeds: Sequence[int]) -> str:
    return ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(str(s) for s in seeds)


def record_counts(records: Iterable[Record]) -> dict[str, int]:
    """Over the distinct runs of ``records``: how many there are, and how many name no machine, no CPU
    kind's ISA, no dtype, no thread count, no CPU seconds, no commit, and how many ran on an uncommitted tree
    (and of those, how many keep their diff)."""
    runs = list(distinct_runs(records).values())

    def lacks(key: str) -> int:
        return sum(1 for r in runs if (r.get("machine") or {}).get(key) is None)

    dirty = [r for r in runs if (r.get("commit") or "").endswith("+dirty")]
    return {"runs": len(runs), "no_machine": sum(1 for r in runs if not r.get("machine")), "no_cpu": lacks("cpu"),
            "no_isa": lacks("isa"), "no_dtype": lacks("dtype"), "no_threads": lacks("threads"),
            "no_host": lacks("host"), "no_cpu_s": sum(1 for r in runs if r.get("cpu_s") is None),
            "no_commit": sum(1 for r in runs if not r.get("commit")), "dirty": len(dirty),
            "dirty_with_diff": sum(1 for r in dirty if r.get("diff"))}


def provenance_counts(records: Iterable[Record], where: str = "behind [docs/results.md](docs/results.md)") -> str:
    """The sentence that says which of the runs name their machine and cost (README and docs/results.md
    render it; what a record does not hold is counted, never claimed); ``where``: the runs' page, as the
    sentence names it."""
    c = record_counts(records)
    n = c["runs"]

    def named(k: int, what: str) -> str:
        return f"{n - k} of the {n} name {what}"

    return (f"Of the {n} distinct runs {where}, every one names its commit" if not c["no_commit"]
            else f"Of the {n} distinct runs {where}, {named(c['no_commit'], 'their commit')}") + (
        f"; {named(c['no_cpu'], 'the CPU and its ISA')}, {named(c['no_dtype'], 'the dtype')}, "
        f"{named(c['no_threads'], 'the thread count')}, {named(c['no_host'], 'the host')} and "
        f"{named(c['no_cpu_s'], 'their CPU seconds')} (the runs written before records named them do not); "
        f"{c['dirty']} ran on a tree with uncommitted changes ({c['dirty_with_diff']} keep the diff).")
