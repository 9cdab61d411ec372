"""Data-parallel learners: helpers in one process, and MAGRPO on 2 CPU processes (gloo) equal to 1.

The multi-process test launches this file under ``python -m torch.distributed.run --nproc_per_node 2``
(see ``worker`` at the bottom): each rank trains on its share of the problems and saves the adapters
it ends with, so the test can check that both ranks agree bit for bit and match a one-process run
over the same batch with the same seeds. Tiny Llama over the real tokenizer (tests/test_magrpo.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from agents import placement
from baselines.infra import distributed
from baselines.infra.distributed import DistInfo

REPO = Path(__file__).resolve().parents[1]

# The runs compared below sample with top-k 10. A float32 matmul rounds a row differently in batches
# of different row counts (AVX2's kernels for most pairs of sizes, AVX-512's for a few; docs/agents.md),
# and one process samples all the prompts in one batch where the ranks sample their shares. An
# inverse-CDF draw over the tiny model's near-uniform 49k-token distribution (token probabilities
# ~2e-5) turns that ~1e-6 into a different token now and then (measured: one token of MADPO's first
# rollout with AVX2's kernels); over 10 candidates (~0.1 each) the chance is ~1e-5 a token.
TOP_K = 10


# ----------------------------------------------------------------------------------------- one process
def test_single_process_helpers_are_identity(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    info = distributed.init_from_env()
    assert info == DistInfo() and info.is_main and not info.distributed
    assert not torch.distributed.is_initialized()  # the plain path never starts a process group
    assert distributed.is_main() and distributed.world_size() == 1 and distributed.rank() == 0
    assert distributed.shard(range(5)) == [0, 1, 2, 3, 4]
    assert distributed.all_sum([1.0, 2.5]) == [1.0, 2.5] and distributed.all_sum(3.0) == 3.0
    rows = {"a": torch.arange(3)}
    assert distributed.gather_rows(rows) is rows
    assert distributed.reduce_metrics({"x": 1}, weight=3) == {"x": 1.0}
    param = torch.nn.Parameter(torch.ones(2))
    param.grad = torch.full((2,), 4.0)
    distributed.all_reduce_grads([param])
    assert param.grad.tolist() == [4.0, 4.0]
    distributed.barrier()
    distributed.check_in_sync([param])
    distributed.check_equal(3, "turns")


def test_shard_splits_contiguously(monkeypatch):
    blocks = []
    for r in range(3):
        monkeypatch.setattr(distributed, "rank", lambda r=r: r)
        monkeypatch.setattr(distributed, "world_size", lambda: 3)
        blocks.append(distributed.shard(range(7)))
    assert blocks == [[0, 1, 2], [3, 4], [5, 6]]  # sizes differ by one at most; the union in order
    with pytest.raises(ValueError, match="cannot share 2 items among 3 processes"):
        distributed.shard(range(2))


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"WORLD_SIZE": "2"}, "RANK is not set"),
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE must be an integer, got 'two'"),
        ({"WORLD_SIZE": "2", "RANK": "2", "LOCAL_RANK": "0"}, "RANK=2"),
        ({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}, "MASTER_ADDR is not set"),
    ],
)
def test_init_from_env_rejects_bad_launcher_env(monkeypatch, env, message):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(RuntimeError, match=message):
        distributed.init_from_env()
    assert not torch.distributed.is_initialized()


def launcher_env(monkeypatch, rank: int) -> None:
    """The environment torchrun gives rank ``rank`` of 2 processes on one node."""
    env = {"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def fake_cuda(monkeypatch, count: int) -> list:
    """This process sees ``count`` CUDA devices; returns the calls made to CUDA or the process group,
    which record instead of running."""
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", d)))
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda **k: calls.append(("init", k["backend"])))
    monkeypatch.setattr(torch.distributed, "get_backend", lambda: calls[-1][1])
    return calls


def test_init_from_env_more_processes_than_gpus_names_the_fix(monkeypatch):
    """Two processes on a one-GPU machine: rank 1 would set cuda:1 and fail with CUDA's 'invalid device
    ordinal'; it raises before touching CUDA, saying to launch fewer processes or use the CPU."""
    launcher_env(monkeypatch, rank=1)
    calls = fake_cuda(monkeypatch, count=1)
    fix = r"LOCAL_RANK=1 and 1 is visible: launch at most 1 process a node \(torchrun --nproc_per_node 1\), " \
          r"or run on the CPU with --device cpu \(the gloo backend\)"
    with pytest.raises(RuntimeError, match=fix):
        distributed.init_from_env()
    with pytest.raises(RuntimeError, match="LOCAL_RANK=1 and 1 is visible"):
        distributed.init_from_env(device="cuda")
    calls = fake_cuda(monkeypatch, count=0)
    with pytest.raises(RuntimeError, match=r"0 are visible \(no CUDA on this machine\): run on the CPU"):
        distributed.init_from_env(backend="nccl")
    assert calls == []  # raised before any CUDA call or process group
    # The fixes: --device cpu takes gloo on a GPU machine; rank 1 of 2 on two GPUs takes cuda:1.
    calls = fake_cuda(monkeypatch, count=1)
    info = distributed.init_from_env(device="cpu")
    assert calls == [("init", "gloo")] and info.backend == "gloo"
    calls = fake_cuda(monkeypatch, count=2)
    info = distributed.init_from_env()
    assert calls == [("set_device", 1), ("init", "nccl")] and (info.rank, info.backend) == (1, "nccl")


def test_placement():
    agents = ["brief", "detailed"]
    two = DistInfo(rank=1, world_size=2, local_rank=1, local_world_size=2, backend="nccl")
    cpu = placement.device_for("data-parallel", agents, DistInfo(), cuda_devices=0)
    assert cpu == {"brief": None, "detailed": None}
    assert placement.device_for("data-parallel", agents, two, cuda_devices=2) == {
        "brief": "cuda:1",
        "detailed": "cuda:1",
    }
    assert placement.device_for("agent-per-device", agents, two, cuda_devices=4) == {
        "brief": "cuda:2",
        "detailed": "cuda:3",
    }
    with pytest.raises(ValueError, match=r"agent-per-device .* 2 agents .* 0 are visible \(no CUDA"):
        placement.device_for("agent-per-device", agents, DistInfo(), cuda_devices=0)
    with pytest.raises(ValueError, match="needs one CUDA device each"):
        placement.device_for("data-parallel", agents, two, cuda_devices=1)
    with pytest.raises(ValueError, match="'model-parallel'"):
        placement.device_for("model-parallel", agents, DistInfo())
    from baselines.learners.magrpo import Config

    with pytest.raises(ValueError, match="'fsdp'"):
        Config(placement="fsdp")  # type: ignore[arg-type]


