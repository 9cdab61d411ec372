"""Tree-expanded multi-turn rollouts for MAGRPO (the reference's rollout), cross joint sampling,
early termination and per-agent, per-turn grouping (AT-GRPO), under the parallel and the sequential
protocol. Docs: docs/magrpo.md.

A **node** is one history: an env at the start of a turn. At a node every agent samples G responses
to its prompt; the node's **joint actions** are

- ``aligned``: ``(g, g, ..., g)`` for g < G (G joint actions), or
- ``cross``: the Cartesian product of the agents' samples (G^N joint actions),

each scored by stepping its own copy of the node's env (the env decides rewards and, through its
transition, the next prompts: the learner never builds a prompt). Unless it is the last turn or the
node's mean joint reward exceeds ``termination_threshold``, every joint action j branches into a
child node (the stepped env copy) that samples G new responses per agent. Returns run leaves-up:
``R_j = r_j + gamma * mean(R of child j)``, ``R_j = r_j`` at a leaf (with ``kl_in="reward"``, an agent's
``r_j`` is less ``kl_coef`` times the KL of its own sample in joint action j, :func:`penalize_kl`). Each
agent's sample is credited with its joint return (aligned) or with the sum of the returns of the joint
actions it takes part in (cross, as the reference does). Advantages are group-relative over

- ``agent-turn`` (AT-GRPO, arXiv 2510.11062; the reference's tree): one agent's G samples at one
  node, so a sample is only compared with candidates under the same history, or
- ``problem-turn``: all of one agent's samples of one problem at one turn (every node of the level).

**Sequential protocol** (an AEC env, roles in order, later roles see the earlier roles' responses of
the same turn): at a node the first agent samples G responses; each of them is stepped into its own
copy of the node's env, and the next agent answers *that* copy's prompt (which holds the response):
``aligned``, one sample per copy (G joint actions, agent k's g-th sample follows the g-th samples of
the agents before it); ``cross``, G samples per copy (the copies multiply: agent k has G^(k+1)
samples at a node, G^N joint actions). Agent k's samples that follow the same earlier responses are
consecutive, G at a time: those G are its ``agent-turn`` group in cross mode; in aligned mode the
node's G samples of an agent are its group.

Generation: under the parallel protocol every node of one level of the whole batch is generated in
one ``policy.generate_joint`` call; under the sequential protocol one call per agent and level (an
agent's prompts hold the earlier agents' responses). With ``sample_seeds`` (one per problem) every
node samples from its own seeds (derived from its problem's seed and its path in the tree), so a
tree does not depend on the rest of the batch or on the process that plays it (data-parallel runs).

Responses per problem and agent, parallel: aligned trees ``G + G^2 + ... + G^T``; cross trees
``G * (1 + G^N + G^2N + ...)`` with G^N joint rewards per node. Sequential: aligned the same; cross,
agent k generates ``G^(k+1)`` per node (nodes as in parallel cross).

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
    n_agents = len(combos[0]) if len(combos) else 0
    return np.stack([agent_credit(returns, combos, a, num_generations) for a in range(n_agents)])


def agent_credit(returns: np.ndarray, combos: Sequence[tuple[int, ...]], agent: int, num_samples: int) -> np.ndarray:
    """One agent's credit at one node: (J,) joint returns -> (num_samples,), sample i getting the sum of
    the returns of the joint actions whose ``combo[agent]`` is i (``combos``: each joint action's
    per-agent sample indices within the node; under the sequential protocol in cross mode agent k has
    G^(k+1) samples at a node).

    >>> agent_credit(np.array([1.0, 2.0, 3.0, 10.0]), [(0, 0), (0, 1), (1, 2), (1, 3)], 1, 4)
    array([ 1.,  2.,  3., 10.])
    """
    returns = np.asarray(returns, dtype=np.float64)
    if len(combos) != len(returns):
        raise ValueError(f"{len(returns)} returns for {len(combos)} joint actions")
    credit = np.zeros(num_samples)
    np.add.at(credit, np.array([c[agent] for c in combos], dtype=np.int64), returns)
    return credit


def child_seed(seed: int, joint_action: int) -> int:
    """The sampling seed of the child node of ``joint_action`` of a node sampled under ``seed``."""
    return int(np.random.SeedSequence([int(seed), 1, int(joint_action)]).generate_state(1)[0])


def prefix_seed(seed: int, agent: int, prefix: int) -> int:
    """Sequential protocol: the seed of agent ``agent``'s prompt row that follows the earlier agents'
    samples numbered ``prefix`` (0 for the first agent) at a node sampled under ``seed``."""
    return int(np.random.SeedSequence([int(seed), 0, int(agent), int(prefix)]).generate_state(1)[0])


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
    """The env (a ``ParallelLLMEnv`` or a ``SequentialLLMEnv``) at the start of this node's turn;
    stepped copies become children."""
    obs: Mapping[str, Any] | None
    """Parallel protocol: each agent's observation at this node (sequential: read from ``env``)."""
    seed: int | None = None
    """Seed of this node's samples (None: torch's global RNG)."""
    row: int = -1
    """This node's position in its level: agent a's samples are rows ``row*n .. row*n+n-1`` of the
    level's generation of a, n = ``sizes[a]``."""
    sizes: list[int] = field(default_factory=list)
    """Samples per agent at this node (G; sequential cross: G^(k+1) for the k-th agent)."""
    combos: list[tuple[int, ...]] = field(default_factory=list)
    """Each joint action's per-agent sample indices within this node."""
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
    """agent -> ``agents.Generation``, node-major (node i's samples of agent a: rows ``i*n .. i*n+n-1``,
    n = ``node.sizes[a]``)."""


