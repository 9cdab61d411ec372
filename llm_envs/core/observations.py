"""What an agent sees: its prompt (the task's text, the visible responses spliced in as token ids, the
chat template) as token ids, left-padded to the observation's length, in the env's ``obs_format``; and
its text. A mixin of :class:`~llm_envs.core.base.LLMEnvCore`, which holds the state it reads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from llm_envs.core.agent_tokens import MixedTokenizersError as MixedTokenizersError
from llm_envs.core.task import (
    Context,
    Prompt,
    Response,
)

VISIBLE_RESPONSE = "\n\nResponse of {role}:\n"
"""With a transition under the sequential protocol: the header before each earlier role's response."""

# Placeholder used to splice token ids into chat-templated prompts: a private-use character no
# tokenizer template emits, so splitting on it is unambiguous.
_SPLICE = "\ue000"

OBS_CACHE_SIZE = 4096
"""First-turn observations kept per env (oldest dropped first)."""


class Observations:
    """Mixin of :class:`~llm_envs.core.base.LLMEnvCore`: prompts and observations."""

    # ------------------------------------------------------------------------------ prompts
    def _encode_text(self, text: str, agent: str) -> list[int]:
        tok = self._agent_tokens[agent].handle.tokenizer
        return list(tok(text, add_special_tokens=False)["input_ids"])

    def _response_ids_for(self, response: Response, reader: str) -> Sequence[int]:
        """A Response part of ``reader``'s prompt as ``reader``'s token ids: its own ids when its writer
        has the reader's tokenizer, else its text encoded with the reader's (text is the interface)."""
        if self._tok is not None:
            return response.ids
        writer = self._agent_tokens.get(response.agent) if response.agent is not None else None
        if writer is not None and writer.handle is self._agent_tokens[reader].handle:
            return response.ids
        return self._encode_text(response.text, reader) if response.text else []

    def _prompt_ids(self, prompt: Prompt, role: str) -> list[int]:
        """Token ids of a task prompt for ``role``: its chat template if on; Response parts spliced as
        their ids (re-encoded from their text for a role with another tokenizer than the writer's)."""
        parts: Sequence[str | Response] = [prompt] if isinstance(prompt, str) else list(prompt)
        for part in parts:
            if not isinstance(part, (str, Response)):
                raise TypeError(f"Prompt parts must be str or Response, got {type(part).__name__}: {part!r}.")
        responses = [p for p in parts if isinstance(p, Response)]
        text = "".join(_SPLICE if isinstance(p, Response) else p for p in parts)
        record = self._agent_tokens[role]
        tok = record.handle.tokenizer
        if record.chat_template:
            text = tok.apply_chat_template(
                [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
            ) + self.task.response_prefix(role)
            pieces = text.split(_SPLICE)
            ids: list[int] = []
            for i, piece in enumerate(pieces):
                if piece:
                    ids.extend(self._encode_text(piece, role))
                if i < len(responses):
                    ids.extend(self._response_ids_for(responses[i], role))
            return ids
        pieces = (text + self.task.response_prefix(role)).split(_SPLICE)
        ids = []
        for i, piece in enumerate(pieces):
            if piece:
                # Only the first piece gets the tokenizer's special prefix (BOS for Llama-style ones).
                ids.extend(tok(piece, add_special_tokens=(i == 0))["input_ids"])
            if i < len(responses):
                ids.extend(self._response_ids_for(responses[i], role))
        return ids

    def _task_prompt(self, role: str, context: Context) -> Prompt:
        """The role's prompt: the task's, or on later turns the transition's (then, under the sequential
        protocol, followed by the responses of the roles that acted before it in this turn)."""
        if self.transition is None or not context.history:
            return self.task.prompt(role, self._problem, context)
        parts: list[str | Response] = [context.history[-1].next_prompts[role]]
        for other, response in context.visible.items():
            parts += [VISIBLE_RESPONSE.format(role=other), response]
        return parts

    def _acted_prompt_text(self, role: str) -> str:
        """The text (before the chat template) of the prompt ``role`` acted on in the current turn."""
        order = self.possible_agents
        before = order[: order.index(role)]
        context = Context(
            turn=self._turn,
            num_turns=self.num_turns,
            history=tuple(self._history),
            visible={r: v for r, v in self._visible.items() if r in before},
        )
        prompt = self._task_prompt(role, context)
        parts = [prompt] if isinstance(prompt, str) else prompt
        return "".join(p if isinstance(p, str) else p.text for p in parts)

    def _next_prompts(self, outputs: Mapping[str, Response], acted: Mapping[str, str]) -> tuple[dict[str, str], float]:
        """Call the transition after a turn: (next prompt per role, seconds it took)."""
        import time

        from llm_envs import transitions

        roles = self.possible_agents
        first = self._prompt_history[roles[0]][0] if self._prompt_history[roles[0]] else acted[roles[0]]
        kwargs = dict(
            prompt=transitions.problem_statement(self._problem, first),
            agent_completions=[outputs[r].text for r in roles],
            prompt_history_per_agent=[[*self._prompt_history[r], acted[r]] for r in roles],
            response_history_per_agent=[[*(rec.outputs[r].text for rec in self._history), outputs[r].text]
                                        for r in roles],
        )
        start = time.perf_counter()
        try:
            result = self.transition(**kwargs)  # type: ignore[misc]
        except Exception as err:
            raise RuntimeError(
                f"transition {self.transition_name} raised {type(err).__name__}: {err} (env {self.env_id}, "
                f"task_index {self._task_index}, after turn {self._turn})"
            ) from err
        prompts = transitions.check_result(self.transition_name, result, roles)
        return dict(zip(roles, prompts)), time.perf_counter() - start

    def _observe_role(self, role: str) -> tuple[np.ndarray, np.ndarray, int, int, str]:
        """(ids, mask, n_prompt_tokens, truncated, prompt_text) of the role's current prompt."""
        cacheable = self._turn == 0 and not self._visible
        key = (self._split, self._task_index, role)
        if cacheable and key in self._obs_cache:
            return self._obs_cache[key]
        # Within an episode a prompt depends only on the turn, the finished turns and which roles'
        # outputs of this turn are visible (each is fixed once given), so token steps and infos never
        # rebuild or re-tokenize it.
        episode_key = (role, self._turn, len(self._history), tuple(self._visible))
        if episode_key in self._episode_cache:
            return self._episode_cache[episode_key]
        prompt = self._task_prompt(role, self._context())
        ids = self._prompt_ids(prompt, role)
        L = self.max_prompt_tokens
        truncated = 0
        if len(ids) > L:
            if self.prompt_overflow == "error":
                raise ValueError(
                    f"The prompt of agent {role!r} (task_index {self._task_index}, split {self._split!r}, "
                    f"turn {self._turn}) has {len(ids)} tokens but max_prompt_tokens={L}. Make the env with "
                    f"a larger max_prompt_tokens, or prompt_overflow='truncate_left' to keep the last {L}."
                )
            ids = ids[-L:]
            truncated = 1
        n = len(ids)
        record = self._agent_tokens[role]
        obs = np.full(L, record.pad_token_id, dtype=np.int64)
        mask = np.zeros(L, dtype=np.int8)
        if n:
            obs[L - n :] = ids
            mask[L - n :] = 1
        obs.flags.writeable = False
        mask.flags.writeable = False
        text = record.handle.tokenizer.decode(ids, skip_special_tokens=False)
        entry = (obs, mask, n, truncated, text)
        if cacheable:
            if len(self._obs_cache) >= OBS_CACHE_SIZE:  # generated splits have unbounded task indices
                del self._obs_cache[next(iter(self._obs_cache))]
            self._obs_cache[key] = entry
        self._episode_cache[episode_key] = entry
        return entry

    def _observation(self, role: str) -> Any:
        ids, mask, n, *_ = self._observe_role(role)
        if self.step_unit == "response" and self.obs_format == "dict":
            # Copies: callers may write into what they get without corrupting the cache.
            return {"observation": ids.copy(), "attention_mask": mask.copy()}
        L, P = self.obs_length, self.max_prompt_tokens
        response = self._response_ids[role] if self.step_unit == "token" else []
        k = len(response)
        obs = np.full(L, self._agent_tokens[role].pad_token_id, dtype=np.int64)
        attention = np.zeros(L, dtype=np.int8)
        obs[L - k - n : L - k] = ids[P - n :]
        if k:
            obs[L - k :] = response
        attention[L - k - n :] = 1
        if self.obs_format == "flat":
            parts = [obs, attention]
            if self.step_unit == "token":
                parts.append(self.action_mask(role))
            return np.concatenate(parts, dtype=np.int64)
        out = {"observation": obs, "attention_mask": attention}
        if self.step_unit == "token":
            out["action_mask"] = self.action_mask(role)
        return out

    def split_flat(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """Cut a flat observation (``obs_format="flat"``, any leading batch axes) back into the Dict's
        parts: ``observation``, ``attention_mask`` and, in token mode, ``action_mask`` (as views). With
        a tokenizer per agent any agent's flat observation is accepted (its length tells its V)."""
        arr = np.asarray(flat)
        sizes = sorted({self.observation_spaces[a].shape[0] for a in self.possible_agents})
        if arr.shape[-1:] not in [(size,) for size in sizes]:
            which = f"{sizes[0]}" if len(sizes) == 1 else f"one of {sizes} (by agent)"
            raise ValueError(
                f"A flat observation of this env has {which} entries on its last axis, got shape {arr.shape}."
            )
        L = self.obs_length
        out = {"observation": arr[..., :L], "attention_mask": arr[..., L : 2 * L]}
        if self.step_unit == "token":
            out["action_mask"] = arr[..., 2 * L :]
        return out

    def text(self, agent: str) -> str:
        """The agent's current observation as text (the prompt exactly as tokenized, chat template and
        special tokens included; in token mode followed by the agent's response so far)."""
        self._check_agent_name(agent)
        self._require_started()
        entry = self._observe_role(agent)
        if self.step_unit == "token" and self._response_ids[agent]:
            n, P = entry[2], self.max_prompt_tokens
            ids = entry[0][P - n :].tolist() + self._response_ids[agent]
            return self._agent_tokens[agent].handle.tokenizer.decode(ids, skip_special_tokens=False)
        return entry[4]
