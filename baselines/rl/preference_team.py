"""The preference machinery MADPO and MARLHF share: their settings, the team that samples joint candidates
and turns them into pairs, and the state a resumed run continues with. The pairs' math (selection,
replay, the DPO and Bradley-Terry losses) is :mod:`baselines.rl.preference`'s.

=========================  ====================================================================
``PreferenceConfig``       candidates, pairs, the iterative form and its comparators, replay, KL
``Team``                   the policy, the envs and the comparator: candidates in, pairs out
``collect_offline``        the offline form's pairs, collected before training
``iterative_pairs``        one iteration's pairs of the iterative form (the team against its comparator)
``History``                ``comparator=history``: the team's weights of the last k iterations
``load_preference_state``  the pairs and comparator weights a resumed run continues with
=========================  ====================================================================
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from agents import placement
from baselines.infra import distributed
from baselines.infra.config import LearnerConfig, check_choice, check_ints, check_ranges
from baselines.infra.metrics import reward_metrics
from baselines.infra.play import probe_env, team_env_kwargs
from baselines.infra.run import Run
from baselines.rl.preference import (
    COMPARATORS,
    REPLAYS,
    SELECTIONS,
    Candidates,
    Comparator,
    Pair,
    PairBuffer,
    PromptCandidates,
    Replay,
    Selection,
    candidate_kl,
    matched_pairs,
    per_prompt,
    ranked_pairs,
    sample_candidates,
    select_pairs,
)


@dataclass
class PreferenceConfig(LearnerConfig):
    """The settings MADPO and MARLHF share: candidates, pairs, the iterative form and its comparators,
    replay, and the KL to the reference. Every field is a ``--flag``."""

    num_candidates: int = 8
    """N: joint candidates per prompt (every agent samples N responses; the j-th form candidate j). The
    reference's default is 80."""
    num_prompts: int = 16
    """Offline: prompts whose candidates are collected before training (drawn from the train split)."""
    num_problems: int = 2
    """Prompts per iteration in the iterative form; offline, prompts per collection batch."""
    pairs_per_prompt: int = 16
    """Pairs kept per prompt by ``pair_selection`` (the reference's default: 16)."""
    pair_selection: Selection = "reward_gap"
    """Which pairs of a prompt to keep: ``reward_gap`` (largest reward gap first, the reference's
    default), ``random``, ``all``, or (iterative) ``comparator_reward`` (the pairs whose comparator
    sample scored highest first: the strongest opponents)."""
    iterative: bool = False
    """The online form: every iteration the current team and a comparator sample candidates and new
    pairs join the replay buffer (see ``comparator``, ``replay``)."""
    comparator: Comparator = "current"
    """Iterative: who candidate j plays against. ``current``: the live team on its own RNG stream;
    ``initial``: the team before training; ``history``: the team ``comparator_history`` iterations back;
    ``model``: ``comparator_model`` (a model of another tokenizer plays through envs of its own
    tokenizer, and its responses join the pairs as their text in each agent's tokens)."""
    comparator_history: int = 1
    """k of ``comparator=history``."""
    comparator_model: str | None = None
    """The model of ``comparator=model`` (HF id or local directory)."""
    replay: Replay = "current"
    """Iterative: which iterations' pairs an update draws from: ``current`` (this iteration's),
    ``nearest_k`` (the last ``replay_k`` equally), ``all_history`` (every iteration equally) or
    ``lambda_decay`` (iteration weights proportional to (1 - lambda) lambda^age)."""
    replay_k: int = 2
    """k of ``replay=nearest_k``."""
    replay_lambda: float = 0.5
    """lambda of ``replay=lambda_decay``."""
    batch_pairs: int = 8
    """Pairs per update."""
    updates_per_iteration: int = 1
    """Updates (batches of pairs) per iteration."""
    micro_batch_pairs: int = 4
    """Pairs per forward/backward (gradient accumulation; the same gradient up to rounding)."""
    micro_batch_size: int = 0
    """Sampled rows per pass of the reference forward (the KL in the reward) and of MARLHF's RL update
    (0: all)."""
    micro_batch_tokens: int = 2048
    """Token budget of those passes (as MAGRPO's)."""
    kl_coef: float = 0.0
    """Weight of the KL to the reference (k3 estimator; the reference: adapters off). 0: none."""
    kl_in: Literal["reward", "loss"] = "loss"
    """Where the KL goes: ``reward`` subtracts kl_coef x the candidate's sequence KL (k3 per token,
    summed over its tokens and over agents) from its joint reward before pairs are ranked; ``loss`` adds
    kl_coef x the per-token k3 KL of the pair's responses to the loss."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_ints(self, {"num_candidates": 1, "num_prompts": 1, "num_problems": 1, "pairs_per_prompt": 1,
                          "comparator_history": 1, "replay_k": 1, "batch_pairs": 1, "updates_per_iteration": 1,
                          "micro_batch_pairs": 1, "micro_batch_size": 0, "micro_batch_tokens": 0})
        check_choice(self, "pair_selection", SELECTIONS)
        check_choice(self, "comparator", COMPARATORS)
        check_choice(self, "replay", REPLAYS)
        check_choice(self, "kl_in", ("reward", "loss"))
        check_ranges(self, {"replay_lambda": (0 < self.replay_lambda < 1, "in (0, 1)"),
                            "kl_coef": (self.kl_coef >= 0, ">= 0")})
        if self.num_turns != 1:
            raise ValueError(f"num_turns={self.num_turns}: the preference learners compare single-turn joint "
                             "responses; use num_turns=1")
        if not self.iterative:
            if self.num_candidates < 2:
                raise ValueError("num_candidates must be >= 2 offline: pairs compare a prompt's candidates")
            for name, value, default in (("pair_selection", self.pair_selection, "comparator_reward"),):
                if value == default:
                    raise ValueError(f"{name}={value!r} ranks comparator samples; it needs --iterative")
            for name in ("comparator", "replay"):
                if getattr(self, name) != "current":
                    raise ValueError(f"{name}={getattr(self, name)!r} belongs to the iterative form; add --iterative")
        if self.comparator == "model" and not self.comparator_model:
            raise ValueError("comparator='model' needs --comparator-model (HF id or local directory)")
        if self.comparator_model and self.comparator != "model":
            raise ValueError(f"comparator_model is set but comparator={self.comparator!r}; use --comparator model")

    def check_processes(self, world_size: int) -> None:
        """Every process samples its share of each batch of prompts (at least one prompt each)."""
        if self.num_problems < world_size:
            raise ValueError(f"num_problems={self.num_problems} cannot be shared among {world_size} processes; every "
                             f"process needs at least one prompt per batch (num_problems >= {world_size})")
        last = self.num_prompts % self.num_problems
        if not self.iterative and 0 < last < world_size:
            raise ValueError(f"num_prompts={self.num_prompts} leaves a last batch of {last} prompts for {world_size} "
                             "processes; make num_prompts a multiple of num_problems")


class Team:
    """The policy, the envs and the comparator of a preference run: candidates in, pairs out."""

    def __init__(self, config: PreferenceConfig, run: Run, extra_agents: Sequence[str] = (), **policy_kwargs: Any):
        self.config = config
        env_kwargs = config.build_env_kwargs()
        agents, _ = probe_env(config.env, max_new_tokens=config.max_new_tokens, **env_kwargs)
        config.check_agents(agents)
        self.agents = agents
        # Extra adapters (MARLHF's reward model) sit on the first agent's base with its LoRA settings.
        everyone = [*agents, *extra_agents]
        models, lora = config.model_of(agents), config.lora_of(agents)
        if isinstance(models, dict):
            models.update({x: models[agents[0]] for x in extra_agents})
        if isinstance(lora, dict):
            lora.update({x: lora[agents[0]] for x in extra_agents})
        self.policy = placement.build_policy(
            everyone, models, placement.device_for("data-parallel", everyone, run.info, config.device),
            dtype=config.dtype, lora=lora, mixed_batches=False, backend=config.backend,
            gradient_checkpointing=config.gradient_checkpointing, activation_budget_mb=config.activation_budget_mb,
            share_prompts=config.share_prompts, **policy_kwargs,
        )
        self.env_kwargs = team_env_kwargs(env_kwargs, self.policy, agents)
        self._base_env_kwargs = env_kwargs
        self._venvs: dict[tuple[int, str], Any] = {}
        self.n_train = len(self.venv(1).envs[0].task.problems("train"))
        # The team before training (LoRA adapters are built from the seed, so a resumed run gets the same).
        self.initial = self.snapshot()
        self.history: dict[int, dict[str, list[torch.Tensor]]] = {}
        self.comparator_policy = None
        self.comparator_foreign: dict[str, tuple[Any, Any, set[int], int]] = {}
        """Agent -> (the comparator's tokenizer, the agent's, the comparator's EOS ids, the agent's EOS id)
        where the comparator model speaks another tokenizer than the agent (empty: one tokenizer)."""
        self.last_venv: Any = None
        if config.iterative and config.comparator == "model":
            self.comparator_policy = self._comparator_model()

    def venv(self, num_prompts: int, which: str = "team") -> Any:
        """The vector env of ``num_prompts`` prompts' candidates, built once and kept: the team's, or
        (``which="model"``) the comparator model's, which speaks its tokenizers where they differ."""
        from llm_envs.core.vector import make_vec

        kwargs = self.env_kwargs
        if which == "model" and self.comparator_foreign:
            kwargs = team_env_kwargs(self._base_env_kwargs, self.comparator_policy, self.agents)
        else:
            which = "team"

        n = num_prompts * self.config.num_candidates
        if (n, which) not in self._venvs:
            self._venvs[n, which] = make_vec(self.config.env, n, max_new_tokens=self.config.max_new_tokens, **kwargs)
        return self._venvs[n, which]

    def close(self) -> None:
        for venv in self._venvs.values():
            venv.close()

    def _comparator_model(self) -> Any:
        from agents import MultiAgentPolicy
        from agents.team import tokenizer_fingerprint

        config = self.config
        other = MultiAgentPolicy.from_pretrained(self.agents, config.comparator_model, dtype=config.dtype,
                                                 device=config.device, mixed_batches=False, backend=config.backend)
        for a in self.agents:  # an agent of another tokenizer than the comparator's: text between them
            theirs, ours = other.tokenizer_of(a), self.policy.tokenizer_of(a)
            if tokenizer_fingerprint(theirs) != tokenizer_fingerprint(ours):
                self.comparator_foreign[a] = (theirs, ours, set(other.eos_token_ids_of(a)),
                                              int(next(iter(self.policy.eos_token_ids_of(a)))))
        return other

    def in_agents_tokens(self, prompts: Sequence[PromptCandidates]) -> list[PromptCandidates]:
        """The comparator model's candidates with each response in its agent's tokens: for an agent whose
        tokenizer is not the comparator's, the response's text (special tokens dropped) encoded by the
        agent's tokenizer, then the agent's EOS where the comparator's response ended with its own (the
        agent's log-prob of the pair's response then counts the end, as for the team's responses). The
        prompts stay the comparator's: the pairs take the team's (:meth:`matched`)."""
        if not self.comparator_foreign:
            return list(prompts)
        out = []
        for pc in prompts:
            responses = dict(pc.responses)
            for a, (theirs, ours, their_eos, our_eos) in self.comparator_foreign.items():
                converted = []
                for ids in pc.responses[a]:
                    row = ids.tolist()
                    text = theirs.decode(row, skip_special_tokens=True, clean_up_tokenization_spaces=False)
                    new = ours(text, add_special_tokens=False)["input_ids"]
                    if row and row[-1] in their_eos:
                        new.append(our_eos)
                    converted.append(torch.tensor(new, dtype=torch.long))
                responses[a] = converted
            out.append(PromptCandidates(pc.prompts, responses, pc.rewards))
        return out

    # ------------------------------------------------------------------ weights
    def snapshot(self) -> dict[str, list[torch.Tensor]]:
        """A copy of every agent's trained weights (adapters; the whole model under full fine-tuning)."""
        return {a: [p.detach().clone() for p in self.policy.parameters(a, value_head=False)] for a in self.agents}

    @torch.no_grad()
    def load_snapshot(self, snap: Mapping[str, Sequence[torch.Tensor]]) -> None:
        for a in self.agents:
            for p, v in zip(self.policy.parameters(a, value_head=False), snap[a]):
                p.copy_(v)

    # ------------------------------------------------------------------ candidates
    def candidates(self, problems: Sequence[int], iteration: int, stream: int, which: str = "team") -> Candidates:
        """This process's joint candidates of the batch ``problems`` (its contiguous share of them):
        ``which`` = ``team`` (the live weights) or a comparator (``current``, ``initial``, ``history``,
        ``model``); ``stream`` separates their sampling seeds. Every prompt's candidates are sampled
        under its own seed, so they do not depend on how the batch is split between processes."""
        config = self.config
        positions = distributed.shard(range(len(problems)))  # this process's prompts of the batch
        venv = self.venv(len(positions), which)
        if which == "team":
            self.last_venv = venv
        n = config.num_candidates
        group_seeds = [distributed.group_seed(config.seed, iteration, stream, b) for b in positions]
        env_seeds = [config.seed * 1_000_003 + iteration * len(problems) * n + b * n + j
                     for b in positions for j in range(n)]
        problems = [problems[b] for b in positions]
        sampling = config.sampling_kwargs(self.agents)
        policy, swap = self.policy, None
        if which == "model":
            policy = self.comparator_policy
        elif which == "initial":
            swap = self.initial
        elif which == "history":
            back = iteration - config.comparator_history
            swap = self.history.get(back, self.initial) if back > 0 else self.initial
        live = self.snapshot() if swap is not None else None
        if swap is not None:
            self.load_snapshot(swap)
        try:
            return sample_candidates(policy, venv, problems, n, group_seeds, env_seeds, sampling, config.max_new_tokens)
        finally:
            if live is not None:
                self.load_snapshot(live)

    def penalised(self, cands: Candidates, which: str = "team") -> np.ndarray:
        """The rewards that rank candidates: the task's, minus kl_coef x the sequence KL with kl_in=reward."""
        config = self.config
        if config.kl_coef > 0 and config.kl_in == "reward":
            policy = self.comparator_policy if which == "model" else self.policy
            return cands.rewards - config.kl_coef * candidate_kl(policy, cands, config)
        return cands.rewards

    def gathered(self, cands: Candidates, rewards: np.ndarray) -> list[PromptCandidates]:
        """Every process's prompts of a batch, in batch order, on every process."""
        return [p for part in distributed.gather_objects(per_prompt(cands, rewards)) for p in part]

    def offline_pairs(
        self, prompts: Sequence[PromptCandidates], iteration: int, rng: np.random.Generator
    ) -> list[Pair]:
        """Every ordered pair of each prompt's candidates with r_w > r_l, then the selection rule."""
        config = self.config
        pairs = []
        for pc in prompts:
            for c in select_pairs(ranked_pairs(pc.rewards), config.pair_selection, config.pairs_per_prompt, rng):
                pairs.append(Pair(dict(pc.prompts), {a: pc.responses[a][c.winner] for a in self.agents},
                                  {a: pc.responses[a][c.loser] for a in self.agents}, iteration, c.gap))
        return pairs

    def matched(self, team: Sequence[PromptCandidates], other: Sequence[PromptCandidates], iteration: int,
                rng: np.random.Generator) -> list[Pair]:
        """Team candidate j against comparator candidate j of each prompt, then the selection rule."""
        config = self.config
        pairs = []
        for mine, theirs in zip(team, other, strict=True):
            for c in select_pairs(matched_pairs(mine.rewards, theirs.rewards), config.pair_selection,
                                  config.pairs_per_prompt, rng):
                win, lose = (mine, theirs) if c.team_won else (theirs, mine)
                pairs.append(Pair(dict(mine.prompts), {a: win.responses[a][c.winner] for a in self.agents},
                                  {a: lose.responses[a][c.winner] for a in self.agents}, iteration, c.gap))
        return pairs


