"""The GPU section of the docs (docs/agents.md "On a GPU", README's "On a GPU"), rendered by ``bench/figures.py`` from
the JSONs of one GPU window (``scripts/gpu_window.sh``) kept in ``bench/measured/gpu/``: the decode step, the
MAGRPO iterations, the demo, the ``make test-gpu`` tally, each against issue #63's targets (met / NOT met, computed
here). With no JSON there, the section says that nothing is measured at this commit and how to measure it.

The files, by the window's step names: ``decode135`` and ``decode17b`` (``bench/decode_step.py``), ``magrpo135x1``
and ``magrpo17bx1`` (``bench/magrpo_step.py --problems 1``, the targets' run), ``magrpo135`` and ``magrpo17b`` (its
own workload), ``demo`` (``bench/demo_step.py``), ``test_gpu`` (``bench/pytest_tally.py``) and ``window`` (the GPU,
torch, CUDA, the commit, each step's outcome: ``scripts/window_record.py``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

SOURCE = "gpu/"
"""The figures' source in bench/figures.py: every JSON of ``bench/measured/gpu/`` (a folder, read whole)."""
ITERATION_S, UPDATE_S = 0.5, 0.25
"""Issue #63: at most this many seconds an iteration of the two-agent one-prompt run, and of its update."""
DECODE_MS = {"135m": 2.0, "1.7b": 3.0}
"""Issue #63: at most this many ms a decode step by default (135M at 32 and 256 rows, 1.7B at 32)."""
FIRST_CALL_S = 5.0
"""Issue #63: a shape's first decode call (its graph's capture included) within this many seconds."""
DEFAULT_MODES = ("graph", "auto")
"""The decode modes that are the engine's default on CUDA: the ones the decode targets judge."""
ITERATION_RUNS = {"magrpo135x1": "two agents, 1 prompt x 4 samples", "magrpo17bx1": "two agents, 1 prompt x 4 samples",
                  "magrpo135": "bench/magrpo_step.py's workload", "magrpo17b": "bench/magrpo_step.py's workload"}
"""The MAGRPO iteration runs of the window, in the table's order; the first two are judged against the targets."""
EXPECTED = ("magrpo135x1", "magrpo17bx1", "decode135", "decode17b", "test_gpu", "demo", "magrpo135")
"""The window's steps a complete measurement has (magrpo17b is run when the budget has room)."""
MEASURE = ("`COMMIT=$(git rev-parse --short HEAD) BUDGET=540 bash scripts/gpu_window.sh` on the GPU machine, then "
           "`python bench/figures.py --gpu-from OUT/measured` here (docs/agents.md, \"The GPU window\")")


def verdict(met: bool | None) -> str:
    return "not measured" if met is None else "**met**" if met else "**NOT met**"


