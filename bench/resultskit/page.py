"""The page of docs/results.md from the comparisons' records (``bench/resultskit/records.py``; the
comparisons in ``comparisons.py``): summaries over seeds, the figures, the tables and the page's
generated sections."""


import json
import math
import re
import textwrap
from pathlib import Path
from typing import Any

from .comparisons import COMPARISONS, LAST, SWEEPS, method, settings_of, sweep_name, swept_comparison
from .provenance import distinct_runs, provenance, provenance_counts, sampling_note, save_samplers, settings
from .reading import SECTION_EFFECTS, SECTION_TESTS, reading
from .records import chosen_rate, completion_commands, edge_note, load_records, machine_label, missing_records
from .roles import ROLES, holders, role_final
from .significance import effects_table, significance_table
from .summary import Summary as Summary
from .summary import fmt, last_finite, last_mean, mean_std, value

WRITING = ("magrpo", "preference", "methods", "sweep")
"""The comparisons on writing/xsum-v0 (joint reward and its components)."""
CODING = ("coding", "coding-sweep")
"""The comparisons on coding/humaneval-v0 (joint reward, its components and pass@1)."""
JOINT = WRITING + CODING
"""The comparisons of a joint task reward (the others, CORY's, log each model's own)."""
SWEEP_OF = {"sweep": "methods", "coding-sweep": "coding"}
"""A sweep comparison -> the comparison whose rates it chooses."""