@dataclass
class _Outcome:
    """One joint action of a node, played: the stepped env and what it returned."""

    env: Any
    obs: Mapping[str, Any] | None
    rewards: dict[str, float]
    info: dict[str, Any]
    over: bool
    combo: tuple[int, ...]


def is_sequential(env: Any) -> bool:
    """Whether ``env`` runs the sequential protocol (a PettingZoo AEC env: one role acts at a time)."""
    from pettingzoo import AECEnv

    return isinstance(env, AECEnv)


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
    sample_seeds: Sequence[int] | None = None,
) -> list[Level]:
    """Expand one tree per problem (``seeds`` and ``options`` per problem: the root env of problem b
    is a copy of ``template``, a parallel or sequential env, reset with ``seeds[b]`` and
    ``options[b]``). ``sample_seeds`` (one int >= 0 per problem, optional): the root's sampling seed;
    every node's samples then come from seeds of its own (:func:`child_seed`, :func:`prefix_seed`).
    Returns the levels in turn order; a level holds every node of that turn of every problem.
    Returns are filled in by :func:`fill_returns`."""
    if len(seeds) != len(options):
        raise ValueError(f"one seed per problem: got {len(seeds)} seeds for {len(options)} problems")
    if sample_seeds is not None and len(sample_seeds) != len(seeds):
        raise ValueError(f"one sample seed per problem: got {len(sample_seeds)} for {len(seeds)} problems")
    agents = list(template.possible_agents)
    joint_indices(len(agents), num_generations, joint_mode)  # checks the mode
    sequential = is_sequential(template)
    frontier: list[Node] = []
    for b, (seed, opts) in enumerate(zip(seeds, options)):
        env = copy.deepcopy(template)
        out = env.reset(seed=int(seed), options=dict(opts))
        root_seed = None if sample_seeds is None else int(sample_seeds[b])
        frontier.append(Node(problem=b, turn=0, env=env, obs=None if sequential else out[0], seed=root_seed))
    expand = _expand_sequential if sequential else _expand_parallel
    levels: list[Level] = []
    while frontier:
        turn = frontier[0].turn
        gens, outcomes = expand(policy, frontier, agents, num_generations, joint_mode, sampling)
        children: list[Node] = []
        for row, (node, played) in enumerate(zip(frontier, outcomes)):
            node.row = row
            node.combos = [o.combo for o in played]
            node.rewards = {a: np.array([o.rewards[a] for o in played]) for a in agents}
            node.totals = np.array([float(o.info["reward_total"]) for o in played])
            node.infos = [o.info for o in played]
            node.terminated = termination_threshold is not None and float(node.totals.mean()) > termination_threshold
            if node.terminated:
                continue
            for j, o in enumerate(played):
                if o.over:
                    break  # every joint action of a node ends the episode at the same turn
                seed = None if node.seed is None else child_seed(node.seed, j)
                child = Node(problem=node.problem, turn=turn + 1, env=o.env, obs=o.obs, seed=seed)
                node.children.append(child)
                children.append(child)
        levels.append(Level(turn=turn, nodes=frontier, generations=gens))
        frontier = children
    return levels


