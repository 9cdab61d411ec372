"""The comparisons of docs/results.md, chosen before they ran: each one's settings and learning-rate grid,
its methods (learner, env, label, own flags), the seeds the page wants, and the ``llm-envs`` command that
runs one method with one seed. ``records.py`` runs those commands and keeps their records."""


from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "docs" / "results"
PAGE = ROOT / "docs" / "results.md"
README = ROOT / "README.md"
"""README's provenance section is rendered from the records too (``page.readme_text``)."""
DEFAULT_SEEDS = (0, 1, 2)

# ------------------------------------------------------------------------------------------ settings
# Chosen before the comparison ran (docs/results.md): the README demo's settings (which learn within
# minutes on 2 CPU cores), 20 iterations of B=2 problems x G=4 samples for every method, the same
# sampled evaluation (training's sampling settings, 32 eval problems, the run's seed) before and after.
MAGRPO_SETTINGS: dict[str, Any] = {
    "max-source-words": 60,
    "num-problems": 2,
    "num-generations": 4,
    "max-new-tokens": 48,
    "num-iterations": 20,
    "learning-rate": 1e-3,
    "lora-rank": 8,
    "lora-alpha": 16.0,
    "normalize-std": True,
    "temperature": 0.7,
    "top-p": 0.9,
    "top-k": 50,
    "num-eval-problems": 32,
    "eval-greedy": False,
}
# CORY vs PPO: docs/cory.md's settings, at 40 iterations x 32 episodes (5.3x the 15 x 16 run there);
# the same adaptive KL controller for every method.
CORY_SETTINGS: dict[str, Any] = {
    "num-iterations": 40,
    "batch-size": 32,
    "minibatch-size": 32,
    "num-ppo-epochs": 4,
    "min-new-tokens": 4,
    "max-new-tokens": 16,
    "learning-rate": 5e-4,
    "lora-rank": 16,
    "lora-alpha": 32.0,
    "init-kl-coef": 0.3,
    "adaptive-kl": True,
    "kl-target": 6.0,
    "kl-horizon": 10000,
    "num-eval-problems": 16,
}
# MAGRPO team vs one centralised model vs MADPO (issue #29): MAGRPO_SETTINGS for every method, each
# method's own flags for what only it has; the same 160 joint samples of training per run (MAGRPO: 20
# iterations x 2 problems x 4; MADPO: 40 prompts x 4 candidates collected before its 20 updates).
PREFERENCE_SETTINGS: dict[str, Any] = {k: v for k, v in MAGRPO_SETTINGS.items()
                                       if k not in ("num-problems", "num-generations", "normalize-std")}
