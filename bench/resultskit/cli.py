"""The command line of docs/results.md (``python bench/results.py run|render|status``, whose docstring
says what each does): the top of the results package, importing the layers below it."""

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from .comparisons import COMPARISONS, DEFAULT_SEEDS, PAGE, README, RECORDS, ROOT, method
from .page import render
from .records import completion_commands, load_records, missing_records, resumable_records, run_records, running_records

DESCRIPTION = "The papers' claims, measured with seeds: the records, figures and tables of docs/results.md."


# ------------------------------------------------------------------------------------------ command line
def build_parser() -> argparse.ArgumentParser:
    """The command line's parser: ``run``, ``render`` and ``status``."""
    parser = argparse.ArgumentParser(description=DESCRIPTION)
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
        page = Path(args.page) if args.page else None
        # README's provenance section follows the page's records: rendered with the page itself, not with another.
        ours = page is not None and page.resolve() == PAGE.resolve() and out.resolve() == RECORDS.resolve()
        readme = README if ours else None
        result = render(out, page, args.smoothing, readme)
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
