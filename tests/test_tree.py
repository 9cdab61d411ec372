"""Tree rollouts, cross joint sampling, early termination and AT-GRPO grouping (baselines/rl/tree.py),
checked against values worked out by hand on a scripted two-agent env.

The scripted policy answers sample g of prompt row b at its k-th call (tree level k) with the word
``<agent><k><b><g>``; the env's reward is a table over the joint words, so every node's rewards are
known in advance.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agents import Generation
from baselines.rl.tree import (
    child_seed,
    count_responses,
    fill_returns,
    joint_indices,
    node_returns,
    penalize_kl,
    prefix_seed,
    rollout_tree,
    sample_credit,
    tree_advantages,
)
from llm_envs.core.parallel import ParallelLLMEnv
from llm_envs.core.sequential import SequentialLLMEnv
from llm_envs.core.task import TemplateTask
from llm_envs.tokenizers import load_tokenizer


class ScriptedPolicy:
    """``generate_joint`` with fixed answers: sample g of row b at call k is the word ``<agent><k><b><g>``."""

    def __init__(self, tokenizer) -> None:
        self.tok = tokenizer
        self.pad_token_id = tokenizer.pad_token_id
        self.calls: list[dict[str, int]] = []
        self.prompts: list[dict[str, list[str]]] = []
        """Per call: each agent's prompt rows as text."""

        self.seeds: list[list[int] | None] = []
        """Per call: the ``seeds=`` it got (None: torch's global RNG)."""

    def pad_token_id_of(self, agent: str) -> int:
        return self.pad_token_id

    def generate_joint(self, prompts, num_samples, seeds=None, **sampling):
        level = len(self.calls)
        self.calls.append({a: len(ids) for a, (ids, _) in prompts.items()})
        self.seeds.append(None if seeds is None else list(seeds))
        self.prompts.append({a: [self.tok.decode(row[m.bool()]) for row, m in zip(ids, mask)]
                             for a, (ids, mask) in prompts.items()})
        out = {}
        for agent, (ids, mask) in prompts.items():
            words = [f"{agent}{level}{b}{g}" for b in range(len(ids)) for g in range(num_samples)]
            encoded = [self.tok(w, add_special_tokens=False)["input_ids"] for w in words]
            width = max(len(e) for e in encoded) + 1
            response = torch.full((len(words), width), self.pad_token_id)
            response_mask = torch.zeros(len(words), width, dtype=torch.long)
            for i, e in enumerate(encoded):
                response[i, : len(e)] = torch.tensor(e)
                response[i, len(e)] = self.tok.eos_token_id
                response_mask[i, : len(e) + 1] = 1
            out[agent] = Generation(
                agent=agent,
                num_samples=num_samples,
                prompt_ids=ids.repeat_interleave(num_samples, 0),
                prompt_mask=mask.repeat_interleave(num_samples, 0),
                response_ids=response,
                response_mask=response_mask,
                logprobs=torch.zeros(len(words), width),
            )
        return out


# Joint rewards by (x word, y word); anything else scores 0.
TABLE = {
    ("x000", "y000"): 1.0, ("x001", "y001"): 3.0,  # root (turn 0)
    ("x100", "y100"): 2.0, ("x101", "y101"): 4.0,  # child of root joint 0
    ("x110", "y110"): 0.0, ("x111", "y111"): 2.0,  # child of root joint 1
    ("x200", "y200"): 5.0, ("x201", "y201"): 1.0,  # turn 2, the only expanded turn-1 node's children
    ("x210", "y210"): 1.0, ("x211", "y211"): 1.0,
}
CROSS = {("x000", "y000"): 1.0, ("x000", "y001"): 2.0, ("x001", "y000"): 3.0, ("x001", "y001"): 10.0}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(None)


class QuotingTask(TemplateTask):
    """Under the sequential protocol a later role's prompt quotes the earlier roles' responses of the turn."""

    def prompt(self, role, problem, context):
        return super().prompt(role, problem, context) + "".join(f" After {r.text}." for r in context.visible.values())


def scripted_env(tokenizer, table, num_turns, protocol="parallel", roles=("x", "y"), **env_kwargs):
    task = QuotingTask(
        roles=roles,
        problems=[{"q": "one"}, {"q": "two"}],
        prompts={r: f"Say word {i} about {{q}}." for i, r in enumerate(roles)},
        reward=lambda problem, outputs: table.get(tuple(outputs[r].strip() for r in roles), 0.0),
    )
    env_class = SequentialLLMEnv if protocol == "sequential" else ParallelLLMEnv
    return env_class(
        task, tokenizer=tokenizer, num_turns=num_turns, max_new_tokens=8, max_prompt_tokens=512, **env_kwargs
    )