# ----------------------------------------------------------------------------------------- the update


# ----------------------------------------------------------------------------------------- the run
def collect_offline(team: Team, run: Run, config: PreferenceConfig) -> tuple[list[Pair], dict[str, float]]:
    """Offline: N candidates for ``num_prompts`` train prompts, ``num_problems`` prompts at a time;
    returns the selected pairs and the candidates' reward statistics."""
    from tqdm.auto import tqdm

    problems = run.draw_problems(team.n_train, config.num_prompts)
    pairs: list[Pair] = []
    rewards = []
    batches = [problems[i:i + config.num_problems] for i in range(0, len(problems), config.num_problems)]
    for c, batch in enumerate(tqdm(batches, desc="candidates", disable=not (config.progress and run.main))):
        cands = team.candidates([int(p) for p in batch], iteration=c, stream=0)
        rewards.append(distributed.gather_rows(cands.rewards))
        pairs += team.offline_pairs(team.gathered(cands, team.penalised(cands)), 0, run.rng)
    all_r = np.concatenate(rewards)
    return pairs, {"pref/candidate_reward": float(all_r.mean()), "pref/candidate_reward_std": float(all_r.std())}


def iterative_pairs(
    team: Team, run: Run, config: PreferenceConfig, iteration: int
) -> tuple[list[int], list[Pair], dict[str, float], Candidates]:
    """The iterative form's pairs of one iteration: the comparator's candidates first, then the team's
    (the envs keep the team's episodes for the transcripts). Returns the problems, the pairs, the
    metrics and this process's team candidates (MARLHF's RL stage trains on them)."""
    problems = [int(p) for p in run.draw_problems(team.n_train, config.num_problems)]
    which = config.comparator
    other = team.candidates(problems, iteration, stream=1, which=which)
    other_r = team.penalised(other, which)
    mine = team.candidates(problems, iteration, stream=0)
    mine_r = team.penalised(mine)
    theirs = team.gathered(other, other_r)
    if which == "model":  # a comparator of another tokenizer: its responses in the agents' tokens
        theirs = team.in_agents_tokens(theirs)
    pairs = team.matched(team.gathered(mine, mine_r), theirs, iteration, run.rng)
    mine_r, other_r = distributed.gather_rows(mine_r), distributed.gather_rows(other_r)
    decided = mine_r != other_r
    metrics = reward_metrics(distributed.gather_rows(dict(mine.infos[team.agents[0]])))
    metrics.update({
        "pref/comparator_reward": float(np.mean(distributed.gather_rows(other.rewards))),
        "pref/win_rate": float((mine_r > other_r)[decided].mean()) if decided.any() else 0.5,
        "pref/new_pairs": float(len(pairs)),
        "charts/reward_std": float(np.std(distributed.gather_rows(mine.rewards))),
    })
    return problems, pairs, metrics, mine


