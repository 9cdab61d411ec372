"""What a bench says about the processes it measured and the machine around them: peak resident memory of a
process and of its descendants (VmHWM), the other processes busy on a CPU while it ran, and the commit measured."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def vm_hwm_mb(pid: int) -> float | None:
    """A process's peak resident memory (VmHWM), in MB; None if it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def children_hwm_mb(pid: int) -> tuple[float | None, int | None]:
    """The sum of the VmHWM of a process's descendants alive now (an upper bound of their peak: pages they share
    count once each), and how many they are (psutil; None without it)."""
    try:
        import psutil
    except ImportError:
        return None, None
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return None, None
    peaks = [v for v in (vm_hwm_mb(k.pid) for k in kids) if v is not None]
    return sum(peaks), len(peaks)


def busy_processes(skip: set[int]) -> list[str]:
    """The other processes using a CPU now (over 0.5 s, >= 5% of a core): what else was running."""
    try:
        import psutil
    except ImportError:
        return ["unknown (no psutil)"]
    procs = [p for p in psutil.process_iter(["pid", "name", "cmdline"]) if p.info["pid"] not in skip]
    for p in procs:
        try:
            p.cpu_percent(None)
        except psutil.Error:
            pass
    time.sleep(0.5)
    busy = []
    for p in procs:
        try:
            share = p.cpu_percent(None)
        except psutil.Error:
            continue
        if share >= 5:
            words = [Path(w).name if i == 0 else w for i, w in enumerate(p.info["cmdline"] or [p.info["name"]])]
            busy.append((share, " ".join(words)[:80]))
    return [f"{what} ({share:.0f}% of a core)" for share, what in sorted(busy, reverse=True)[:8]]


def commit() -> str | None:
    """The short commit measured, ``-dirty`` when the served code (llm_envs/, baselines/) has uncommitted changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--", "llm_envs", "baselines"], cwd=ROOT,
                                 capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return (head + "-dirty" if changed else head) or None