GROUPS = {"num-problems": 2, "num-generations": 4, "normalize-std": True}
# Each method at its own learning rate (issue #38): PREFERENCE_SETTINGS, 32 train articles held out as the
# validation split (never drawn for training; the sweep is scored on them, never on the eval articles),
# and the same 160 joint samples per run scored by the task's reward (docs/results.md section 4).
METHODS_SETTINGS: dict[str, Any] = {**PREFERENCE_SETTINGS, "num-validation-problems": 32}
SWEEP_RATES: dict[str, tuple[float, ...]] = {
    "magrpo": (3e-4, 1e-3, 3e-3),               # MAGRPO's 1e-3 (section 1) between a third and three times it
    # The same learner (MAGRPO) on one adapter: at 1e-3 it lost the format by iteration 16 (total 0), so the
    # third rate is below 3e-4, not 3e-3 above (docs/results.md section 4).
    "centralized-prefill": (1e-4, 3e-4, 1e-3),
    "madpo": (3e-5, 1e-4, 3e-4),                # DPO's usual LoRA range (the demo's 1e-4 in the middle)
    # 3e-4, the top of the first grid (offline MADPO's), won with its DPO loss still near chance (0.6-0.75):
    # 1e-3 was added above it once those three records existed (docs/results.md section 4).
    "madpo-iterative": (3e-5, 1e-4, 3e-4, 1e-3),
    "marlhf": (1e-4, 3e-4, 1e-3),               # its RL stage (MAGRPO on the learned reward): 1e-4 to MAGRPO's
}
"""The learning rates each method is swept over (one seed, 0), spanning its usual range; the chosen rate
is the sweep record's best ``val/total`` and runs three seeds (seed 0 is the sweep's record itself)."""
FIXED_RATE = 1e-3
"""The learning rate of a method without a sweep (the strict centralised model, whose every advantage is
0: no rate changes what it learns)."""
# MAGRPO on code (issue #51, docs/results.md section 5): the reference's coding set-up (HumanEval, helper +
# main, 256 new tokens, G = 4, 2 turns of level feedback for the multi-turn row) at the writing rows' budget
# of 20 iterations x 2 problems x 4 samples, each method at its own learning rate chosen on 32 held-out train
# problems (as section 4); the evaluation samples like training on the 32 eval problems (pass@1, sampled).
CODING_SETTINGS: dict[str, Any] = {
    "num-problems": 2,
    "num-generations": 4,
    "max-new-tokens": 256,
    "num-iterations": 20,
    "lora-rank": 8,
    "lora-alpha": 16.0,
    "normalize-std": True,
    "temperature": 0.7,
    "top-p": 0.9,
    "top-k": 50,
    "num-eval-problems": 32,
    "num-validation-problems": 32,
    "eval-greedy": False,
}
CODING_SWEEP_RATES: dict[str, tuple[float, ...]] = {
    # MAGRPO's writing rate (1e-3, sections 1 and 4) between a third and three times it: LoRA on 135M.
    "single": (3e-4, 1e-3, 3e-3),
    "magrpo": (3e-4, 1e-3, 3e-3),
    "magrpo-2turn": (3e-4, 1e-3, 3e-3),
}
"""The coding comparison's learning rates per trained method (seed 0, like :data:`SWEEP_RATES`)."""
# --quick: the same methods at tiny sizes (CI smoke tests; a tiny model with --model).
QUICK = {
    "magrpo": {"max-source-words": 20, "num-problems": 1, "num-generations": 2, "max-new-tokens": 8,
               "num-iterations": 2, "num-eval-problems": 2},
    "preference": {"max-source-words": 20, "max-new-tokens": 8, "num-iterations": 2, "num-eval-problems": 2},
    "methods": {"max-source-words": 20, "max-new-tokens": 8, "num-iterations": 2, "num-eval-problems": 2,
                "num-validation-problems": 2},
    "coding": {"num-problems": 1, "num-generations": 2, "max-new-tokens": 8, "num-iterations": 2,
               "num-eval-problems": 2, "num-validation-problems": 2},
    "cory": {"num-iterations": 2, "batch-size": 2, "minibatch-size": 2, "num-ppo-epochs": 1, "min-new-tokens": 2,
             "max-new-tokens": 4, "num-eval-problems": 2},
}
RUN_FLAGS = {"checkpoint-every": 1, "tensorboard": False, "progress": False, "samples-every": 0}
"""Flags of every training run (not part of the comparison): a checkpoint each iteration (the newest two
kept), so a run a sitting leaves unfinished continues in the next (``resume``); no TensorBoard."""
LAST = 5
"""CORY comparison: final task reward and KL are the means over the last LAST iterations."""


@dataclass(frozen=True)
class Method:
    """One method of a comparison: the learner (``magrpo``, ``ppo``, ``cory``; ``eval`` for an untrained
    policy), its env and the flags it adds to the comparison's settings."""

    name: str
    learner: str
    env: str
    label: str
    flags: Mapping[str, Any] = field(default_factory=dict)
    models: tuple[str, ...] = ()
    """PPO / CORY: the adapters whose per-model metrics (``agent_<model>/...``) form the curves."""
    token_factor: int = 1
    """Multiplies the comparison's ``max-new-tokens``: the single agent writes both parts, so it gets twice
    the pair's tokens per response (the text budget of the two agents together)."""
    reuse: str | None = None
    """The comparison whose record of the same method and seed this one is (the same command): it is
    read from there, never run twice."""
    quick_flags: Mapping[str, Any] = field(default_factory=dict)
    """Flags on top of ``flags`` under ``--quick``."""


