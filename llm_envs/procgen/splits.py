"""Seeded instances and the two splits of a generated family, and its difficulty levels.

Instances and splits
--------------------
An instance is a pure function of its family, its generator parameters (the difficulty) and an
integer *instance seed*: ``random.Random("<family>/<params>/<seed>")`` drives the generator, which
draws only with ``random()`` (the one method whose sequence Python guarantees across versions), so
every machine and Python version generates the same instances.

Small families (a 6 x 6 Sokoban room with one box, a 4 x 4 Sudoku) give the same instance for
different seeds, so the splits are separated by instance, not only by seed. An instance is in the
*eval class* when the BLAKE2b hash of its content is 0 modulo :data:`EVAL_CLASS` (1 in 4):

=========  =====================================  ==============================================
split      ``task_index`` i                       instance
=========  =====================================  ==============================================
``eval``   0 .. 999 (:data:`EVAL_SIZE`)           the i-th distinct eval-class instance of seeds
                                                  0, 1, 2, ... (below 2**32)
``train``  0 .. 2**62 - 1 (:data:`TRAIN_SIZE`)    seed ``2**32 + i``; if that instance is in the
                                                  eval class, seed ``2**32 + i + 2**62``, and so on
=========  =====================================  ==============================================

So eval instances are distinct, no train instance is ever an eval instance, and both are the same on
every machine. ``reset(seed=s)`` draws the task index from the env's seeded generator, so the same
seed gives the same instance; ``options={"task_index": i, "split": "eval"}`` pins one. The train split
is generated on demand and never runs out of indices (a family with few distinct instances repeats
them, as sampling would).
"""

from __future__ import annotations

import functools
import hashlib
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from llm_envs.core.task import Problem

MAX_ATTEMPTS = 1000
"""Random tries a generator makes for an instance that meets its level before it gives up."""
EVAL_SIZE = 1000
"""Instances of the eval split."""
EVAL_CLASS = 4
"""An instance is in the eval class when the hash of its content is 0 modulo this."""
TRAIN_SEED_OFFSET = 2**32
"""Eval instances come from seeds below this; train index i starts at seed TRAIN_SEED_OFFSET + i."""
TRAIN_SIZE = 2**62
"""Indices of the train split (generated on demand)."""
MAX_TRAIN_DRAWS = 64
"""Seeds tried for one train index before giving up (each is in the eval class with probability 1/4)."""
EVAL_SEEDS_PER_INSTANCE = 64
"""The eval split gives up when fewer than one seed in this many yields a new eval instance."""
LEVELS = ("easy", "medium", "hard")


