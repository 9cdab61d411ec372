"""scripts/gpu_window.sh, the one command a GPU window runs: every step's command parses with its bench's own parser,
the steps are the ones bench/gpu_figures.py renders, in the targets' order and within the command's limit; the
bookkeeping (scripts/window_record.py) keeps each bench's JSON with its stamp; scripts/box_python.py refuses the
modules the GPU machine lacks. The whole window in its dry mode (every step on this CPU, tiny models) is the slow
test at the end."""

from __future__ import annotations

import json
import os
import runpy
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from test_docs_commands import makefile_targets, run_parser, script_parser

ROOT = Path(__file__).resolve().parent.parent
WINDOW = ROOT / "scripts" / "gpu_window.sh"
COMMAND_LIMIT_S = 600
"""The GPU machine's limit on one command; the window's BUDGET must leave room under it."""


@pytest.fixture(scope="module")
def gpu_figures():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import gpu_figures

        yield gpu_figures
    finally:
        sys.path.remove(str(ROOT / "bench"))


def listed(tmp_path: Path, **env: str) -> list[tuple[str, int, list[str]]]:
    """The window's steps as ``LIST=1`` prints them: (name, limit, command words)."""
    out = subprocess.run(["bash", str(WINDOW)], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60,
                         env={**os.environ, "OUT": str(tmp_path), "LIST": "1", **env}).stdout
    steps = []
    for line in out.splitlines():
        name, limit, command = line.split("\t")
        steps.append((name, int(limit), shlex.split(command)))
    return steps


def check_command(words: list[str], python: list[str], device: str) -> None:
    """``python bench/X.py ARGS`` parsed by the bench's own parser (a tally's pytest command after its ``--``
    checked too), on ``device``."""
    assert words[: len(python)] == python, words
    script, args = words[len(python)], words[len(python) + 1:]
    ns = run_parser(f"python {script}", lambda: script_parser(ROOT / script).parse_args(args))
    if script == "bench/pytest_tally.py":
        inner = ns.command[1:]
        if inner[0] == "make":
            assert inner[1] == "test-gpu" and "test-gpu" in makefile_targets(), inner
        else:
            assert inner[: len(python) + 2] == [*python, "-m", "pytest"], inner
        return
    assert ns.device == device, (script, ns.device)


def test_every_step_parses_with_its_bench_and_the_window_fits_its_command(tmp_path, gpu_figures) -> None:
    steps = listed(tmp_path)
    names = [name for name, _, _ in steps]
    # What the issue needs most first: the targets' MAGRPO runs, the decode step, the tests; the rest after.
    assert names[:5] == ["magrpo135x1", "magrpo17bx1", "decode135", "decode17b", "test_gpu"], names
    assert set(gpu_figures.EXPECTED) <= set(names) and set(gpu_figures.ITERATION_RUNS) <= set(names)
    for _, _, words in steps:
        check_command(words, ["python3"], "cuda")
    commands = {name: words for name, _, words in steps}
    assert commands["magrpo135x1"][commands["magrpo135x1"].index("--problems") + 1] == "1"
    assert {"--shape", "1.7b"} <= set(commands["magrpo17bx1"]) and "graph" in commands["decode17b"]
    decode = commands["decode135"]
    assert decode[decode.index("--rows") + 1: decode.index("--rows") + 3] == ["32", "256"]
    text = WINDOW.read_text(encoding="utf-8")
    budget = int(text.split("BUDGET=${BUDGET:-")[1].split("}")[0])
    model = 60  # the kit's model step, before the benches (not listed: it runs only on a fresh machine)
    targets = names[:5]  # the steps of the targets fit the budget whole; the rest runs in what they leave
    required = model + sum(limit for name, limit, _ in steps if name in targets)
    assert required <= budget <= COMMAND_LIMIT_S - 60, (required, budget)


def test_the_dry_steps_are_the_same_steps_on_the_cpu(tmp_path) -> None:
    real, dry = listed(tmp_path), listed(tmp_path, DRY="1", HOST_PY=".venv/bin/python")
    assert [(n, limit) for n, limit, _ in real] == [(n, limit) for n, limit, _ in dry]
    for _, _, words in dry:
        check_command(words, [".venv/bin/python", "scripts/box_python.py"], "cpu")