def expand(tokenizer, table, num_turns, mode="aligned", threshold=None, gamma=0.5, protocol="parallel",
           roles=("x", "y"), sample_seeds=None, problems=(0,), **env_kwargs):
    policy = ScriptedPolicy(tokenizer)
    levels = rollout_tree(
        policy,
        scripted_env(tokenizer, table, num_turns, protocol, roles, **env_kwargs),
        list(problems),
        [{"task_index": b} for b in problems],
        num_generations=2,
        joint_mode=mode,
        termination_threshold=threshold,
        sampling={"max_new_tokens": 8},
        sample_seeds=sample_seeds,
    )
    fill_returns(levels, gamma)
    return policy, levels


def test_two_agent_two_turn_tree_by_hand(tokenizer):
    policy, levels = expand(tokenizer, TABLE, num_turns=2)
    # One root with G=2 joint actions, each branching into a child: 3 nodes, 2 + 4 responses per agent.
    assert [len(level.nodes) for level in levels] == [1, 2]
    assert policy.calls == [{"x": 1, "y": 1}, {"x": 2, "y": 2}]  # one batched call per level
    assert count_responses(levels) == 2 * (2 + 4)
    root, (a, b) = levels[0].nodes[0], levels[1].nodes
    np.testing.assert_allclose(root.rewards["x"], [1.0, 3.0])
    np.testing.assert_allclose(a.rewards["x"], [2.0, 4.0])
    np.testing.assert_allclose(b.rewards["y"], [0.0, 2.0])
    # Leaves: R = r. Root: R_0 = 1 + 0.5 * mean(2, 4) = 2.5, R_1 = 3 + 0.5 * mean(0, 2) = 3.5.
    np.testing.assert_allclose(root.returns["x"], [2.5, 3.5])
    np.testing.assert_allclose(a.returns["y"], [2.0, 4.0])
    # Each node is its own group (agent-turn): root [-0.5, 0.5]; children [-1, 1] each.
    for agent in ("x", "y"):
        adv = tree_advantages(levels, agent, 2, grouping="agent-turn")
        torch.testing.assert_close(adv[0], torch.tensor([-0.5, 0.5]))
        torch.testing.assert_close(adv[1], torch.tensor([-1.0, 1.0, -1.0, 1.0]))
    # problem-turn: the whole level is one group: returns 2, 4, 0, 2 around their mean 2.
    adv = tree_advantages(levels, "x", 2, grouping="problem-turn")
    torch.testing.assert_close(adv[1], torch.tensor([0.0, 2.0, -2.0, 0.0]))
    # The children's prompts hold their parent's joint action (the env's feedback path).
    assert "x000" in a.env.text("x") and "x001" in b.env.text("x")


def test_kl_penalty_comes_off_each_agents_own_rewards_before_the_returns(tokenizer):
    _, levels = expand(tokenizer, TABLE, num_turns=2)
    # x's KL: root samples [1, 0]; turn-1 rows (node A: 0, 1; node B: 2, 3) [0, 2, 0, 0]; y's: none.
    penalize_kl(levels, "x", [np.array([1.0, 0.0]), np.array([0.0, 2.0, 0.0, 0.0])], 0.5)
    fill_returns(levels, 0.5)
    root, (a, b) = levels[0].nodes[0], levels[1].nodes
    np.testing.assert_allclose(root.rewards["x"], [0.5, 3.0])
    np.testing.assert_allclose(a.rewards["x"], [2.0, 3.0])
    np.testing.assert_allclose(b.rewards["x"], [0.0, 2.0])
    np.testing.assert_allclose(a.rewards["y"], [2.0, 4.0])  # y pays nothing
    # R_0 = 0.5 + 0.5 * mean(2, 3) = 1.75, R_1 = 3 + 0.5 * mean(0, 2) = 3.5; y's as without a penalty.
    np.testing.assert_allclose(root.returns["x"], [1.75, 3.5])
    np.testing.assert_allclose(root.returns["y"], [2.5, 3.5])
    torch.testing.assert_close(tree_advantages(levels, "x", 2)[0], torch.tensor([-0.875, 0.875]))
    np.testing.assert_allclose(root.totals, [1.0, 3.0])  # the task's reward (termination, metrics) stays
    # Cross: x's sample 0 takes part in joint actions (0, 0) and (0, 1), and pays in both.
    _, levels = expand(tokenizer, CROSS, num_turns=1, mode="cross")
    penalize_kl(levels, "x", [np.array([1.0, 0.0])], 1.0)
    fill_returns(levels, 0.5)
    np.testing.assert_allclose(levels[0].nodes[0].rewards["x"], [0.0, 1.0, 3.0, 10.0])
    torch.testing.assert_close(tree_advantages(levels, "x", 2)[0], torch.tensor([-6.0, 6.0]))  # credit 1, 13