def _seed_kwargs(seeds: list[int | None]) -> dict[str, Any]:
    """``seeds=`` for ``generate_joint`` when the nodes are seeded (all or none are)."""
    return {} if seeds[0] is None else {"seeds": seeds}


def _expand_parallel(
    policy: Any, frontier: list[Node], agents: list[str], g: int, mode: JointMode, sampling: Mapping[str, Any]
) -> tuple[dict[str, Any], list[list[_Outcome]]]:
    """Every agent samples G responses at every node (one ``generate_joint`` call); each joint action
    steps its own copy of the node's env."""
    from agents.rows import pad_actions, strip_left

    combos = joint_indices(len(agents), g, mode)
    prompts = {}
    for a in agents:
        ids = np.stack([node.obs[a]["observation"] for node in frontier])  # type: ignore[index]
        mask = np.stack([node.obs[a]["attention_mask"] for node in frontier])  # type: ignore[index]
        prompts[a] = tuple(torch.as_tensor(x) for x in strip_left(ids, mask))
    gens = policy.generate_joint(prompts, g, **_seed_kwargs([n.seed for n in frontier]), **sampling)
    length = frontier[0].env.max_new_tokens
    actions = {a: pad_actions(gens[a].response_ids, length, policy.pad_token_id_of(a)) for a in agents}
    outcomes = []
    for row, node in enumerate(frontier):
        node.sizes = [g] * len(agents)
        played = []
        for combo in combos:
            env = copy.deepcopy(node.env)
            obs, rew, terms, truncs, infos = env.step({a: actions[a][row * g + combo[i]] for i, a in enumerate(agents)})
            over = any(terms.values()) or any(truncs.values())
            played.append(_Outcome(env, obs, {a: float(rew[a]) for a in agents}, dict(infos[agents[0]]), over, combo))
        outcomes.append(played)
    return gens, outcomes


def _expand_sequential(
    policy: Any, frontier: list[Node], agents: list[str], g: int, mode: JointMode, sampling: Mapping[str, Any]
) -> tuple[dict[str, Any], list[list[_Outcome]]]:
    """Agents in turn order: each answers the prompt of every partial joint action so far (its env
    copy, holding the earlier agents' responses), G samples per prompt for the first agent and in
    cross mode, one in aligned mode; one ``generate_joint`` call per agent for the whole level."""
    from agents.rows import pad_actions, strip_left

    length = frontier[0].env.max_new_tokens
    # Per node: the partial joint actions so far, (env after them, each earlier agent's sample index).
    states: list[list[tuple[Any, tuple[int, ...]]]] = [[(copy.deepcopy(node.env), ())] for node in frontier]
    gens: dict[str, Any] = {}
    for k, agent in enumerate(agents):
        per_row = 1 if (k > 0 and mode == "aligned") else g
        rows = [(i, env, combo) for i, node_states in enumerate(states) for env, combo in node_states]
        obs = [env.observe(agent) for _, env, _ in rows]
        ids, mask = strip_left(
            np.stack([o["observation"] for o in obs]), np.stack([o["attention_mask"] for o in obs])
        )
        seeds = [
            None if frontier[i].seed is None else prefix_seed(frontier[i].seed, k, combo[-1] if combo else 0)
            for i, _, combo in rows
        ]
        prompt = (torch.as_tensor(ids), torch.as_tensor(mask))
        gen = policy.generate_joint({agent: prompt}, per_row, **_seed_kwargs(seeds), **sampling)[agent]
        actions = pad_actions(gen.response_ids, length, policy.pad_token_id_of(agent))
        stepped: list[list[tuple[Any, tuple[int, ...]]]] = [[] for _ in frontier]
        for r, (i, env, combo) in enumerate(rows):
            prefix = combo[-1] if combo else 0
            for s in range(per_row):
                after = copy.deepcopy(env) if per_row > 1 else env  # the row's own copy when it branches
                after.step(actions[r * per_row + s])
                # Agent k's index within the node: its prompt row's position among the node's rows,
                # times the samples per row, plus the sample (aligned: the earlier agents' g).
                stepped[i].append((after, (*combo, prefix * per_row + s)))
        states = stepped
        gens[agent] = gen
    outcomes = []
    for node, node_states in zip(frontier, states):
        node.sizes = [g if (k == 0 or mode == "aligned") else g ** (k + 1) for k in range(len(agents))]
        played = []
        for env, combo in node_states:
            over = all(env.terminations[a] or env.truncations[a] for a in agents)
            rewards = {a: float(env.rewards[a]) for a in agents}
            played.append(_Outcome(env, None, rewards, dict(env.infos[agents[0]]), over, combo))
        outcomes.append(played)
    return gens, outcomes