def record(tmp_path: Path, *args: str) -> None:
    subprocess.run([sys.executable, str(ROOT / "scripts" / "window_record.py"), *args], check=True, timeout=60,
                   env={**os.environ, "COMMIT": "abc1234"})


def test_the_window_keeps_each_benchs_json_stamped_and_each_steps_outcome(tmp_path) -> None:
    out = tmp_path / "out"
    (out / "measured").mkdir(parents=True)
    logs = {"decode135": "loading\n{\"rows\": 32}\n{\"bench\": \"decode_step\", \"device\": \"cuda\"}\n\n",
            "test_gpu": "Traceback ...\nRuntimeError: no GPU\n", "model": "{\"size\": \"135m\"}\n"}
    for name, text in logs.items():
        (tmp_path / f"{name}.log").write_text(text, encoding="utf-8")
    record(tmp_path, "step", str(out), "model", "0", "20", "60", str(tmp_path / "model.log"))
    record(tmp_path, "step", str(out), "decode135", "0", "31", "40", str(tmp_path / "decode135.log"))
    record(tmp_path, "step", str(out), "test_gpu", "124", "150", "150", str(tmp_path / "test_gpu.log"))
    record(tmp_path, "step", str(out), "demo", "skipped", "0", "50", "/dev/null")
    record(tmp_path, "step", str(out), "test_gpu", "0", "90", "100", str(tmp_path / "decode135.log"))  # a rerun
    (out / "gpu.txt").write_text("NVIDIA H200, 143771 MiB, 580.1\n", encoding="utf-8")
    record(tmp_path, "finish", str(out), "480", "gpu")
    decode = json.loads((out / "measured" / "decode135.json").read_text(encoding="utf-8"))
    assert decode["bench"] == "decode_step" and decode["measured"]["commit"] == "abc1234"
    assert decode["window_step"] == {"step": "decode135", "status": "ok", "rc": 0, "seconds": 31, "limit_s": 40}
    assert not (out / "measured" / "model.json").exists()  # the model step prepares, it measures nothing
    window = json.loads((out / "measured" / "window.json").read_text(encoding="utf-8"))
    steps = {s["step"]: s for s in window["steps"]}
    assert steps["test_gpu"]["status"] == "ok" and steps["test_gpu"]["seconds"] == 90  # the rerun's outcome
    assert steps["demo"] == {"step": "demo", "status": "skipped", "rc": None, "seconds": 0, "limit_s": 50,
                             "json": False}
    assert window["kind"] == "gpu" and window["budget_s"] == 480 and window["nvidia_smi"].startswith("NVIDIA H200")


