"""``llm-envs report RUN_DIR``: one self-contained HTML page per run.

The page holds the run's config, the learning curves per reward component (the plot of
``llm-envs plot`` as inline SVG), the eval table before and after training, and the transcripts: for
each eval problem, every agent's response before and after training side by side with the reward
components, the words that changed highlighted; then the logged training batches. Everything is in
the one file (inline CSS and SVG, no script, no font or image fetched), so it opens anywhere, offline,
and can be attached or archived as it is. ``llm-envs train`` writes ``<run>/report.html`` at the end
of every run.

Inputs, all from the run directory: ``metrics.jsonl`` (curves, eval table), ``samples.jsonl``
(transcripts; :mod:`baselines.infra.samples`) and the newest checkpoint's ``trainer.json`` (config). A
missing part is said on the page; a run directory with neither metrics nor samples is an error.
"""

from __future__ import annotations

import difflib
import html
import json
import math
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPORT_FILE = "report.html"

CSS = """
:root { --fg: #1d2430; --muted: #5b6575; --line: #d9dee7; --bg: #f6f7f9; --card: #fff;
        --ins: #d7f5dd; --ins-fg: #0b5d1e; --del: #fde2e1; --del-fg: #8a1c13; --accent: #2f5fb3; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--fg);
       font: 14px/1.45 -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 20px 60px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 32px 0 10px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 15px; margin: 0 0 8px; }
.sub { color: var(--muted); margin: 0 0 16px; }
.headline { display: flex; flex-wrap: wrap; gap: 12px; margin: 14px 0; }
.stat { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px; }
.stat b { display: block; font-size: 20px; }
.stat span { color: var(--muted); font-size: 12px; }
table { border-collapse: collapse; background: var(--card); }
th, td { border: 1px solid var(--line); padding: 4px 9px; text-align: left; vertical-align: top; }
th { background: #eef1f6; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.up { color: var(--ins-fg); font-weight: 600; }
.down { color: var(--del-fg); font-weight: 600; }
.config td:first-child { color: var(--muted); }
.config { font-size: 13px; }
.columns2 { columns: 2 360px; column-gap: 24px; }
.columns2 table { width: 100%; }
.curves { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 8px; overflow-x: auto; }
.curves svg { max-width: 100%; height: auto; display: block; margin: 0 auto; }
.problem { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 14px 16px;
           margin: 0 0 18px; }
.problem .meta { color: var(--muted); font-size: 12px; margin-bottom: 8px; }
.pair { display: grid; grid-template-columns: 1fr 1fr; gap: 12px; margin: 8px 0 12px; }
.side { border: 1px solid var(--line); border-radius: 6px; padding: 8px 10px; background: #fbfcfd; min-width: 0; }
.side .label { font-size: 12px; color: var(--muted); margin-bottom: 4px; }
.text { white-space: pre-wrap; overflow-wrap: anywhere; font-family: ui-monospace, Menlo, Consolas, monospace;
        font-size: 12.5px; }
ins { background: var(--ins); color: var(--ins-fg); text-decoration: none; border-radius: 2px; }
del { background: var(--del); color: var(--del-fg); border-radius: 2px; }
details { margin: 6px 0; }
summary { cursor: pointer; color: var(--accent); }
.prompt { background: #f3f5f8; border-radius: 6px; padding: 8px 10px; margin: 6px 0; }
.role { font-weight: 600; margin: 10px 0 2px; }
.note { color: var(--muted); font-style: italic; }
.train-episode { border-top: 1px solid var(--line); padding: 8px 0; }
.comp { font-size: 12.5px; margin: 6px 0; }
"""


# ----------------------------------------------------------------------------------------- inputs
def _read_config(run_dir: Path) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """(config, trainer record without config) of the run's newest checkpoint, or (None, {})."""
    from baselines.infra.checkpoints import CheckpointError, find_checkpoint

    try:
        trainer = json.loads((find_checkpoint(run_dir) / "trainer.json").read_text(encoding="utf-8"))
    except (CheckpointError, OSError, ValueError):
        return None, {}
    if not isinstance(trainer, dict) or not isinstance(trainer.get("config"), dict):
        return None, {}
    return trainer["config"], {k: trainer.get(k) for k in ("learner", "step")}


def _eval_rows(rows: Sequence[Mapping[str, Any]]) -> list[tuple[int, dict[str, float]]]:
    """(step, {name: value}) of every evaluation in the metrics, in order (``eval/`` prefix removed)."""
    out = []
    for row in rows:
        values = {k.split("/", 1)[1]: float(v) for k, v in row.items() if k.startswith("eval/")}
        if values:
            out.append((int(row["step"]), values))
    return out


