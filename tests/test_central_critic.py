"""The centralised critic as an option of PPO and CORY (``--critic central``): MAAC's critic adapter and
value head (baselines/learners/maac.py) shared by every model. Its input holds every agent's prompt and response;
short runs train the actors and the critic (and leave the actors' own value heads alone); a resumed
CORY run equals an uninterrupted one; ``llm-envs eval`` reads the checkpoint."""

from __future__ import annotations

import dataclasses
import json
import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from test_ppo import tiny_ppo

from agents import Generation
from baselines.infra.checkpoints import find_checkpoint
from baselines.infra.cli import main as cli
from baselines.infra.metrics import read_metrics
from baselines.learners import cory, ppo
from baselines.learners.maac import CRITIC, central_context, central_forward


def generation(agent: str, prompts: list[list[int]], responses: list[list[int]], pad: int = 0) -> Generation:
    """A hand-made Generation: left-padded prompts, right-padded responses."""
    p_width, r_width = max(map(len, prompts)), max(map(len, responses))
    p_ids = torch.tensor([[pad] * (p_width - len(p)) + p for p in prompts])
    p_mask = torch.tensor([[0] * (p_width - len(p)) + [1] * len(p) for p in prompts])
    r_ids = torch.tensor([r + [pad] * (r_width - len(r)) for r in responses])
    r_mask = torch.tensor([[1] * len(r) + [0] * (r_width - len(r)) for r in responses])
    return Generation(agent, 1, p_ids, p_mask, r_ids, r_mask, torch.zeros(r_ids.shape))


GENS = {
    "ann": generation("ann", [[11, 12], [13]], [[31], [32, 33]]),
    "bob": generation("bob", [[21], [22, 23, 24]], [[41, 42], [43]]),
    "cid": generation("cid", [[51, 52, 53], [54]], [[61], [62, 63, 64]]),
}
ROLES = ["ann", "bob", "cid"]


def test_central_context_holds_every_agents_prompt_and_response():
    ids, mask = central_context(GENS, ROLES, "bob", pad_id=0)
    # Row 0: ann's prompt and response, cid's prompt and response (env order, bob left out), then bob's prompt.
    assert ids[0][mask[0].bool()].tolist() == [11, 12, 31, 51, 52, 53, 61, 21]
    assert ids[1][mask[1].bool()].tolist() == [13, 32, 33, 54, 62, 63, 64, 22, 23, 24]
    assert not mask[0, :2].any() and mask[1].all()  # left-padded to the longest row
    # The critic reads bob's response after the context: its input holds every agent's response.
    bob = GENS["bob"]
    for row in range(2):
        seen = ids[row][mask[row].bool()].tolist() + bob.response_ids[row][bob.response_mask[row].bool()].tolist()
        for agent, gen in GENS.items():
            response = gen.response_ids[row][gen.response_mask[row].bool()].tolist()
            assert any(seen[i : i + len(response)] == response for i in range(len(seen))), (agent, row)
    # The first role's context: the others' prompts and responses, then its own prompt.
    first, first_mask = central_context(GENS, ROLES, "ann", pad_id=0)
    assert first[0][first_mask[0].bool()].tolist() == [21, 41, 42, 51, 52, 53, 61, 11, 12]


def test_central_critic_values_read_the_other_agents_response(tiny_model_dir):
    """Changing only ann's response changes the critic's values at bob's tokens, and never bob's own
    log-probs (the actor sees its own prompt only)."""
    from agents import LoraSettings, MultiAgentPolicy

    torch.manual_seed(0)
    policy = MultiAgentPolicy.from_pretrained(
        ["ann", "bob", CRITIC], tiny_model_dir, lora=LoraSettings(rank=4, alpha=8.0), value_head=True, dtype="float32"
    )
    gens = {a: GENS[a] for a in ("ann", "bob")}
    other = dict(gens, ann=generation("ann", [[11, 12], [13]], [[35], [32, 36]]))
    b = gens["bob"]
    args = (b.prompt_ids, b.prompt_mask, b.response_ids, b.response_mask)
    with torch.no_grad():
        lp1, v1 = central_forward(policy, "bob", *args, central_context(gens, ["ann", "bob"], "bob", 0))
        lp2, v2 = central_forward(policy, "bob", *args, central_context(other, ["ann", "bob"], "bob", 0))
    torch.testing.assert_close(lp1, lp2)
    mask = b.response_mask.bool()
    assert (v1[mask] - v2[mask]).abs().min() > 0  # every token's value moved
    assert v1.shape == b.response_ids.shape and (v1[~mask] == 0).all()