def preference_dir(run: Run) -> Path:
    return run.run_dir / "preference"


class History:
    """``comparator=history``: the team's weights after each of the last k iterations, in memory and in
    ``<run>/preference/weights_<step>.pt`` (a resumed run reads back those it needs)."""

    def __init__(self, directory: Path, k: int, enabled: bool, main: bool = True) -> None:
        self.directory, self.k, self.enabled, self.main = directory, k, enabled, main
        """``main``: this process writes and prunes the files (rank 0); every process keeps the weights."""

    def save(self, team: Team, step: int) -> None:
        if not self.enabled:
            return
        team.history[step] = team.snapshot()
        for old in [s for s in team.history if s < step - self.k]:
            del team.history[old]
        if not self.main:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"weights_{step:06d}.pt"
        tmp = path.with_suffix(".tmp")
        torch.save({a: [t.cpu() for t in v] for a, v in team.history[step].items()}, tmp)
        tmp.replace(path)
        for old in self.directory.glob("weights_*.pt"):
            if int(old.stem.split("_")[1]) < step - self.k:
                old.unlink()

    def load(self, team: Team, before: int) -> None:
        if not self.enabled:
            return
        for path in sorted(self.directory.glob("weights_*.pt")) if self.directory.exists() else []:
            s = int(path.stem.split("_")[1])
            if s > before:
                if self.main:
                    path.unlink(missing_ok=True)
            elif s >= before - self.k:
                try:
                    snap = torch.load(path, map_location="cpu", weights_only=True)
                except Exception as err:
                    raise ValueError(f"corrupt comparator weights {path}: {type(err).__name__}") from err
                device = team.initial[team.agents[0]][0].device
                team.history[s] = {a: [t.to(device) for t in v] for a, v in snap.items()}


def load_preference_state(team: Team, run: Run, config: PreferenceConfig) -> tuple[PairBuffer, History]:
    """The pairs and comparator weights a (resumed) run continues with: those of the iterations before
    its checkpoint's step; files of later iterations (an interrupted one's) are removed."""
    directory = preference_dir(run)
    if not config.resume and run.main and directory.exists():
        for path in list(directory.glob("pairs_*.pt")) + list(directory.glob("weights_*.pt")):
            path.unlink()  # a new run (--overwrite) starts without the old run's pairs
    # Offline: the collected pairs are iteration 0's, complete once the boundary records the collection.
    before = run.start_step if config.iterative else (1 if "collected" in run.extra else 0)
    buffer = PairBuffer.load(directory, before, prune=run.main) if config.resume else PairBuffer()
    history = History(directory, config.comparator_history, config.iterative and config.comparator == "history",
                      main=run.main)
    if config.resume:
        history.load(team, run.start_step)
    return buffer, history
