"""Tree-expanded multi-turn rollouts for MAGRPO (the reference's rollout), cross joint sampling,
early termination and per-agent, per-turn grouping (AT-GRPO). Docs: docs/magrpo.md.

A **node** is one history: an env at the start of a turn. At a node every agent samples G responses
to its prompt; the node's **joint actions** are

- ``aligned``: ``(g, g, ..., g)`` for g < G (G joint actions), or
- ``cross``: the Cartesian product of the agents' samples (G^N joint actions),

each scored by stepping its own copy of the node's env (the env decides rewards and, through its
transition, the next prompts: the learner never builds a prompt). Unless it is the last turn or the
node's mean joint reward exceeds ``termination_threshold``, every joint action j branches into a
child node (the stepped env copy) that samples G new responses per agent. Returns run leaves-up:
``R_j = r_j + gamma * mean(R of child j)``, ``R_j = r_j`` at a leaf. Each agent's sample is credited
with its joint return (aligned) or with the sum of the returns of the joint actions it takes part in
(cross, as the reference does). Advantages are group-relative over

- ``agent-turn`` (AT-GRPO, arXiv 2510.11062; the reference's tree): one agent's G samples at one
  node, so a sample is only compared with candidates under the same history, or
- ``problem-turn``: all of one agent's samples of one problem at one turn (every node of the level).

Every node of one level of the whole batch is generated in one ``policy.generate_joint`` call.
Responses per problem and agent: aligned trees ``G + G^2 + ... + G^T``; cross trees
``G * (1 + G^N + G^2N + ...)`` with G^N joint rewards per node.

>>> joint_indices(2, 2, "cross")
[(0, 0), (0, 1), (1, 0), (1, 1)]
>>> sample_credit(np.array([1.0, 2.0, 3.0, 10.0]), joint_indices(2, 2, "cross"), 2)
array([[ 3., 13.],
       [ 4., 12.]])
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

JointMode = Literal["aligned", "cross"]
Grouping = Literal["agent-turn", "problem-turn"]


# ----------------------------------------------------------------------------------------- math
def joint_indices(num_agents: int, num_generations: int, mode: JointMode) -> list[tuple[int, ...]]:
    """The joint actions of a node as tuples of per-agent sample indices (agents in env order)."""
    if mode == "aligned":
        return [(g,) * num_agents for g in range(num_generations)]
    if mode == "cross":
        return list(itertools.product(range(num_generations), repeat=num_agents))
    raise ValueError(f"joint_mode must be 'aligned' or 'cross', got {mode!r}")


def sample_credit(returns: np.ndarray, combos: Sequence[tuple[int, ...]], num_generations: int) -> np.ndarray:
    """Per-sample credit of one node: (J,) joint returns -> (N_agents, G).

    Sample g of agent a gets the sum of the returns of the joint actions it takes part in (aligned:
    exactly one, so its joint return)."""
    returns = np.asarray(returns, dtype=np.float64)
    if len(combos) != len(returns):
        raise ValueError(f"{len(returns)} returns for {len(combos)} joint actions")
    n_agents = len(combos[0])
    credit = np.zeros((n_agents, num_generations))
    for ret, combo in zip(returns, combos):
        for a, g in enumerate(combo):
            credit[a, g] += ret
    return credit


def node_returns(rewards: np.ndarray, child_returns: Sequence[np.ndarray] | None, gamma: float) -> np.ndarray:
    """(J,) rewards of a node's joint actions and, unless it is a leaf, each joint action's child's
    returns -> (J,) returns ``r_j + gamma * mean(child_j)``."""
    rewards = np.asarray(rewards, dtype=np.float64)
    if not child_returns:
        return rewards.copy()
    if len(child_returns) != len(rewards):
        raise ValueError(f"{len(child_returns)} children for {len(rewards)} joint actions")
    return rewards + gamma * np.array([float(np.mean(c)) for c in child_returns])


# ----------------------------------------------------------------------------------------- tree
@dataclass
class Node:
    """One history of one problem: the env at the start of turn ``turn`` and what was sampled there."""

    problem: int
    """Position of the problem in the iteration's batch."""
    turn: int
    env: Any
    """The env (a ``ParallelLLMEnv``) at the start of this node's turn; stepped copies become children."""
    obs: Mapping[str, Any]
    """Each agent's observation at this node."""
    row: int = -1
    """This node's row in its level's ``generate_joint`` call (samples rows ``row*G .. row*G+G-1``)."""
    combos: list[tuple[int, ...]] = field(default_factory=list)
    rewards: dict[str, np.ndarray] = field(default_factory=dict)
    """agent -> (J,) reward of each joint action."""
    totals: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """(J,) the task's joint reward of each joint action (``reward_total``): what termination reads."""
    infos: list[dict[str, Any]] = field(default_factory=list)
    """The first agent's info after each joint action (reward components for the metrics)."""
    children: list[Node] = field(default_factory=list)
    terminated: bool = False
    """Expanded no further because the mean joint reward exceeded the threshold."""
    returns: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class Level:
    """All nodes of one turn across the batch, generated together."""

    turn: int
    nodes: list[Node]
    generations: dict[str, Any]
    """agent -> ``agents.Generation`` with ``len(nodes) * G`` rows, node-major."""