def test_cross_mode_credit_on_a_2x2_table(tokenizer):
    # Hand-made table r[x_g][y_g] = [[1, 2], [3, 10]]: x0 takes part in 1 + 2, x1 in 3 + 10;
    # y0 in 1 + 3, y1 in 2 + 10.
    credit = sample_credit(np.array([1.0, 2.0, 3.0, 10.0]), joint_indices(2, 2, "cross"), 2)
    np.testing.assert_allclose(credit, [[3.0, 13.0], [4.0, 12.0]])
    _, levels = expand(tokenizer, CROSS, num_turns=1, mode="cross")
    root = levels[0].nodes[0]
    assert root.combos == [(0, 0), (0, 1), (1, 0), (1, 1)]
    np.testing.assert_allclose(root.rewards["x"], [1.0, 2.0, 3.0, 10.0])
    torch.testing.assert_close(tree_advantages(levels, "x", 2)[0], torch.tensor([-5.0, 5.0]))
    torch.testing.assert_close(tree_advantages(levels, "y", 2)[0], torch.tensor([-4.0, 4.0]))


def test_cross_tree_branches_every_joint_action(tokenizer):
    policy, levels = expand(tokenizer, CROSS, num_turns=2, mode="cross")
    # G^N = 4 joint actions at the root, each with its own child of 4 more: 1 + 4 nodes.
    assert [len(level.nodes) for level in levels] == [1, 4]
    assert count_responses(levels) == 2 * (2 + 4 * 2)
    root = levels[0].nodes[0]
    # Children's joint rewards are all 0 (the table has no level-1 words): R = r.
    np.testing.assert_allclose(root.returns["x"], root.rewards["x"])


def test_early_termination_prunes_a_branch(tokenizer):
    # Three turns, threshold 2.5: the root (mean 2) expands; child A (mean 3) stops; child B (mean 1)
    # expands into two turn-2 nodes.
    policy, levels = expand(tokenizer, TABLE, num_turns=3, threshold=2.5)
    assert [len(level.nodes) for level in levels] == [1, 2, 2]
    a, b = levels[1].nodes
    assert a.terminated and not a.children and not b.terminated and len(b.children) == 2
    c, d = levels[2].nodes  # call 2 sees rows 0, 1 = B's children
    np.testing.assert_allclose(c.returns["x"], [5.0, 1.0])
    np.testing.assert_allclose(d.returns["x"], [1.0, 1.0])
    # B: R = r + 0.5 * mean(child): [0 + 0.5 * 3, 2 + 0.5 * 1]; A is a leaf: R = r = [2, 4].
    np.testing.assert_allclose(b.returns["x"], [1.5, 2.5])
    np.testing.assert_allclose(a.returns["x"], [2.0, 4.0])
    root = levels[0].nodes[0]
    np.testing.assert_allclose(root.returns["x"], [1.0 + 0.5 * 3.0, 3.0 + 0.5 * 2.0])
    # Without the threshold the same tree has 1 + 2 + 4 nodes.
    _, full = expand(tokenizer, TABLE, num_turns=3)
    assert [len(level.nodes) for level in full] == [1, 2, 4]
    # A threshold below every node mean stops at the root.
    _, stopped = expand(tokenizer, TABLE, num_turns=3, threshold=-1.0)
    assert [len(level.nodes) for level in stopped] == [1]
    np.testing.assert_allclose(stopped[0].nodes[0].returns["x"], [1.0, 3.0])


def test_node_returns_and_joint_indices_errors():
    np.testing.assert_allclose(node_returns(np.array([1.0, 2.0]), [np.array([2.0]), np.array([0.0, 4.0])], 0.5),
                               [2.0, 3.0])
    with pytest.raises(ValueError, match="3 children for 2"):
        node_returns(np.array([1.0, 2.0]), [np.zeros(1)] * 3, 0.5)
    with pytest.raises(ValueError, match="'diagonal'"):
        joint_indices(2, 2, "diagonal")  # type: ignore[arg-type]
    assert len(joint_indices(3, 2, "cross")) == 8 and joint_indices(3, 2, "aligned") == [(0, 0, 0), (1, 1, 1)]


