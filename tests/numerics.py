"""Float32 tolerances that follow from the computation, not from one machine's kernels.

Two float32 implementations of the same network (our fused decoder and the model's own forward through
PEFT; one pass and separate passes; shared and whole prompts) agree only up to rounding, and the
rounding differs with the kernel set: AVX2, AVX-512 and AMX matmuls sum in different orders and block
sizes, and ATen's vectorised softmax/exp kernels differ by ISA (``ATEN_CPU_CAPABILITY``). A float32
accumulation of ``k`` products has a worst-case relative error of about ``k * eps`` *of the magnitude
of its operands*, not of its result; the norms (RMSNorm, softmax, log-softmax) then bring every
error back to the scale of the largest entries. So an output at the end of a chain of ``depth``
accumulations is off by at most about ``depth * k * eps * max|output|`` (errors add linearly in the
worst case; they usually partly cancel, which is why the measured differences sit 5-20x below it).

For the tiny test models (hidden 32, MLP 64, 2 layers): a forward path through one layer crosses about
10 accumulations (q/k/v projection and its LoRA A and B, q k^T, attention x v, o projection and LoRA,
gate/up and LoRA, down and LoRA), two layers and the final norm, head and log-softmax make
``FORWARD_DEPTH`` = 24 at ``k`` = 64; a gradient crosses the chain forward and back again (48).
That gives 1.8e-4 x max|output| for scores and 3.7e-4 x max|gradient|: measured differences across
kernel sets reach 4e-5 (values, AVX-512 vs the PEFT path) and 1.6e-4 (Qwen2 gradients, AVX2-only
EPYC) of the maximum. A real defect (a wrong mask, a missed adapter, a position off by one) moves
results by 1e-2 or more of the maximum: these bounds still catch it.
"""

from __future__ import annotations

from typing import Any

EPS32 = 2.0**-23  # torch.finfo(torch.float32).eps
TINY_K = 64  # the longest accumulation of the tiny models (MLP width)
FORWARD_DEPTH = 24
BACKWARD_DEPTH = 2 * FORWARD_DEPTH


def f32_bound(reference: Any, *, depth: int = FORWARD_DEPTH, k: int = TINY_K) -> float:
    """The largest difference two float32 implementations of a ``depth``-deep chain of length-``k``
    accumulations may show on ``reference`` (see the module docstring)."""
    scale = max(float(reference.detach().abs().max()), 1.0) if reference.numel() else 1.0
    return depth * k * EPS32 * scale


def assert_f32_close(actual: Any, expected: Any, *, depth: int = FORWARD_DEPTH, k: int = TINY_K) -> None:
    """``actual`` equals ``expected`` up to :func:`f32_bound` (same shape and dtype)."""
    import torch

    bound = f32_bound(expected, depth=depth, k=k)
    torch.testing.assert_close(actual, expected, atol=bound, rtol=0)


def assert_grads_close(mine: list[Any], theirs: list[Any]) -> None:
    """Float32 gradients of sums over tokens: equal up to the backward chain's rounding bound, each
    relative to its own tensor's scale (and each gradient is non-zero, so the check means something)."""
    assert len(mine) == len(theirs) > 2
    for a, b in zip(mine, theirs):
        assert b.abs().max() > 0
        bound = BACKWARD_DEPTH * TINY_K * EPS32 * float(b.abs().max())
        assert (a - b).abs().max() <= bound, ((a - b).abs().max(), bound)


def assert_grads_near_exact(mine: list[Any], exact: list[Any], *, what: str = "") -> None:
    """Float32 gradients ``mine`` against the same network's gradients computed in float64 (``exact``):
    within the backward chain's bound, relative to the largest entry of all of ``exact``.

    The scale is that of the whole set, not each tensor's own. A weight's gradient is a sum over the
    batch's tokens of its inputs times the gradient flowing back into it; where those terms cancel (a
    small gradient made of large parts), the rounding stays the size of the parts, that is of the
    gradients flowing back, whose scale the largest gradient entry gives. Measured on the tiny Llama (24
    random instances, the fused decoder and PEFT, AVX-512): up to 1.7e-4 of the largest entry, while a
    tensor's error reached 3.5e-4 of its own maximum (the bound of :func:`assert_grads_close`, which
    compares two float32 paths, is 3.7e-4 of each tensor's own maximum)."""
    assert len(mine) == len(exact) > 2
    scale = max(float(b.abs().max()) for b in exact)
    bound = BACKWARD_DEPTH * TINY_K * EPS32 * scale
    for i, (a, b) in enumerate(zip(mine, exact)):
        assert b.abs().max() > 0, f"{what}: gradient {i} is zero: the check would mean nothing"
        error = float((a.double() - b.double()).abs().max())
        assert error <= bound, (f"{what}: gradient {i} is {error:.3g} from float64, bound {bound:.3g} "
                                f"({error / scale:.2g} of the largest entry)")