def test_the_box_guard_refuses_to_the_project_what_the_gpu_machine_lacks(tmp_path, monkeypatch) -> None:
    box = runpy.run_path(str(ROOT / "scripts" / "box_python.py"))
    site, project = tmp_path / "site", tmp_path / "bench"
    site.mkdir()
    project.mkdir()
    (site / "not_on_the_box.py").write_text("VALUE = 1\n", encoding="utf-8")
    (site / "a_dependency.py").write_text("import not_on_the_box\n", encoding="utf-8")  # a package's own import
    (project / "uses_it.py").write_text("import json, torch\nimport not_on_the_box\n", encoding="utf-8")
    (project / "uses_a_package.py").write_text("import a_dependency\n", encoding="utf-8")
    guard_class = box["BoxGuard"]
    box_globals = guard_class.find_spec.__globals__
    monkeypatch.setitem(box_globals, "ROOT", tmp_path)  # the guard's project: tmp_path's folders
    monkeypatch.setitem(box_globals, "ON_THE_BOX", box_globals["ON_THE_BOX"] | {"a_dependency"})  # a box package
    monkeypatch.syspath_prepend(str(site))
    guard = guard_class()
    monkeypatch.setattr(sys, "meta_path", [guard, *sys.meta_path])
    for name in ("not_on_the_box", "a_dependency"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(ModuleNotFoundError, match="No module named 'not_on_the_box' on the GPU machine"):
        runpy.run_path(str(project / "uses_it.py"))
    assert guard.refused == ["not_on_the_box"]
    runpy.run_path(str(project / "uses_a_package.py"))  # imported inside a package: the package's business
    assert "a_dependency" in sys.modules and guard.refused == ["not_on_the_box"]


@pytest.mark.parametrize("name", ["box_python", "window_record"])
def test_the_window_helpers_examples_run(name) -> None:
    """The examples in scripts/box_python.py's and scripts/window_record.py's docstrings (scripts/ is no package:
    pytest does not collect them)."""
    import doctest
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_window_{name}", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0, result


OFF_THE_WINDOWS_PATHS = {
    "fastapi": "llm_envs/serve/", "openenv": "llm_envs/serve/", "pydantic": "llm_envs/serve/",
    "starlette": "llm_envs/serve/", "uvicorn": "llm_envs/serve/", "websockets": ("llm_envs/serve/", "bench/serve.py"),
    "scipy": "bench/resultskit/", "wandb": "baselines/infra/metrics.py",
}
"""Third-party modules the GPU machine lacks that the project imports, each only where the window never goes:
serving (``llm-envs serve`` and its bench), the results page's statistics, W&B logging (``--wandb`` only)."""


def test_the_project_imports_nothing_the_gpu_machine_lacks_but_off_the_windows_paths() -> None:
    """A static check of every import in agents/, baselines/, llm_envs/ and bench/ (the dry window checks the
    imports its steps make as they run): a module not on the GPU machine is imported only where the window never
    goes."""
    import ast

    box = runpy.run_path(str(ROOT / "scripts" / "box_python.py"))
    ours = {"agents", "baselines", "llm_envs", "resultskit", "hub_fixtures", "tiny_models",
            *(p.stem for p in (ROOT / "bench").glob("*.py"))}
    found: dict[str, set[str]] = {}
    for folder in ("agents", "baselines", "llm_envs", "bench"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module] if isinstance(node, ast.ImportFrom) and not node.level and node.module else [])
                for top in {name.split(".")[0] for name in names}:
                    if top not in sys.stdlib_module_names and top not in box["ON_THE_BOX"] and top not in ours:
                        found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    assert set(found) <= set(OFF_THE_WINDOWS_PATHS), sorted(set(found) - set(OFF_THE_WINDOWS_PATHS))
    for module, files in found.items():
        assert all(f.startswith(OFF_THE_WINDOWS_PATHS[module]) for f in files), (module, sorted(files))


@pytest.mark.slow
def test_the_dry_window_runs_each_bench_and_its_jsons_render(tmp_path, gpu_figures) -> None:
    """One step of each bench of the window on this CPU (tiny models, a few tokens; each Python command through
    the box guard): each exits 0 and leaves its JSON, and the GPU section renders from them as the benches print
    them. (``DRY=1 OUT=/tmp/dry bash scripts/gpu_window.sh`` runs every step.)"""
    out = tmp_path / "out"
    steps = ("magrpo135x1", "decode135", "test_gpu", "demo")
    env = {**os.environ, "OUT": str(out), "DRY": "1", "BUDGET": "1200", "OMP_NUM_THREADS": "1",
           "HOST_PY": sys.executable, "ONLY": " ".join(steps)}
    subprocess.run(["bash", str(WINDOW)], cwd=ROOT, env=env, check=True, timeout=1300, capture_output=True)
    window = json.loads((out / "measured" / "window.json").read_text(encoding="utf-8"))
    assert window["kind"] == "dry"
    assert {s["step"]: s["status"] for s in window["steps"]} == dict.fromkeys(("model", *steps), "ok"), window
    records = {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in (out / "measured").glob("*.json")}
    assert records["demo"]["rc"] == 0 and records["demo"]["iterations"] == 2, records["demo"]
    assert records["test_gpu"]["passed"] >= 1 and records["test_gpu"]["failed"] == 0
    with pytest.raises(SystemExit, match="a dry run's"):
        gpu_figures.load(out / "measured")  # no GPU measurement: refused for the docs
    for record in records.values():  # the renderer reads them as a GPU's (no peak GPU memory on a CPU)
        record["peak_gpu_gib"] = record.get("peak_gpu_gib") or 0.0
    text = gpu_figures.agents_section({gpu_figures.SOURCE: records})
    assert "| 135m, 8 rows | static |" in text and "| 135m, two agents, 1 prompt x 4 samples" in text
    assert "The demo's run: exit status 0" in text and "1 passed, 0 failed" in text