# ----------------------------------------------------------------------------------------- sequential
# Sequential protocol: x answers first; y answers each of x's samples in its own env copy, seeing it.
# Aligned, 2 turns, G=2: call 0: x at the root (1 row, 2 samples x000 x001); call 1: y, one row per x
# sample (y100 after x000, y110 after x001); call 2: x at the 2 children (x200 x201 | x210 x211); call 3:
# y, one row per x sample (y300 y310 | y320 y330).
SEQ = {
    ("x000", "y100"): 1.0, ("x001", "y110"): 3.0,  # root
    ("x200", "y300"): 2.0, ("x201", "y310"): 4.0,  # child of root joint 0
    ("x210", "y320"): 0.0, ("x211", "y330"): 2.0,  # child of root joint 1
}
# Cross, 1 turn, G=2: call 1 samples y twice per x sample: y100 y101 after x000, y110 y111 after x001.
SEQ_CROSS = {("x000", "y100"): 1.0, ("x000", "y101"): 2.0, ("x001", "y110"): 3.0, ("x001", "y111"): 10.0}


def test_sequential_aligned_two_turn_tree_by_hand(tokenizer):
    policy, levels = expand(tokenizer, SEQ, num_turns=2, protocol="sequential")
    assert [len(level.nodes) for level in levels] == [1, 2]
    # One call per agent and level; y's rows are x's samples (one each in aligned mode).
    assert policy.calls == [{"x": 1}, {"y": 2}, {"x": 2}, {"y": 4}]
    assert count_responses(levels) == 2 * (2 + 4)  # as under the parallel protocol
    # The second agent sees the first agent's response of the same node (and only that one).
    assert "x000" in policy.prompts[1]["y"][0] and "x001" not in policy.prompts[1]["y"][0]
    assert "x001" in policy.prompts[1]["y"][1] and "x000" not in policy.prompts[1]["y"][1]
    assert "x210" in policy.prompts[3]["y"][2] and "x211" in policy.prompts[3]["y"][3]
    root, (a, b) = levels[0].nodes[0], levels[1].nodes
    assert root.combos == [(0, 0), (1, 1)] and root.sizes == [2, 2]
    np.testing.assert_allclose(root.rewards["y"], [1.0, 3.0])
    np.testing.assert_allclose(a.rewards["x"], [2.0, 4.0])
    np.testing.assert_allclose(b.rewards["x"], [0.0, 2.0])
    # R_0 = 1 + 0.5 * mean(2, 4) = 2.5, R_1 = 3 + 0.5 * mean(0, 2) = 3.5; leaves R = r.
    np.testing.assert_allclose(root.returns["x"], [2.5, 3.5])
    for agent in ("x", "y"):
        adv = tree_advantages(levels, agent, 2, grouping="agent-turn")
        torch.testing.assert_close(adv[0], torch.tensor([-0.5, 0.5]))
        torch.testing.assert_close(adv[1], torch.tensor([-1.0, 1.0, -1.0, 1.0]))
    # Children hold their parent's joint action: child b's prompts have x001 and y110.
    assert "x001" in b.env.text("x") and "y110" in b.env.text("y")


def test_sequential_cross_credit_by_hand(tokenizer):
    policy, levels = expand(tokenizer, SEQ_CROSS, num_turns=1, mode="cross", protocol="sequential")
    assert policy.calls == [{"x": 1}, {"y": 2}]  # y: 2 rows (one per x sample), 2 samples each
    root = levels[0].nodes[0]
    assert root.sizes == [2, 4]
    # y's sample index within the node: x's sample * G + y's sample.
    assert root.combos == [(0, 0), (0, 1), (1, 2), (1, 3)]
    np.testing.assert_allclose(root.rewards["x"], [1.0, 2.0, 3.0, 10.0])
    # x0 takes part in 1 + 2, x1 in 3 + 10: credit [3, 13], advantages [-5, 5]. Each y sample is in one
    # joint action; its group is the 2 samples after the same x sample: [1, 2] and [3, 10].
    torch.testing.assert_close(tree_advantages(levels, "x", 2)[0], torch.tensor([-5.0, 5.0]))
    torch.testing.assert_close(tree_advantages(levels, "y", 2)[0], torch.tensor([-0.5, 0.5, -3.5, 3.5]))
    # problem-turn: y's 4 samples form one group around their mean 4.
    adv = tree_advantages(levels, "y", 2, grouping="problem-turn")[0]
    torch.testing.assert_close(adv, torch.tensor([-3.0, -2.0, -1.0, 6.0]))
    assert "x001" in policy.prompts[1]["y"][1] and "x000" not in policy.prompts[1]["y"][1]