def rollout_tree(
    policy: Any,
    template: Any,
    seeds: Sequence[int],
    options: Sequence[Mapping[str, Any]],
    *,
    num_generations: int,
    joint_mode: JointMode = "aligned",
    termination_threshold: float | None = None,
    sampling: Mapping[str, Any],
) -> list[Level]:
    """Expand one tree per problem (``seeds`` and ``options`` per problem: the root env of problem b
    is a copy of ``template`` reset with ``seeds[b]`` and ``options[b]``). Returns the levels in turn
    order; a level holds every node of that turn of every problem. Returns are filled in
    (:func:`fill_returns`)."""
    from baselines.tensors import pad_actions, strip_left_padding

    if len(seeds) != len(options):
        raise ValueError(f"one seed per problem: got {len(seeds)} seeds for {len(options)} problems")
    agents = list(template.possible_agents)
    g = num_generations
    combos = joint_indices(len(agents), g, joint_mode)
    frontier: list[Node] = []
    for b, (seed, opts) in enumerate(zip(seeds, options)):
        env = copy.deepcopy(template)
        obs, _ = env.reset(seed=int(seed), options=dict(opts))
        frontier.append(Node(problem=b, turn=0, env=env, obs=obs))
    levels: list[Level] = []
    while frontier:
        turn = frontier[0].turn
        prompts = {}
        for a in agents:
            ids = np.stack([node.obs[a]["observation"] for node in frontier])
            mask = np.stack([node.obs[a]["attention_mask"] for node in frontier])
            prompts[a] = tuple(torch.as_tensor(x) for x in strip_left_padding(ids, mask))
        gens = policy.generate_joint(prompts, g, **sampling)
        length = template.max_new_tokens
        actions = {a: pad_actions(gens[a].response_ids, length, policy.pad_token_id) for a in agents}
        children: list[Node] = []
        for row, node in enumerate(frontier):
            node.row, node.combos = row, combos
            rewards = {a: np.zeros(len(combos)) for a in agents}
            totals = np.zeros(len(combos))
            stepped = []
            for j, combo in enumerate(combos):
                env = copy.deepcopy(node.env)
                joint = {a: actions[a][row * g + combo[i]] for i, a in enumerate(agents)}
                obs, rew, terms, truncs, infos = env.step(joint)
                for a in agents:
                    rewards[a][j] = float(rew[a])
                totals[j] = float(infos[agents[0]]["reward_total"])
                node.infos.append(dict(infos[agents[0]]))
                stepped.append((env, obs, any(terms.values()) or any(truncs.values())))
            node.rewards, node.totals = rewards, totals
            node.terminated = termination_threshold is not None and float(totals.mean()) > termination_threshold
            if node.terminated:
                continue
            for env, obs, over in stepped:
                if over:
                    break  # every joint action of a node ends the episode at the same turn
                child = Node(problem=node.problem, turn=turn + 1, env=env, obs=obs)
                node.children.append(child)
                children.append(child)
        levels.append(Level(turn=turn, nodes=frontier, generations=gens))
        frontier = children
    return levels


def fill_returns(levels: Sequence[Level], gamma: float) -> None:
    """Returns of every node, leaves first: ``R_j = r_j + gamma * mean(R of child j)``."""
    for level in reversed(levels):
        for node in level.nodes:
            node.returns = {
                a: node_returns(node.rewards[a], [c.returns[a] for c in node.children], gamma)
                for a in node.rewards
            }