def test_agent_per_device_on_cpu_fails_clearly(tiny_model_dir, tmp_path):
    from baselines.learners import magrpo

    config = tiny_config(tiny_model_dir, tmp_path, placement="agent-per-device", num_eval_problems=0)
    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has the CUDA devices agent-per-device needs")
    with pytest.raises(ValueError, match="agent-per-device .* use --placement data-parallel"):
        magrpo.main(config)


def test_group_seed():
    assert distributed.group_seed(0, 3, 0, 1) == distributed.group_seed(0, 3, 0, 1)
    seeds = {distributed.group_seed(s, i, t, b) for s in (0, 1) for i in range(3) for t in range(2) for b in range(3)}
    assert len(seeds) == 36
    with pytest.raises(ValueError, match="problem must be an int >= 0, got -1"):
        distributed.group_seed(0, 0, 0, -1)


# ----------------------------------------------------------------------------------------- policies
@pytest.fixture(scope="module")
def tiny_policy(tiny_model_dir):
    from tiny_models import testing_device

    from agents import LoraSettings, MultiAgentPolicy

    torch.manual_seed(0)
    return MultiAgentPolicy.from_pretrained(  # float32: exact comparisons (bf16 rounds with the batch's shape)
        ["brief", "detailed"], tiny_model_dir, lora=LoraSettings(rank=4, alpha=8.0), mixed_batches=False,
        dtype="float32", device=str(testing_device()),
    )


def prompt_batch(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, 9, (n,), generator=gen)
    ids = torch.randint(10, 2000, (n, 9), generator=gen)
    mask = (torch.arange(9) >= 9 - lengths[:, None]).long()
    return ids * mask, mask


def test_generate_per_group_does_not_depend_on_the_batch(tiny_policy):
    """The samples of a group are the same alone and next to other groups (what makes ranks agree)."""
    ids, mask = prompt_batch(6, seed=1)
    prompts = {a: (ids, mask) for a in tiny_policy.agents}
    sampling = dict(max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=TOP_K)
    state = torch.get_rng_state()
    full = distributed.generate_per_group(tiny_policy, prompts, 2, [11, 22, 33], **sampling)
    assert torch.equal(torch.get_rng_state(), state)  # the global stream is untouched
    middle = {a: (ids[2:4], mask[2:4]) for a in prompts}
    alone = distributed.generate_per_group(tiny_policy, middle, 2, [22], **sampling)
    for agent in tiny_policy.agents:
        whole, part = full[agent], alone[agent]
        t = part.response_ids.shape[1]
        assert torch.equal(whole.response_ids[2:4, :t], part.response_ids)
        assert torch.equal(whole.response_mask[2:4, :t], part.response_mask)
        assert not whole.response_mask[2:4, t:].any()
        torch.testing.assert_close(whole.logprobs[2:4, :t], part.logprobs)
        # Merged rows still score as recorded: padding is consistent.
        again = tiny_policy.logprobs(
            agent, whole.prompt_ids, whole.prompt_mask, whole.response_ids, whole.response_mask
        )
        torch.testing.assert_close(again, whole.logprobs, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="6 prompt rows do not make 2 groups of 2"):
        distributed.generate_per_group(tiny_policy, prompts, 2, [1, 2], **sampling)


def test_agent_per_device_policy_reads_and_writes_multi_agent_checkpoints(tiny_model_dir, tiny_policy, tmp_path,
                                                                          device):
    """Both agents' "devices" are the testing device: the wrapper's dispatch and checkpoint layout are what is
    tested, and that a checkpoint lands on the device of the policy that loads it, whichever wrote it."""
    from agents import LoraSettings, MultiAgentPolicy

    with torch.no_grad():
        for agent in tiny_policy.agents:
            for p in tiny_policy.parameters(agent):
                p.add_(0.01 * torch.randn_like(p))
    tiny_policy.save(tmp_path / "shared")
    split = placement.AgentPerDevicePolicy.from_pretrained(
        tiny_policy.agents, tiny_model_dir, {"brief": str(device), "detailed": str(device)},
        lora=LoraSettings(rank=4, alpha=8.0), dtype="float32",
    )
    split.load(tmp_path / "shared")
    ids, mask = prompt_batch(4, seed=2)
    resp, rmask = prompt_batch(4, seed=3)
    rmask = rmask.flip(1)  # right-padded responses
    for agent in tiny_policy.agents:
        assert {p.device for p in split.parameters(agent)} == {tiny_policy.parameters(agent)[0].device}
        expected = tiny_policy.logprobs(agent, ids, mask, resp, rmask)
        torch.testing.assert_close(split.logprobs(agent, ids, mask, resp, rmask), expected)
    split.save(tmp_path / "split")
    assert json.loads((tmp_path / "split" / "policy.json").read_text())["agents"] == ["brief", "detailed"]
    fresh = MultiAgentPolicy.from_pretrained(  # on the CPU: under --device cuda, a GPU's checkpoint read there
        ["brief", "detailed"], tiny_model_dir, lora=LoraSettings(rank=4, alpha=8.0), mixed_batches=False, device="cpu"
    )
    fresh.load(tmp_path / "split")
    for agent in tiny_policy.agents:
        for a, b in zip(fresh.parameters(agent), tiny_policy.parameters(agent), strict=True):
            assert a.device.type == "cpu" and torch.equal(a, b.cpu())
    gens = split.generate_joint({a: (ids, mask) for a in split.agents}, 1, max_new_tokens=4)
    assert sorted(gens) == ["brief", "detailed"]
    with pytest.raises(ValueError, match=r"holds agents \['brief'\], this policy has"):
        only = tmp_path / "only"
        MultiAgentPolicy.from_pretrained(["brief"], tiny_model_dir, lora=LoraSettings(rank=4, alpha=8.0)).save(only)
        split.load(only)