def summarise(comparison: str, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per method: seeds, walls, and mean/std over seeds of the final numbers."""
    out: dict[str, Any] = {}
    for m in COMPARISONS[comparison]:
        mine = sorted((r for r in records if r["method"] == m.name), key=lambda r: r["seed"])
        if not mine:
            continue
        entry: dict[str, Any] = {"label": m.label, "seeds": [r["seed"] for r in mine],
                                 "wall_s": {str(r["seed"]): r["wall_s"] for r in mine}}
        if comparison in JOINT:
            keys = sorted({k for r in mine for k in r["eval"] if comparison in CODING or not k.startswith("pass@")})
            entry["eval"] = {k: mean_std([r["eval"].get(k, math.nan) for r in mine]) for k in keys}
            entry["eval_before"] = {k: mean_std([r["eval_before"].get(k, math.nan) for r in mine]) for k in keys}
            if any(r.get("validation") for r in mine):
                entry["validation"] = {k: mean_std([r.get("validation", {}).get(k, math.nan) for r in mine])
                                       for k in keys}
            rates = sorted({r["flags"]["learning-rate"] for r in mine if "learning-rate" in r.get("flags", {})})
            entry["learning_rate"] = rates[0] if len(rates) == 1 else (rates or None)
            accuracy = [last_finite(r["curve"].get("pref/rm_heldout_accuracy", [])) for r in mine]
            if any(math.isfinite(a) for a in accuracy):
                entry["rm_heldout_accuracy"] = mean_std(accuracy)
        else:
            entry["final"] = {  # from the curves: a record's stored mean dropped non-finite values
                model: {k: mean_std([last_mean(r["curve"][f"agent_{model}/{k}"]) for r in mine])
                        for k in ("task_reward", "kl", "combined")}
                for model in m.models
            }
            if m.learner == "cory":  # the roles swap: each role's values from the model that held it
                entry["final_by_role"] = {
                    role: {k: mean_std([role_final(role, k)(r) for r in mine])
                           for k in ("task_reward", "kl", "combined")}
                    for role in ROLES}
                entry["role_holders"] = {role: holders(mine, role) for role in ROLES}
            keys = sorted({k for r in mine for k in r["eval"]})
            entry["eval"] = {k: mean_std([r["eval"].get(k, math.nan) for r in mine]) for k in keys}
            entry["eval_before"] = {k: mean_std([r["eval_before"].get(k, math.nan) for r in mine]) for k in keys}
        out[m.name] = entry
    return out


# ------------------------------------------------------------------------------------------ figures
def _band(ax: Any, curves: list[list[float]], color: str, label: str, smoothing: int, style: str = "-") -> None:
    import numpy as np

    from baselines.infra.plots import smooth

    length = min(len(c) for c in curves)
    stack = np.array([smooth(c[:length], smoothing) for c in curves])  # (seeds, iterations)
    x = np.arange(1, length + 1)
    mean = np.nanmean(stack, axis=0)
    broken = int((~np.isfinite(stack)).any(axis=1).sum())  # seeds with a non-finite value: said, not hidden
    ax.plot(x, mean, style, color=color, linewidth=2,
            label=f"{label} (n={len(curves)}" + (f", ⚠ {broken} with non-finite values)" if broken else ")"))
    if len(curves) > 1:
        std = np.nanstd(stack, axis=0, ddof=1)
        ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.18, linewidth=0)


COLORS = ("tab:grey", "tab:brown", "tab:orange", "tab:purple", "tab:blue", "tab:green", "tab:red")


def plot_magrpo(records: list[dict[str, Any]], summary: dict[str, Any], path: Path, smoothing: int,
                comparison: str = "magrpo") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    colors = dict(zip((m.name for m in COMPARISONS[comparison]), COLORS))
    # The single writer's format: the delimiter (magrpo) or the tagged sections (the centralised model); on
    # code, the fraction of the test assertions that pass.
    share = {"magrpo": "reward/delimiter", "coding": "reward/tests"}.get(comparison, "reward/sections_found")
    for m in COMPARISONS[comparison]:
        mine = [r for r in records if r["method"] == m.name and r["curve"].get("reward/total")]
        if mine:
            _band(axes[0], [r["curve"]["reward/total"] for r in mine], colors[m.name], m.label, smoothing)
            if share in mine[0]["curve"]:
                _band(axes[2], [r["curve"][share] for r in mine], colors[m.name], m.label, smoothing)
    top = 4.0 if comparison in CODING else 3.0
    axes[0].set_title(f"training batch joint reward (max {top}), moving average {smoothing}", fontsize=9)
    axes[0].set_xlabel("iteration")
    axes[2].set_title({"magrpo": "single agent: share of training responses with [PARAGRAPH_SPLIT]",
                       "coding": "training batch: fraction of the test assertions passed"}.get(
                          comparison, "centralised model: share of roles with a tagged section"), fontsize=9)
    axes[2].set_xlabel("iteration")
    axes[2].set_ylim(-0.05, 1.05)
    names = [n for n in (m.name for m in COMPARISONS[comparison]) if n in summary]
    # On code the one coder cannot reach the pair's aux levels: the bars compare what both are scored by alike.
    shown = "tests" if comparison in CODING else "total"
    for i, name in enumerate(names):
        untrained = method(comparison, name).learner == "eval"  # before = after: one bar
        for j, (key, shade) in enumerate((("eval_before", 0.35), ("eval", 1.0))):
            if untrained and key == "eval_before":
                continue
            mean, std, n, _ = summary[name][key].get(shown, mean_std([]))
            if n:
                axes[1].bar(i + (j - 0.5) * 0.38, mean, 0.36, yerr=std if n > 1 else None, color=colors[name],
                            alpha=shade, capsize=3)  # one seed: no spread to draw
    # Labels wrapped to their slot (~480 px of axis, ~5.5 px a character at this size): whole long labels
    # ran into their neighbours.
    width = max(8, int(480 / max(len(names), 1) / 5.5))
    axes[1].set_xticks(range(len(names)), [textwrap.fill(summary[n]["label"], width) for n in names], fontsize=7)
    axes[1].set_title(f"eval {'fraction of the test assertions passed' if shown == 'tests' else 'joint reward'} "
                      "before (faint) / after training, mean ± std", fontsize=9)
    for ax in axes:
        ax.grid(alpha=0.3)
    if axes[0].lines:
        axes[0].legend(fontsize=7)
    if axes[2].lines:
        axes[2].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_cory(records: list[dict[str, Any]], path: Path, smoothing: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    lines = {("ppo", "agent"): ("tab:red", "-"), ("cory", "model_0"): ("tab:blue", "-"),
             ("cory", "model_1"): ("tab:green", "-"), ("cory-no-swap", "model_0"): ("tab:blue", ":"),
             ("cory-no-swap", "model_1"): ("tab:green", ":"), ("cory-individual", "model_0"): ("tab:cyan", "--"),
             ("cory-individual", "model_1"): ("tab:olive", "--")}
    titles = {"task_reward": "task reward (the model's own VADER sentiment)", "kl": "KL to the base (nats / response)",
              "kl_coef": "adaptive KL coefficient"}
    for m in COMPARISONS["cory"]:
        mine = [r for r in records if r["method"] == m.name]
        if not mine:
            continue
        for model in m.models:
            color, style = lines[(m.name, model)]
            for ax, key in zip(axes, titles):
                curves = [r["curve"][f"agent_{model}/{key}"] for r in mine]
                _band(ax, curves, color, f"{m.label} {model}" if m.learner == "cory" else m.label, smoothing, style)
    for ax, title in zip(axes, titles.values()):
        ax.set_title(f"{title}; band ± std", fontsize=9)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    if axes[0].lines:
        axes[0].legend(fontsize=7)
    fig.suptitle(f"CORY vs PPO on IMDB (SmolLM2-135M, LoRA); moving average {smoothing}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ------------------------------------------------------------------------------------------ the page
def tables(comparison: str, summary: dict[str, Any], records: list[dict[str, Any]], out: Path) -> str:
    """The page's generated section for one comparison (markdown)."""
    lines: list[str] = []
    if comparison in SWEEP_OF:
        lines += sweep_table(summary, out, SWEEP_OF[comparison])
    elif comparison == "coding":
        components = ("total", "pass@1", "tests", "main_defined", "aux_defined", "syntax", "aux_call",
                      "beyond_wrapper", "ignored_result")
        # Every component before and after training, a row each (an untrained pair's one evaluation, one row).
        lines.append("| method | learning rate | eval | " + " | ".join(components) + " |")
        lines.append("|---" * (len(components) + 3) + "|")
        for name, entry in summary.items():
            trained = method(comparison, name).learner != "eval"
            for when, key in ((("after training", "eval"), ("before training", "eval_before")) if trained
                              else (("untrained", "eval"),)):
                cells = [fmt(*entry[key][c]) if c in entry[key] else "—" for c in components]
                lines.append(f"| {entry['label']} | {entry['learning_rate'] or '—'} | {when} | " + " | ".join(cells)
                             + " |")
    elif comparison == "methods":
        components = ("total", "structure", "length", "diversity", "transition", "jaccard", "sections_found")
        lines.append("| method | learning rate | " + " | ".join(f"eval {c}" for c in components)
                     + " | eval total before | reward model held-out accuracy |")
        lines.append("|---" * (len(components) + 4) + "|")
        for entry in summary.values():
            cells = [fmt(*entry["eval"][c]) if c in entry["eval"] else "—" for c in components]
            accuracy = fmt(*entry["rm_heldout_accuracy"]) if "rm_heldout_accuracy" in entry else "—"
            lines.append(f"| {entry['label']} | {entry['learning_rate']} | " + " | ".join(cells)
                         + f" | {fmt(*entry['eval_before']['total'])} | {accuracy} |")
    elif comparison in ("magrpo", "preference"):
        components = ("total", "structure", "length", "diversity", "transition", "jaccard",
                      "delimiter" if comparison == "magrpo" else "sections_found")
        lines.append("| method | " + " | ".join(f"eval {c}" for c in components) + " | eval total before |")
        lines.append("|---" * (len(components) + 2) + "|")
        for entry in summary.values():
            cells = [fmt(*entry["eval"][c]) if c in entry["eval"] else "—" for c in components]
            lines.append(f"| {entry['label']} | " + " | ".join(cells) + f" | {fmt(*entry['eval_before']['total'])} |")
    else:
        # CORY's models swap roles: its rows are its roles, each from the model that held it in the last iterations.
        lines.append(f"| method | model (CORY: role, and the model that held it in the last {LAST} it.) | task reward "
                     f"(last {LAST} it.) | KL (last {LAST} it.) | r - 0.01 KL | eval after |")
        lines.append("|---|---|---|---|---|---|")
        for entry in summary.values():
            rows = ({f"{role} ({entry['role_holders'][role]})": (values, [f"sentiment_{role}", "total"])
                     for role, values in entry["final_by_role"].items()} if "final_by_role" in entry
                    else {model: (values, None) for model, values in entry["final"].items()})
            for model, (values, keys) in rows.items():
                evals = {k: v for k, v in entry["eval"].items()
                         if (k in keys if keys else k.startswith("sentiment") or k == "total")}
                shown = ", ".join(f"{k} {fmt(*v)}" for k, v in evals.items())
                lines.append(f"| {entry['label']} | {model} | {fmt(*values['task_reward'])} | {fmt(*values['kl'])} | "
                             f"{fmt(*values['combined'])} | {shown} |")
    if comparison in SECTION_TESTS and records:
        lines.append("")
        lines += significance_table(records, SECTION_TESTS[comparison])
    effects = effects_table(records, SECTION_EFFECTS.get(comparison, [])) if records else []
    if effects:
        lines += ["", *effects]
    lines.append("")
    lines.append("Records (one per method and seed; wall = seconds of that run on a machine shared with other jobs; "
                 "a run resumed across sittings sums its legs, counting the iterations an interruption made it redo):")
    lines.append("")
    lines.append("| record | wall (s) | CPU (s) | load avg start / end | finished | commit | machine, dtype |")
    lines.append("|---|---|---|---|---|---|---|")
    for r in sorted(records, key=lambda r: (r["method"], r["seed"])):
        load = r["load_average_1min"]
        name = f"{r['method']}__s{r['seed']}"
        link = f"results/{r.get('reused_from', comparison)}/{name}.json"
        legs = f" ({len(r['legs'])} legs)" if r.get("legs") else ""  # resumed across sittings: summed
        lines.append(f"| [{name}]({link}) | {r['wall_s']}{legs} | {r.get('cpu_s', '—')} | "
                     f"{load['start']:.1f} / {load['end']:.1f} | {r['finished']} | {short_commit(r['commit'])} | "
                     f"{machine_label(r)} |")
    lines.append("")
    lines.append(provenance(records, out))
    missing = missing_records(out, comparison)
    lines.append("")
    if missing:
        lines.append("**Missing records** (" + ", ".join(f"{n}: seeds {s}" for n, s in missing.items())
                     + "). Complete them with:")
        lines.append("")
        lines.append("```bash")
        lines += completion_commands(comparison, missing)
        lines.append("python bench/results.py render")
        lines.append("```")
    else:
        lines.append("All records of this comparison exist.")
    return "\n".join(lines)


def sweep_table(summary: dict[str, Any], out: Path, comparison: str = "methods") -> list[str]:
    """The learning-rate sweep of ``comparison``'s methods: each method's rates scored on the validation
    split (the held-out train problems), the chosen rate marked; the eval split is not looked at to choose."""
    shown = ("tests", "pass@1") if comparison in CODING else ("structure", "length")
    lines = [f"| method | learning rate | validation total (chosen: **bold**) | validation {shown[0]} | "
             f"validation {shown[1]} | eval total after | eval total before | reward model held-out accuracy |",
             "|---|---|---|---|---|---|---|---|"]
    for name, rates in SWEEPS[comparison][1].items():
        best = chosen_rate(out, name, comparison)
        label = method(comparison, name).label
        for rate in rates:
            entry = summary.get(sweep_name(name, rate))
            if entry is None:
                lines.append(f"| {label} | {rate:g} | (missing) | | | | | |")
                continue
            val = entry.get("validation", {})
            total = value(val["total"].mean) if "total" in val else "—"
            total = f"**{total}**" if best == rate else total
            cells = [value(val[c].mean) if c in val else "—" for c in shown]
            accuracy = value(entry["rm_heldout_accuracy"].mean) if "rm_heldout_accuracy" in entry else "—"
            lines.append(f"| {label} | {rate:g} | {total} | {' | '.join(cells)} | "
                         f"{value(entry['eval']['total'].mean)} | {value(entry['eval_before']['total'].mean)} | "
                         f"{accuracy} |")
    edges = [f"{method(comparison, name).label}: {note}" for name in SWEEPS[comparison][1]
             if (note := edge_note(out, name, comparison))]
    if edges:
        lines += ["", "Chosen at an edge of its grid (no run outside the grid says more): " + "; ".join(edges) + "."]
    return lines


def short_commit(commit: str | None) -> str:
    """``abcdef12`` (``+dirty`` when the tree had uncommitted changes to tracked files).

    >>> short_commit("0123456789abcdef+dirty")
    '01234567+dirty'
    """
    if not commit:
        return ""
    return commit[:8] + ("+dirty" if commit.endswith("+dirty") else "")


MARKER = "<!-- results:{name}:{end} (written by `python bench/results.py render`; edits in between are lost) -->"


def replace_section(text: str, name: str, body: str, marker: str = MARKER) -> str:
    """Put ``body`` between the ``name`` markers of ``text`` (``marker`` formatted with ``name`` and ``end``;
    the markers must be there)."""
    begin, end = marker.format(name=name, end="begin"), marker.format(name=name, end="end")
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.DOTALL)
    if not pattern.search(text):
        raise ValueError(f"the page has no {name!r} section: add the two marker lines {begin!r} and {end!r}")
    return pattern.sub(lambda _: f"{begin}\n{body}\n{end}", text)


