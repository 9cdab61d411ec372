"""Data-parallel training across processes with ``torch.distributed`` (``torchrun`` / ``accelerate launch``).

The learners call these helpers unconditionally; with one process (``WORLD_SIZE`` unset or 1) every
one of them is a no-op that returns its input, and ``torch.distributed`` is never initialised, so a
plain ``llm-envs train magrpo`` runs exactly as before. Under a launcher each process:

1. draws the same B problems of an iteration (same seed) and keeps its contiguous share
   (:func:`shard`), so the union over ranks, in rank order, is the one-process batch;
2. samples every problem group from its own seed (:func:`group_seed`, :func:`generate_per_group`),
   so a problem's samples do not depend on which rank plays it or what else is in the batch;
3. normalises its loss by the *global* token (or response) count (:func:`all_sum`) and sums the
   gradients of the trainable parameters over ranks (:func:`all_reduce_grads`), which gives the
   gradient of the one-process loss, however the token counts differ between ranks;
4. reduces its metrics (:func:`reduce_metrics`, :func:`gather_rows`); only rank 0 (:func:`is_main`)
   logs, evaluates, plots and writes checkpoints while the others wait at a :func:`barrier`.

=========================  ==========================================================================
``init_from_env``          reads RANK / WORLD_SIZE / LOCAL_RANK (set by torchrun and accelerate),
                           picks gloo on CPU and nccl on CUDA, returns a :class:`DistInfo`
``is_main`` ``rank``       rank 0 (or the only process); this process's rank and the world size
``world_size``
``shard``                  this rank's contiguous block of a sequence of indices
``all_sum``                element-wise sum over ranks of floats or a tensor
``all_reduce_grads``       sum (or mean) of ``.grad`` over ranks, one flat buffer per call
``broadcast_params``       copy rank 0's parameter values to every rank
``broadcast``              rank 0's tensor on every rank (e.g. a shared shuffled order)
``global_minibatches``     shuffled minibatches of the global batch (PPO): this rank's rows of each
                           and the minibatch's global token count
``reduce_metrics``         weighted mean (or sum) of a metrics dict over ranks
``gather_rows``            concatenation over ranks (rank order) of per-row arrays or tensors
``check_in_sync``          raise if the ranks' parameters differ (a cheap checksum per rank)
``barrier``                wait for every rank
``group_seed``             the sampling seed of problem ``b`` of an iteration and turn
``generate_per_group``     ``policy.generate_joint`` per problem group, each under its own seed
=========================  ==========================================================================

Device placement (``--placement``: :func:`agents.placement.device_for`, ``build_policy``) is
:mod:`agents.placement`'s. See docs/scaling.md for commands, NCCL notes and memory figures.
"""

from __future__ import annotations

import atexit
import datetime
import hashlib
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from agents.rows import strip_left

T = TypeVar("T")


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: ``rank`` of ``world_size`` processes, ``local_rank`` on its node."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _env_int(name: str, default: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        if default is None:
            raise RuntimeError(
                f"environment variable {name} is not set but WORLD_SIZE={os.environ.get('WORLD_SIZE')!r} asks "
                "for several processes; start the run with torchrun or accelerate launch (they set RANK, "
                "LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)"
            )
        return default
    try:
        value = int(raw)
    except ValueError as err:
        raise RuntimeError(f"environment variable {name} must be an integer, got {raw!r}") from err
    if value < 0:
        raise RuntimeError(f"environment variable {name} must be >= 0, got {raw!r}")
    return value