# ----------------------------------------------------------------------------------------- 2 processes
@pytest.fixture
def dp_device(device) -> str | None:
    """The ``device`` setting of the two-process runs: the CPU (gloo) by default, as in ``make test``, also
    on a machine with GPUs; under ``--device cuda`` each rank on ``cuda:<LOCAL_RANK>`` (nccl), skipped
    where fewer CUDA devices than the 2 processes are visible (NCCL needs one each: init_from_env says so)."""
    if device.type == "cpu":
        return "cpu"
    visible = torch.cuda.device_count()
    if visible < 2:
        pytest.skip(f"2 processes with nccl need 2 CUDA devices, {visible} visible (these tests run on the CPU "
                    "with gloo without --device cuda)")
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def policy_tensors(policy_dir: Path) -> dict[str, torch.Tensor]:
    """Every adapter tensor of a saved policy, keyed ``<agent>/<name>``."""
    from safetensors.torch import load_file

    files = sorted(policy_dir.glob("*.adapter.safetensors"))
    return {f"{f.name.split('.')[0]}/{k}": v for f in files for k, v in load_file(str(f)).items()}


def training_rows(run_dir: Path) -> list[dict[str, float]]:
    from baselines.infra.metrics import read_metrics

    keep = ("reward/", "losses/", "agent_", "charts/episode_return", "charts/reward_std")
    return [
        {k: v for k, v in row.items() if k.startswith(keep)} for row in read_metrics(run_dir / "metrics.jsonl")
        if "reward/total" in row
    ]


def test_magrpo_two_processes_match_one(tiny_model_dir, tmp_path, dp_device):
    """2 gloo processes x 2 iterations == 1 process over the same 3 problems (uneven shards: 2 + 1),
    adapters identical on both ranks; a 2-process run paused after one iteration and resumed ends
    the same. Both loss aggregations, the KL as a reward penalty (A) and as a loss term (B) and the clipped
    second epoch are exercised."""
    from baselines.learners import magrpo

    # float32: the comparison is to 1e-4, and in bf16 a different split of rows rounds differently.
    # Rows computed whole (no shared prompts): a pass's rounding then does not depend on which other
    # prompts share it, and the runs stay within rounding of each other through the second rollout. With
    # shared prompts the first update already differs by ~1e-5 (Adam's steps amplify rounding where a
    # gradient is near zero), enough to flip a sampled token in the next rollout.
    base = tiny_config(tiny_model_dir, tmp_path, num_problems=3, seed_per_problem=True, threads=1, dtype="float32",
                       share_prompts=False, top_k=TOP_K, device=dp_device)
    # A: token-mean, the KL as a reward penalty, evaluation on rank 0 (before and after), straight through.
    a = dataclasses.replace(base, run_name="a", num_eval_problems=1, kl_in="reward", kl_coef=0.1)
    # B: sequence-sum with KL and two epochs; the 2-process run pauses after iteration 1 and resumes.
    b = dataclasses.replace(
        base, run_name="b", num_eval_problems=0, loss_aggregation="sequence-sum", kl_coef=0.1, num_epochs=2
    )
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"a": dataclasses.asdict(a), "b": dataclasses.asdict(b), "out": str(tmp_path / "dp")}))
    threads = torch.get_num_threads()
    start = time.perf_counter()
    launch = launch_workers(spec)
    try:
        # The single-process reference runs meanwhile (threads=1: one core per process).
        one_a = magrpo.main(dataclasses.replace(a, output_dir=str(tmp_path / "one")))
        magrpo.main(dataclasses.replace(b, output_dir=str(tmp_path / "one")))
        output, _ = launch.communicate(timeout=240)
    finally:
        if launch.poll() is None:  # the launcher and its workers, nothing else: they share a new session
            os.killpg(launch.pid, signal.SIGKILL)
            launch.wait()
        torch.set_num_threads(threads)
    elapsed = time.perf_counter() - start
    assert launch.returncode == 0, output[-4000:]
    print(f"1 + 2 processes took {elapsed:.1f} s")

    for name in ("a", "b"):
        ranks = [policy_tensors(tmp_path / "dp" / f"{name}.rank{r}") for r in (0, 1)]
        saved = policy_tensors(find_checkpoint(tmp_path / "dp" / name) / "policy")  # written by rank 0
        reference = policy_tensors(find_checkpoint(tmp_path / "one" / name) / "policy")
        assert ranks[0].keys() == ranks[1].keys() == saved.keys() == reference.keys() and ranks[0]
        moved = 0.0
        for key, ref in reference.items():
            assert torch.equal(ranks[0][key], ranks[1][key]), f"{name}: ranks differ on {key}"
            assert torch.equal(ranks[0][key], saved[key]), f"{name}: checkpoint differs from rank 0 on {key}"
            # Within 0.5% of one AdamW step (lr 1e-2). LoRA A's first nonzero gradients (B starts at 0) are
            # near AdamW's eps, where a step's size follows the rounding of the gradient: the two runs sum
            # positions in different orders (one pass against two ranks' passes and an all-reduce). Measured
            # worst elements: 9.4e-6 with padded passes, 1.9e-5 with packed ones; the rest agree to ~1e-6.
            torch.testing.assert_close(saved[key], ref, rtol=1e-4, atol=5e-5,
                                       msg=lambda m, name=name, key=key: f"{name}: {key}: {m}")
            moved += float(ref.abs().sum()) if "lora_B" in key else 0.0
        assert moved > 0  # the adapters were trained (LoRA B starts at zero)
        rows_one, rows_dp = training_rows(tmp_path / "one" / name), training_rows(tmp_path / "dp" / name)
        assert len(rows_one) == len(rows_dp) == 2
        for one, two in zip(rows_one, rows_dp, strict=True):
            assert one.keys() == two.keys()
            for key in one:
                assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-5), (name, key)
    assert one_a["eval/total"] == pytest.approx(training_eval(tmp_path / "dp" / "a"), abs=1e-6)