COMPARISONS: dict[str, tuple[Method, ...]] = {
    "magrpo": (
        Method("untrained-parallel", "eval", "writing/xsum-v0", "untrained pair, parallel"),
        Method("untrained-sequential", "eval", "writing/xsum-sequential-v0", "untrained pair, sequential"),
        Method("single-reference", "magrpo", "writing/xsum-single-v0", "single agent (GRPO), split=reference",
               token_factor=2),
        Method("single-strict", "magrpo", "writing/xsum-single-strict-v0", "single agent (GRPO), split=strict",
               token_factor=2),
        Method("magrpo", "magrpo", "writing/xsum-v0", "MAGRPO, parallel"),
        Method("magrpo-2turn", "magrpo", "writing/xsum-v0", "MAGRPO, 2 turns (env feedback)", {"num-turns": 2}),
    ),
    "preference": (
        Method("magrpo", "magrpo", "writing/xsum-v0", "MAGRPO team (2 agents)", GROUPS, reuse="magrpo"),
        Method("centralized", "magrpo", "writing/xsum-v0", "centralised single model (MAGRPO)",
               {**GROUPS, "centralized": True}, token_factor=2),
        Method("madpo", "madpo", "writing/xsum-v0", "MADPO (offline, 40 prompts x 4 candidates)",
               {"num-prompts": 40, "num-candidates": 4, "num-problems": 2, "pairs-per-prompt": 4, "batch-pairs": 8},
               quick_flags={"num-prompts": 2, "num-candidates": 2}),
    ),
    "methods": (
        Method("magrpo", "magrpo", "writing/xsum-v0", "MAGRPO team (2 agents)", GROUPS),
        Method("centralized", "magrpo", "writing/xsum-v0", "centralised single model, reference format (MAGRPO)",
               {**GROUPS, "centralized": True}, token_factor=2),
        Method("centralized-prefill", "magrpo", "writing/xsum-v0",
               "centralised single model, first tag prefilled (MAGRPO)",
               {**GROUPS, "centralized": True, "prefill": True}, token_factor=2),
        Method("madpo", "madpo", "writing/xsum-v0", "MADPO, offline (40 prompts x 4 candidates)",
               {"num-prompts": 40, "num-candidates": 4, "num-problems": 2, "pairs-per-prompt": 4, "batch-pairs": 8},
               quick_flags={"num-prompts": 2, "num-candidates": 2}),
        Method("madpo-iterative", "madpo", "writing/xsum-v0", "MADPO, iterative (20 x 2 prompts x (2 + 2 comparator))",
               {"iterative": True, "num-problems": 2, "num-candidates": 2, "comparator": "current",
                "replay": "nearest_k", "pairs-per-prompt": 2, "batch-pairs": 8}),
        Method("marlhf", "marlhf", "writing/xsum-v0", "MARLHF (reward model on 40 x 4, then MAGRPO)",
               {"num-prompts": 40, "num-candidates": 4, "num-problems": 2, "pairs-per-prompt": 6, "batch-pairs": 8,
                "normalize-std": True}, quick_flags={"num-prompts": 2, "num-candidates": 2}),
    ),
    "coding": (
        Method("untrained-parallel", "eval", "coding/humaneval-v0", "untrained pair, parallel"),
        Method("untrained-sequential", "eval", "coding/humaneval-sequential-v0",
               "untrained pair, sequential (main reads helper's aux)"),
        Method("single", "magrpo", "coding/humaneval-single-v0", "one coder, whole function (GRPO)"),
        Method("magrpo", "magrpo", "coding/humaneval-v0", "MAGRPO pair, one turn"),
        Method("magrpo-2turn", "magrpo", "coding/humaneval-v0", "MAGRPO pair, 2 turns (tests' feedback)",
               {"num-turns": 2}),
    ),
    "cory": (
        Method("ppo", "ppo", "sentiment/imdb-v0", "PPO", models=("agent",)),
        Method("cory", "cory", "sentiment/imdb-cory-v0", "CORY", {"swap-every": 5}, models=("model_0", "model_1")),
        Method("cory-no-swap", "cory", "sentiment/imdb-cory-v0", "CORY, no role exchange", {"swap-every": 0},
               models=("model_0", "model_1")),
        Method("cory-individual", "cory", "sentiment/imdb-cory-individual-v0", "CORY, individual rewards",
               {"swap-every": 5}, models=("model_0", "model_1")),
    ),
}


def sweep_name(name: str, rate: float) -> str:
    """The sweep record's method name of ``name`` at learning rate ``rate``.

    >>> sweep_name("madpo", 1e-4)
    'madpo@lr0.0001'
    """
    return f"{name}@lr{rate:g}"


SWEEPS: dict[str, tuple[str, Mapping[str, tuple[float, ...]]]] = {
    "methods": ("sweep", SWEEP_RATES),
    "coding": ("coding-sweep", CODING_SWEEP_RATES),
}
"""A comparison whose methods run at rates chosen on validation -> (its sweep comparison, method -> rates)."""
for _comparison, (_sweep, _rates) in SWEEPS.items():
    COMPARISONS[_sweep] = tuple(
        replace(m, name=sweep_name(m.name, rate), label=f"{m.label}, lr {rate:g}",
                flags={**m.flags, "learning-rate": rate})
        for m in COMPARISONS[_comparison] if m.name in _rates for rate in _rates[m.name]
    )