def load(folder: Path) -> dict[str, dict[str, Any]]:
    """The window's JSONs in ``folder`` by step name (empty when there is none); a dry run's or a CPU's records
    are refused: they are no GPU measurement."""
    records = {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.json"))}
    window = records.get("window", {})
    if window.get("kind", "gpu") != "gpu":
        raise SystemExit(f"{folder}: window.json is a {window['kind']} run's, not a GPU measurement")
    cpu = [name for name, r in records.items() if name != "window" and not str(r.get("device", "")).startswith("cuda")]
    if cpu:
        raise SystemExit(f"{folder}: {', '.join(cpu)} ran on {records[cpu[0]].get('device')}, not on a GPU")
    return records


def copy_window(folders: list[Path], target: Path) -> list[str]:
    """Replace ``target``'s JSONs by the window's in ``folders`` (a rerun's folder after the first: its steps win,
    and its window.json's steps are merged over the earlier ones). Returns the step names kept."""
    records: dict[str, dict[str, Any]] = {}
    window: dict[str, Any] = {}
    steps: dict[str, dict[str, Any]] = {}
    for folder in folders:
        found = load(folder)
        if not found:
            raise SystemExit(f"{folder}: no JSON (the window's OUT/measured holds them)")
        for record in found.get("window", {}).get("steps", []):
            steps[record["step"]] = record
        window.update(found.pop("window", {}))
        records.update(found)
    if window:
        records["window"] = {**window, "steps": list(steps.values())}
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for name, record in records.items():
        (target / f"{name}.json").write_text(json.dumps(record) + "\n", encoding="utf-8")
    return sorted(records)


def where(records: dict[str, dict[str, Any]]) -> str:
    """The sentence that opens the section: the GPU, torch, CUDA, the dtype, when and at which commit."""
    window = records.get("window", {})
    some = next((r for n, r in records.items() if n != "window"), window)
    m = some.get("machine", {})
    gpu = m.get("gpu") or window.get("gpu") or "an unnamed GPU"
    extras = [f"compute capability {m['capability']}" if m.get("capability") else None,
              f"{m['gpu_memory_gib']:g} GiB" if m.get("gpu_memory_gib") else None,
              f"driver {window['nvidia_smi'].split(',')[-1].strip()}" if window.get("nvidia_smi") else None]
    stamp = some.get("measured", {})
    return (f"Measured: {gpu} ({', '.join(e for e in extras if e)}), torch {m.get('torch')}, CUDA {m.get('cuda')}, "
            f"{m.get('dtype')}; {stamp.get('when')} at {stamp.get('commit')}, {stamp.get('load')} "
            "(`bench/measured/gpu/`, written by `scripts/gpu_window.sh`). Random weights of SmolLM2's shapes (the "
            "GPU kit's model), so every row decodes to its last new token; rewards mean nothing there.")


def decode_rows(records: dict[str, dict[str, Any]]) -> tuple[list[str], dict[str, bool]]:
    """The decode table's rows and the targets' verdicts (``"135m, 32 rows"`` -> met)."""
    rows, verdicts = [], {}
    for name in ("decode135", "decode17b"):
        d = records.get(name)
        if d is None:
            continue
        target = DECODE_MS.get(d["shape"])
        for entry in d["table"]:
            for mode, m in ((k, v) for k, v in entry.items() if isinstance(v, dict) and "ms_per_step" in v):
                judged = target is not None and mode in DEFAULT_MODES
                met = judged and m["ms_per_step"] <= target and m["first_call_s"] <= FIRST_CALL_S
                if judged:
                    verdicts[f"{d['shape']}, {entry['rows']} rows"] = met
                peak = f"{m['peak_gib']:.2f} GiB" if m.get("peak_gib") is not None else ""
                goal = f"<= {target:g} ms, first call <= {FIRST_CALL_S:g} s: {verdict(met)}" if judged else ""
                rows.append(f"| {d['shape']}, {entry['rows']} rows | {mode} | {m['ms_per_step']:.2f} ms | "
                            f"{entry['floor_ms']:.3f} ms | {entry['floor_ms'] / m['ms_per_step']:.2f} | "
                            f"{m['first_call_s']:.2f} s | {peak} | {goal} |")
    return rows, verdicts


def iteration_rows(records: dict[str, dict[str, Any]]) -> tuple[list[str], dict[str, bool], list[str]]:
    """The MAGRPO table's rows, the targets' verdicts (shape -> met) and the compiled update's notes."""
    rows, verdicts, notes = [], {}, []
    for name, what in ITERATION_RUNS.items():
        r = records.get(name)
        if r is None:
            continue
        judged = name.endswith("x1")
        met = judged and r["s_per_iteration"] <= ITERATION_S and r["update_s"] <= UPDATE_S
        if judged:
            verdicts[r["shape"]] = met
        goal = (f"<= {ITERATION_S:g} s, update <= {UPDATE_S:g} s: {verdict(met)}" if judged else "")
        rows.append(f"| {r['shape']}, {what} ({r['problems']} x {r['G']}, {r['max_new_tokens']} tokens) | "
                    f"{r['s_per_iteration']:.3f} s | {r['rollout_s']:.3f} s | {r['update_s']:.3f} s | "
                    f"{r['first_iteration_s']:.2f} s | {r['peak_gpu_gib']:.2f} GiB | {goal} |")
        notes += compile_notes(f"{r['shape']}, {what}", r.get("update_compile", {}))
    d = records.get("demo")
    if d is not None and d.get("iterations"):
        peak = f"{d['peak_gpu_gib']:.2f} GiB" if d.get("peak_gpu_gib") is not None else ""
        rows.append(f"| the demo (`llm-envs train magrpo --preset demo`, {d['problems']} x {d['G']}, "
                    f"{d['max_new_tokens']} tokens; median of {max(1, d['iterations'] - 1)} iterations) | "
                    f"{d['s_per_iteration']:.3f} s | {d['rollout_s']:.3f} s | {d['update_s']:.3f} s | "
                    f"{d['first_iteration_s']:.2f} s | {peak} | |")
        notes += compile_notes("the demo", d.get("update_compile", {}))
    return rows, verdicts, notes


def compile_notes(run: str, counters: dict[str, dict[str, float | None]]) -> list[str]:
    """The compiled update's counters a run reported (``update_compile_s``, ``update_compiled_shapes``): its first
    iteration's and the others' mean."""
    return [f"{run}: `{key}` {value['first']:.3f} in the first iteration"
            + (f", {value['mean_after']:.3f} on average after it" if value.get("mean_after") is not None else "")
            for key, value in counters.items() if value.get("first") is not None]


def tally_text(t: dict[str, Any]) -> tuple[str, bool]:
    """The ``make test-gpu`` tally in one paragraph, and whether it is green (nothing failed, no error)."""
    green = t.get("failed", 1) == 0 and t.get("errors", 1) == 0 and t.get("rc") == 0 and not t.get("interrupted")
    text = (f"`make test-gpu` (`{t['command']}`): {t.get('passed', 0)} passed, {t.get('failed', 0)} failed, "
            f"{t.get('errors', 0)} errors, {t.get('skipped', 0)} skipped in {t['seconds']:.0f} s, exit status "
            f"{t['rc']}" + (", interrupted at its limit" if t.get("interrupted") else "") + ".")
    if t.get("failing"):
        text += " Failing: " + ", ".join(f"`{test}`" for test in t["failing"]) + "."
    if t.get("skip_reasons"):
        text += " Skipped: " + "; ".join(f"{reason} ({n})" for reason, n in t["skip_reasons"].items()) + "."
    return text, green


def missing(records: dict[str, dict[str, Any]]) -> str:
    """The expected steps with no JSON, with their outcome in window.json when it has one."""
    outcomes = {s["step"]: s for s in records.get("window", {}).get("steps", [])}
    gone = [f"{name} ({outcomes[name]['status']}, rc {outcomes[name]['rc']})" if name in outcomes else name
            for name in EXPECTED if name not in records]
    return f"Not measured in this window: {', '.join(gone)} (their logs are in the window's OUT/logs/)." if gone else ""


def targets(records: dict[str, dict[str, Any]]) -> list[tuple[str, bool | None]]:
    """Issue #63's targets and their verdicts (None: not measured)."""
    _, decode = decode_rows(records)
    _, iteration, _ = iteration_rows(records)
    tests = records.get("test_gpu")
    return [
        *[(f"MAGRPO {shape} iteration <= {ITERATION_S:g} s with its update <= {UPDATE_S:g} s", iteration.get(shape))
          for shape in ("135m", "1.7b")],
        *[(f"decode step {key} <= {DECODE_MS[key.split(',')[0]]:g} ms, first call <= {FIRST_CALL_S:g} s",
           decode.get(key)) for key in ("135m, 32 rows", "135m, 256 rows", "1.7b, 32 rows")],
        ("`make test-gpu` green on one GPU", None if tests is None else tally_text(tests)[1]),
    ]


def agents_section(measured: dict[str, dict[str, Any]]) -> str:
    """docs/agents.md's GPU figures: where, the targets' verdicts, the decode and iteration tables, the tally."""
    records = measured[SOURCE]
    if not records:
        return ("Not measured yet at this commit: `bench/measured/gpu/` holds no JSON. Issue #63's targets (a "
                f"two-agent one-prompt MAGRPO iteration <= {ITERATION_S:g} s at SmolLM2's 135M and 1.7B shapes with "
                f"its update <= {UPDATE_S:g} s; a decode step <= {DECODE_MS['135m']:g} ms at 135M, 32 and 256 rows, "
                f"and <= {DECODE_MS['1.7b']:g} ms at 1.7B, 32 rows, by default, with a first call <= "
                f"{FIRST_CALL_S:g} s; `make test-gpu` green) are measured by {MEASURE}.")
    lines = [where(records), "", "Issue #63's targets: " + "; ".join(f"{what}: {verdict(met)}"
                                                                       for what, met in targets(records)) + "."]
    decode, _ = decode_rows(records)
    if decode:
        d = next(records[n] for n in ("decode135", "decode17b") if n in records)
        lines += ["", f"The decode step (`bench/decode_step.py --device cuda`; 2 agents with rank-8 adapters, G = 4, "
                      f"{d['max_new_tokens']} new tokens, temperature {d['sampling']['temperature']} / top-p "
                      f"{d['sampling']['top_p']} / top-k {d['sampling']['top_k']}; ms a step from calls of two "
                      "lengths, median of the repeats; the floor: the weights read once at the card's measured copy "
                      "rate):", "",
                  "| shape, rows | mode | ms a step | floor | floor / step | first call | peak GPU memory | target |",
                  "|---|---|---|---|---|---|---|---|", *decode]
    iteration, _, notes = iteration_rows(records)
    if iteration:
        lines += ["", "MAGRPO iterations (`bench/magrpo_step.py --device cuda`: the mean of the iterations after an "
                      "untimed first, whose seconds include the compiles of the update's graphs; rollout and update "
                      "apart; peak GPU memory allocated):", "",
                  "| run | s/iteration | rollout | update | first iteration | peak GPU memory | target |",
                  "|---|---|---|---|---|---|---|", *iteration]
        if notes:
            lines += ["", "The compiled update (`compile_update`; seconds compiling, graphs compiled): "
                      + "; ".join(notes) + "."]
    demo = records.get("demo")
    if demo is not None:
        lines += ["", f"The demo's run: exit status {demo['rc']}"
                      + (f" ({demo['error']})" if demo.get("error") else "")
                      + f", {demo['wall_s']:.1f} s in all with its {demo['evaluations']} evaluations of "
                      f"{demo['num_eval_problems']} problems (`{demo['command']}`)."]
    if "test_gpu" in records:
        lines += ["", tally_text(records["test_gpu"])[0]]
    gone = missing(records)
    if gone:
        lines += ["", gone]
    return "\n".join(lines)


def readme_section(measured: dict[str, dict[str, Any]]) -> str:
    """README's GPU figures: the targets' verdicts in one paragraph (the tables are docs/agents.md's)."""
    records = measured[SOURCE]
    if not records:
        return ("GPU figures: not measured yet at this commit (`bench/measured/gpu/` holds no JSON); "
                f"{MEASURE} measures them.")
    window = records.get("window", {})
    stamp = next((r for n, r in records.items() if n != "window"), window).get("measured", {})
    gpu = window.get("gpu") or next((r["machine"].get("gpu") for r in records.values() if r.get("machine")), None)
    return (f"GPU figures ({gpu}, {stamp.get('when')} at {stamp.get('commit')}; the tables in docs/agents.md, "
            "\"On a GPU\"): issue #63's targets: "
            + "; ".join(f"{what}: {verdict(met)}" for what, met in targets(records)) + ".")