@pytest.fixture(scope="module")
def team_dirs(tiny_model_dir, tmp_path_factory):
    """A two-base team as local model directories: ``brief`` the tiny Llama over SmolLM2's tokenizer,
    ``detailed`` a tiny Qwen2 over a 300-id byte-level BPE trained in process (tests/test_teams.py)."""
    from test_teams import byte_bpe, tiny_qwen
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("team-models") / "qwen"
    bpe = byte_bpe()
    bpe.save_pretrained(path)
    # A directory with a Qwen2 config.json loads the tokenizer as Qwen2's (one more special token) in
    # every process (the workers too): size the model by that tokenizer, loaded as they will load it.
    tiny_qwen(bpe, extra_rows=0).config.save_pretrained(path)
    tiny_qwen(AutoTokenizer.from_pretrained(path), extra_rows=0).save_pretrained(path)
    return {"brief": tiny_model_dir, "detailed": str(path)}


def team_config(team_dirs, tmp_path, **overrides):
    from test_magrpo import tiny_config

    settings = dict(agent_models=(f"detailed={team_dirs['detailed']}",),
                    agent_settings=("detailed.max_new_tokens=8", "detailed.learning_rate=5e-3"),
                    num_problems=3, seed_per_problem=True, threads=1, dtype="float32", share_prompts=False,
                    max_new_tokens=12, num_eval_problems=0, run_name="team", top_k=TOP_K)
    settings.update(overrides)
    return tiny_config(team_dirs["brief"], tmp_path, **settings)


def length_bonus_reward(monkeypatch=None) -> None:
    """The writing reward + 1e-3 per character (conftest's ``varied_writing_reward``, also for the
    workers): returns differ within a group, so both agents learn."""
    from llm_envs.tasks.writing import WritingTask

    real = WritingTask.reward

    def reward(self, problem, outputs):
        total, components = real(self, problem, outputs)
        return total + 1e-3 * sum(len(t) for t in outputs.values()), components

    if monkeypatch is None:
        WritingTask.reward = reward
    else:
        monkeypatch.setattr(WritingTask, "reward", reward)


def test_magrpo_team_of_two_bases_two_processes_match_one(team_dirs, tmp_path, monkeypatch, dp_device):
    """A Llama and a Qwen2 with different tokenizers: 2 gloo processes x 2 iterations == 1 process, as
    ``test_magrpo_two_processes_match_one`` checks for one base (same bounds)."""
    from baselines.learners import magrpo

    length_bonus_reward(monkeypatch)
    config = team_config(team_dirs, tmp_path, device=dp_device)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"learner": "team", "config": dataclasses.asdict(config), "out": str(tmp_path / "dp")}))
    threads = torch.get_num_threads()
    launch = launch_workers(spec)
    try:
        magrpo.main(dataclasses.replace(config, output_dir=str(tmp_path / "one")))
        output, _ = launch.communicate(timeout=240)
    finally:
        if launch.poll() is None:  # the launcher and its workers, nothing else: they share a new session
            os.killpg(launch.pid, signal.SIGKILL)
            launch.wait()
        torch.set_num_threads(threads)
    assert launch.returncode == 0, output[-4000:]
    ranks = [policy_tensors(tmp_path / "dp" / f"team.rank{r}") for r in (0, 1)]
    saved = policy_tensors(find_checkpoint(tmp_path / "dp" / "team") / "policy")
    reference = policy_tensors(find_checkpoint(tmp_path / "one" / "team") / "policy")
    assert ranks[0].keys() == ranks[1].keys() == saved.keys() == reference.keys()
    assert {k.split("/")[0] for k in reference} == {"brief", "detailed"}
    moved = {"brief": 0.0, "detailed": 0.0}
    for key, ref in reference.items():
        assert torch.equal(ranks[0][key], ranks[1][key]), f"ranks differ on {key}"
        assert torch.equal(ranks[0][key], saved[key]), f"checkpoint differs from rank 0 on {key}"
        torch.testing.assert_close(saved[key], ref, rtol=1e-4, atol=5e-5, msg=key)
        moved[key.split("/")[0]] += float(ref.abs().sum()) if "lora_B" in key else 0.0
    assert all(v > 0 for v in moved.values()), moved  # both agents were trained
    rows_one, rows_dp = training_rows(tmp_path / "one" / "team"), training_rows(tmp_path / "dp" / "team")
    assert len(rows_one) == len(rows_dp) == 2
    for one, two in zip(rows_one, rows_dp, strict=True):
        assert one.keys() == two.keys()
        for key in one:
            assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-5), key


def test_agent_per_device_team_of_two_bases_trains(team_dirs, tmp_path, monkeypatch, varied_writing_reward):
    """Agent-per-device placement of a two-base team through MAGRPO. No CPU machine has the devices,
    so each agent gets its own name of the CPU ("cpu", "cpu:0"): build_policy then makes the
    AgentPerDevicePolicy (one single-agent policy per device), which is what is tested."""
    from safetensors.torch import load_file

    from baselines.learners import magrpo

    built = {}
    real_build = placement.build_policy

    def build(*args, **kwargs):
        built["policy"] = real_build(*args, **kwargs)
        return built["policy"]

    monkeypatch.setattr(placement, "device_for", lambda *a, **k: {"brief": "cpu", "detailed": "cpu:0"})
    monkeypatch.setattr(placement, "build_policy", build)
    config = team_config(team_dirs, tmp_path, placement="agent-per-device", num_problems=2, checkpoint_every=1)
    result = magrpo.main(config)
    policy = built["policy"]
    assert isinstance(policy, placement.AgentPerDevicePolicy)
    assert policy.policies["detailed"].group("detailed").causal_lm.config.model_type == "qwen2"
    size = len(policy.tokenizer_of("detailed"))
    assert size < 400 and len(policy.tokenizer_of("brief")) == 49152
    assert all(isinstance(v, float) for v in result.values() if not isinstance(v, (str, int)))
    steps = [find_checkpoint(tmp_path / "team").parent / f"step_{s:06d}" / "policy" for s in (1, 2)]
    for agent in ("brief", "detailed"):
        a, b = (load_file(str(d / f"{agent}.adapter.safetensors")) for d in steps)
        assert any(not torch.equal(a[k], b[k]) for k in a), agent
        assert any(bool(b[k].abs().sum() > 0) for k in b if "lora_B" in k), agent  # gradients, not decay
    manifest = json.loads((steps[1] / "policy.json").read_text())
    assert manifest["team"]["detailed"]["tokenizer"]["size"] == size


