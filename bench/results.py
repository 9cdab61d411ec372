"""The papers' claims, measured with seeds: the records, figures and tables of docs/results.md.

Seven comparisons, each a fixed list of methods with hyper-parameters chosen before running (in
``results_comparisons.py``: ``MAGRPO_SETTINGS``, ``CORY_SETTINGS``, ``PREFERENCE_SETTINGS``,
``CODING_SETTINGS``):

- ``magrpo``: MAGRPO on ``writing/xsum-v0`` against its baselines: the untrained pair (parallel and
  sequential protocol), a single agent trained with GRPO (our MAGRPO with one agent) on the one-role
  env under both split policies, MAGRPO (parallel) and MAGRPO with ``--num-turns 2``.
- ``preference``: the MAGRPO team (the ``magrpo`` comparison's records, not run twice) against one
  centralised model (``--centralized``) and offline MADPO, on the same 160 joint samples of training.
- ``sweep`` and ``methods`` (issue #38): each method at its own learning rate. ``sweep`` runs each
  method of ``methods`` once (seed 0) at the rates of ``SWEEP_RATES``, scored on 32 held-out train
  articles (``--num-validation-problems``); ``methods`` runs every learner (MAGRPO team, the centralised
  model in the reference's format and with its first tag prefilled, offline and iterative MADPO,
  MARLHF) at its sweep's best rate on seeds 0 1 2, seed 0 being the sweep's record.
- ``cory``: CORY against PPO on IMDB with the same adaptive KL controller, plus CORY's two ablations
  (no role exchange, ``--swap-every 0``; individual rewards, ``sentiment/imdb-cory-individual-v0``).
- ``coding-sweep`` and ``coding`` (issue #51): MAGRPO on ``coding/humaneval-v0`` against its baselines,
  the untrained pair (parallel and sequential), one coder trained with GRPO on
  ``coding/humaneval-single-v0``, the MAGRPO pair over one turn and over two with the tests' feedback;
  each trained method at the rate its own sweep (``CODING_SWEEP_RATES``) chose on validation.

Every method x seed is one **record**: ``<out>/<comparison>/<method>__s<seed>.json`` with the command,
the flags, the per-iteration curve, the evaluation before and after, and the wall time, written as
soon as that run finishes. A re-run skips the records that exist, so the page can be completed over
several sittings; a training run a sitting left unfinished continues from its newest checkpoint
(``results_resume.py``: one checkpoint per iteration, the record's ``legs`` and summed times). A
record being run is marked (``<record>.running``, the pid), so sittings run in parallel split the
missing records between them instead of starting one twice. The learners run through their command
line (``llm-envs train ...`` / ``llm-envs eval ...``, in this process), each in its own run directory
under ``--runs-dir``.

This file is the command line; the comparisons are in ``results_comparisons.py``, their records in
``results_records.py``, the summaries, figures and the page's tables in ``results_page.py``, what the
page says about the records in ``results_reading.py`` (the readings), ``results_provenance.py``
(machines, samplers, shared flags), ``results_significance.py`` (the paired and Welch tests with Holm's
correction; the math in ``results_stats.py``) and ``results_values.py`` (a record's values, formatted);
a run across sittings in ``results_resume.py``. The page holds no number typed by hand: ``render``
writes every one from the records, and ``tests/test_results_bench.py`` fails when docs/results.md
differs from what it renders.

    python bench/results.py run magrpo --seeds 0 1 2        # the MAGRPO comparison (skips finished records)
    python bench/results.py run cory --seeds 0 1 2 --methods ppo cory
    python bench/results.py render                          # figures, summary JSON and the page's tables
    python bench/results.py status                          # records that exist, run now (how far), resume, are missing
    python bench/results.py run magrpo --quick --model DIR  # 1 seed, 2 iterations, tiny sizes (tests)

Each command prints one JSON object as its last stdout line.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its siblings, when loaded by path (the tests)

from results_comparisons import COMPARISONS, DEFAULT_SEEDS, ROOT, method
from results_comparisons import CORY_SETTINGS as CORY_SETTINGS
from results_comparisons import FIXED_RATE as FIXED_RATE
from results_comparisons import MAGRPO_SETTINGS as MAGRPO_SETTINGS
from results_comparisons import METHODS_SETTINGS as METHODS_SETTINGS
from results_comparisons import PAGE as PAGE
from results_comparisons import PREFERENCE_SETTINGS as PREFERENCE_SETTINGS
from results_comparisons import RECORDS as RECORDS
from results_comparisons import SWEEP_RATES as SWEEP_RATES
from results_comparisons import flags_of as flags_of
from results_comparisons import sweep_name as sweep_name
from results_comparisons import to_argv as to_argv
from results_page import MARKER as MARKER
from results_page import mean_std as mean_std
from results_page import render
from results_page import render_page as render_page
from results_page import replace_section as replace_section
from results_page import sections as sections
from results_records import chosen_rate as chosen_rate
from results_records import (
    completion_commands,
    load_records,
    missing_records,
    resumable_records,
    run_records,
    running_records,
)

# The names imported `as` themselves are read from here too (the tests load this file by path): the
# comparisons' settings and command lines from results_comparisons.py, the page's pieces from results_page.py.


# ------------------------------------------------------------------------------------------ command line
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the missing records of a comparison")
    run.add_argument("comparison", choices=sorted(COMPARISONS))
    run.add_argument("--seeds", type=int, nargs="+", default=None, help="default: 0 1 2 (--quick: 0)")
    run.add_argument("--methods", nargs="+", default=None, help="default: every method of the comparison")
    run.add_argument("--quick", action="store_true", help="tiny sizes, 2 iterations (smoke tests)")
    run.add_argument("--model", default=None, help="HF model id or local dir (default: the embedded SmolLM2-135M)")
    run.add_argument("--threads", type=int, default=None, help="torch threads of each training run")
    for p in (run, sub.add_parser("render", help="figures, summaries and the page's tables from the records"),
              sub.add_parser("status", help="which records exist, which run now (how far), which an earlier "
                                            "sitting left to resume (from which step) and which are missing")):
        p.add_argument("--out", default=None, help=f"records and figures (default: {RECORDS.relative_to(ROOT)}; "
                                                   "--quick: runs/results-quick/records)")
        p.add_argument("--runs-dir", default="runs/results", help="run directories and logs (default: %(default)s)")
    render_parser = sub.choices["render"]
    render_parser.add_argument("--page", default=str(PAGE), help="page to update ('' for none; default: %(default)s)")
    render_parser.add_argument("--smoothing", type=int, default=3, help="moving-average window (default: %(default)s)")
    args = parser.parse_args(argv)
    quick = getattr(args, "quick", False)
    out = Path(args.out) if args.out else (Path("runs/results-quick/records") if quick else RECORDS)
    if args.command == "run":
        seeds = args.seeds if args.seeds is not None else ([0] if quick else list(DEFAULT_SEEDS))
        if args.methods:
            for name in args.methods:
                method(args.comparison, name)  # unknown names fail before anything runs
        result = run_records(args.comparison, seeds=seeds, methods=args.methods, quick=quick, out=out,
                             runs_dir=Path(args.runs_dir) / ("quick" if quick else ""), model=args.model,
                             threads=args.threads)
        status = 1 if result["failed"] else 0
    elif args.command == "render":
        result = render(out, Path(args.page) if args.page else None, args.smoothing)
        status = 0
    else:
        result = {c: {"records": [f"{r['method']}__s{r['seed']}" for r in load_records(out, c)],
                      "running": running_records(out, c),
                      "resumable": resumable_records(out, c, Path(args.runs_dir)),
                      "missing": missing_records(out, c), "commands": completion_commands(c, missing_records(out, c))}
                  for c in COMPARISONS}
        status = 0
    from agents.models import machine_description

    print(json.dumps({**result, "machine": machine_description("auto")}))
    return status


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
