"""A training run's record for a docs page: the command, the machine, wall and CPU seconds and peak RSS
(from ``/usr/bin/time -v``'s log) and, from the run's metrics.jsonl, the eval before and after training,
the training reward and the seconds of each iteration. One JSON object on stdout.

    /usr/bin/time -v llm-envs train magrpo ... --output-dir runs --run-name X 2> time.log
    python bench/run_record.py runs/X time.log "llm-envs train magrpo ..." > docs/figures/X.json

docs/procgen.md and docs/classeval.md quote their training tables from such records (docs/figures/).
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.models import machine_description


def time_field(log: str, name: str) -> str:
    """A field of ``/usr/bin/time -v``'s report."""
    match = re.search(rf"{re.escape(name)}: (.+)", log)
    if match is None:
        raise ValueError(f"no {name!r} in the time log: pass the stderr of /usr/bin/time -v")
    return match.group(1).strip()


def record(run_dir: Path, time_log: Path, command: str) -> dict:
    log = time_log.read_text(encoding="utf-8", errors="replace")
    clock = [float(part) for part in time_field(log, "Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":")]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    evals = [row for row in rows if "eval/total" in row]
    iterations = [row for row in rows if "reward/total" in row]
    if not evals or not iterations:
        raise ValueError(f"{run_dir}/metrics.jsonl has no eval or no iteration: run with --num-eval-problems > 0")

    def eval_of(row: dict) -> dict:
        return {key.split("/", 1)[1]: round(value, 3) for key, value in row.items() if key.startswith("eval/")}

    return {
        "command": command,
        "date": datetime.date.today().isoformat(),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                 cwd=Path(__file__).parent).stdout.strip(),
        "machine": machine_description("auto"),
        "wall_s": round(sum(part * 60**i for i, part in enumerate(reversed(clock))), 1),
        "cpu_s": round(sum(float(time_field(log, f"{kind} time (seconds)")) for kind in ("User", "System")), 1),
        "peak_rss_mib": round(int(time_field(log, "Maximum resident set size (kbytes)")) / 1024),
        "s_per_iteration": [round(row["charts/s_per_iteration"], 1) for row in iterations],
        "train_reward": [round(row["reward/total"], 3) for row in iterations],
        "eval_before": eval_of(evals[0]),
        "eval_after": eval_of(evals[-1]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="the run directory (holds metrics.jsonl)")
    parser.add_argument("time_log", type=Path, help="the stderr of /usr/bin/time -v around the run")
    parser.add_argument("command", help="the command that ran, as the page shows it")
    args = parser.parse_args()
    print(json.dumps(record(args.run_dir, args.time_log, args.command)))


if __name__ == "__main__":
    main()