def estimate_missing(out: Path) -> tuple[float, float, list[str]]:
    """Wall and CPU seconds the missing records would take at the means of the finished records of the
    same method (a swept method's records at any rate, in its sweep or its rows, count as the same
    method), and the methods (``comparison/method``) with no finished record to estimate from."""
    loaded = {c: load_records(out, c) for c in COMPARISONS}
    wall, cpu, unknown = 0.0, 0.0, []
    for comparison in COMPARISONS:
        family = {comparison, swept_comparison(comparison), *((SWEEPS[comparison][0],) if comparison in SWEEPS else ())}
        for name, seeds in missing_records(out, comparison).items():
            if comparison in SWEEPS and name in SWEEPS[comparison][1]:
                seeds = [seed for seed in seeds if seed != 0]  # the sweep's record, copied: no run of its own
            base = name.split("@")[0]
            same = [r for c in family for r in loaded.get(c, []) if r["method"].split("@")[0] == base]
            if not same:
                unknown.append(f"{comparison}/{name}")
                continue
            wall += len(seeds) * sum(r["wall_s"] for r in same) / len(same)
            timed = [r["cpu_s"] for r in same if r.get("cpu_s") is not None]
            cpu += len(seeds) * (sum(timed) / len(timed) if timed else math.nan)
    return wall, cpu, unknown


