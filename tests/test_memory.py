"""agents.memory: releasing memory, the tuned allocator's reuse of large blocks and the blocks
``mapped_large_blocks`` hands back (moved out of tests/test_decoder.py: they test the allocator, not the decoder)."""

from __future__ import annotations

import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_release_memory_runs():
    from agents.memory import release_memory

    assert release_memory() in (True, False)
    if os.uname().sysname == "Linux":
        import platform

        if platform.libc_ver()[0] == "glibc":
            assert release_memory() is True


FAULTS_PROBE = """
import json, os, resource, sys
import torch
from agents.memory import tune_allocator
applied = tune_allocator(float32=sys.argv[1] == "float32")
def touch():  # a pass's activations: three 16 MB blocks written, then freed
    blocks = [torch.empty(4 * 2**20, dtype=torch.float32).fill_(1.0) for _ in range(3)]
    del blocks
touch()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    touch()
print(json.dumps({"applied": applied, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def test_tuned_allocator_reuses_large_blocks_instead_of_faulting_them_in_again():
    import json
    import platform
    import subprocess
    import sys

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("tune_allocator acts on glibc's malloc only")
    runs = {}
    for setting, base in (("1", "bfloat16"), ("0", "bfloat16"), ("1", "float32")):
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, "LLM_ENVS_TUNE_MALLOC": setting, "PYTHONPATH": path}
        env.pop("MALLOC_MMAP_THRESHOLD_", None)
        env.pop("MALLOC_TRIM_THRESHOLD_", None)
        out = subprocess.run([sys.executable, "-c", FAULTS_PROBE, base], env=env, capture_output=True, text=True,
                             check=True)
        runs[setting, base] = json.loads(out.stdout.strip().splitlines()[-1])
    tuned, default, float32 = runs["1", "bfloat16"], runs["0", "bfloat16"], runs["1", "float32"]
    assert tuned["applied"] is True and default["applied"] is False and float32["applied"] is True
    pages = 10 * 48 * 2**20 // os.sysconf("SC_PAGE_SIZE")
    # Tuned: the freed blocks are reused (at most one block is faulted in again over the 10 rounds);
    # glibc's defaults hand some back to the OS, more or fewer from run to run (its thresholds adapt).
    assert tuned["faults"] < pages // 20, runs
    assert default["faults"] > 2 * tuned["faults"], runs
    # For a float32 base, 16 MB blocks are above the threshold: mapped and handed back every time.
    assert float32["faults"] > pages * 9 // 10, runs


MAPPED_PROBE = FAULTS_PROBE.split("touch()\nbefore")[0] + """
from agents.memory import mapped_large_blocks
def faults(rounds=10):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(rounds):
        touch()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
touch()
with mapped_large_blocks():
    inside = faults()
touch()
print(json.dumps({"applied": applied, "inside": inside, "after": faults()}))
"""


def test_mapped_large_blocks_hands_blocks_back_inside_and_restores_reuse_after():
    """MARLHF's reward-model fit: inside ``mapped_large_blocks`` a freed 16 MB block goes back to the OS (each
    round faults its pages in afresh); after the block, the tuned reuse again (next to no faults)."""
    import json
    import platform
    import subprocess
    import sys

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("mapped_large_blocks acts on glibc's malloc only")
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "LLM_ENVS_TUNE_MALLOC": "1", "PYTHONPATH": path}
    env.pop("MALLOC_MMAP_THRESHOLD_", None)
    env.pop("MALLOC_TRIM_THRESHOLD_", None)
    out = subprocess.run([sys.executable, "-c", MAPPED_PROBE, "bfloat16"], env=env, capture_output=True, text=True,
                         check=True)
    run = json.loads(out.stdout.strip().splitlines()[-1])
    pages = 10 * 48 * 2**20 // os.sysconf("SC_PAGE_SIZE")
    assert run["applied"] is True
    # Mapped afresh every round: at least a fault per 2 MiB huge page of every block (4 KiB pages: 512 times
    # that); after the block, reused: under a twentieth of the pages.
    assert run["inside"] >= 10 * 3 * 8 and run["inside"] > 5 * run["after"], run
    assert run["after"] < pages // 20, run