@pytest.mark.parametrize(
    ("roles", "mode", "turns", "calls", "nodes", "responses"),
    [
        # cross, 2 agents, 2 turns: 4 joint actions per node -> 1 + 4 nodes; a node makes 2 x + 4 y responses.
        (("x", "y"), "cross", 2, [{"x": 1}, {"y": 2}, {"x": 4}, {"y": 8}], [1, 4], 5 * (2 + 4)),
        # cross, 3 agents, 1 turn: x 2, y 4, z 8 samples, 8 joint actions.
        (("x", "y", "z"), "cross", 1, [{"x": 1}, {"y": 2}, {"z": 4}], [1], 2 + 4 + 8),
        # aligned, 3 agents, 2 turns: 2 joint actions per node -> 1 + 2 nodes, 2 responses per agent and node.
        (("x", "y", "z"), "aligned", 2, [{"x": 1}, {"y": 2}, {"z": 2}, {"x": 2}, {"y": 4}, {"z": 4}], [1, 2],
         3 * 3 * 2),
    ],
)
def test_sequential_node_and_response_counts(tokenizer, roles, mode, turns, calls, nodes, responses):
    policy, levels = expand(tokenizer, {}, num_turns=turns, mode=mode, protocol="sequential", roles=roles)
    assert policy.calls == calls
    assert [len(level.nodes) for level in levels] == nodes
    assert count_responses(levels) == responses
    joint = 2 ** len(roles) if mode == "cross" else 2
    assert all(len(n.combos) == joint for level in levels for n in level.nodes)


def test_sequential_early_termination_prunes_a_branch(tokenizer):
    # 3 turns, threshold 2.5: root mean 2 expands; child a (mean 3) stops; child b (mean 1) expands.
    policy, levels = expand(tokenizer, SEQ, num_turns=3, protocol="sequential", threshold=2.5)
    assert [len(level.nodes) for level in levels] == [1, 2, 2]
    a, b = levels[1].nodes
    assert a.terminated and not a.children and len(b.children) == 2
    assert policy.calls[4:] == [{"x": 2}, {"y": 4}]  # b's two children only


@pytest.mark.parametrize("protocol", ["parallel", "sequential"])
def test_seeded_nodes_get_their_own_seeds(tokenizer, protocol):
    """With sample seeds every generate call gets one seed per prompt row: the root's is its problem's,
    a child's derives from its parent's and its joint action, a later sequential agent's row from the
    node's seed and the earlier agents' samples it follows."""
    policy, levels = expand(tokenizer, SEQ, num_turns=2, protocol=protocol, sample_seeds=[7, 9], problems=(0, 1))
    root0, root1 = (n.seed for n in levels[0].nodes)
    assert (root0, root1) == (7, 9)
    children = [c.seed for c in levels[1].nodes]
    assert children == [child_seed(7, 0), child_seed(7, 1), child_seed(9, 0), child_seed(9, 1)]
    if protocol == "parallel":
        assert policy.seeds == [[7, 9], children]
    else:
        y_rows = [prefix_seed(s, 1, g) for s in (7, 9) for g in (0, 1)]
        assert policy.seeds[:2] == [[prefix_seed(7, 0, 0), prefix_seed(9, 0, 0)], y_rows]
        assert policy.seeds[2] == [prefix_seed(s, 0, 0) for s in children]
    _, unseeded = expand(tokenizer, SEQ, num_turns=1, protocol=protocol)
    assert unseeded[0].nodes[0].seed is None


