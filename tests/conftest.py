"""Shared test set-up: offline hub, one tokenizer per session, fixtures for hub-only data sources."""

from __future__ import annotations

import functools
import os
from pathlib import Path

# No model or dataset hub is reachable here or in CI: fail fast instead of retrying the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tianshou (the clients extra: tests/test_clients.py, docs/marl-integration.md's snippet in tests/test_docs.py)
# compiles its buffer helpers with numba on first use, seconds of CPU for a run of a few steps; interpreted they
# are as exact. numba reads this when first imported, so it is set for the whole session: set in one test
# after another test's import, it leaves numba half-configured ("no attribute 'get_call_template'").
os.environ.setdefault("NUMBA_DISABLE_JIT", "1")
# The learners compile their update by default on a GPU (compile_update="auto"): tens of seconds a shape, which
# every smoke test would pay under make test-gpu. Off for the session; the compiled update's own tests ask for it.
os.environ.setdefault("LLM_ENVS_COMPILE_UPDATE", "off")

import pytest
from hub_fixtures import hub_fixture_rows, write_jsonl


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--device", default=None,
        help="torch device of the device-sensitive tests (tiny models are built there): cpu (default) or cuda; "
        "the LLM_ENVS_TEST_DEVICE environment variable does the same (make test-gpu)",
    )


def pytest_configure(config: pytest.Config) -> None:
    device = config.getoption("--device")
    if device:
        os.environ["LLM_ENVS_TEST_DEVICE"] = device  # read by tiny_models.testing_device, in xdist workers too


@pytest.fixture(scope="session")
def device():
    """The torch device the device-sensitive tests run on (``--device``; the CPU by default)."""
    from tiny_models import testing_device

    return testing_device()


@pytest.fixture(scope="session")
def hub_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hub-fixtures")


@pytest.fixture(scope="session")
def env_kwargs_for(hub_data_dir: Path):
    """``env_kwargs_for(env_id)``: extra make() kwargs so that the id builds offline."""

    def kwargs_for(env_id: str) -> dict:
        rows = hub_fixture_rows(env_id)
        if rows is None:
            return {}
        path = write_jsonl(hub_data_dir / (env_id.replace("/", "__") + ".jsonl"), rows)
        return {"data_path": str(path)}

    return kwargs_for


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny Llama and the default tokenizer saved as a local model directory (for ``--model``)."""
    from tiny_models import tiny_model

    from llm_envs.tokenizers import load_tokenizer

    tok = load_tokenizer(None)
    model = tiny_model(tok, seed=0, extra_eos=range(1000, 2500))
    path = tmp_path_factory.mktemp("tiny-model")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module's tests (``pytestmark = pytest.mark.usefixtures("one_thread")``): tiny
    models gain nothing from more, and on a machine shared with other jobs oversubscribed OpenMP threads
    spin (measured 20x slower passes on 2 busy cores)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def team_toks():
    """A team's two tokenizers (tests/team_kit.py): SmolLM2's default one and a byte-level BPE of 300 ids."""
    from team_kit import byte_bpe

    from llm_envs.tokenizers import load_tokenizer

    return load_tokenizer(None), byte_bpe()


@pytest.fixture(scope="session")
def team_dirs(team_toks, tmp_path_factory):
    """``llama`` (SmolLM2's tokenizer), ``qwen`` (the BPE tokenizer), ``qwen-smol`` (Qwen2 over SmolLM2's
    tokenizer, hidden 48: another width than the Llama's 32) as local model directories."""
    from team_kit import save_model_dir, tiny_qwen
    from tiny_models import tiny_model

    smol, bpe = team_toks
    root = tmp_path_factory.mktemp("team")
    return {
        "llama": save_model_dir(root / "llama", lambda t: tiny_model(t, 0, extra_eos=range(1000, 2500)), smol),
        "qwen": save_model_dir(root / "qwen", lambda t: tiny_qwen(t, extra_rows=0), bpe),
        "qwen-smol": save_model_dir(root / "qwen-smol", lambda t: tiny_qwen(t, seed=2, extra_rows=0), smol),
    }


@pytest.fixture
def count_calls(monkeypatch):
    """``count_calls(module, name)``: ``module.name`` replaced by a wrapper that calls it and appends to
    the list returned, which then holds one entry a call."""

    def install(module, name: str) -> list:
        calls: list = []
        real = getattr(module, name)

        def spy(*args, **kwargs):
            calls.append(1)
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)
        return calls

    return install


@pytest.fixture
def varied_writing_reward(monkeypatch):
    """A random tiny model's text mostly scores 0 on the writing reward, and a batch of equal rewards
    teaches nothing: this adds a small bonus per character, so that returns differ whatever was sampled
    and a short training run always moves the adapters."""
    from llm_envs.tasks.writing import WritingTask

    real_reward = WritingTask.reward

    def reward(self, problem, outputs):
        total, components = real_reward(self, problem, outputs)
        return total + 1e-3 * sum(len(text) for text in outputs.values()), components

    monkeypatch.setattr(WritingTask, "reward", reward)


TASK_METHODS = ("reward", "feedback", "prompt", "problems", "check_split")


@functools.cache
def _load_task_modules() -> None:
    """Every module of llm_envs.tasks, once: a test that loads one first and patches it is caught too."""
    import importlib
    import pkgutil

    import llm_envs.tasks

    for module in pkgutil.iter_modules(llm_envs.tasks.__path__):
        importlib.import_module(f"llm_envs.tasks.{module.name}")


def _task_methods() -> dict:
    """(task class, method name) -> the method the class itself defines (None where it inherits), for
    every subclass of llm_envs' Task."""
    from llm_envs.core.task import Task

    _load_task_modules()
    found, stack = {}, [Task]
    while stack:
        cls = stack.pop()
        for name in TASK_METHODS:
            found[(cls, name)] = cls.__dict__.get(name)
        stack.extend(cls.__subclasses__())
    return found


@pytest.fixture(autouse=True)
def _tasks_left_as_found():
    """A test that patches a task's method (its reward, say) must undo it (monkeypatch does): else every
    later test of this process scores with the patched reward, and ``WORKERS=1`` (or ``-p no:xdist``)
    runs the whole suite in one process."""
    before = _task_methods()
    yield
    after = _task_methods()
    changed = sorted(f"{cls.__module__}.{cls.__qualname__}.{name}" for (cls, name) in before.keys() & after.keys()
                     if before[(cls, name)] is not after[(cls, name)])
    assert not changed, f"the test left these task methods patched (use monkeypatch): {changed}"
