"""GRPO with TRL on the embedded model, with llm-envs' rewards as TRL ``reward_funcs``.

TRL's ``GRPOTrainer`` trains one model (SmolLM2-135M-Instruct, the converted default directory, with a
LoRA adapter) for a few steps on each task below: the single-agent versions of our envs, with our
reward functions exactly as TRL calls them (keyword arguments ``prompts``, ``completions``,
``completion_ids``, the dataset's other columns, ``trainer_state``, ``log_extra``, ``log_metric``).
The reward components go to TRL's logs through ``log_metric`` (``tldr/structure``, ``coding/tests``,
``sentiment/pos``, ...), next to TRL's own ``reward`` and ``rewards/<func>/mean``.

=========  ======================================  =========================================  ==========================
task       data (offline)                          prompt                                     reward_funcs
=========  ======================================  =========================================  ==========================
writing    XSum articles (``writing/xsum-v0``)     ``tasks.writing.single_agent_prompt``:     ``tldr_reward_func``
                                                   both parts, split by [PARAGRAPH_SPLIT]
coding     HumanEval (``coding/humaneval-v0``)     ``tasks.coding.single_agent_prompt``:      ``coding_reward_func``
                                                   aux and the entry point                    (columns ``code_prompt``,
                                                                                              ``test``, ``entry_point``)
sentiment  IMDB review openings                    the opening itself, continued              ``sentiment_reward``
           (``sentiment/imdb-v0``)                                                            (column ``query``)
=========  ======================================  =========================================  ==========================

    python examples/trl_grpo.py                       # all three tasks, 2 steps each (a few minutes on 2 CPU cores)
    python examples/trl_grpo.py --task coding --max-steps 10 --output-dir runs/trl

Needs ``trl`` (the ``trl`` extra: ``pip install -e ".[train,trl]"``; ``make setup`` installs it).
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import llm_envs
from llm_envs.rewards.coding import coding_reward_func
from llm_envs.rewards.sentiment import sentiment_reward
from llm_envs.rewards.writing import tldr_reward_func
from llm_envs.tasks import coding as coding_task
from llm_envs.tasks import writing as writing_task

TASKS = ("writing", "coding", "sentiment")


@dataclass
class Config:
    task: str = "all"
    """writing, coding, sentiment or all."""
    max_steps: int = 2
    """GRPO steps per task."""
    num_prompts: int = 2
    """Prompts per step (per_device_train_batch_size / num_generations)."""
    num_generations: int = 2
    """Completions per prompt (the GRPO group)."""
    max_completion_length: int = 48
    """Tokens per completion."""
    learning_rate: float = 1e-4
    """AdamW learning rate of the LoRA adapter."""
    precision: str = "auto"
    """Mixed precision of TRL's training: ``auto`` (bfloat16 autocast where the CPU or GPU multiplies
    bfloat16 natively, as ``agents.models.resolve_dtype`` decides; float32 elsewhere, where TRL's own
    default of bf16=True is ~3x slower), ``bfloat16`` or ``float32``."""
    seed: int = 0
    output_dir: str | None = None
    """Where TRL writes (default: a temporary directory, removed afterwards)."""

    def __post_init__(self) -> None:
        if self.precision not in ("auto", "bfloat16", "float32"):
            raise ValueError(f"precision must be auto, bfloat16 or float32, got {self.precision!r}")
        if self.task not in (*TASKS, "all"):
            raise ValueError(f"task must be one of {[*TASKS, 'all']}, got {self.task!r}")
        for name in ("max_steps", "num_prompts", "max_completion_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if isinstance(self.num_generations, bool) or not isinstance(self.num_generations, int) or \
                self.num_generations < 2:
            raise ValueError(f"num_generations must be an int >= 2 (a GRPO group), got {self.num_generations!r}")
        if not (self.learning_rate > 0 and math.isfinite(self.learning_rate)):
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate!r}")


def user(text: str) -> list[dict[str, str]]:
    """A conversational TRL prompt: TRL applies the model's chat template."""
    return [{"role": "user", "content": text}]


def writing_rows(n: int) -> list[dict[str, Any]]:
    problems = llm_envs.make("writing/xsum-v0", max_source_words=60).task.problems("train")
    return [{"prompt": user(writing_task.single_agent_prompt(p["source"]))} for p in problems[:n]]


def coding_rows(n: int) -> list[dict[str, Any]]:
    problems = llm_envs.make("coding/humaneval-v0").task.problems("train")
    # TRL reserves "prompt" for what the model reads; the problem's code travels as "code_prompt".
    return [
        {
            "prompt": user(coding_task.single_agent_prompt(p["prompt"], p["entry_point"])),
            "code_prompt": p["prompt"],
            "test": p["test"],
            "entry_point": p["entry_point"],
        }
        for p in problems[:n]
    ]


def sentiment_rows(n: int) -> list[dict[str, Any]]:
    problems = llm_envs.make("sentiment/imdb-v0").task.problems("train")
    # A plain-text prompt: the model continues the review; the reward scores opening + continuation.
    return [{"prompt": p["query"], "query": p["query"]} for p in problems[:n]]


TASK_SETUP: dict[str, tuple[Callable[[int], list[dict[str, Any]]], Callable[..., list[float]]]] = {
    "writing": (writing_rows, tldr_reward_func),
    "coding": (coding_rows, coding_reward_func),
    "sentiment": (sentiment_rows, sentiment_reward),
}


def train_task(task: str, config: Config, output_dir: str) -> list[dict[str, float]]:
    """GRPOTrainer on one task; returns TRL's log history (one dict per logged step)."""
    from datasets import Dataset
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from agents.models import convert_default_model, resolve_dtype

    make_rows, reward = TASK_SETUP[task]
    dtype = resolve_dtype(None if config.precision == "auto" else config.precision, torch.device("cpu"))
    dataset = Dataset.from_list(make_rows(config.max_steps * config.num_prompts))
    args = GRPOConfig(
        output_dir=os.path.join(output_dir, task),
        max_steps=config.max_steps,
        per_device_train_batch_size=config.num_prompts * config.num_generations,
        num_generations=config.num_generations,
        max_completion_length=config.max_completion_length,
        learning_rate=config.learning_rate,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=config.seed,
        bf16=dtype == torch.bfloat16,  # autocast; the weights load in float32 (TRL's default)
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=str(convert_default_model()),  # safetensors and tokenizer files: loads like any local model
        reward_funcs=[reward],
        args=args,
        train_dataset=dataset,
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    trainer.train()
    return [dict(row) for row in trainer.state.log_history]


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (tests/test_docs_commands.py parses the docs' command lines with it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, default in vars(Config()).items():
        kind = type(default) if default is not None else str
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=default)
    return parser


def main(argv: Sequence[str] | None = None) -> dict[str, list[dict[str, float]]]:
    parser = build_parser()
    config = Config(**vars(parser.parse_args(argv)))
    tasks = TASKS if config.task == "all" else (config.task,)
    histories = {}
    with tempfile.TemporaryDirectory(prefix="trl-grpo-") as tmp:
        for task in tasks:
            histories[task] = train_task(task, config, config.output_dir or tmp)
            steps = [row for row in histories[task] if "reward" in row]
            for row in steps:
                parts = ", ".join(f"{k} {v:.3f}" for k, v in sorted(row.items())
                                  if "/" in k and not k.startswith(("rewards/", "completions/", "clip_ratio/")))
                print(f"{task} step {int(row['step'])}: reward {row['reward']:.3f} (std {row['reward_std']:.3f}); "
                      f"{parts}")
    return histories


if __name__ == "__main__":
    main()