def training_eval(run_dir: Path) -> float:
    from baselines.infra.metrics import read_metrics

    return [row for row in read_metrics(run_dir / "metrics.jsonl") if "eval/total" in row][-1]["eval/total"]


def all_policy_tensors(policy_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a saved policy (adapters and value heads), keyed ``<file stem>/<name>``."""
    from safetensors.torch import load_file

    files = sorted(policy_dir.glob("*.safetensors"))
    return {f"{f.name.rsplit('.', 1)[0]}/{k}": v for f in files for k, v in load_file(str(f)).items()}


def launch_workers(spec: Path) -> subprocess.Popen:
    """``worker(spec)`` on 2 processes under torch.distributed.run, in a session of their own."""
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        # The workers import this checkout (not whichever one the environment installed as editable).
        "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1"]
    command += ["--master_port", str(free_port()), __file__, str(spec)]
    return subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def test_ppo_and_cory_two_processes_match_one(tiny_model_dir, tmp_path, dp_device):
    """PPO on 2 gloo processes x 2 iterations == 1 process over the same 9 episodes (uneven shards:
    5 + 4), adapters and value heads identical on both ranks. Minibatches of 3 from a shared shuffle
    of the global rows, so most straddle the ranks; whitening, the value loss, the adaptive KL
    controller, rank-0 evaluation and a pause/resume after iteration 1 are all exercised. CORY (two
    models on the sequential pioneer -> observer env, roles swapped after iteration 1) likewise, with
    per-model value heads and with the centralised critic (there with the KL as a loss term)."""
    from test_ppo import tiny_ppo

    from baselines.learners import cory, ppo

    # float32: the comparison is to 1e-4, and in bf16 a different split of rows rounds differently.
    settings = dict(batch_size=9, minibatch_size=3, seed_per_episode=True, threads=1, init_kl_coef=0.2, dtype="float32",
                    top_k=TOP_K, device=dp_device)
    configs = {
        "ppo": tiny_ppo(tiny_model_dir, tmp_path, run_name="ppo", num_eval_problems=1, **settings),
        "cory": cory.Config(
            **{
                **dataclasses.asdict(tiny_ppo(tiny_model_dir, tmp_path, **settings)),
                "env": "sentiment/imdb-cory-v0",
                "run_name": "cory",
                "num_eval_problems": 0,
                "batch_size": 4,
                "minibatch_size": 2,
                "swap_every": 1,
                # Adam turns the last-bit differences that batch padding makes in near-zero gradient
                # entries into steps of ~lr; at 1e-2 that reaches 1.5e-5 on one weight in 10^4.
                "learning_rate": 1e-3,
            }
        ),
    }
    # CORY with the centralised critic (--critic central): its gradients are summed over ranks too; the KL
    # term of the loss is a token sum over the minibatch's global count, like the clipped losses.
    configs["cory_central"] = dataclasses.replace(configs["cory"], run_name="cory_central", critic="central",
                                                  kl_in="loss", adaptive_kl=False)
    spec = tmp_path / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "learner": "ppo",
                "configs": {k: dataclasses.asdict(c) for k, c in configs.items()},
                "out": str(tmp_path / "dp"),
            }
        )
    )
    threads = torch.get_num_threads()
    start = time.perf_counter()
    launch = launch_workers(spec)
    try:
        one = ppo.main(dataclasses.replace(configs["ppo"], output_dir=str(tmp_path / "one")))
        cory.main(dataclasses.replace(configs["cory"], output_dir=str(tmp_path / "one")))
        cory.main(dataclasses.replace(configs["cory_central"], output_dir=str(tmp_path / "one")))
        output, _ = launch.communicate(timeout=240)
    finally:
        if launch.poll() is None:  # the launcher and its workers, nothing else: they share a new session
            os.killpg(launch.pid, signal.SIGKILL)
            launch.wait()
        torch.set_num_threads(threads)
    print(f"1 + 2 processes took {time.perf_counter() - start:.1f} s")
    assert launch.returncode == 0, output[-4000:]

    from baselines.infra.metrics import read_metrics

    def rows(run_dir: Path) -> list[dict[str, float]]:
        keep = ("reward/", "losses/", "agent_")
        metrics = read_metrics(run_dir / "metrics.jsonl")
        return [{k: v for k, v in row.items() if k.startswith(keep)} for row in metrics if "reward/total" in row]

    for name in configs:
        dp_run, one_run = tmp_path / "dp" / name, tmp_path / "one" / name
        ranks = [all_policy_tensors(tmp_path / "dp" / f"{name}.rank{r}") for r in (0, 1)]
        saved = all_policy_tensors(find_checkpoint(dp_run) / "policy")
        reference = all_policy_tensors(find_checkpoint(one_run) / "policy")
        assert ranks[0].keys() == ranks[1].keys() == saved.keys() == reference.keys()
        assert any("value_head" in k for k in reference) and any("lora_B" in k for k in reference)
        for key, ref in reference.items():
            assert torch.equal(ranks[0][key], ranks[1][key]), f"{name}: ranks differ on {key}"
            assert torch.equal(ranks[0][key], saved[key]), f"{name}: checkpoint differs from rank 0 on {key}"
            # Within 0.5% of one AdamW step (lr 1e-2). LoRA A's first nonzero gradients (B starts at 0) are
            # near AdamW's eps, where a step's size follows the rounding of the gradient: the two runs sum
            # positions in different orders (one pass against two ranks' passes and an all-reduce). Measured
            # worst elements: 9.4e-6 with padded passes, 1.9e-5 with packed ones; the rest agree to ~1e-6.
            torch.testing.assert_close(saved[key], ref, rtol=1e-4, atol=5e-5,
                                       msg=lambda m, name=name, key=key: f"{name}: {key}: {m}")
        assert sum(float(v.abs().sum()) for k, v in reference.items() if "lora_B" in k) > 0  # trained

        rows_one, rows_dp = rows(one_run), rows(dp_run)
        assert len(rows_one) == len(rows_dp) == 2
        for a, b in zip(rows_one, rows_dp, strict=True):
            assert a.keys() == b.keys()
            for key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-5), (name, key)
    assert rows(tmp_path / "dp" / "ppo")[1]["agent_agent/kl_coef"] != 0.2  # the controller moved, on the global KL
    assert rows(tmp_path / "dp" / "cory")[1]["agent_model_0/role"] == 1.0  # model_0 observed in iteration 2
    assert one["eval/total"] == pytest.approx(training_eval(tmp_path / "dp" / "ppo"), abs=1e-6)


def test_maac_two_processes_match_one(team_dirs, tmp_path, dp_device):
    """MAAC on 2 gloo processes x 2 iterations == 1 process over the same 3 problems (uneven shards:
    2 + 1), 2 turns, two epochs: actors, critic adapter and value head identical on both ranks and
    equal to the one-process run to 1e-4; advantages are whitened over the whole batch and the
    critic's value loss is a mean over every rank's rows; the team's KL comes off the rewards. The
    2-process run pauses after iteration 1 and resumes; rank 0 evaluates.

    The team has two tokenizers (a Llama over SmolLM2's, a Qwen2 over a 300-id BPE) and the critic its
    own base (--critic-model, the Qwen2's): it reads the Llama's prompts and responses as text in the
    BPE's tokens, re-encoded on each rank from that rank's rows (docs/maac.md "Teams"). One tokenizer
    takes the same code with nothing re-encoded (its inputs pinned in tests/test_teams.py)."""
    from test_maac import tiny_maac

    from baselines.learners import maac

    # float32: the comparison is to 1e-4, and in bf16 a different split of rows rounds differently.
    config = tiny_maac(team_dirs["brief"], tmp_path, num_problems=3, num_turns=2, seed_per_problem=True, threads=1,
                       dtype="float32", run_name="maac", learning_rate=1e-3, critic_learning_rate=1e-3,
                       kl_in="reward", kl_coef=0.1, top_k=TOP_K, agent_models=(f"detailed={team_dirs['detailed']}",),
                       critic_model=team_dirs["detailed"], device=dp_device)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"learner": "maac", "config": dataclasses.asdict(config), "out": str(tmp_path / "dp")}))
    threads = torch.get_num_threads()
    start = time.perf_counter()
    launch = launch_workers(spec)
    try:
        one = maac.main(dataclasses.replace(config, output_dir=str(tmp_path / "one")))
        output, _ = launch.communicate(timeout=240)
    finally:
        if launch.poll() is None:  # the launcher and its workers, nothing else: they share a new session
            os.killpg(launch.pid, signal.SIGKILL)
            launch.wait()
        torch.set_num_threads(threads)
    print(f"1 + 2 processes took {time.perf_counter() - start:.1f} s")
    assert launch.returncode == 0, output[-4000:]

    dp_run, one_run = tmp_path / "dp" / "maac", tmp_path / "one" / "maac"
    ranks = [all_policy_tensors(tmp_path / "dp" / f"maac.rank{r}") for r in (0, 1)]
    saved = all_policy_tensors(find_checkpoint(dp_run) / "policy")
    reference = all_policy_tensors(find_checkpoint(one_run) / "policy")
    assert ranks[0].keys() == ranks[1].keys() == saved.keys() == reference.keys()
    assert any(k.startswith("critic.value_head") for k in reference)
    assert "charts/critic_reencode_fraction" in one
    for key, ref in reference.items():
        assert torch.equal(ranks[0][key], ranks[1][key]), f"ranks differ on {key}"
        assert torch.equal(ranks[0][key], saved[key]), f"checkpoint differs from rank 0 on {key}"
        torch.testing.assert_close(saved[key], ref, rtol=1e-4, atol=1e-5, msg=key)
    for name in ("brief", "detailed", "critic"):  # every adapter trained (LoRA B starts at zero)
        assert sum(float(v.abs().sum()) for k, v in reference.items() if k.startswith(name) and "lora_B" in k) > 0

    from baselines.infra.metrics import read_metrics

    def rows(run_dir: Path) -> list[dict[str, float]]:
        keep = ("reward/", "losses/", "agent_", "charts/critic", "charts/episode_return")
        metrics = read_metrics(run_dir / "metrics.jsonl")
        return [{k: v for k, v in row.items() if k.startswith(keep) and k != "charts/critic_reencode_fraction"}
                for row in metrics if "reward/total" in row]

    rows_one, rows_dp = rows(one_run), rows(dp_run)
    assert len(rows_one) == len(rows_dp) == 2
    for a, b in zip(rows_one, rows_dp, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-5), key
    assert one["eval/total"] == pytest.approx(training_eval(dp_run), abs=1e-6)


def test_preference_learners_two_processes_match_one(tiny_model_dir, tmp_path, monkeypatch, dp_device):
    """Iterative MADPO (comparator history, replay of every iteration) and iterative MARLHF on 2 gloo
    processes x 2 iterations == 1 process over the same 3 prompts (uneven shards: 2 + 1): each process
    samples its prompts' candidates, every process builds and draws the same pairs, the gradients of
    their shares are summed. Weights identical on both ranks and equal to the one-process run to
    float32 rounding; MADPO's 2-process run pauses after iteration 1 and resumes."""
    from test_preference import tiny

    from baselines.learners import madpo, marlhf

    # float32 and rows computed whole, as in the MAGRPO comparison above.
    common = dict(num_problems=3, threads=1, dtype="float32", share_prompts=False, iterative=True,
                  num_eval_problems=0, num_candidates=3, top_k=TOP_K, device=dp_device)
    dpo = tiny(madpo, tiny_model_dir, tmp_path, run_name="madpo", comparator="history", replay="all_history",
               **common)
    rlhf = tiny(marlhf, tiny_model_dir, tmp_path, run_name="marlhf", **common)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"learner": "preference", "madpo": dataclasses.asdict(dpo),
                                "marlhf": dataclasses.asdict(rlhf), "out": str(tmp_path / "dp")}))
    threads = torch.get_num_threads()
    launch = launch_workers(spec)
    try:
        # The workers' reward too (preference_worker): pairs need different rewards. Through monkeypatch:
        # this process runs the rest of the suite after it (WORKERS=1), with the task's own reward.
        length_bonus_reward(monkeypatch)
        madpo.main(dataclasses.replace(dpo, output_dir=str(tmp_path / "one")))
        marlhf.main(dataclasses.replace(rlhf, output_dir=str(tmp_path / "one")))
        output, _ = launch.communicate(timeout=240)
    finally:
        if launch.poll() is None:
            os.killpg(launch.pid, signal.SIGKILL)
            launch.wait()
        torch.set_num_threads(threads)
    assert launch.returncode == 0, output[-4000:]
    for name in ("madpo", "marlhf"):
        ranks = [all_policy_tensors(tmp_path / "dp" / f"{name}.rank{r}") for r in (0, 1)]
        saved = all_policy_tensors(find_checkpoint(tmp_path / "dp" / name) / "policy")
        reference = all_policy_tensors(find_checkpoint(tmp_path / "one" / name) / "policy")
        assert ranks[0].keys() == ranks[1].keys() == saved.keys() == reference.keys() and reference
        for key, ref in reference.items():
            assert torch.equal(ranks[0][key], ranks[1][key]), f"{name}: ranks differ on {key}"
            assert torch.equal(ranks[0][key], saved[key]), f"{name}: checkpoint differs from rank 0 on {key}"
            torch.testing.assert_close(saved[key], ref, rtol=1e-4, atol=5e-5,
                                       msg=lambda m, name=name, key=key: f"{name}: {key}: {m}")
        assert sum(float(v.abs().sum()) for k, v in reference.items() if "lora_B" in k) > 0
        one, two = training_rows(tmp_path / "one" / name), training_rows(tmp_path / "dp" / name)
        assert len(one) == len(two) == 2
        for a, b in zip(one, two, strict=True):
            assert a.keys() == b.keys()
            for key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-5), (name, key)


