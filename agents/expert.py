"""A model as the turn transition: an expert LLM reads the team's joint responses and writes edit
suggestions into each agent's next prompt (the reference's ``expert_edits``, with a local model
instead of an API).

An env never loads a model, so the expert is built here and passed to the env as an object, the way
a reward model is passed in::

    from agents import ExpertTransition
    env = llm_envs.make("coding/humaneval-v0", num_turns=2, transition=ExpertTransition())

It follows the transition signature of :mod:`llm_envs.transitions`. One call generates the
suggestions for every agent of the env in one batched ``generate`` (greedy by default, so the same
responses give the same next prompts). Its cost is kept in :attr:`ExpertTransition.stats` (calls,
generated tokens, seconds); the env reports each call's seconds as ``transition_s`` in its infos.
Copies of an env share one expert (``copy.deepcopy`` returns the same object): vector envs and tree
rollouts copy envs, never the model.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

EXPERT_PROMPT = (
    "You review the answers of a team of {n} agents working on one task.\n\nTask:\n{prompt}\n\n{answers}\n\n"
    "Suggest concrete edits that would improve the answer of agent {index}. Reply with the edits only."
)
ANSWER = "Answer of agent {index}:\n{text}"
NEXT_PROMPT = (
    "{first}\n\nYour previous answer:\n{last}\n\nAn expert reviewer suggests these edits:\n{edits}\n\n"
    "Revise your answer."
)


class ExpertTransition:
    """A second causal LM that writes each agent's next prompt (see the module docstring).

    Args:
        model: an HF model id, a local directory, ``None`` for the embedded SmolLM2-135M-Instruct, or a
            loaded model (then ``tokenizer`` is required).
        tokenizer: the model's tokenizer (default: loaded from ``model``).
        max_new_tokens: longest suggestion.
        greedy: arg-max decoding (else sampling at ``temperature``).
        temperature: sampling temperature when ``greedy`` is False.
        device, dtype: where and how to load a model given by name (``agents.load_model``'s defaults).
    """

    def __init__(
        self,
        model: Any = None,
        tokenizer: Any = None,
        *,
        max_new_tokens: int = 64,
        greedy: bool = True,
        temperature: float = 0.7,
        device: str | None = None,
        dtype: str | None = None,
    ) -> None:
        from agents.models import load_model
        from llm_envs.tokenizers import load_tokenizer

        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
        if not greedy and not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        if model is None or isinstance(model, (str, os.PathLike)):
            self.model = load_model(model, device=device, dtype=dtype)
            self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model)
        else:
            if tokenizer is None:
                raise ValueError("ExpertTransition(model=<a loaded model>) needs its tokenizer: pass tokenizer=")
            self.model, self.tokenizer = model, tokenizer
        self.model.eval()
        self.max_new_tokens = max_new_tokens
        self.greedy = greedy
        self.temperature = temperature
        self.stats: dict[str, float] = {"calls": 0.0, "generated_tokens": 0.0, "seconds": 0.0}
        """Totals over every call: calls, generated tokens, wall-clock seconds."""

    def __deepcopy__(self, memo: dict[int, Any]) -> ExpertTransition:
        return self  # envs are copied freely; the model is shared, never copied

    def expert_prompts(self, prompt: str, agent_completions: list[str]) -> list[str]:
        """The expert's input for each agent (one row per agent)."""
        n = len(agent_completions)
        answers = "\n\n".join(ANSWER.format(index=i + 1, text=t) for i, t in enumerate(agent_completions))
        return [EXPERT_PROMPT.format(n=n, prompt=prompt, answers=answers, index=i + 1) for i in range(n)]

    def __call__(
        self,
        prompt: str,
        agent_completions: list[str],
        prompt_history_per_agent: list[list[str]],
        response_history_per_agent: list[list[str]],
    ) -> list[str]:
        start = time.perf_counter()
        texts = self.expert_prompts(prompt, agent_completions)
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            texts = [
                tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
                for t in texts
            ]
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        rows = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
        width = max(len(r) for r in rows)
        device = next(self.model.parameters()).device
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):  # left padding: every row's next token is at the last column
            ids[i, width - len(r) :] = torch.tensor(r)
            mask[i, width - len(r) :] = 1
        sampling = {"do_sample": False} if self.greedy else {"do_sample": True, "temperature": self.temperature}
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids.to(device),
                attention_mask=mask.to(device),
                max_new_tokens=self.max_new_tokens,
                pad_token_id=pad,
                **sampling,
            )
        new = out[:, width:].cpu()
        eos = self.model.generation_config.eos_token_id
        stops = {pad, tok.eos_token_id, *(eos if isinstance(eos, list) else [eos])} - {None}
        edits = []
        for row in new.tolist():
            end = next((i for i, t in enumerate(row) if t in stops), len(row))
            self.stats["generated_tokens"] += end
            edits.append(tok.decode(row[:end], skip_special_tokens=True).strip())
        self.stats["calls"] += 1
        self.stats["seconds"] += time.perf_counter() - start
        return [
            NEXT_PROMPT.format(first=prompts[0], last=responses[-1], edits=edit)
            for prompts, responses, edit in zip(prompt_history_per_agent, response_history_per_agent, edits)
        ]
