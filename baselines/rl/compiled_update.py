"""The update's micro-batches through one compiled region (``--compile-update``, baselines/infra/config.py).

:func:`baselines.rl.policy_gradient.update_agent` (MAGRPO's linear and tree updates, MAAC's actors, MARLHF's
RL stage) runs each micro-batch's loss and backward through ``torch.compile(micro_batch_loss, fullgraph=True,
dynamic=False)`` when :func:`compile_wanted` says so: ``auto`` on an agent whose rows sit on a CUDA device
and are scored by the fused decoder (agents/decoder.py), ``on`` wherever, ``off`` never (so the CPU keeps
the eager update unless asked).

A compiled graph is specialised to its input shapes, so the micro-batches come in coarse buckets:
:func:`compiled_slices` cuts a turn's rows into passes of a power-of-two row count and
:func:`pad_rows` pads the rows (copies of the first row's prompt with an empty response), the prompt width
(left, masked) and the response width (right, masked) up to :func:`coarse_length`, and the distinct prompts
the fused forward computes once (``share_prompts``) up to a power of two (copies of the first, which no
row reads). A pad row has an empty response mask and a zero advantage, and the loss divides by
denominators counted on the host before the loop (:func:`baselines.rl.policy_gradient.update_agent`), so
pads change neither the loss nor the gradients nor the statistics. A run thus compiles a handful of
graphs per agent (tens of seconds each with inductor on a GPU), each at its shape's first call; those
calls' seconds and the graphs compiled so far are logged (``charts/update_compile_s``,
``charts/update_compiled_shapes``, and per agent), so the amortisation is visible.

A graph break is an error (``fullgraph=True``), and so is passing dynamo's recompile limit (raised to
:data:`RECOMPILE_LIMIT` for this region): the update never falls back to eager without saying so. With
``activation_budget_mb="auto"`` the budget of an agent's compiled passes is read once, at its first compiled
call (the layers a graph keeps are fixed when it is traced).
"""

from __future__ import annotations

import contextlib
import os
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from agents.rows import CheckedRows, to_device

CompileMode = Literal["auto", "on", "off"]
COMPILE_MODES: tuple[str, ...] = ("auto", "on", "off")

RECOMPILE_LIMIT = 64
"""Dynamo's recompile limit while the compiled update runs (its default, 8, counts every agent's and
policy's graphs of the one function): past it the update raises instead of running eagerly."""

CHARTS = ("update_compile_s", "update_compiled_shapes")
"""The per-agent statistics of a compiled update (``agent_<a>/<name>``), summed over agents as ``charts/<name>``."""


AUTO_ENV = "LLM_ENVS_COMPILE_UPDATE"
"""``auto`` reads this environment variable first: ``on`` or ``off`` decides for every run of the process
(the test suite sets ``off``, so that on a GPU only the tests of the compiled update compile one)."""


def compile_wanted(mode: str, device: torch.device | str, fused: bool = True) -> bool:
    """Whether an agent's update runs compiled: ``on`` always, ``off`` never, ``auto`` when its rows sit on
    a CUDA ``device`` and its gradient passes go through the fused decoder (``fused``; the model's own
    forward through PEFT is not traced), unless :data:`AUTO_ENV` says ``on`` or ``off``.

    >>> compile_wanted("auto", "cpu"), compile_wanted("on", "cpu"), compile_wanted("off", "cuda:1")
    (False, True, False)
    """
    if mode == "on":
        return True
    if mode == "off":
        return False
    if mode == "auto":
        forced = os.environ.get(AUTO_ENV, "")
        if forced not in ("", "on", "off"):
            raise ValueError(f"{AUTO_ENV} must be 'on', 'off' or unset, got {forced!r}")
        if forced:
            return forced == "on" and fused
        return torch.device(device).type == "cuda" and fused
    raise ValueError(f"compile_update must be 'auto', 'on' or 'off', got {mode!r}")


def scores_fused(policy: Any, agent: str) -> bool:
    """Whether ``agent``'s gradient passes run through the fused decoder (the engine backend, LoRA, no
    LoRA dropout in train mode), asked of the policy that holds ``agent`` (one of an agent-per-device
    policy's)."""
    holder = policy.policies[agent] if hasattr(policy, "policies") else policy
    with torch.enable_grad():
        return bool(holder._fused(holder.group(agent)))


def coarse_length(n: int) -> int:
    """A width rounded up to the coarse grid of the compiled update: 8, 12, 16, 24, 32, 48, ... (the powers of
    two and 1.5 times them; 0 stays 0), at most ~1.4 times ``n`` and two shapes an octave.

    >>> [coarse_length(n) for n in (0, 3, 9, 13, 17, 33, 100)]
    [0, 8, 12, 16, 24, 48, 128]
    """
    if n <= 8:
        return 0 if n <= 0 else 8
    up = 1 << (n - 1).bit_length()
    return up * 3 // 4 if up * 3 // 4 >= n else up