SEEDS_WANTED = {"magrpo": {m.name: DEFAULT_SEEDS for m in COMPARISONS["magrpo"]},
                "sweep": {m.name: (0,) for m in COMPARISONS["sweep"]},
                "methods": {m.name: DEFAULT_SEEDS for m in COMPARISONS["methods"]},
                "preference": {m.name: DEFAULT_SEEDS for m in COMPARISONS["preference"]},
                "coding": {m.name: DEFAULT_SEEDS for m in COMPARISONS["coding"]},
                "coding-sweep": {m.name: (0,) for m in COMPARISONS["coding-sweep"]},
                "cory": {"ppo": DEFAULT_SEEDS, "cory": DEFAULT_SEEDS, "cory-no-swap": (0,), "cory-individual": (0,)}}
"""The records the page needs: 3 seeds per method, one seed per CORY ablation."""


def method(comparison: str, name: str) -> Method:
    for m in COMPARISONS[comparison]:
        if m.name == name:
            return m
    names = [m.name for m in COMPARISONS[comparison]]
    raise ValueError(f"unknown method {name!r} of {comparison!r}; choose from {names}")


def settings_of(comparison: str, quick: bool) -> dict[str, Any]:
    base = dict({"magrpo": MAGRPO_SETTINGS, "preference": PREFERENCE_SETTINGS, "methods": METHODS_SETTINGS,
                 "sweep": METHODS_SETTINGS, "coding": CODING_SETTINGS,
                 "coding-sweep": CODING_SETTINGS}.get(comparison, CORY_SETTINGS))
    if quick:
        base.update(QUICK[swept_comparison(comparison)])
    return base


def swept_comparison(comparison: str) -> str:
    """The comparison a sweep comparison chooses rates for (``sweep`` -> ``methods``); else ``comparison``."""
    return next((c for c, (sweep, _) in SWEEPS.items() if sweep == comparison), comparison)


def flags_of(m: Method, comparison: str, quick: bool) -> dict[str, Any]:
    """The method's flags: the comparison's settings with the method's own on top."""
    flags = {**settings_of(comparison, quick), **m.flags, **(m.quick_flags if quick else {})}
    flags["max-new-tokens"] *= m.token_factor
    return flags


def to_argv(flags: Mapping[str, Any]) -> list[str]:
    """``{"num-turns": 2, "normalize-std": True, "eval-greedy": False, "overwrite": None}`` ->
    ``["--num-turns", "2", "--normalize-std", "--no-eval-greedy", "--overwrite"]``.

    >>> to_argv({"num-turns": 2, "normalize-std": True, "eval-greedy": False, "overwrite": None})
    ['--num-turns', '2', '--normalize-std', '--no-eval-greedy', '--overwrite']
    """
    argv: list[str] = []
    for key, value in flags.items():
        if value is None or value is True:
            argv.append(f"--{key}")
        elif value is False:
            argv.append(f"--no-{key}")
        else:
            argv += [f"--{key}", str(value)]
    return argv


def command_of(m: Method, comparison: str, seed: int, *, quick: bool, runs_dir: Path, model: str | None,
               threads: int | None) -> list[str]:
    """The ``llm-envs`` arguments of one record's run."""
    flags = flags_of(m, comparison, quick)
    if m.learner == "eval":
        # An untrained policy through `llm-envs eval`, with the sampling and eval problems of the trained runs.
        argv = ["eval", "--env", m.env, "--num-problems", str(flags["num-eval-problems"]), "--sample",
                "--temperature", str(flags["temperature"]), "--top-p", str(flags["top-p"]),
                "--top-k", str(flags["top-k"]), "--max-new-tokens", str(flags["max-new-tokens"]), "--seed", str(seed)]
        if "max-source-words" in flags:
            argv += ["--max-source-words", str(flags["max-source-words"])]
    else:
        run = {"env": m.env, "seed": seed, "output-dir": str(runs_dir), "run-name": run_name(comparison, m, seed)}
        argv = ["train", m.learner, *to_argv({**run, **flags, **RUN_FLAGS})]
        if m.learner == "marlhf" and not flags.get("iterative"):
            # The fit reads none of the RL stage's settings: a seed's rates share one (docs/marlhf.md).
            argv += ["--rm-cache", str(runs_dir / "rm-cache")]
        if threads is not None:
            argv += ["--threads", str(threads)]
    if model is not None:
        argv += ["--model", model]
    return argv


def run_name(comparison: str, m: Method, seed: int) -> str:
    """A record's run: its directory under ``--runs-dir`` and its log's name under ``<runs-dir>/logs``."""
    return f"{comparison}__{m.name}__s{seed}"