def fill_returns(levels: Sequence[Level], gamma: float) -> None:
    """Returns of every node, leaves first: ``R_j = r_j + gamma * mean(R of child j)``."""
    for level in reversed(levels):
        for node in level.nodes:
            node.returns = {
                a: node_returns(node.rewards[a], [c.returns[a] for c in node.children], gamma)
                for a in node.rewards
            }


def penalize_kl(levels: Sequence[Level], agent: str, kls: Sequence[np.ndarray], kl_coef: float) -> None:
    """``kl_in="reward"``: subtract ``kl_coef`` times the KL of ``agent``'s own sample (``kls``: one
    (rows,) array per level, rows as the level's generation of ``agent``, :func:`sequence_kl
    <baselines.rl.policy_gradient.sequence_kl>`) from ``agent``'s reward of every joint action the sample
    takes part in, before :func:`fill_returns`. In cross mode a sample in k joint actions is charged k
    times, as it is credited with the k returns."""
    for level, kl in zip(levels, kls):
        kl = np.asarray(kl, dtype=np.float64)
        for node in level.nodes:
            index = list(node.rewards).index(agent)
            size = node.sizes[index]
            rows = [node.row * size + c[index] for c in node.combos]
            node.rewards[agent] = node.rewards[agent] - kl_coef * kl[rows]


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
    generations). ``agent-turn``: one group per node and G consecutive samples (this agent's G samples
    under one history; a node of the sequential cross mode has several); ``problem-turn``: one group
    per problem and level."""
    from baselines.rl.policy_gradient import group_advantages

    g = num_generations
    out = []
    for level in levels:
        index = list(level.nodes[0].rewards).index(agent)
        size = level.nodes[0].sizes[index]
        credit = torch.tensor(
            np.stack([agent_credit(n.returns[agent], n.combos, index, size) for n in level.nodes]),
            dtype=torch.float32,
        )  # (nodes, samples per node)
        if grouping == "agent-turn":
            adv = group_advantages(credit.reshape(-1, g), baseline, normalize_std)  # type: ignore[arg-type]
        elif grouping == "problem-turn":
            adv = torch.zeros_like(credit)
            problems = torch.tensor([n.problem for n in level.nodes])
            for p in problems.unique():
                rows = problems == p
                grouped = group_advantages(credit[rows].reshape(1, -1), baseline, normalize_std)  # type: ignore[arg-type]
                adv[rows] = grouped.reshape(-1, size)
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


def _empty_generation(agent: str, num_samples: int) -> Any:
    """An ``agents.Generation`` of no rows: a level this process's trees did not reach."""
    from agents import Generation

    none = torch.zeros((0, 1), dtype=torch.long)
    return Generation(agent, num_samples, none, none.clone(), none.clone(), none.clone(), torch.zeros((0, 1)))