def init_from_env(
    backend: str | None = None, timeout_s: float = 1800.0, device: str | torch.device | None = None
) -> DistInfo:
    """Join the process group described by the launcher's environment, once; later calls return the
    same :class:`DistInfo`.

    ``WORLD_SIZE`` unset or 1: a single process, nothing is initialised. Otherwise RANK, LOCAL_RANK,
    MASTER_ADDR and MASTER_PORT must be set (torchrun and ``accelerate launch`` set them). ``backend``
    defaults to gloo when ``device`` (the run's ``--device``) is the CPU or CUDA is not available, else
    nccl. NCCL needs a CUDA device of its own per process (``cuda:<LOCAL_RANK>``): with more processes
    on a node than visible devices this raises a ``RuntimeError`` naming the fix before any CUDA call
    (not CUDA's ``invalid device ordinal``). A collective that waits longer than ``timeout_s`` (a rank
    died or hangs) raises instead of blocking forever.
    """
    world = _env_int("WORLD_SIZE", 1)
    if world == 0:
        raise RuntimeError("environment variable WORLD_SIZE must be >= 1, got '0'")
    if world == 1:
        return DistInfo()
    rank, local_rank = _env_int("RANK"), _env_int("LOCAL_RANK")
    local_world = _env_int("LOCAL_WORLD_SIZE", world)
    if rank >= world or local_rank >= local_world:
        raise RuntimeError(
            f"inconsistent launcher environment: RANK={rank}, LOCAL_RANK={local_rank}, WORLD_SIZE={world}, "
            f"LOCAL_WORLD_SIZE={local_world}"
        )
    for name in ("MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(name):
            raise RuntimeError(
                f"environment variable {name} is not set; start the run with torchrun or accelerate launch"
            )
    on_cpu = device is not None and torch.device(device).type == "cpu"
    if backend is None:
        backend = "gloo" if on_cpu or not torch.cuda.is_available() else "nccl"
    if backend not in ("gloo", "nccl", "mpi", "ucc"):
        raise ValueError(f"backend must be 'gloo', 'nccl', 'mpi' or 'ucc', got {backend!r}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
    if backend == "nccl":
        _check_one_device_per_process(local_rank, local_world)
    if not dist.is_initialized():
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
        dist.init_process_group(
            backend=backend,
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        atexit.register(destroy)
    return DistInfo(rank, world, local_rank, local_world, dist.get_backend())


def _check_one_device_per_process(local_rank: int, local_world: int) -> None:
    """NCCL puts process ``LOCAL_RANK`` on ``cuda:<LOCAL_RANK>``: raise, naming the fix, where that
    device does not exist (two processes on a one-GPU machine, say)."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if local_rank < count:
        return
    fewer = (f"launch at most {count} process{'' if count == 1 else 'es'} a node (torchrun --nproc_per_node "
             f"{count}), or " if count else "")
    raise RuntimeError(
        f"{local_world} processes on this node with the nccl backend need one CUDA device each, but "
        f"LOCAL_RANK={local_rank} and {count} {'is' if count == 1 else 'are'} visible"
        + (" (no CUDA on this machine)" if count == 0 else "")
        + f": {fewer}run on the CPU with --device cpu (the gloo backend)"
    )


def _active() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    """This process's rank (0 without a process group)."""
    return dist.get_rank() if _active() else 0


def world_size() -> int:
    """Number of processes (1 without a process group)."""
    return dist.get_world_size() if _active() else 1


def is_main() -> bool:
    """True on rank 0 and in a single process: the one that logs, plots and writes checkpoints."""
    return rank() == 0


def barrier() -> None:
    """Wait until every rank gets here (no-op in a single process)."""
    if _active():
        dist.barrier()


def destroy() -> None:
    """Leave the process group (no-op if none)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def shard(indices: Sequence[T]) -> list[T]:
    """This rank's contiguous block of ``indices``: ranks get sizes differing by at most one, earlier
    ranks the larger ones, and concatenating the blocks in rank order gives ``indices`` back.

    >>> shard(range(5))  # one process
    [0, 1, 2, 3, 4]
    """
    items = list(indices)
    world, me = world_size(), rank()
    if len(items) < world:
        raise ValueError(
            f"cannot share {len(items)} items among {world} processes: every rank needs at least one "
            f"(raise num_problems to >= {world} or launch fewer processes)"
        )
    base, extra = divmod(len(items), world)
    start = me * base + min(me, extra)
    return items[start : start + base + (1 if me < extra else 0)]


def _device() -> torch.device:
    if _active() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_sum(values: torch.Tensor | Sequence[float] | float) -> Any:
    """Element-wise sum over ranks. A float gives a float, a sequence a list, a tensor a tensor (on
    its own device, detached). One process: the input unchanged."""
    if not _active():
        return values
    if isinstance(values, torch.Tensor):
        buf = values.detach().clone().to(_device(), torch.float64)
        dist.all_reduce(buf)
        return buf.to(values.device, values.dtype)
    scalar = not isinstance(values, Sequence)
    buf = torch.tensor([values] if scalar else list(values), dtype=torch.float64, device=_device())
    dist.all_reduce(buf)
    out = buf.cpu().tolist()
    return out[0] if scalar else out


def all_reduce_grads(params: Iterable[torch.nn.Parameter], op: Literal["sum", "mean"] = "sum") -> None:
    """Sum (or average) ``.grad`` of ``params`` over ranks in place, through one flat buffer.

    Use ``sum`` when each rank's loss is already divided by the global count (the learners do, so
    that ranks with more tokens weigh more, exactly as in one process); ``mean`` when each rank's loss
    is a mean over an equal share. A parameter without a gradient counts as zeros (every rank must
    pass the same parameters in the same order)."""
    if op not in ("sum", "mean"):
        raise ValueError(f"op must be 'sum' or 'mean', got {op!r}")
    if not _active():
        return
    # Not filtered by requires_grad: PEFT re-freezes every adapter but the active one when adapters are
    # re-enabled (after a reference forward), so the flag can differ between ranks, and every rank must
    # reduce the same parameters or the collectives mismatch.
    params = list(params)
    if not params:
        return
    device = _device()
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).to(device) for p in params])
    dist.all_reduce(flat)
    if op == "mean":
        flat /= dist.get_world_size()
    offset = 0
    for p in params:
        n = p.numel()
        chunk = flat[offset : offset + n].view_as(p).to(p.device, p.dtype)
        if p.grad is None:
            p.grad = chunk.clone()
        else:
            p.grad.copy_(chunk)
        offset += n


@torch.no_grad()
def broadcast_params(params: Iterable[torch.nn.Parameter], src: int = 0) -> None:
    """Copy rank ``src``'s values of ``params`` to every rank (start of training: identical replicas
    even if a rank's RNG drew different LoRA initialisations)."""
    if not _active():
        return
    params = list(params)
    if not params:
        return
    device = _device()
    flat = torch.cat([p.detach().reshape(-1).to(device, torch.float32) for p in params])
    dist.broadcast(flat, src)
    offset = 0
    for p in params:
        p.copy_(flat[offset : offset + p.numel()].view_as(p).to(p.device, p.dtype))
        offset += p.numel()


def broadcast(tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
    """Rank ``src``'s ``tensor`` on every rank (same shape and dtype everywhere), e.g. the shuffled
    order of PPO's minibatches. One process: ``tensor`` itself."""
    if not _active():
        return tensor
    buf = tensor.detach().clone().to(_device())
    dist.broadcast(buf, src)
    return buf.to(tensor.device)


def global_minibatches(
    tokens: torch.Tensor, size: int, epochs: int
) -> Iterator[tuple[int, torch.Tensor, float | None]]:
    """``epochs`` passes of shuffled minibatches of ``size`` rows over the global batch (every rank's
    rows, in rank order). Yields ``(epoch, rows, denominator)``: this rank's rows of the minibatch as
    local indices (possibly none) and the minibatch's global token count (None with one process, where
    the rows are the whole minibatch). ``tokens``: (n,) the tokens of each of this rank's rows. Every
    rank draws the same order (rank 0's permutation), so a minibatch is the same set of rows as in one
    process.

    >>> _ = torch.manual_seed(0)
    >>> [(epoch, rows.tolist()) for epoch, rows, _ in global_minibatches(torch.ones(3), 2, 1)]
    [(0, [2, 0]), (0, [1])]
    """
    n = len(tokens)
    offset, n_total, lengths = 0, n, None
    if _active():
        counts = gather_rows(torch.tensor([n], dtype=torch.long))
        offset, n_total = int(counts[: rank()].sum()), int(counts.sum())
        lengths = gather_rows(tokens.double().cpu())  # (n_total,)
    size = min(size, n_total)
    for epoch in range(epochs):
        order = broadcast(torch.randperm(n_total))
        for start in range(0, n_total, size):
            batch = order[start : start + size]
            if lengths is None:
                yield epoch, batch, None
            else:
                yield epoch, batch[(batch >= offset) & (batch < offset + n)] - offset, float(lengths[batch].sum())


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (picklable), in rank order, on every rank; one process: ``[obj]``."""
    if not _active():
        return [obj]
    return _gather_objects(obj)


def local_block(items: Sequence[T]) -> list[T]:
    """This rank's contiguous block of ``items`` as :func:`shard` cuts it, but a rank may get none
    (a batch of pairs smaller than the number of processes).

    >>> local_block([1, 2, 3])  # one process
    [1, 2, 3]
    """
    items = list(items)
    base, extra = divmod(len(items), world_size())
    me = rank()
    start = me * base + min(me, extra)
    return items[start : start + base + (1 if me < extra else 0)]


def _gather_objects(obj: Any) -> list[Any]:
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def reduce_metrics(
    metrics: Mapping[str, float], weight: float = 1.0, op: Literal["mean", "sum"] = "mean"
) -> dict[str, float]:
    """The metrics of all ranks as one dict, the same on every rank: ``mean`` weights each rank's
    value by its ``weight`` (e.g. its number of rows), ``sum`` adds them. A name missing on some
    ranks is reduced over the ranks that have it. One process: a plain copy."""
    if op not in ("mean", "sum"):
        raise ValueError(f"op must be 'mean' or 'sum', got {op!r}")
    if not weight > 0:
        raise ValueError(f"weight must be > 0, got {weight!r}")
    if not _active():
        return {k: float(v) for k, v in metrics.items()}
    parts = _gather_objects(({k: float(v) for k, v in metrics.items()}, float(weight)))
    out: dict[str, float] = {}
    for name in dict.fromkeys(k for part, _ in parts for k in part):
        pairs = [(part[name], w) for part, w in parts if name in part]
        if op == "sum":
            out[name] = float(sum(v for v, _ in pairs))
        else:
            out[name] = float(sum(v * w for v, w in pairs) / sum(w for _, w in pairs))
    return out


def gather_rows(rows: T) -> T:
    """Concatenate per-row data over ranks in rank order (rank 0's rows first), on every rank.

    ``rows``: a tensor or numpy array (concatenated along axis 0), or a dict of them (key by key).
    With :func:`shard` the result is the one-process batch. One process: ``rows`` itself."""
    if not _active():
        return rows
    parts = _gather_objects(_to_cpu(rows))
    return _concat(parts, rows)


def _to_cpu(rows: Any) -> Any:
    if isinstance(rows, Mapping):
        return {k: _to_cpu(v) for k, v in rows.items()}
    if isinstance(rows, torch.Tensor):
        return rows.detach().cpu()
    return np.asarray(rows)


def _concat(parts: list[Any], like: Any) -> Any:
    if isinstance(like, Mapping):
        return {k: _concat([p[k] for p in parts], like[k]) for k in like}
    if isinstance(like, torch.Tensor):
        return torch.cat(parts).to(like.device)
    return np.concatenate(parts)


def check_equal(value: Any, what: str) -> None:
    """Raise ``RuntimeError`` naming ``what`` unless every rank passes an equal (picklable) ``value``;
    called before collectives whose number depends on it, which would otherwise hang."""
    if not _active():
        return
    values = _gather_objects(value)
    if any(v != values[0] for v in values):
        raise RuntimeError(f"{what} differ between ranks: {values}")


def check_in_sync(params: Iterable[torch.nn.Parameter], what: str = "parameters") -> None:
    """Raise ``RuntimeError`` if the ranks' ``params`` are not bit-identical (data-parallel replicas
    that drifted apart: a bug, or ranks that loaded different checkpoints)."""
    if not _active():
        return
    digest = hashlib.sha256()
    for p in params:
        digest.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    digests = _gather_objects(digest.hexdigest())
    if len(set(digests)) > 1:
        differing = [r for r, d in enumerate(digests) if d != digests[0]]
        raise RuntimeError(f"{what} differ between ranks: ranks {differing} disagree with rank 0")


# ----------------------------------------------------------------------------------------- sampling
def group_seed(seed: int, iteration: int, turn: int, problem: int) -> int:
    """Sampling seed of the group of problem position ``problem`` (0..B-1 in the iteration's batch)
    at ``turn`` of ``iteration``: the same on every rank and for every world size."""
    for name, value in (("seed", seed), ("iteration", iteration), ("turn", turn), ("problem", problem)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name} must be an int >= 0, got {value!r}")
    return int(np.random.SeedSequence([int(seed), int(iteration), int(turn), int(problem)]).generate_state(1)[0])


def generate_per_group(
    policy: Any,
    prompts: Mapping[str, tuple[Any, Any]],
    group_size: int,
    seeds: Sequence[int],
    **sampling: Any,
) -> dict[str, Any]:
    """``policy.generate_joint(prompts, 1, **sampling)`` with rows taken ``group_size`` at a time,
    each group under its own seed ``seeds[k]`` (row j of the group: a generator seeded from
    (``seeds[k]``, j, the agent)), all in one batched call; torch's global stream is untouched.

    A group's samples are therefore the same whatever else is in the batch (what makes ranks of a
    data-parallel run agree with one process). Returns ``{agent: Generation}`` of all rows in order,
    prompts stripped of the columns that are padding in every row."""
    rows = {len(pair[0]) for pair in prompts.values()}
    if len(rows) != 1:
        raise ValueError(f"every agent needs the same number of prompt rows, got {sorted(rows)}")
    (n,) = rows
    if group_size < 1 or n != group_size * len(seeds):
        raise ValueError(f"{n} prompt rows do not make {len(seeds)} groups of {group_size}")
    row_seeds = [
        int(np.random.SeedSequence([int(seed), j]).generate_state(1)[0]) for seed in seeds for j in range(group_size)
    ]
    stripped = {
        a: tuple(torch.as_tensor(x) for x in strip_left(ids, mask)) for a, (ids, mask) in prompts.items()
    }
    return policy.generate_joint(stripped, 1, seeds=row_seeds, **sampling)
