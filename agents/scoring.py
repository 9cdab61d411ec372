"""Scoring: log-probs, values and reference log-probs of given responses, in one batched forward
(the fused decoder of :mod:`agents.decoder` with the engine backend, else the model's own forward
through PEFT). See :mod:`agents.policy` for the positions and what the numbers are."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from agents.memory import auto_activation_budget_mb
from agents.rows import ArrayLike, CheckedRows, distinct_rows, row_numbers
from agents.settings import check_temperature
from agents.team import BaseGroup


class ScoringMixin:
    """``forward``, ``logprobs``, ``values``, ``ref_logprobs`` and ``score`` of
    :class:`agents.policy.MultiAgentPolicy`."""

    def _fused(self, group: BaseGroup | None = None) -> bool:
        """Whether scoring passes run through the fused decoder (:mod:`agents.decoder`) rather than the
        model's own forward through PEFT: with the engine backend and LoRA adapters, except for
        gradient passes in train mode with LoRA dropout (PEFT draws dropout per adapted module)."""
        group = group or self._one("engine")
        if group.engine is None or group.full:
            return False
        return not (torch.is_grad_enabled() and self._training and group.dropout)

    def activation_keep_mb(self, device: torch.device) -> float:
        """The megabytes of activations a gradient pass on ``device`` keeps now: ``activation_budget_mb``,
        or with ``"auto"`` :func:`agents.memory.auto_activation_budget_mb` (the device's free memory,
        read at this call). Only gradient passes with checkpointing read it."""
        budget = self.activation_budget_mb
        return auto_activation_budget_mb(device) if budget == "auto" else float(budget)

    def _score(
        self,
        group: BaseGroup,
        p_ids: torch.Tensor,
        p_mask: torch.Tensor,
        r_ids: torch.Tensor,
        r_mask: torch.Tensor,
        adapter: str | None,
        value_agent: str | None,
        temperature: float = 1.0,
        with_reference: bool = False,
        with_logprobs: bool = True,
        shared: tuple[torch.Tensor | None, torch.Tensor | None] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(B, T) log-probs under ``adapter`` (``None``: the base), values from ``value_agent``'s head and,
        with ``with_reference``, the base's log-probs too (one forward of both row blocks when fused).
        Without ``with_logprobs`` (values only) the fused path skips the LM head (zeros in their place).
        ``shared``: the prompts' repeats (:func:`agents.rows.distinct_rows`) when already known."""
        width, length = p_ids.shape[1], r_ids.shape[1]
        if length == 0:
            empty = r_ids.new_zeros(r_ids.shape, dtype=torch.float32)
            return empty, (empty if value_agent is not None else None), (empty if with_reference else None)
        input_ids = torch.cat([p_ids, r_ids], dim=1)  # (B, P+T)
        attention_mask = torch.cat([p_mask, r_mask], dim=1)
        # Position P-1+t predicts response token t: the last prompt token predicts the first.
        keep = torch.arange(width - 1, width + length - 1, device=group.device)
        if self._fused(group):
            from agents.decoder import Block, bucket_length, pad_left
            from agents.head import chosen_logprobs

            rows = len(input_ids)
            adapters = [adapter, None] if with_reference else [adapter]
            blocks = [Block(a, rows) for a in adapters]
            assert group.engine is not None
            if not self.share_prompts:
                shared = (None, None)
            checkpoint = self.gradient_checkpointing and torch.is_grad_enabled()
            keep_mb = self.activation_keep_mb(group.device) if checkpoint else 0.0
            distinct, index = distinct_rows(p_ids, p_mask) if shared is None else shared
            if distinct is not None and index is not None:  # the G samples of a problem: its prompt once
                u = len(distinct)
                bucket = bucket_length(width)
                prompt_ids, prompt_mask = pad_left(p_ids[distinct], p_mask[distinct], bucket, group.pad_token_id)
                extra = bucket_length(length) - length  # right pads: masked, cut off below
                ids = torch.nn.functional.pad(r_ids, (0, extra), value=group.pad_token_id)
                mask = torch.nn.functional.pad(r_mask, (0, extra), value=0)
                n = len(adapters)
                hidden = group.engine.hidden_states_shared(  # (B or 2B, T, H)
                    prompt_ids.repeat(n, 1), prompt_mask.repeat(n, 1), [Block(a, u) for a in adapters],
                    torch.cat([index + k * u for k in range(n)]), ids.repeat(n, 1), mask.repeat(n, 1), blocks,
                    checkpoint=checkpoint, keep_mb=keep_mb,
                )[:, :length]
            else:
                bucket = bucket_length(input_ids.shape[1])  # few distinct shapes (see bucket_length)
                keep = keep + (bucket - input_ids.shape[1])
                input_ids, attention_mask = pad_left(input_ids, attention_mask, bucket, group.pad_token_id)
                if with_reference:
                    input_ids, attention_mask = input_ids.repeat(2, 1), attention_mask.repeat(2, 1)
                hidden = group.engine.hidden_states(  # (B or 2B, T, H)
                    input_ids, attention_mask, blocks, keep, checkpoint=checkpoint, keep_mb=keep_mb,
                )
            if not with_logprobs and not with_reference and value_agent is not None:
                assert self.value_heads is not None
                values = self.value_heads[value_agent](hidden[:rows].float()).squeeze(-1).masked_fill(r_mask == 0, 0.0)
                return torch.zeros_like(values), values, None
            head = group.causal_lm.lm_head
            targets = r_ids.repeat(len(blocks), 1)
            count = group.token_count  # the head's rows beyond the tokenizer are masked, as in sampling
            if head.bias is None:
                # chunked over the vocabulary
                scores = chosen_logprobs(hidden, head.weight[:count], targets, temperature)
            else:
                logits = torch.nn.functional.linear(hidden, head.weight[:count], head.bias[:count])
                scores = self._token_logprobs(logits, targets, r_mask.repeat(len(blocks), 1), temperature)
            scores = scores.masked_fill(r_mask.repeat(len(blocks), 1) == 0, 0.0)
            values = None
            if value_agent is not None:
                assert self.value_heads is not None
                values = self.value_heads[value_agent](hidden[:rows].float()).squeeze(-1).masked_fill(r_mask == 0, 0.0)
            return scores[:rows], values, (scores[rows:] if with_reference else None)

        logprobs, values = self._score_hf(group, input_ids, attention_mask, keep, r_ids, r_mask, adapter, value_agent,
                                          temperature)
        ref = None
        if with_reference:
            ref = self._score_hf(group, input_ids, attention_mask, keep, r_ids, r_mask, None, None, temperature)[0]
        return logprobs, values, ref

    def _score_hf(
        self,
        group: BaseGroup,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        keep: torch.Tensor,
        r_ids: torch.Tensor,
        r_mask: torch.Tensor,
        adapter: str | None,
        value_agent: str | None,
        temperature: float,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The model's own forward (through PEFT): ``adapter`` active, or the reference when ``None``."""
        model = group.model
        context: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if adapter is None:
            if group.full:
                model = group.reference
            else:
                context = group.model.disable_adapter()
        else:
            group.set_agent(adapter)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        captured: list[torch.Tensor] = []
        hook = None
        if value_agent is not None:
            body = group.causal_lm.base_model

            def grab(_module: nn.Module, _args: Any, output: Any) -> None:
                captured.append(output[0] if isinstance(output, tuple) else output.last_hidden_state)

            hook = body.register_forward_hook(grab)
        try:
            kwargs: dict[str, Any] = {"logits_to_keep": keep} if group.keeps_logits else {}
            with context:
                logits = model(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    position_ids=position_ids,
                    use_cache=False,
                    **kwargs,
                ).logits
        finally:
            if hook is not None:
                hook.remove()
        if not group.keeps_logits:
            logits = logits[:, keep]
        logits = logits[..., : group.token_count]  # ids beyond the tokenizer are never sampled (generation.py)
        logprobs = self._token_logprobs(logits, r_ids, r_mask, temperature)
        values = None
        if value_agent is not None:
            assert self.value_heads is not None
            hidden = captured[-1][:, keep].float()  # (B, T, H)
            values = self.value_heads[value_agent](hidden).squeeze(-1).masked_fill(r_mask == 0, 0.0)
        return logprobs, values

    @staticmethod
    def _token_logprobs(
        logits: torch.Tensor, r_ids: torch.Tensor, r_mask: torch.Tensor, temperature: float
    ) -> torch.Tensor:
        """(B, T, V) logits -> (B, T) float32 log-probs of the response tokens, 0 on pads."""
        if temperature != 1.0:
            logits = logits.float() / temperature
        logprobs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)  # one fused pass over the vocabulary
        return logprobs.gather(-1, r_ids.unsqueeze(-1)).squeeze(-1).masked_fill(r_mask == 0, 0.0)

    def forward(
        self,
        agent: str,
        prompt_ids: ArrayLike,
        prompt_mask: ArrayLike,
        response_ids: ArrayLike,
        response_mask: ArrayLike,
        *,
        with_values: bool = False,
        temperature: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One forward with ``agent``'s adapter: (B, T) log-probs and, if ``with_values``, (B, T) values.

        Gradients flow when torch's grad mode is on (wrap in ``torch.no_grad()`` for old log-probs).
        ``temperature``: log-probs of ``softmax(logits / temperature)`` (1: the raw policy).
        """
        check_temperature(temperature)
        self._check_agent(agent)
        if with_values and self.value_heads is None:
            raise ValueError("with_values=True needs a policy built with value_head=True")
        return self._forward(agent, prompt_ids, prompt_mask, response_ids, response_mask, with_values=with_values,
                             temperature=temperature)

    def _forward(self, agent: str, prompt_ids: ArrayLike, prompt_mask: ArrayLike, response_ids: ArrayLike,
                 response_mask: ArrayLike, *, with_values: bool, temperature: float,
                 with_logprobs: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        group = self._group_of[agent]
        tensors = self._pair(group, prompt_ids, prompt_mask, response_ids, response_mask)
        # A pass without gradients scores (old log-probs, values): no dropout, whatever the mode.
        with contextlib.nullcontext() if torch.is_grad_enabled() else self._eval_mode():
            logprobs, values, _ = self._score(
                group, *tensors, adapter=agent, value_agent=agent if with_values else None, temperature=temperature,
                with_logprobs=with_logprobs,
            )
        return logprobs, values

    def logprobs(
        self,
        agent: str,
        prompt_ids: ArrayLike,
        prompt_mask: ArrayLike,
        response_ids: ArrayLike,
        response_mask: ArrayLike,
        *,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """(B, T) log-prob of each response token under ``agent``'s policy (at ``temperature``; 1: raw);
        0 on pads. Differentiable."""
        return self.forward(agent, prompt_ids, prompt_mask, response_ids, response_mask, temperature=temperature)[0]

    def checked_rows(
        self,
        agent: str,
        prompt_ids: ArrayLike,
        prompt_mask: ArrayLike,
        response_ids: ArrayLike,
        response_mask: ArrayLike,
    ) -> CheckedRows:
        """``agent``'s rows checked as :meth:`logprobs` checks them and placed on its device, once, with
        their repeated prompts found: :meth:`logprobs_of` then scores slices of them without the host
        waiting for the device (an update's micro-batches)."""
        self._check_agent(agent)
        group = self._group_of[agent]
        tensors = self._pair(group, prompt_ids, prompt_mask, response_ids, response_mask)
        keys = tuple(row_numbers(tensors[0], tensors[1])) if self.share_prompts else None
        return CheckedRows(*tensors, prompt_keys=keys)

    def logprobs_of(self, agent: str, rows: CheckedRows, *, temperature: float = 1.0) -> torch.Tensor:
        """:meth:`logprobs` of rows from :meth:`checked_rows` (or a slice of them): the same numbers,
        without checking the rows again."""
        check_temperature(temperature)
        self._check_agent(agent)
        if not isinstance(rows, CheckedRows):
            raise TypeError(f"logprobs_of takes the rows of checked_rows, got {type(rows).__name__}")
        group = self._group_of[agent]
        with contextlib.nullcontext() if torch.is_grad_enabled() else self._eval_mode():
            return self._score(
                group, rows.prompt_ids, rows.prompt_mask, rows.response_ids, rows.response_mask, adapter=agent,
                value_agent=None, temperature=temperature, shared=rows.distinct_prompts(),
            )[0]

    def values(
        self,
        agent: str,
        prompt_ids: ArrayLike,
        prompt_mask: ArrayLike,
        response_ids: ArrayLike,
        response_mask: ArrayLike,
    ) -> torch.Tensor:
        """(B, T) value of the state before each response token under ``agent``; 0 on pads. Differentiable
        (value head and adapter). The LM head is not run (no log-probs) where the fused path scores."""
        self._check_agent(agent)
        if self.value_heads is None:
            raise ValueError("values() needs a policy built with value_head=True")
        return self._forward(agent, prompt_ids, prompt_mask, response_ids, response_mask, with_values=True,
                             temperature=1.0, with_logprobs=False)[1]

    @torch.no_grad()
    def ref_logprobs(
        self,
        agent: str,
        prompt_ids: ArrayLike,
        prompt_mask: ArrayLike,
        response_ids: ArrayLike,
        response_mask: ArrayLike,
        *,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """(B, T) log-probs under the reference policy (the base model with adapters disabled; under full
        fine-tuning, the frozen initial model), at ``temperature``. No grad, no dropout."""
        self._check_agent(agent)
        check_temperature(temperature)
        group = self._group_of[agent]
        tensors = self._pair(group, prompt_ids, prompt_mask, response_ids, response_mask)
        with self._eval_mode():
            return self._score(group, *tensors, adapter=None, value_agent=None, temperature=temperature)[0]

    @torch.no_grad()
    def score(
        self,
        agent: str,
        prompt_ids: ArrayLike,
        prompt_mask: ArrayLike,
        response_ids: ArrayLike,
        response_mask: ArrayLike,
        *,
        with_values: bool = False,
        with_reference: bool = False,
        temperature: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Everything an update reads before its first gradient step, in as few passes as possible:
        (B, T) log-probs under ``agent``'s policy, its values (``with_values``) and the reference's
        log-probs (``with_reference``); ``None`` for what was not asked. No grad, no dropout.

        With the engine backend the policy's rows and the reference's rows go through one forward
        (two row blocks: the adapter's and the bare base's) and values come from the same hidden
        states; otherwise it is :meth:`forward` then :meth:`ref_logprobs`. The numbers equal those
        calls' either way.
        """
        check_temperature(temperature)
        self._check_agent(agent)
        if with_values and self.value_heads is None:
            raise ValueError("with_values=True needs a policy built with value_head=True")
        group = self._group_of[agent]
        tensors = self._pair(group, prompt_ids, prompt_mask, response_ids, response_mask)
        with self._eval_mode():
            return self._score(
                group, *tensors, adapter=agent, value_agent=agent if with_values else None, temperature=temperature,
                with_reference=with_reference,
            )