def _curves_svg(metrics_path: Path) -> str | None:
    """The learning curves (``plot_metrics``) as inline SVG markup, or None when there is nothing to plot."""
    import matplotlib

    from baselines.infra.plots import plot_metrics

    # A fixed salt makes the SVG's element ids, and so the whole page, the same for the same run.
    with tempfile.TemporaryDirectory() as tmp, matplotlib.rc_context({"svg.hashsalt": "llm-envs-report"}):
        try:
            out = plot_metrics(metrics_path, Path(tmp) / "curves.svg")
        except ValueError:
            return None
        svg = out.read_text(encoding="utf-8")
    svg = svg[svg.index("<svg") :]  # drop the XML declaration and the DOCTYPE (it names a DTD URL)
    return re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.DOTALL)


# ----------------------------------------------------------------------------------------- html bits
def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: Any) -> str:
    if isinstance(value, float):
        return "nan" if not math.isfinite(value) else f"{value:.3f}"
    return _e(value)


def _delta(before: float | None, after: float | None) -> str:
    if before is None or after is None or not (math.isfinite(before) and math.isfinite(after)):
        return '<td class="num"></td>'
    d = after - before
    cls = "up" if d > 1e-12 else "down" if d < -1e-12 else ""
    return f'<td class="num {cls}">{d:+.3f}</td>'


_TOKEN = re.compile(r"\s+|[^\s]+")


def diff_html(before: str, after: str) -> tuple[str, str]:
    """Both texts as HTML with the words that differ marked: ``<del>`` in ``before`` (gone after
    training), ``<ins>`` in ``after`` (new). Whitespace is kept; everything is escaped.

    >>> diff_html("the cat sat", "the dog sat")
    ('the <del>cat</del> sat', 'the <ins>dog</ins> sat')
    """
    a, b = _TOKEN.findall(before or ""), _TOKEN.findall(after or "")
    left, right = [], []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        old, new = _e("".join(a[i1:i2])), _e("".join(b[j1:j2]))
        if op == "equal":
            left.append(old)
            right.append(new)
            continue
        if old.strip():
            left.append(f"<del>{old}</del>")
        else:
            left.append(old)
        if new.strip():
            right.append(f"<ins>{new}</ins>")
        else:
            right.append(new)
    return "".join(left), "".join(right)


def _text_block(markup: str) -> str:
    return f'<div class="text">{markup if markup else "<span class=note>(empty)</span>"}</div>'


def _components_table(before: Mapping[str, float] | None, after: Mapping[str, float] | None,
                      names: Sequence[str]) -> str:
    head = "<tr><th>component</th><th>before</th><th>after</th><th>change</th></tr>"
    body = []
    for name in names:
        b = None if before is None else before.get(name)
        a = None if after is None else after.get(name)
        body.append(f"<tr><td>{_e(name)}</td><td class=num>{'' if b is None else _num(b)}</td>"
                    f"<td class=num>{'' if a is None else _num(a)}</td>{_delta(b, a)}</tr>")
    return f'<table class="comp">{head}{"".join(body)}</table>'


# ----------------------------------------------------------------------------------------- sections
def _section_config(config: Mapping[str, Any] | None, trainer: Mapping[str, Any]) -> str:
    if config is None:
        return "<h2>Config</h2><p class=note>No checkpoint with a config was found in this run directory.</p>"
    rows = "".join(f"<tr><td>{_e(k)}</td><td>{_e(json.dumps(v))}</td></tr>" for k, v in config.items())
    return (f"<h2>Config</h2><p class=sub>From the newest checkpoint (step {_e(trainer.get('step'))}).</p>"
            f'<div class="columns2"><table class="config">{rows}</table></div>')


def _section_curves(svg: str | None) -> str:
    if svg is None:
        return "<h2>Learning curves</h2><p class=note>No training iteration was logged yet.</p>"
    return ("<h2>Learning curves</h2><p class=sub>Per reward component: the training batch mean (faint), its moving "
            "average, and the eval-split means (markers) before, during and after training.</p>"
            f'<div class="curves">{svg}</div>')


