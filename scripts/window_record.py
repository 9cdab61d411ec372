"""scripts/gpu_window.sh's bookkeeping (the standard library only: it runs before anything is installed).

    python scripts/window_record.py step OUT NAME RC SECONDS LIMIT LOG   # after each step
    python scripts/window_record.py finish OUT BUDGET KIND               # at the end (KIND: gpu or dry)

``step`` appends the step's outcome to ``OUT/steps.jsonl`` and, when the log's last line is a JSON object (a
bench's), writes it to ``OUT/measured/NAME.json`` with a ``measured`` stamp (when, load, commit: ``$COMMIT``) and
the step's own record (``window_step``). ``finish`` writes ``OUT/measured/window.json``: the GPU as nvidia-smi
names it (``OUT/gpu.txt``), torch and CUDA as the benches saw them, the commit, the budget and each step's last
outcome (ok, failed with its status, timed out, skipped).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def status(rc: str) -> str:
    """A step's outcome from its exit status as the window records it (``timeout`` exits 124).

    >>> [status(rc) for rc in ("0", "1", "124", "skipped")]
    ['ok', 'failed', 'timed out', 'skipped']
    """
    return {"0": "ok", "124": "timed out", "137": "timed out", "skipped": "skipped"}.get(rc, "failed")


def last_json(log: Path) -> dict[str, Any] | None:
    """The log's last non-empty line as a JSON object, or None."""
    try:
        lines = [line for line in log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    except OSError:
        return None
    try:
        record = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def stamp() -> dict[str, str]:
    return {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load": "nothing else running (the GPU window, one step at a time)",
            "commit": os.environ.get("COMMIT", "unknown")}


SETUP = ("model",)
"""Steps that prepare the window (the random-weight model's cache) and measure nothing: no JSON of theirs is kept."""


def step(out: Path, name: str, rc: str, seconds: str, limit: str, log: str) -> None:
    record = {"step": name, "status": status(rc), "rc": None if rc == "skipped" else int(rc),
              "seconds": int(seconds), "limit_s": int(limit)}
    result = None if name in SETUP else last_json(Path(log))
    if result is not None:
        result = {**result, "measured": stamp(), "window_step": record}
        (out / "measured" / f"{name}.json").write_text(json.dumps(result) + "\n", encoding="utf-8")
    record["json"] = result is not None
    with open(out / "steps.jsonl", "a", encoding="utf-8") as file:
        file.write(json.dumps(record) + "\n")


def finish(out: Path, budget: str, kind: str) -> None:
    steps: dict[str, dict[str, Any]] = {}
    path = out / "steps.jsonl"
    for line in (path.read_text(encoding="utf-8").splitlines() if path.is_file() else []):
        record = json.loads(line)
        steps[record["step"]] = record  # a rerun's record replaces the step's earlier one
    measured = [json.loads(p.read_text(encoding="utf-8")) for p in sorted((out / "measured").glob("*.json"))
                if p.name != "window.json"]
    machines = [m.get("machine", {}) for m in measured]
    first = next((m for m in machines if m.get("gpu")), machines[0] if machines else {})
    gpu_txt = out / "gpu.txt"
    window = {
        "bench": "gpu_window", "kind": kind, "budget_s": int(budget),
        "nvidia_smi": gpu_txt.read_text(encoding="utf-8").strip() if gpu_txt.is_file() else None,
        "gpu": first.get("gpu"), "torch": first.get("torch"), "cuda": first.get("cuda"),
        "steps": list(steps.values()), "machine": first, "measured": stamp(),
    }
    (out / "measured" / "window.json").write_text(json.dumps(window) + "\n", encoding="utf-8")


def main(argv: list[str]) -> int:
    if argv[:1] == ["step"] and len(argv) == 7:
        step(Path(argv[1]), *argv[2:])
    elif argv[:1] == ["finish"] and len(argv) == 4:
        finish(Path(argv[1]), argv[2], argv[3])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