def parity_reward(monkeypatch=None) -> None:
    """Writing reward 10 for sources of odd length (+ a small bonus per character, so that returns differ):
    with termination_threshold=5 those problems' trees stop at the root while the others grow a second
    level, so the two ranks' trees differ in depth."""
    from llm_envs.tasks.writing import WritingTask

    real = WritingTask.reward

    def reward(self, problem, outputs):
        _, components = real(self, problem, outputs)
        return 10.0 * (len(problem["source"]) % 2) + 1e-3 * sum(len(t) for t in outputs.values()), components

    if monkeypatch is None:
        WritingTask.reward = reward
    else:
        monkeypatch.setattr(WritingTask, "reward", reward)


def test_magrpo_tree_two_processes_match_one(tiny_model_dir, tmp_path, monkeypatch, dp_device):
    """MAGRPO tree rollouts (sequential protocol, 2 turns, early termination) on 2 gloo processes x 2
    iterations == 1 process over the same 3 problems: every node samples from its own seeds, a rank
    whose trees all stopped at the root updates over an empty second level, metrics cover both ranks;
    each agent's KL comes off its rewards. The 2-process run pauses after iteration 1 and resumes."""
    from baselines.learners import magrpo

    parity_reward(monkeypatch)
    # TOP_K also keeps the last-bit differences of the two runs' weights after iteration 1 from moving a
    # draw (measured with top-k 0: the cumulative sum's rounding moves 49k boundaries).
    # seed=4: the sampled problems make rank 0's trees stop at the root in iteration 1 (rank 1's grow)
    # and the other way round in iteration 2.
    config = tiny_config(tiny_model_dir, tmp_path, num_problems=3, rollout="tree", num_turns=2,
                         protocol="sequential", termination_threshold=5.0, baseline="mean", seed_per_problem=True,
                         threads=1, dtype="float32", run_name="tree", num_eval_problems=1, learning_rate=1e-3, seed=4,
                         top_k=TOP_K, kl_in="reward", kl_coef=0.1, device=dp_device)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"learner": "tree", "config": dataclasses.asdict(config), "out": str(tmp_path / "dp")}))
    threads = torch.get_num_threads()
    start = time.perf_counter()
    launch = launch_workers(spec)
    try:
        one = magrpo.main(dataclasses.replace(config, output_dir=str(tmp_path / "one")))
        output, _ = launch.communicate(timeout=240)
    finally:
        if launch.poll() is None:  # the launcher and its workers, nothing else: they share a new session
            os.killpg(launch.pid, signal.SIGKILL)
            launch.wait()
        torch.set_num_threads(threads)
    print(f"1 + 2 processes took {time.perf_counter() - start:.1f} s")
    assert launch.returncode == 0, output[-4000:]

    depths = [json.loads((tmp_path / "dp" / f"depths.rank{r}.json").read_text()) for r in (0, 1)]
    assert depths[0] != depths[1], depths  # the ranks' trees differed in depth in some iteration
    dp_run, one_run = tmp_path / "dp" / "tree", tmp_path / "one" / "tree"
    ranks = [policy_tensors(tmp_path / "dp" / f"tree.rank{r}") for r in (0, 1)]
    saved = policy_tensors(find_checkpoint(dp_run) / "policy")
    reference = policy_tensors(find_checkpoint(one_run) / "policy")
    assert ranks[0].keys() == ranks[1].keys() == saved.keys() == reference.keys() and reference
    for key, ref in reference.items():
        assert torch.equal(ranks[0][key], ranks[1][key]), f"ranks differ on {key}"
        assert torch.equal(ranks[0][key], saved[key]), f"checkpoint differs from rank 0 on {key}"
        torch.testing.assert_close(saved[key], ref, rtol=1e-4, atol=1e-5, msg=key)
    assert sum(float(v.abs().sum()) for k, v in reference.items() if "lora_B" in k) > 0
    counted = ("charts/responses", "charts/joint_rewards", "charts/terminated_nodes")
    rows_one, rows_dp = training_rows(one_run), training_rows(dp_run)
    assert len(rows_one) == len(rows_dp) == 2
    for a, b in zip(rows_one, rows_dp, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-5), key
    from baselines.infra.metrics import read_metrics

    def tree_counts(run_dir: Path) -> list[dict[str, float]]:
        return [{k: v for k, v in r.items() if k.startswith("charts/turn_") or k in counted}
                for r in read_metrics(run_dir / "metrics.jsonl") if "charts/responses" in r]

    counts, dp_counts = tree_counts(one_run), tree_counts(dp_run)
    assert counts == dp_counts and any(c["charts/terminated_nodes"] > 0 for c in counts)
    assert one["eval/total"] == pytest.approx(training_eval(dp_run), abs=1e-6)