@pytest.mark.parametrize("protocol", ["parallel", "sequential"])
def test_seeded_tree_does_not_depend_on_the_batch(tiny_model_dir, tokenizer, protocol):
    """A problem's tree is the same alone and beside another problem (what makes data-parallel tree
    runs match one process), through a real (tiny) policy."""
    from agents import LoraSettings, MultiAgentPolicy

    torch.manual_seed(0)
    policy = MultiAgentPolicy.from_pretrained(["x", "y"], tiny_model_dir, lora=LoraSettings(rank=4, alpha=8.0),
                                              dtype="float32")
    env = scripted_env(tokenizer, {}, 2, protocol, stop_token_ids=list(policy.eos_token_ids))
    # top-k 10 as in tests/test_distributed.py (TOP_K): rounding that depends on the batch's size must not
    # move a draw over the tiny model's near-uniform vocabulary.
    sampling = {"max_new_tokens": 6, "temperature": 1.0, "top_p": 1.0, "top_k": 10}

    def grow(problems, seeds):
        return rollout_tree(policy, env, list(problems), [{"task_index": b} for b in problems], num_generations=2,
                            joint_mode="cross", sampling=sampling, sample_seeds=seeds)

    both, alone = grow([0, 1], [5, 6]), grow([1], [6])
    for level_both, level_alone in zip(both, alone, strict=True):
        for agent in ("x", "y"):
            whole, part = level_both.generations[agent], level_alone.generations[agent]
            n = len(part.response_ids)
            assert len(whole.response_ids) == 2 * n  # problem 1's nodes are the second half
            t = part.response_ids.shape[1]
            assert torch.equal(whole.response_ids[n:, :t], part.response_ids)
            assert not whole.response_mask[n:, t:].any()


# ----------------------------------------------------------------------------------------- learner
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(rollout="bush"), "'bush'"),
        (dict(joint_mode="crossed"), "'crossed'"),
        (dict(grouping="agent"), "'agent'"),
        (dict(termination_threshold=float("nan")), "nan"),
        (dict(num_turns=2, joint_mode="cross"), "rollout='tree'"),
        (dict(num_turns=2, grouping="agent-turn"), "rollout='tree'"),
        (dict(num_turns=2, termination_threshold=0.5), "rollout='tree'"),
        (dict(protocol="sequential"), "rollout='tree'"),
        (dict(env="sentiment/imdb-cory-v0"), "sequential .* use rollout='tree'"),
        (dict(protocol="aec"), "'aec'"),
    ],
)
def test_config_rejects_bad_tree_settings(overrides, message):
    from baselines.learners.magrpo import Config

    with pytest.raises(ValueError, match=message):
        Config(**overrides)


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [
        dict(rollout="tree", num_turns=2, termination_threshold=10.0, transition="plain"),
        dict(rollout="tree", num_turns=2, joint_mode="cross", grouping="problem-turn", transition="expert"),
        dict(rollout="tree", num_turns=2, joint_mode="cross", protocol="sequential", kl_in="reward", kl_coef=0.1),
    ],
    ids=["tree-plain", "cross-tree-expert", "sequential-cross-tree-kl-reward"],
)
def test_magrpo_tree_runs_train_every_agent(tiny_model_dir, tmp_path, overrides):
    import math

    from test_magrpo import adapter_state, tiny_config

    from baselines.infra.metrics import read_metrics
    from baselines.learners import magrpo

    if overrides.get("transition") == "expert":
        overrides = {**overrides, "expert_model": tiny_model_dir, "expert_max_new_tokens": 4}
    config = tiny_config(tiny_model_dir, tmp_path, num_problems=1, **overrides)
    result = magrpo.main(config)
    if config.transition == "expert":
        assert result["charts/expert_tokens"] > 0 and result["charts/expert_s"] > 0
    numbers = {k: v for k, v in result.items() if isinstance(v, float)}
    assert all(math.isfinite(v) for v in numbers.values()), numbers
    rows = [r for r in read_metrics(config.run_dir() / "metrics.jsonl") if "charts/responses" in r]
    # One problem, G=2, 2 agents: aligned 2 * (2 + 4) responses; cross 2 * (2 + 4 * 2); sequential cross:
    # 1 + 4 nodes of 2 (first agent) + 4 (second agent, 2 per first-agent sample) responses.
    cross, sequential = overrides.get("joint_mode") == "cross", overrides.get("protocol") == "sequential"
    expected = 30.0 if sequential else 20.0 if cross else 12.0
    assert [r["charts/responses"] for r in rows] == [expected, expected]
    assert rows[0]["charts/turn_1_nodes"] == (4.0 if cross else 2.0)
    for agent, state in adapter_state(config.run_dir()).items():
        assert sum(float(v.abs().sum()) for k, v in state.items() if "lora_B" in k) > 0, agent
        assert (f"agent_{agent}/kl" in result) == (config.kl_coef > 0)