def _section_eval_table(evals: Sequence[tuple[int, dict[str, float]]]) -> str:
    if not evals:
        return "<h2>Evaluation</h2><p class=note>No evaluation in this run.</p>"
    (first_step, first), (last_step, last) = evals[0], evals[-1]
    names = sorted(set(first) | set(last), key=lambda n: (n != "total", n != "return", n))
    head = (f"<tr><th>eval</th><th>before (step {first_step})</th><th>after (step {last_step})</th>"
            "<th>change</th></tr>")
    body = "".join(
        f"<tr><td>{_e(n)}</td><td class=num>{_num(first.get(n, ''))}</td><td class=num>{_num(last.get(n, ''))}</td>"
        f"{_delta(first.get(n), last.get(n))}</tr>"
        for n in names
    )
    return f"<h2>Evaluation</h2><table>{head}{body}</table>"


def _prompts_details(turn: Mapping[str, Any]) -> str:
    parts = "".join(
        f'<div class=role>{_e(role)}</div><div class="prompt text">{_e(text)}</div>'
        for role, text in turn.get("prompts", {}).items()
    )
    return f"<details><summary>prompts</summary>{parts}</details>" if parts else ""


def _who(record: Mapping[str, Any], role: str) -> str:
    model = record.get("models", {}).get(role, role)
    return _e(role) + ("" if model == role else f" <span class=note>(played by {_e(model)})</span>")