def tree_worker(spec: dict) -> None:
    """One rank of ``test_magrpo_tree_two_processes_match_one``: paused after iteration 1 and resumed;
    records the depth of its trees per iteration and saves the policy it ends with."""
    from baselines.learners import magrpo
    from baselines.rl import tree

    parity_reward()
    out = Path(spec["out"])
    captured, depths = {}, []
    build, grow = placement.build_policy, tree.rollout_tree

    def capture(*args, **kwargs):
        captured["policy"] = build(*args, **kwargs)
        return captured["policy"]

    def record(*args, **kwargs):
        levels = grow(*args, **kwargs)
        depths.append(len(levels))
        return levels

    placement.build_policy, tree.rollout_tree = capture, record
    rank = int(os.environ["RANK"])
    config = magrpo.Config(**{**spec["config"], "output_dir": str(out)})
    magrpo.main(dataclasses.replace(config, num_iterations=1))
    magrpo.main(dataclasses.replace(config, resume=True))
    captured["policy"].save(out / f"tree.rank{rank}")
    (out / f"depths.rank{rank}.json").write_text(json.dumps(depths))


def capture_policy(owner: Any, name: str) -> dict[str, Any]:
    """Wrap the policy builder ``owner.<name>`` (in this worker process) so that the returned dict's
    ``"policy"`` is the last policy it built, for the worker to save at the end."""
    captured: dict[str, Any] = {}
    build = getattr(owner, name)

    def capture(*args: Any, **kwargs: Any) -> Any:
        captured["policy"] = build(*args, **kwargs)
        return captured["policy"]

    setattr(owner, name, capture)
    return captured