# ------------------------------------------------------------------------------------- seeding
def instance_random(family: str, params: tuple[Any, ...], seed: int) -> random.Random:
    """The generator of one instance. Generators draw only with ``random()`` (see :func:`below`)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"An instance seed must be an int >= 0, got {seed!r}.")
    return random.Random(f"{family}/{params!r}/{seed}")


def below(rng: random.Random, n: int) -> int:
    """An int in ``[0, n)`` from one ``random()`` draw (stable across Python versions, unlike
    ``randrange``)."""
    return int(rng.random() * n)


def shuffled(rng: random.Random, items: Sequence[Any]) -> list[Any]:
    """A Fisher-Yates shuffle of ``items`` drawn with :func:`below`."""
    out = list(items)
    for i in range(len(out) - 1, 0, -1):
        j = below(rng, i + 1)
        out[i], out[j] = out[j], out[i]
    return out


def split_size(split: str) -> int:
    if split == "eval":
        return EVAL_SIZE
    if split == "train":
        return TRAIN_SIZE
    raise ValueError(f"Unknown split {split!r}; expected 'train' or 'eval'.")


def instance_key(problem: Problem, fields: Sequence[str]) -> tuple[Any, ...]:
    """The content of an instance that identifies it (its seed excluded)."""
    return tuple(problem[f] for f in fields)


def in_eval_class(key: tuple[Any, ...]) -> bool:
    """Whether an instance with this content belongs to the eval split's class (1 in :data:`EVAL_CLASS`).

    >>> [i for i in range(20) if in_eval_class((i,))]
    [8]
    """
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % EVAL_CLASS == 0


Generator = Callable[..., dict]
"""``generator(seed, *params) -> instance``, a module-level function."""


@functools.lru_cache(maxsize=16384)
def generate_cached(generator: Generator, params: tuple[Any, ...], seed: int) -> dict:
    """``generator(seed, *params)``, cached per process (instances are immutable by convention)."""
    return generator(seed, *params)


class _EvalInstances:
    """The eval split of one generator and parameters, generated in seed order as far as asked."""

    def __init__(self, generator: Generator, params: tuple[Any, ...], fields: tuple[str, ...]) -> None:
        self.generator, self.params, self.fields = generator, params, fields
        self.instances: list[dict] = []
        self.keys: set[tuple[Any, ...]] = set()
        self.next_seed = 0

    def get(self, index: int) -> dict:
        while len(self.instances) <= index:
            if self.next_seed >= EVAL_SEEDS_PER_INSTANCE * (len(self.instances) + 1) + 1000:
                raise ValueError(
                    f"Only {len(self.instances)} distinct eval instances among seeds 0-{self.next_seed - 1} of "
                    f"{self.generator.__name__} with parameters {self.params}: these parameters give too few distinct "
                    f"instances for an eval split of {EVAL_SIZE}. Choose a larger or harder level."
                )
            problem = self.generator(self.next_seed, *self.params)
            self.next_seed += 1
            key = instance_key(problem, self.fields)
            if key not in self.keys and in_eval_class(key):
                self.keys.add(key)
                self.instances.append(problem)
        return self.instances[index]


@functools.lru_cache(maxsize=64)
def _eval_instances(generator: Generator, params: tuple[Any, ...], fields: tuple[str, ...]) -> _EvalInstances:
    return _EvalInstances(generator, params, fields)


class GeneratedSplit(Sequence[Problem]):
    """The instances of one split of a generator with fixed parameters, made on demand (see the module
    docstring for which instance each index is)."""

    def __init__(self, generator: Generator, params: tuple[Any, ...], fields: Sequence[str], split: str) -> None:
        split_size(split)
        self.generator, self.params, self.fields, self.split = generator, tuple(params), tuple(fields), split

    def __len__(self) -> int:
        return split_size(self.split)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        size = len(self)
        if isinstance(index, int) and not isinstance(index, bool) and index < 0:
            index += size
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < size:
            raise IndexError(f"task_index must be an int in [0, {size - 1}] for split {self.split!r}, got {index!r}.")
        if self.split == "eval":
            return _eval_instances(self.generator, self.params, self.fields).get(index)
        for k in range(MAX_TRAIN_DRAWS):
            problem = generate_cached(self.generator, self.params, TRAIN_SEED_OFFSET + index + k * TRAIN_SIZE)
            if not in_eval_class(instance_key(problem, self.fields)):
                return problem
        raise RuntimeError(f"Train index {index}: all {MAX_TRAIN_DRAWS} instances drawn for it are eval instances "
                           f"({self.generator.__name__}, parameters {self.params}).")

    def __iter__(self) -> Iterator[Problem]:
        return (self[i] for i in range(len(self)))

    def __repr__(self) -> str:
        return f"GeneratedSplit({self.generator.__name__}, {self.params}, {self.split!r})"


# ------------------------------------------------------------------------------------- levels
def resolve_level(difficulty: str, presets: Mapping[str, Mapping[str, Any]], overrides: Mapping[str, Any]) -> dict:
    """The generator parameters of ``difficulty`` with the explicit ``overrides`` that are not None."""
    if difficulty not in presets:
        raise ValueError(f"difficulty must be one of {list(presets)}, got {difficulty!r}.")
    params = dict(presets[difficulty])
    params.update({k: v for k, v in overrides.items() if v is not None})
    return params


def check_int(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an int in [{low}, {high}], got {value!r}.")
    return value


def check_fraction(name: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ValueError(f"{name} must be a number in [{low}, {high}], got {value!r}.")
    return float(value)


def labeled_grid(rows: Sequence[str]) -> str:
    """A grid of characters with its column numbers on top and row numbers on the left.

    >>> print(labeled_grid(["S.", "#G"]))
       0 1
    0  S .
    1  # G
    """
    width = len(str(max(len(rows), len(rows[0])) - 1))
    header = " " * (width + 2) + " ".join(str(c).rjust(width) for c in range(len(rows[0])))
    lines = [header]
    for r, row in enumerate(rows):
        lines.append(str(r).rjust(width) + "  " + " ".join(ch.rjust(width) for ch in row))
    return "\n".join(lines)