def _problem_card(key: tuple[Any, Any], before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> str:
    task_index, episode = key
    some = after if after is not None else before
    if some is None:
        raise ValueError(f"problem {task_index} has neither a before nor an after record")
    rb = None if before is None else before["reward"]
    ra = None if after is None else after["reward"]
    change = "" if rb is None or ra is None else f" ({ra - rb:+.3f})"
    reward = f"reward {_num(rb) if rb is not None else '–'} → {_num(ra) if ra is not None else '–'}{change}"
    out = [f'<div class="problem" id="problem-{_e(task_index)}-{_e(episode)}">',
           f"<h3>Problem {_e(task_index)} · {reward}</h3>",
           f'<div class="meta">{_e(some["env"])} · split {_e(some["split"])} · seed {_e(some["seed"])}'
           f"{'' if before is None else ' · before: iteration ' + _e(before['iteration'])}"
           f"{'' if after is None else ' · after: iteration ' + _e(after['iteration'])}</div>"]
    n_turns = max(len(r["turns"]) for r in (before, after) if r is not None)
    for t in range(n_turns):
        tb = before["turns"][t] if before is not None and t < len(before["turns"]) else None
        ta = after["turns"][t] if after is not None and t < len(after["turns"]) else None
        if n_turns > 1:
            out.append(f"<div class=meta>turn {t + 1} of {n_turns}</div>")
        out.append(_prompts_details(ta or tb))
        roles = list(dict.fromkeys([*((tb or {}).get("responses", {})), *((ta or {}).get("responses", {}))]))
        for role in roles:
            left, right = diff_html((tb or {}).get("responses", {}).get(role, ""),
                                    (ta or {}).get("responses", {}).get(role, ""))
            who_b = _who(before, role) if before is not None else _e(role)
            who_a = _who(after, role) if after is not None else _e(role)
            out.append(
                '<div class="pair">'
                f'<div class="side before"><div class="label">{who_b} · before</div>'
                f"{_text_block(left) if tb is not None else '<p class=note>not evaluated</p>'}</div>"
                f'<div class="side after"><div class="label">{who_a} · after</div>'
                f"{_text_block(right) if ta is not None else '<p class=note>not evaluated</p>'}</div>"
                "</div>"
            )
        names = list(dict.fromkeys([*((tb or {}).get("components", {})), *((ta or {}).get("components", {}))]))
        comps_b = None if tb is None else {"total": tb["reward"], **tb["components"]}
        comps_a = None if ta is None else {"total": ta["reward"], **ta["components"]}
        out.append(_components_table(comps_b, comps_a, ["total", *names]))
    out.append("</div>")
    return "".join(out)


def _section_transcripts(samples: Sequence[Mapping[str, Any]] | None) -> str:
    if samples is None:
        return ("<h2>Transcripts</h2><p class=note>This run has no samples.jsonl (runs made before transcripts "
                "were written have none).</p>")
    evals = [r for r in samples if r["kind"] == "eval"]
    if not evals:
        return "<h2>Transcripts</h2><p class=note>No evaluation transcripts in samples.jsonl.</p>"
    first_it = min(r["iteration"] for r in evals)
    last_it = max(r["iteration"] for r in evals)
    before = {(r["task_index"], r["episode"]): r for r in evals if r["iteration"] == first_it}
    after = {(r["task_index"], r["episode"]): r for r in evals if r["iteration"] == last_it} if last_it != first_it \
        else {}
    keys = sorted(set(before) | set(after), key=lambda k: (k[0] is None, k[0] or 0, k[1]))
    intro = (f"<p class=sub>Each eval problem at the first evaluation (iteration {first_it}) and the last (iteration "
             f"{last_it}), side by side; <del>struck</del> words are gone after training, <ins>marked</ins> words "
             "are new.</p>" if after else
             f"<p class=sub>Only one evaluation (iteration {first_it}) so far: no before/after pair yet.</p>")
    cards = "".join(_problem_card(k, before.get(k), after.get(k)) for k in keys)
    return f'<h2 id="transcripts">Transcripts</h2>{intro}{cards}'


def _section_training(samples: Sequence[Mapping[str, Any]] | None) -> str:
    train = [r for r in samples or () if r["kind"] == "train"]
    if not train:
        return ""
    by_iteration: dict[int, list[Mapping[str, Any]]] = {}
    for r in train:
        by_iteration.setdefault(r["iteration"], []).append(r)
    blocks = []
    for iteration, records in sorted(by_iteration.items()):
        episodes = []
        for r in records:
            turn = r["turns"][-1]
            comps = ", ".join(f"{_e(k)} {_num(v)}" for k, v in r["components"].items())
            texts = "".join(f"<div class=role>{_who(r, role)}</div>{_text_block(_e(text))}"
                            for role, text in turn["responses"].items())
            episodes.append(f'<div class="train-episode"><div class=meta>task {_e(r["task_index"])} · episode '
                            f'{_e(r["episode"])} · reward {_num(r["reward"])} ({comps})</div>{texts}</div>')
        mean = sum(r["reward"] for r in records) / len(records)
        blocks.append(f"<details><summary>iteration {iteration}: {len(records)} episodes, mean reward {mean:.3f}"
                      f"</summary>{''.join(episodes)}</details>")
    return ("<h2>Training samples</h2><p class=sub>The first episodes of the logged training batches (sampled, "
            f"not greedy).</p>{''.join(blocks)}")


# ----------------------------------------------------------------------------------------- main
def build_report(run_dir: str | os.PathLike[str]) -> str:
    """The report of ``run_dir`` as one HTML document (a string)."""
    from baselines.infra.metrics import METRICS_FILE, read_metrics
    from baselines.infra.samples import SAMPLES_FILE, read_samples

    run = Path(run_dir)
    if not run.is_dir():
        raise FileNotFoundError(f"run directory {str(run)!r} not found")
    metrics_path, samples_path = run / METRICS_FILE, run / SAMPLES_FILE
    if not metrics_path.is_file() and not samples_path.is_file():
        raise FileNotFoundError(
            f"{str(run)!r} holds neither {METRICS_FILE} nor {SAMPLES_FILE}: pass the directory of a training run"
        )
    rows = read_metrics(metrics_path) if metrics_path.is_file() else []
    samples = read_samples(samples_path) if samples_path.is_file() else None
    config, trainer = _read_config(run)
    evals = _eval_rows(rows)
    learner = trainer.get("learner") or "run"
    env_id = (config or {}).get("env") or next((r["env"] for r in samples or ()), "")
    model = (config or {}).get("model") or "SmolLM2-135M-Instruct (embedded default)"
    steps = max((int(r["step"]) for r in rows), default=0)
    stats = []
    if evals:
        (_, first), (_, last) = evals[0], evals[-1]
        if "total" in first and "total" in last:
            stats.append(f'<div class="stat"><b>{first["total"]:.3f} → {last["total"]:.3f}</b>'
                         "<span>eval reward, before → after</span></div>")
    stats.append(f'<div class="stat"><b>{steps}</b><span>iterations logged</span></div>')
    if samples is not None:
        stats.append(f'<div class="stat"><b>{len(samples)}</b><span>episodes in samples.jsonl</span></div>')
    title = f"{learner} · {env_id} · {run.name}"
    body = "".join([
        f"<h1>{_e(title)}</h1>",
        f"<p class=sub>model {_e(model)} · run directory {_e(str(run))}</p>",
        f'<div class="headline">{"".join(stats)}</div>',
        _section_eval_table(evals),
        _section_curves(_curves_svg(metrics_path) if rows else None),
        _section_transcripts(samples),
        _section_training(samples),
        _section_config(config, trainer),
    ])
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(title)}</title><style>{CSS}</style></head>"
        f"<body><main>{body}</main></body></html>\n"
    )


def write_report(run_dir: str | os.PathLike[str], output: str | os.PathLike[str] | None = None) -> Path:
    """Write the report of ``run_dir`` (default ``<run_dir>/report.html``, replaced atomically); returns its path."""
    text = build_report(run_dir)
    out = Path(output) if output is not None else Path(run_dir) / REPORT_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out)
    return out
