"""The papers' claims, measured with seeds: the records, figures and tables of docs/results.md.

Seven comparisons, each a fixed list of methods with hyper-parameters chosen before running (in
``resultskit/comparisons.py``: ``MAGRPO_SETTINGS``, ``CORY_SETTINGS``, ``PREFERENCE_SETTINGS``,
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
(``resultskit/resume.py``: one checkpoint per iteration, the record's ``legs`` and summed times). A
record being run is marked (``<record>.running``, the pid), so sittings run in parallel split the
missing records between them instead of starting one twice. The learners run through their command
line (``llm-envs train ...`` / ``llm-envs eval ...``, in this process), each in its own run directory
under ``--runs-dir``.

The machinery is the package ``bench/resultskit/``, whose modules stack without a circle (each imports
only those listed before it; ``tests/test_results_package.py`` checks the import graph):

- ``comparisons``: the comparisons, their settings and commands; ``resume``: a run across sittings;
  ``stats``: the tests (scipy.stats) and the multiplicity correction;
- ``summary``: mean and std over seeds, formatting; ``records``: running, writing, loading the records,
  the rate a sweep chose;
- ``values``: a record's values, formatted; ``provenance``: machines, samplers, shared flags;
  ``significance``: each section's comparisons tested (the premise check, the primary test, the
  correction, the readings holds / reversed / inconclusive);
- ``reading``: what the page says about each section; ``page``: the summaries, figures, tables and the
  page's generated sections; ``cli``: this command line.

The page holds no number typed by hand: ``render`` writes every one from the records, and
``tests/test_results_bench.py`` fails when docs/results.md differs from what it renders.

    python bench/results.py run magrpo --seeds 0 1 2        # the MAGRPO comparison (skips finished records)
    python bench/results.py run cory --seeds 0 1 2 --methods ppo cory
    python bench/results.py render                          # figures, summary JSON and the page's tables
    python bench/results.py status                          # records that exist, run now (how far), resume, are missing
    python bench/results.py run magrpo --quick --model DIR  # 1 seed, 2 iterations, tiny sizes (tests)

Each command prints one JSON object as its last stdout line.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the package beside it, when loaded by path (the tests)

from resultskit.cli import build_parser as build_parser
from resultskit.cli import main
from resultskit.comparisons import CORY_SETTINGS as CORY_SETTINGS
from resultskit.comparisons import FIXED_RATE as FIXED_RATE
from resultskit.comparisons import MAGRPO_SETTINGS as MAGRPO_SETTINGS
from resultskit.comparisons import METHODS_SETTINGS as METHODS_SETTINGS
from resultskit.comparisons import PAGE as PAGE
from resultskit.comparisons import PREFERENCE_SETTINGS as PREFERENCE_SETTINGS
from resultskit.comparisons import RECORDS as RECORDS
from resultskit.comparisons import ROOT
from resultskit.comparisons import SWEEP_RATES as SWEEP_RATES
from resultskit.comparisons import flags_of as flags_of
from resultskit.comparisons import method as method
from resultskit.comparisons import sweep_name as sweep_name
from resultskit.comparisons import to_argv as to_argv
from resultskit.page import MARKER as MARKER
from resultskit.page import mean_std as mean_std
from resultskit.page import render as render
from resultskit.page import render_page as render_page
from resultskit.page import replace_section as replace_section
from resultskit.page import sections as sections
from resultskit.records import chosen_rate as chosen_rate
from resultskit.records import completion_commands as completion_commands
from resultskit.records import load_records as load_records
from resultskit.records import missing_records as missing_records
from resultskit.records import run_records as run_records

# The names imported `as` themselves are read from here too (the tests load this file by path).

if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