def sections(out: Path, smoothing: int) -> tuple[dict[str, str], dict[str, Any]]:
    """The page's generated sections (name -> markdown) and the totals, from the records alone (no
    figure, no file written)."""
    result: dict[str, Any] = {"records": 0, "missing": {}, "summaries": {}}
    texts: dict[str, str] = {}
    every: list[dict[str, Any]] = []
    records_of = {comparison: load_records(out, comparison) for comparison in COMPARISONS}
    for comparison, records in records_of.items():
        summary = summarise(comparison, records)
        result["summaries"][comparison] = summary
        result["records"] += len(records)
        every += records
        result["missing"][comparison] = missing_records(out, comparison)
        texts[comparison] = tables(comparison, summary, records, out)
        texts[f"{comparison}-settings"] = settings(records)
        body = reading(comparison, records_of, out, smoothing)
        if body is not None:
            texts[f"{comparison}-reading"] = body
    runs = distinct_runs(every)
    result["runs"] = len(runs)
    result["total_wall_s"] = sum(r["wall_s"] for r in runs.values())
    hours = result["total_wall_s"] / 3600
    estimate, cpu, unknown = estimate_missing(out)
    result["missing_wall_estimate_s"], result["missing_cpu_estimate_s"] = estimate, cpu
    text = (f"Wall of the {len(runs)} distinct runs so far ({result['records']} records: a run shown in two sections, "
            f"a reused record or a sweep record copied as seed 0, counts once): **{result['total_wall_s']:.0f} s "
            f"({hours:.2f} h)**, the sum of the runs' own wall times on machines shared with other jobs: several runs "
            "at once (see each record's load average), and paused at times while timing benchmarks ran. "
            "Each record's CPU seconds (where recorded) are its own process's CPU time, the fairer measure of cost.")
    if any(result["missing"].values()):
        if estimate:
            text += (f" The missing records would take about {cpu / 3600:.1f} CPU-hours ({estimate / 3600:.1f} h of "
                     "wall at the same load), at the means of the finished records of the same method (a swept "
                     "method's at any rate)")
            text += f", plus the methods with no record yet: {', '.join(unknown)}." if unknown else "."
        else:
            text += f" The missing records are of methods with no record yet: {', '.join(unknown)}."
    texts["wall"] = text + " " + provenance_counts(every, "of this page")
    texts["sampling"] = sampling_note(every, out)
    return texts, result