def tree_advantages(
    levels: Sequence[Level],
    agent: str,
    num_generations: int,
    *,
    grouping: Grouping = "agent-turn",
    baseline: str = "mean",
    normalize_std: bool = False,
) -> list[torch.Tensor]:
    """Advantages of ``agent``'s samples, one (rows,) tensor per level (rows node-major, as the level's
    generations). ``agent-turn``: one group per node (this agent's G samples under one history);
    ``problem-turn``: one group per problem and level."""
    from baselines.policy_gradient import group_advantages

    g = num_generations
    out = []
    for level in levels:
        index = list(level.nodes[0].rewards).index(agent)
        credit = torch.tensor(
            np.stack([sample_credit(n.returns[agent], n.combos, g)[index] for n in level.nodes]),
            dtype=torch.float32,
        )  # (nodes, G)
        if grouping == "agent-turn":
            adv = group_advantages(credit, baseline, normalize_std)  # type: ignore[arg-type]
        elif grouping == "problem-turn":
            adv = torch.zeros_like(credit)
            problems = torch.tensor([n.problem for n in level.nodes])
            for p in problems.unique():
                rows = problems == p
                adv[rows] = group_advantages(credit[rows].reshape(1, -1), baseline, normalize_std).reshape(-1, g)  # type: ignore[arg-type]
        else:
            raise ValueError(f"grouping must be 'agent-turn' or 'problem-turn', got {grouping!r}")
        out.append(adv.reshape(-1))
    return out


def count_responses(levels: Sequence[Level]) -> int:
    """Responses generated by all agents in a tree batch."""
    return sum(int(gen.response_ids.shape[0]) for level in levels for gen in level.generations.values())


def leaf_infos(levels: Sequence[Level]) -> list[dict[str, Any]]:
    """The infos of every joint action that ends an episode (last turn or a terminated node)."""
    return [info for level in levels for node in level.nodes if not node.children for info in node.infos]


def train_step(
    policy: Any,
    optimizers: Mapping[str, torch.optim.Optimizer],
    template: Any,
    seeds: Sequence[int],
    options: Sequence[Mapping[str, Any]],
    config: Any,
) -> dict[str, float]:
    """One MAGRPO iteration on tree rollouts (``config`` is a ``magrpo.Config``): expand, fill returns,
    compute each agent's advantages and update it on its samples of every level. Returns the metrics."""
    import time

    from baselines.play import Turn
    from baselines.policy_gradient import update_agent

    t0 = time.perf_counter()
    sampling = dict(
        max_new_tokens=config.max_new_tokens, temperature=config.temperature, top_p=config.top_p, top_k=config.top_k
    )
    levels = rollout_tree(
        policy,
        template,
        seeds,
        options,
        num_generations=config.num_generations,
        joint_mode=config.joint_mode,
        termination_threshold=config.termination_threshold,
        sampling=sampling,
    )
    t_rollout = time.perf_counter() - t0
    fill_returns(levels, config.gamma)
    grouping = config.resolved_grouping()
    turns = [Turn(prompts={}, responses=level.generations, rewards={}, infos={}) for level in levels]
    rows = max(t.responses[a].response_ids.shape[0] for t in turns for a in t.responses)
    metrics: dict[str, float] = {}
    for agent in template.possible_agents:
        per_level = tree_advantages(
            levels,
            agent,
            config.num_generations,
            grouping=grouping,
            baseline=config.baseline,
            normalize_std=config.normalize_std,
        )
        # update_agent reads advantages[rows of turn t, t]: pad the shorter levels (never read).
        adv = torch.zeros(rows, len(levels))
        for t, values in enumerate(per_level):
            adv[: len(values), t] = values
        stats = update_agent(policy, optimizers[agent], agent, turns, adv, config)
        for key, value in stats.items():
            metrics[f"agent_{agent}/{key}"] = value
        lengths = torch.cat([t.responses[agent].response_lengths.float().cpu() for t in turns])
        metrics[f"agent_{agent}/response_tokens"] = float(lengths.mean())
        metrics[f"agent_{agent}/advantage_abs"] = float(torch.cat(per_level).abs().mean())
        metrics[f"agent_{agent}/return"] = float(np.mean([n.returns[agent].mean() for n in levels[0].nodes]))
    leaves = leaf_infos(levels)
    metrics["reward/total"] = float(np.mean([i["reward_total"] for i in leaves]))
    for key in leaves[0]:
        if key.startswith("reward_") and key != "reward_total":
            metrics[f"reward/{key[len('reward_'):]}"] = float(np.mean([i[key] for i in leaves]))
    for level in levels:
        metrics[f"charts/turn_{level.turn}_reward"] = float(np.mean([n.totals.mean() for n in level.nodes]))
        metrics[f"charts/turn_{level.turn}_nodes"] = float(len(level.nodes))
    metrics["charts/responses"] = float(count_responses(levels))
    metrics["charts/joint_rewards"] = float(sum(len(n.combos) for level in levels for n in level.nodes))
    metrics["charts/terminated_nodes"] = float(sum(n.terminated for level in levels for n in level.nodes))
    metrics["charts/reward_std"] = float(np.std([i["reward_total"] for i in leaves]))
    metrics["charts/episode_return"] = float(np.mean([n.returns[template.possible_agents[0]].mean()
                                                       for n in levels[0].nodes]))
    metrics["charts/rollout_s"] = t_rollout
    return metrics
