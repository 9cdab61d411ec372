"""Acting on env observations: ``env.step(policy.act(obs))`` for parallel, AEC and vector envs, in
response or token mode, with Dict or flat observations."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from agents.rows import pad_actions, strip_left, to_tensor
from agents.settings import Sampling


class ActingMixin:
    """``act`` of :class:`agents.policy.MultiAgentPolicy`."""

    def act(
        self,
        observations: Mapping[str, Any],
        agent: str | None = None,
        *,
        max_new_tokens: int | None = None,
        sampling: Sampling | None = None,
        env: Any = None,
    ) -> Any:
        """Env observations in, env actions out: ``env.step(policy.act(obs))``.

        - Parallel env: ``{agent: observation}`` -> ``{agent: action}``.
        - AEC env: ``policy.act(obs, agent=env.agent_selection)`` with one observation -> one action.
        - Vector env: the same with a leading N axis on every array -> N actions per agent.

        Observations may take every form the envs give:

        - Response mode (``step_unit="response"``), ``{"observation": (L,) ids, "attention_mask": (L,)}``:
          the action is the response ids, ``(max_new_tokens,)`` int64 padded with the pad (= EOS) id
          after its end. ``max_new_tokens`` must match the env's action length; it defaults to
          ``sampling.max_new_tokens``.
        - Token mode (``step_unit="token"``; the Dict also holds ``action_mask``): the action is one
          token id (an ``int``; an (N,) int64 array for a vector env), sampled from the agent's adapter
          after the observation (its prompt and its response so far) among the tokens the action mask
          allows. A row whose mask allows a single token (an agent that has finished or waits for its
          turn) gets that token without running the model; a sampled EOS is returned as the pad id,
          which ends the response in every env. Each call runs the whole observation (no KV cache
          between steps): convenient for generic MARL loops, not a fast decoder. ``max_new_tokens`` is
          not used.
        - Flat observations (``obs_format="flat"``, either step unit): pass ``env=`` the env or vector
          env the observations come from; its ``split_flat`` cuts them into the parts above.

        Only the columns that are padding in every row are dropped before generating, so the result
        does not depend on how much left padding the env adds.
        """
        if sampling is not None and not isinstance(sampling, Sampling):
            raise TypeError(f"sampling must be a Sampling, got {sampling!r}")
        if agent is not None:
            return self.act({agent: observations}, max_new_tokens=max_new_tokens, sampling=sampling, env=env)[agent]
        if not isinstance(observations, Mapping):
            raise TypeError(f"observations must be a mapping agent -> observation, got {type(observations)}")
        if "observation" in observations and not isinstance(observations["observation"], Mapping):
            raise ValueError("got a single agent's observation dict; pass agent=<name> (AEC envs: env.agent_selection)")
        parts = {name: self._observation_parts(name, obs, env) for name, obs in observations.items()}
        if not parts:
            return {}
        token_mode = {name: "action_mask" in p for name, p in parts.items()}
        if len(set(token_mode.values())) > 1:
            raise ValueError(
                f"observations mix token mode (with action_mask) and response mode: {sorted(token_mode.items())}"
            )
        # Each agent's own settings (policy.sampling_of) unless one is given for all.
        settings = {name: sampling if sampling is not None else self.sampling_of[name] for name in parts}
        if next(iter(token_mode.values())):
            return self._act_tokens(parts, settings)
        if max_new_tokens is not None:
            settings = {name: replace(s, max_new_tokens=max_new_tokens) for name, s in settings.items()}
        prompts = {name: strip_left(p["observation"], p["attention_mask"], empty_ok=True) for name, p in parts.items()}
        generations = self.generate_joint(prompts, 1, sampling=settings)
        actions = {}
        for name, gen in generations.items():
            action = pad_actions(gen.response_ids, settings[name].max_new_tokens, self._group_of[name].pad_token_id)
            actions[name] = action if parts[name]["batched"] else action[0]
        return actions

    def _observation_parts(self, name: str, obs: Any, env: Any) -> dict[str, Any]:
        """One agent's observation as (N, L) ``observation`` / ``attention_mask`` tensors, (N, V)
        ``action_mask`` in token mode, and whether it came batched."""
        self._check_agent(name)
        if not isinstance(obs, Mapping):
            if env is None or not hasattr(env, "split_flat"):
                raise ValueError(
                    f"observation of agent {name!r} is a flat array (obs_format='flat'): pass env=<the env or vector "
                    f"env it comes from> so that its split_flat can cut it into its parts, got env={env!r}"
                )
            obs = env.split_flat(np.asarray(obs))
        if "observation" not in obs or "attention_mask" not in obs:
            raise ValueError(
                f"observation of agent {name!r} must be a dict with 'observation' and 'attention_mask', "
                f"got {type(obs).__name__} with keys {list(obs)}"
            )
        ids = to_tensor(obs["observation"], f"observation of agent {name!r}")
        mask = to_tensor(obs["attention_mask"], f"attention_mask of agent {name!r}")
        if ids.dim() not in (1, 2):
            raise ValueError(f"observation of agent {name!r} must be (L,) or (N, L), got shape {tuple(ids.shape)}")
        if mask.shape != ids.shape:
            raise ValueError(
                f"attention_mask of agent {name!r} has shape {tuple(mask.shape)}, its observation {tuple(ids.shape)}"
            )
        out: dict[str, Any] = {
            "observation": ids.reshape(-1, ids.shape[-1]),
            "attention_mask": mask.reshape(-1, mask.shape[-1]),
            "batched": ids.dim() == 2,
        }
        if "action_mask" in obs:
            legal = to_tensor(obs["action_mask"], f"action_mask of agent {name!r}")
            legal = legal.reshape(-1, legal.shape[-1])
            vocab_size = self._group_of[name].vocab_size
            if len(legal) != len(out["observation"]) or legal.shape[-1] > vocab_size:
                raise ValueError(
                    f"action_mask of agent {name!r} has shape {tuple(legal.shape)}: expected one row of at most "
                    f"{vocab_size} entries per observation row ({len(out['observation'])})"
                )
            out["action_mask"] = legal != 0
        return out

    def _act_tokens(self, parts: Mapping[str, dict[str, Any]], settings: Mapping[str, Sampling]) -> dict[str, Any]:
        """Token mode: one token per row, within its action mask (see :meth:`act`)."""
        chosen: dict[str, np.ndarray] = {}
        prompts: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        open_rows: dict[str, torch.Tensor] = {}
        for name, p in parts.items():
            legal = p["action_mask"]
            allowed = legal.sum(-1)
            if (allowed == 0).any():
                row = int((allowed == 0).nonzero()[0, 0])
                raise ValueError(f"action_mask of agent {name!r} allows no token in row {row}")
            full = allowed == legal.shape[-1]
            partial = ~full & (allowed > 1)
            if partial.any():
                row = int(partial.nonzero()[0, 0])
                raise ValueError(
                    f"action_mask of agent {name!r} allows {int(allowed[row])} of {legal.shape[-1]} tokens in row "
                    f"{row}; act samples from masks that allow every token or exactly one (the envs' two masks)"
                )
            # Rows with one legal token take it; the others are sampled below.
            chosen[name] = legal.long().argmax(-1).cpu().numpy().astype(np.int64)
            rows = full.nonzero().flatten()
            if len(rows):
                open_rows[name] = rows
                prompts[name] = strip_left(p["observation"][rows], p["attention_mask"][rows], empty_ok=True)
        if prompts:
            one_token = {name: replace(settings[name], max_new_tokens=1, stop=()) for name in prompts}
            generations = self.generate_joint(prompts, 1, sampling=one_token)
            for name, gen in generations.items():
                group = self._group_of[name]
                eos = torch.tensor(group.eos_token_ids)
                token = gen.response_ids[:, 0].cpu()
                token = torch.where(torch.isin(token, eos), torch.full_like(token, group.pad_token_id), token)
                chosen[name][open_rows[name].cpu().numpy()] = token.numpy()
        return {name: chosen[name] if parts[name]["batched"] else int(chosen[name][0]) for name in parts}