def render_page(text: str, texts: dict[str, str]) -> str:
    """``text`` with every generated section replaced (a page must hold the markers of each)."""
    for name, body in texts.items():
        text = replace_section(text, name, body)
    return text


README_SECTION = "provenance"
"""README's one generated section (between its ``results:provenance`` markers): which runs of
docs/results.md name their machine, cost and code (:func:`provenance.provenance_counts`)."""


def readme_text(out: Path) -> str:
    """README's provenance section from the records in ``out``."""
    every = [r for comparison in COMPARISONS for r in load_records(out, comparison)]
    return ("The seeded results of [docs/results.md](docs/results.md) keep one record per run (the command, flags, "
            "curves, evaluations, wall time and commit). " + provenance_counts(every))


def render(out: Path, page: Path | None, smoothing: int, readme: Path | None = None) -> dict[str, Any]:
    """Figures, summary JSON and (when ``page`` is given) the page's generated sections, from the records;
    with ``readme``, README's provenance section (:func:`readme_text`) too."""
    texts, result = sections(out, smoothing)
    summaries = result.pop("summaries")
    result["figures"] = []
    for comparison in COMPARISONS:
        records = load_records(out, comparison)
        summary = summaries[comparison]
        if records and comparison not in SWEEP_OF:
            figure = out / f"{comparison}.png"
            if comparison in JOINT:
                plot_magrpo(records, summary, figure, smoothing, comparison)
            else:
                plot_cory(records, figure, smoothing)
            result["figures"].append(str(figure))
        (out / f"{comparison}.json").parent.mkdir(parents=True, exist_ok=True)
        (out / f"{comparison}.json").write_text(json.dumps({"settings": settings_of(comparison, False),
                                                            "summary": summary}, indent=1) + "\n", encoding="utf-8")
    if page is not None:
        page.write_text(render_page(page.read_text(encoding="utf-8"), texts), encoding="utf-8")
        result["page"] = str(page)
        save_samplers(out)
    if readme is not None:
        readme.write_text(replace_section(readme.read_text(encoding="utf-8"), README_SECTION, readme_text(out)),
                          encoding="utf-8")
        result["readme"] = str(readme)
    return result
