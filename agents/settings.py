"""The settings of a policy's agents: LoRA adapters (:class:`LoraSettings`) and sampling
(:class:`Sampling`), with the checks every entry point shares (agent names, sampling values,
temperatures)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapter settings, shared by every agent's adapter."""

    rank: int = 16
    """LoRA rank r."""
    alpha: float = 32.0
    """LoRA scaling numerator (the update is scaled by alpha / rank)."""
    dropout: float = 0.0
    """Dropout on the adapter input (active only in ``policy.train()`` mode)."""
    target_modules: str | tuple[str, ...] = "all-linear"
    """Module names to adapt, or "all-linear" (every linear layer except the LM head)."""

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise ValueError(f"LoraSettings.rank must be a positive int, got {self.rank!r}")
        if not isinstance(self.alpha, (int, float)) or not self.alpha > 0:
            raise ValueError(f"LoraSettings.alpha must be a positive number, got {self.alpha!r}")
        if not isinstance(self.dropout, (int, float)) or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoraSettings.dropout must be in [0, 1), got {self.dropout!r}")
        targets = self.target_modules
        if isinstance(targets, list):
            object.__setattr__(self, "target_modules", tuple(targets))
            targets = self.target_modules
        if isinstance(targets, str):
            if not targets:
                raise ValueError("LoraSettings.target_modules must not be empty")
        elif not targets or not all(isinstance(t, str) and t for t in targets):
            raise ValueError(
                f"LoraSettings.target_modules must be 'all-linear' or a non-empty tuple of module names, "
                f"got {targets!r}"
            )

    def peft_config(self) -> Any:
        from peft import LoraConfig

        targets = self.target_modules if isinstance(self.target_modules, str) else list(self.target_modules)
        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=targets,
            bias="none",
            task_type="CAUSAL_LM",
        )


@dataclass(frozen=True)
class Sampling:
    """Sampling settings of :meth:`MultiAgentPolicy.act` (``generate`` takes the same as arguments)."""

    max_new_tokens: int = 64
    """Response length; must equal the env's action length (``env.action_space(agent).shape[-1]``)."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 disables top-k."""
    repetition_penalty: float = 1.0
    greedy: bool = False
    """Take the arg-max token instead of sampling (temperature/top-p/top-k are then unused)."""
    stop: tuple[str, ...] = ()
    """Strings that end a response (cut after the token that completes the first one)."""

    def __post_init__(self) -> None:
        if isinstance(self.stop, list):
            object.__setattr__(self, "stop", tuple(self.stop))
        if isinstance(self.stop, str) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a tuple of non-empty strings, got {self.stop!r}")
        check_sampling(self.max_new_tokens, self.temperature, self.top_p, self.top_k, self.repetition_penalty)


def check_sampling(max_new_tokens: int, temperature: float, top_p: float, top_k: int, rep: float) -> None:
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"temperature must be > 0 (use greedy=True for arg-max decoding), got {temperature!r}")
    if not isinstance(top_p, (int, float)) or not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
        raise ValueError(f"top_k must be an int >= 0 (0 disables it), got {top_k!r}")
    if not isinstance(rep, (int, float)) or not rep > 0:
        raise ValueError(f"repetition_penalty must be > 0, got {rep!r}")


DEFAULT_LORA = LoraSettings()
DEFAULT_SAMPLING = Sampling()


def check_temperature(value: Any, name: str = "temperature") -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a number > 0, got {value!r}")



def check_agent_names(agents: Sequence[str]) -> tuple[str, ...]:
    if isinstance(agents, str) or not isinstance(agents, Sequence) or not agents:
        raise ValueError(f"agents must be a non-empty sequence of names, got {agents!r}")
    for name in agents:
        # PEFT keys adapters by name inside module paths, reserves "__base__" for "no adapter" in mixed
        # batches, and mistakes names contained in its "lora_" prefix for that prefix when loading.
        if not isinstance(name, str) or not name or "." in name or name == "__base__" or name in "lora_":
            raise ValueError(
                f"agent name {name!r} is not usable as an adapter name (a non-empty str without '.', not "
                "'__base__' and not part of 'lora_')"
            )
    if len(set(agents)) != len(agents):
        raise ValueError(f"agent names must be distinct, got {list(agents)}")
    return tuple(agents)


