"""ClassEval scoring throughput, before and after the tests moved out of the class's process (#40).

    python bench/classeval.py [--before 429389a] [--repeats 5] [--data-path ClassEval_data.json]

The batch: every class of the data, twice: its canonical solution split between the two agents (the
oracle, ``split="reference"``) and the empty answer (no methods written). ``--data-path`` reads the real
set (a json / jsonl in the schema of ``FudanSELab/ClassEval``, e.g. ``data/ClassEval_data.json`` of
github.com/FudanSELab/ClassEval; rows whose skeleton does not parse are left out); without it the
fixture of the tests (``tests/hub_fixtures.py``, 100 rows of two hand-written classes) is used.

Both versions score the same batch with ``score_classes`` at the task's default limits
(``timeout_s=30``, ``test_timeout_s=5``), each in a fresh process (the old one imports ``llm_envs`` from
``git archive <before>``), after a warm-up that starts its fork servers; they alternate ``--repeats``
times and the figures are medians. The ratio is the median of the per-repetition ratios (new / old).

Prints one JSON object on its last line: the CPU model and ISA flags, dtype "n/a" (no model), the
number of classes and attempts, seconds per batch, attempts per second, the ratio, and the attempts
that get full marks in each version.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEFORE_COMMIT = "429389a"
"""The last commit before #40 (the class and its tests in one sandboxed process)."""
TIMEOUT_S, TEST_TIMEOUT_S = 30.0, 5.0  # the task's defaults
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")


def cpu_info() -> dict:
    """The CPU model and its ISA flags (from /proc/cpuinfo on Linux)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return {"cpu": model, "isa": [f for f in ISA_FLAGS if f in flags]}


def load_rows(data_path: str | None) -> list[dict]:
    if data_path is None:
        sys.path.insert(0, str(ROOT / "tests"))
        from hub_fixtures import classeval_rows

        return classeval_rows()
    text = Path(data_path).read_text()
    return json.loads(text) if text.lstrip().startswith("[") else [json.loads(line) for line in text.splitlines()
                                                                   if line.strip()]


def batch(rows: list[dict]) -> dict:
    """The canonical and the empty answer of every usable class, as ``score_classes`` columns."""
    sys.path.insert(0, str(ROOT))
    from llm_envs.rewards.classeval import assign_methods, extract_methods, methods_to_write

    columns: dict[str, list] = {"texts": [], "skeletons": [], "tests": [], "class_names": [], "owners": []}
    classes = 0
    for row in rows:
        try:
            methods = methods_to_write(row["skeleton"], row["class_name"])
        except (SyntaxError, ValueError):
            continue  # a skeleton the task itself refuses
        classes += 1
        owners = assign_methods(methods, "reference")
        found = extract_methods(row["solution_code"], [m for m, _ in methods])
        canonical = ["\n".join(found.get(m, "") for (m, _), o in zip(methods, owners) if o == i) for i in (0, 1)]
        for texts in (canonical, ["", ""]):
            columns["texts"].append(texts)
            columns["skeletons"].append(row["skeleton"])
            columns["tests"].append(row["test"])
            columns["class_names"].append(row["class_name"])
            columns["owners"].append(list(owners))
    return {"classes": classes, **columns}


def worker(root: str, batch_file: str) -> None:
    """One timed run: score the batch with the ``llm_envs`` found under ``root``."""
    sys.path.insert(0, root)
    from llm_envs.rewards.classeval import score_classes
    from llm_envs.sandbox import SandboxLimits

    columns = json.loads(Path(batch_file).read_text())
    limits = SandboxLimits(timeout_s=TIMEOUT_S, test_timeout_s=TEST_TIMEOUT_S, cpu_time_s=int(TIMEOUT_S) + 1)
    args = [columns[k] for k in ("texts", "skeletons", "tests", "class_names", "owners")]
    score_classes(*[column[:4] for column in args], limits)  # warm-up: the fork servers start
    start = time.perf_counter()
    scores = score_classes(*args, limits)
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "totals": [s.total for s in scores]}))


def timed(root: str, batch_file: str) -> dict:
    done = subprocess.run([sys.executable, __file__, "--worker", root, batch_file], capture_output=True, text=True,
                          check=False, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"the run under {root} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=BEFORE_COMMIT, help="the commit to compare with")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data-path", default=None, help="the real ClassEval set (json or jsonl)")
    parser.add_argument("--worker", nargs=2, metavar=("ROOT", "BATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return
    columns = batch(load_rows(args.data_path))
    with tempfile.TemporaryDirectory(prefix="bench-classeval-") as tmp:
        old_root = os.path.join(tmp, "before")
        os.makedirs(old_root)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.before, "llm_envs"], capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", old_root], input=archive, check=True)
        batch_file = os.path.join(tmp, "batch.json")
        Path(batch_file).write_text(json.dumps(columns))
        old_runs, new_runs = [], []
        for _ in range(args.repeats):
            old_runs.append(timed(old_root, batch_file))
            new_runs.append(timed(str(ROOT), batch_file))
    attempts = len(columns["texts"])
    old_s = statistics.median(r["seconds"] for r in old_runs)
    new_s = statistics.median(r["seconds"] for r in new_runs)
    ratios = [n["seconds"] / o["seconds"] for o, n in zip(old_runs, new_runs)]
    print(json.dumps({
        **cpu_info(), "dtype": "n/a", "cores": os.cpu_count(), "data": args.data_path or "tests/hub_fixtures.py",
        "classes": columns["classes"], "attempts": attempts, "repeats": args.repeats, "before": args.before,
        "old_s": round(old_s, 3), "new_s": round(new_s, 3),
        "old_attempts_per_s": round(attempts / old_s, 1), "new_attempts_per_s": round(attempts / new_s, 1),
        "ratio_new_over_old": round(statistics.median(ratios), 3), "ratios": sorted(round(r, 3) for r in ratios),
        "old_full_marks": sum(t == 6.0 for t in old_runs[0]["totals"]),
        "new_full_marks": sum(t == 6.0 for t in new_runs[0]["totals"]),
    }))


if __name__ == "__main__":
    main()