def test_config_rejects_an_unknown_critic():
    with pytest.raises(ValueError, match="'shared'"):
        ppo.Config(critic="shared")  # type: ignore[arg-type]


def policy_files(run_dir) -> dict[str, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    directory = find_checkpoint(run_dir) / "policy"
    return {p.name.rsplit(".", 1)[0]: load_file(str(p)) for p in sorted(directory.glob("*.safetensors"))}


@pytest.mark.parametrize("learner", ["ppo", "cory"])
def test_smoke_trains_actors_and_the_central_critic(tiny_model_dir, tmp_path, monkeypatch, learner):
    import agents

    initial = {}
    build = agents.MultiAgentPolicy.from_pretrained

    def capture(*args, **kwargs):
        policy = build(*args, **kwargs)
        initial.update({name: {k: v.clone() for k, v in state.items()} for name, state in policy.state().items()})
        # (keys: the checkpoint's file names)
        return policy

    monkeypatch.setattr(agents.MultiAgentPolicy, "from_pretrained", capture)
    config = tiny_ppo(tiny_model_dir, tmp_path, env="sentiment/imdb-cory-v0", critic="central")
    if learner == "cory":
        config = cory.Config(**dataclasses.asdict(config), swap_every=1)
    result = (ppo if learner == "ppo" else cory).main(config)
    rows = read_metrics(config.run_dir() / "metrics.jsonl")
    for row in rows:
        assert all(math.isfinite(v) for v in row.values()), row
    models = ["pioneer", "observer"] if learner == "ppo" else ["model_0", "model_1"]
    last = [r for r in rows if "charts/iteration" in r][-1]
    for model in models:
        assert last[f"agent_{model}/value_loss"] > 0
    files = policy_files(config.run_dir())
    assert sorted(files) == sorted([f"{m}.{kind}" for m in [*models, CRITIC] for kind in ("adapter", "value_head")])
    for name in [*models, CRITIC]:  # LoRA B starts at 0: non-zero means trained
        assert any(t.abs().sum() > 0 for k, t in files[f"{name}.adapter"].items() if "lora_B" in k), name
    # The critic's head learned; the actors' own heads are not used and stay as they were built.
    initial = {name.rsplit(".", 1)[0]: tensors for name, tensors in initial.items()}  # file stems
    assert sorted(initial) == sorted(files)
    head = f"{CRITIC}.value_head"
    assert any(not torch.equal(tensor, initial[head][key]) for key, tensor in files[head].items())
    for model in models:
        for key, tensor in files[f"{model}.value_head"].items():
            assert torch.equal(tensor, initial[f"{model}.value_head"][key]), (model, key)
    assert "eval/total" in result and "eval_before/total" in result


def test_cory_central_resume_equals_uninterrupted_and_eval_reads_it(tiny_model_dir, tmp_path, capsys):
    settings = dataclasses.asdict(tiny_ppo(tiny_model_dir, tmp_path, num_eval_problems=0, critic="central"))
    settings.update(env="sentiment/imdb-cory-v0", swap_every=1)
    straight = cory.Config(**{**settings, "run_name": "straight"})
    cory.main(straight)
    resumed = cory.Config(**{**settings, "run_name": "resumed", "num_iterations": 1})
    cory.main(resumed)
    cory.main(dataclasses.replace(resumed, num_iterations=2, resume=True))
    a, b = policy_files(straight.run_dir()), policy_files(resumed.run_dir())
    assert sorted(a) == sorted(b)
    for name, tensors in a.items():
        for key, tensor in tensors.items():
            assert torch.equal(tensor, b[name][key]), (name, key)
    optimizers = torch.load(find_checkpoint(resumed.run_dir()) / "optimizers.pt", weights_only=True)
    assert sorted(optimizers) == ["critic", "model_0", "model_1"]
    assert cli(["eval", "--checkpoint", str(resumed.run_dir()), "--num-problems", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert "eval/total" in result