def train_step(
    policy: Any,
    optimizers: Mapping[str, torch.optim.Optimizer],
    template: Any,
    seeds: Sequence[int],
    options: Sequence[Mapping[str, Any]],
    config: Any,
    sample_seeds: Sequence[int] | None = None,
) -> dict[str, float]:
    """One MAGRPO iteration on tree rollouts (``config`` is a ``magrpo.Config``): expand, fill returns,
    compute each agent's advantages and update it on its samples of every level. Returns the metrics.

    Data-parallel (several processes, each with its share of the problems, ``sample_seeds`` set): every
    process updates over the same number of levels (levels its trees did not reach are empty), the
    update sums the gradients over processes, and the metrics are those of every process's trees."""
    import time

    from baselines.infra import distributed
    from baselines.infra.play import Turn
    from baselines.rl.policy_gradient import response_kl, update_agent

    t0 = time.perf_counter()
    sampling = config.sampling_kwargs(list(template.possible_agents))
    levels = rollout_tree(
        policy,
        template,
        seeds,
        options,
        num_generations=config.num_generations,
        joint_mode=config.joint_mode,
        termination_threshold=config.termination_threshold,
        sampling=sampling,
        sample_seeds=sample_seeds,
    )
    t_rollout = time.perf_counter() - t0
    fill_returns(levels, config.gamma)
    agents = list(template.possible_agents)
    roots = levels[0].nodes
    root_returns = distributed.gather_rows(np.array([float(n.returns[agents[0]].mean()) for n in roots]))
    metrics: dict[str, float] = {}
    if config.kl_in == "reward" and config.kl_coef > 0:
        # Each agent's own samples' KL comes off its rewards; then the returns again, penalties included.
        for agent in agents:
            kls = [response_kl(policy, agent, level.generations[agent], config).numpy() for level in levels]
            penalize_kl(levels, agent, kls, config.kl_coef)
            every = distributed.gather_rows(np.concatenate(kls))
            metrics[f"agent_{agent}/kl"] = float(np.mean(every))
        fill_returns(levels, config.gamma)
    grouping = config.resolved_grouping()
    g = config.num_generations
    depth = int(distributed.gather_rows(np.array([len(levels)])).max())  # levels of the deepest tree anywhere
    turns = [Turn(prompts={}, responses=level.generations, rewards={}, infos={}) for level in levels]
    turns += [Turn(prompts={}, responses={a: _empty_generation(a, g) for a in agents}, rewards={}, infos={})
              for _ in range(depth - len(levels))]
    rows = max(t.responses[a].response_ids.shape[0] for t in turns for a in agents)
    for agent in agents:
        per_level = tree_advantages(
            levels, agent, g, grouping=grouping, baseline=config.baseline, normalize_std=config.normalize_std
        )
        # update_agent reads advantages[rows of turn t, t]: pad the shorter levels (never read).
        adv = torch.zeros(rows, depth)
        for t, values in enumerate(per_level):
            adv[: len(values), t] = values
        stats = update_agent(policy, optimizers[agent], agent, turns, adv, config)
        for key, value in stats.items():
            metrics[f"agent_{agent}/{key}"] = value
        gathered = distributed.gather_rows({
            "lengths": torch.cat([t.responses[agent].response_lengths.float().cpu() for t in turns]),
            "adv": torch.cat(per_level),
            "returns": torch.tensor([float(n.returns[agent].mean()) for n in roots]),
        })
        metrics[f"agent_{agent}/response_tokens"] = float(gathered["lengths"].mean())
        metrics[f"agent_{agent}/advantage_abs"] = float(gathered["adv"].abs().mean())
        metrics[f"agent_{agent}/return"] = float(gathered["returns"].mean())
    leaves = leaf_infos(levels)
    components = [k for k in leaves[0] if k.startswith("reward_")]
    last = distributed.gather_rows({k: np.array([float(i[k]) for i in leaves]) for k in components})
    metrics["reward/total"] = float(np.mean(last["reward_total"]))
    for key in components:
        if key != "reward_total":
            metrics[f"reward/{key[len('reward_'):]}"] = float(np.mean(last[key]))
    for t in range(depth):
        nodes = levels[t].nodes if t < len(levels) else []
        totals = distributed.gather_rows(np.array([float(n.totals.mean()) for n in nodes]))
        metrics[f"charts/turn_{t}_reward"] = float(np.mean(totals))
        metrics[f"charts/turn_{t}_nodes"] = float(len(totals))
    counts = distributed.all_sum([
        float(count_responses(levels)),
        float(sum(len(n.combos) for level in levels for n in level.nodes)),
        float(sum(n.terminated for level in levels for n in level.nodes)),
    ])
    metrics["charts/responses"], metrics["charts/joint_rewards"], metrics["charts/terminated_nodes"] = counts
    metrics["charts/reward_std"] = float(np.std(last["reward_total"]))
    metrics["charts/episode_return"] = float(np.mean(root_returns))
    metrics["charts/rollout_s"] = t_rollout
    return metrics