def _ceil_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def compiled_slices(gen: Any, config: Any) -> list[tuple[slice, int]]:
    """A turn's rows in passes for the compiled update: (row slice, rows after padding, a power of two).
    Within ``micro_batch_size`` and the ``micro_batch_tokens`` budget counted at the padded widths, as
    :func:`baselines.rl.policy_gradient.row_slices` bounds the eager passes.

    >>> from types import SimpleNamespace as NS
    >>> gen = NS(response_mask=torch.ones(11, 5), prompt_ids=torch.ones(11, 20))
    >>> compiled_slices(gen, NS(micro_batch_size=0, micro_batch_tokens=200))  # 24 + 8 columns: 6 rows, so 4
    [(slice(0, 4, None), 4), (slice(4, 8, None), 4), (slice(8, 11, None), 4)]
    """
    n = len(gen.response_mask)
    if not n:
        return []
    cap = config.micro_batch_size or n
    if config.micro_batch_tokens:
        width = coarse_length(gen.prompt_ids.shape[1]) + coarse_length(gen.response_mask.shape[1])
        cap = min(cap, max(1, config.micro_batch_tokens // max(width, 1)))
    size = _ceil_pow2(n) if not config.micro_batch_size and not config.micro_batch_tokens else min(
        _ceil_pow2(n), 1 << (cap.bit_length() - 1))
    return [(slice(i, min(i + size, n)), _ceil_pow2(min(size, n - i))) for i in range(0, n, size)]


@dataclass(frozen=True)
class PaddedRows(CheckedRows):
    """Rows padded to a compiled shape, with their distinct prompts already found and padded (``first``,
    ``index``: what :meth:`CheckedRows.distinct_prompts` gives, as tensors the graph reads, so that the
    graph depends on their count, not on which rows repeat)."""

    first: torch.Tensor | None = None
    index: torch.Tensor | None = None

    def distinct_prompts(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return self.first, self.index


def pad_rows(rows: CheckedRows, n_rows: int, prompt_width: int, response_width: int) -> PaddedRows:
    """``rows`` (a slice of ``checked_rows``) padded to ``n_rows`` rows, ``prompt_width`` prompt columns (on
    the left, masked) and ``response_width`` response columns (on the right, masked). Pad rows repeat the
    first row's prompt (a valid prompt that adds no distinct one) and have an empty response. The distinct
    prompts' count is padded to a power of two with copies of the first, which no row reads."""
    n, p, t = len(rows), rows.prompt_ids.shape[1], rows.response_ids.shape[1]
    if n < 1 or n_rows < n or prompt_width < p or response_width < t:
        raise ValueError(f"cannot pad {n} rows of {p} + {t} columns to {n_rows} rows of {prompt_width} + "
                         f"{response_width}")
    extra = n_rows - n
    prompt_ids = F.pad(rows.prompt_ids, (prompt_width - p, 0), value=0)
    prompt_mask = F.pad(rows.prompt_mask, (prompt_width - p, 0), value=0)
    prompt_ids = torch.cat([prompt_ids, prompt_ids[:1].expand(extra, -1)])
    prompt_mask = torch.cat([prompt_mask, prompt_mask[:1].expand(extra, -1)])
    response_ids = F.pad(rows.response_ids, (0, response_width - t, 0, extra), value=0)
    response_mask = F.pad(rows.response_mask, (0, response_width - t, 0, extra), value=0)
    first = index = None
    if rows.prompt_keys is not None:
        keys = list(rows.prompt_keys) + [rows.prompt_keys[0]] * extra
        order: dict[int, int] = {}
        for row, key in enumerate(keys):
            order.setdefault(key, row)
        if 1 < len(keys) and len(order) < len(keys):  # else every row is distinct: nothing to share
            position = {key: i for i, key in enumerate(order)}
            firsts = list(order.values())
            firsts += firsts[:1] * (_ceil_pow2(len(firsts)) - len(firsts))
            device = rows.response_ids.device
            first = to_device(torch.tensor(firsts), device)
            index = to_device(torch.tensor([position[key] for key in keys]), device)
    return PaddedRows(prompt_ids, prompt_mask, response_ids, response_mask, None, first, index)


def pad_to(values: torch.Tensor, n_rows: int, width: int | None = None) -> torch.Tensor:
    """(n,) or (n, T) ``values`` with zero rows (and zero columns on the right, to ``width``) added."""
    if values.dim() == 1:
        return F.pad(values, (0, n_rows - len(values)))
    return F.pad(values, (0, (width or values.shape[1]) - values.shape[1], 0, n_rows - len(values)))


class CompiledLoss:
    """``loss_fn`` (:func:`baselines.rl.policy_gradient.micro_batch_loss`) compiled once for a policy and a
    backend (kept while the policy lives), with each agent's compile seconds and graphs counted (:meth:`run`)."""

    def __init__(self, loss_fn: Callable[..., tuple[Any, ...]], backend: str) -> None:
        self.backend = backend
        self.fn = torch.compile(loss_fn, fullgraph=True, dynamic=False, backend=backend)
        self.graphs: dict[str, int] = {}
        self.seconds: dict[str, float] = {}
        self.keep_mb: dict[str, float] = {}

    def run(self, agent: str, divisor: float, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """``loss_fn(*args, **kwargs)`` compiled, and the backward of its loss over ``divisor``;
        a call that compiled (the forward's graph and, AOTAutograd's, the backward's) counts its seconds."""
        import torch._dynamo
        from torch._dynamo.utils import counters

        before = counters["stats"]["unique_graphs"]
        start = time.perf_counter()
        limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        policy, rows = args[0], args[2]
        try:
            with torch._dynamo.config.patch(recompile_limit=limit), self._budget_fixed(policy, agent, rows):
                out = self.fn(*args, **kwargs)
        except torch._dynamo.exc.FailOnRecompileLimitHit as err:
            raise RuntimeError(
                f"agent {agent!r}: the compiled update passed dynamo's recompile limit ({limit} graphs; "
                f"{self.graphs.get(agent, 0)} of them this agent's shapes): a shape or a setting changes every "
                "call. Run with --compile-update off, or TORCH_LOGS=recompiles to see why"
            ) from err
        (out[0] / divisor).backward()
        compiled = counters["stats"]["unique_graphs"] - before
        self.graphs[agent] = self.graphs.get(agent, 0) + compiled
        if compiled:
            self.seconds[agent] = self.seconds.get(agent, 0.0) + time.perf_counter() - start
        return out

    @contextlib.contextmanager
    def _budget_fixed(self, policy: Any, agent: str, rows: CheckedRows) -> Iterator[None]:
        """``activation_budget_mb="auto"`` read once for ``agent`` (the device's free memory at its first
        compiled call) and held while a compiled call runs: a graph's choice of the layers that keep their
        activations is fixed when it is traced, and reading the free memory is not traceable."""
        holder = policy.policies[agent] if hasattr(policy, "policies") else policy
        budget = getattr(holder, "activation_budget_mb", None)
        if budget != "auto":
            yield
            return
        if agent not in self.keep_mb:
            self.keep_mb[agent] = float(holder.activation_keep_mb(rows.response_ids.device))
        holder.activation_budget_mb = self.keep_mb[agent]
        try:
            yield
        finally:
            holder.activation_budget_mb = budget

    def take_stats(self, agent: str) -> dict[str, float]:
        """``agent``'s compile seconds since the last call and its graphs so far (the ``CHARTS`` names)."""
        return {"update_compile_s": self.seconds.pop(agent, 0.0),
                "update_compiled_shapes": float(self.graphs.get(agent, 0))}


_COMPILED: weakref.WeakKeyDictionary[Any, dict[tuple[Any, str], CompiledLoss]] = weakref.WeakKeyDictionary()


def compiled_loss(policy: Any, loss_fn: Callable[..., tuple[Any, ...]], backend: str) -> CompiledLoss:
    """The policy's :class:`CompiledLoss` of ``loss_fn`` for ``backend`` (made at the first call; a backend
    dynamo does not know is a ``ValueError`` quoting it)."""
    per_backend = _COMPILED.setdefault(policy, {})
    if (loss_fn, backend) not in per_backend:
        import torch._dynamo

        known = torch._dynamo.list_backends(exclude_tags=())
        if backend not in known:
            raise ValueError(f"compile_backend must be one of torch's compile backends ({', '.join(known)}), "
                             f"got {backend!r}")
        per_backend[loss_fn, backend] = CompiledLoss(loss_fn, backend)
    return per_backend[loss_fn, backend]


def compile_charts(metrics: Mapping[str, float], agents: Sequence[str]) -> dict[str, float]:
    """``charts/<name>`` of :data:`CHARTS`: the sums over ``agents`` of ``agent_<a>/<name>``, when any logged it.

    >>> compile_charts({"agent_a/update_compile_s": 2.0, "agent_b/update_compile_s": 1.0}, ["a", "b"])
    {'charts/update_compile_s': 3.0}
    """
    out = {}
    for name in CHARTS:
        values = [metrics[f"agent_{a}/{name}"] for a in agents if f"agent_{a}/{name}" in metrics]
        if values:
            out[f"charts/{name}"] = float(sum(values))
    return out