def preference_worker(spec: dict) -> None:
    """One rank of ``test_preference_learners_two_processes_match_one``: MADPO paused after iteration 1
    and resumed, then MARLHF straight through; each rank saves the policy it ends with."""
    from baselines.learners import madpo, marlhf

    length_bonus_reward()
    out = Path(spec["out"])
    captured = capture_policy(placement, "build_policy")
    rank = int(os.environ["RANK"])
    config = madpo.Config(**{**spec["madpo"], "output_dir": str(out)})
    madpo.main(dataclasses.replace(config, num_iterations=1))
    madpo.main(dataclasses.replace(config, resume=True))
    captured["policy"].save(out / f"madpo.rank{rank}")
    marlhf.main(marlhf.Config(**{**spec["marlhf"], "output_dir": str(out)}))
    captured["policy"].save(out / f"marlhf.rank{rank}")


def maac_worker(spec: dict) -> None:
    """One rank of ``test_maac_two_processes_match_one``: paused after iteration 1 and resumed; each
    rank saves the policy it ends with."""
    import agents
    from baselines.learners import maac

    out = Path(spec["out"])
    captured = capture_policy(agents.MultiAgentPolicy, "from_pretrained")
    rank = int(os.environ["RANK"])
    config = maac.Config(**{**spec["config"], "output_dir": str(out)})
    first = maac.main(dataclasses.replace(config, num_iterations=1))
    assert ("eval/total" in first) == (rank == 0), sorted(first)
    maac.main(dataclasses.replace(config, resume=True))
    captured["policy"].save(out / f"maac.rank{rank}")


def ppo_worker(spec: dict) -> None:
    """One rank of ``test_ppo_and_cory_two_processes_match_one``: PPO paused after iteration 1 and
    resumed, then CORY straight through; each rank saves the policy it ends with."""
    import agents
    from baselines.learners import cory, ppo

    out = Path(spec["out"])
    captured = capture_policy(agents.MultiAgentPolicy, "from_pretrained")
    rank = int(os.environ["RANK"])
    config = ppo.Config(**{**spec["configs"]["ppo"], "output_dir": str(out)})
    first = ppo.main(dataclasses.replace(config, num_iterations=1))
    assert ("eval/total" in first) == (rank == 0), sorted(first)
    ppo.main(dataclasses.replace(config, resume=True))
    captured["policy"].save(out / f"ppo.rank{rank}")
    cory.main(cory.Config(**{**spec["configs"]["cory"], "output_dir": str(out)}))
    captured["policy"].save(out / f"cory.rank{rank}")
    cory.main(cory.Config(**{**spec["configs"]["cory_central"], "output_dir": str(out)}))
    captured["policy"].save(out / f"cory_central.rank{rank}")


def team_worker(spec: dict) -> None:
    """One rank of ``test_magrpo_team_of_two_bases_two_processes_match_one``."""
    from baselines.learners import magrpo

    out = Path(spec["out"])
    captured = capture_policy(placement, "build_policy")
    length_bonus_reward()
    magrpo.main(magrpo.Config(**{**spec["config"], "output_dir": str(out)}))
    captured["policy"].save(out / f"team.rank{os.environ['RANK']}")


def worker(spec_path: str) -> None:
    """One rank of ``test_magrpo_two_processes_match_one`` (run under torch.distributed.run)."""
    from baselines.learners import magrpo
    from baselines.learners.magrpo import Config

    spec = json.loads(Path(spec_path).read_text())
    if spec.get("learner") == "ppo":
        ppo_worker(spec)
        return
    if spec.get("learner") == "maac":
        maac_worker(spec)
        return
    if spec.get("learner") == "preference":
        preference_worker(spec)
        return
    if spec.get("learner") == "tree":
        tree_worker(spec)
        return
    if spec.get("learner") == "team":
        team_worker(spec)
        return
    out = Path(spec["out"])
    captured = capture_policy(placement, "build_policy")
    rank = int(os.environ["RANK"])

    def dump(name: str) -> None:
        captured["policy"].save(out / f"{name}.rank{rank}")

    a = Config(**{**spec["a"], "output_dir": str(out)})
    result = magrpo.main(a)
    assert ("eval/total" in result) == (rank == 0), sorted(result)
    dump("a")
    b = Config(**{**spec["b"], "output_dir": str(out)})
    magrpo.main(dataclasses.replace(b, num_iterations=1))
    magrpo.main(dataclasses.replace(b, resume=True))
    dump("b")


if __name__ == "__main__":
    worker(sys.argv[1])
else:
    from test_magrpo import tiny_config

    from baselines.infra.checkpoints import find_checkpoint
