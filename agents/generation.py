"""Generation: sampled responses (:class:`Generation`), and the policy's ``generate`` /
``generate_joint`` with their backends: the rollout engine (:mod:`agents.engine`: every agent's rows in
one decode loop) or ``transformers``' ``generate`` (with a logits processor that records the raw
policy's log-probs). See :mod:`agents.policy` for what the log-probs are."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from agents.memory import release_memory
from agents.rows import ArrayLike, left_pad, right_pad
from agents.settings import check_sampling, check_temperature


@dataclass
class Generation:
    """Sampled responses of one agent. Rows are prompt-major: row ``b * num_samples + g`` is sample g of
    prompt b, so ``x.view(B, num_samples, ...)`` gives groups."""

    agent: str
    num_samples: int
    prompt_ids: torch.Tensor
    """(B*G, P) the prompts, each repeated ``num_samples`` times, left-padded."""
    prompt_mask: torch.Tensor
    """(B*G, P) 1 on prompt tokens."""
    response_ids: torch.Tensor
    """(B*G, T) sampled tokens; after the first EOS every id is the pad id. T <= max_new_tokens."""
    response_mask: torch.Tensor
    """(B*G, T) 1 up to and including the first EOS, 0 after it."""
    logprobs: torch.Tensor
    """(B*G, T) raw policy log-prob of each sampled token (see the module docs); 0 where the mask is 0."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def response_lengths(self) -> torch.Tensor:
        """(B*G,) number of response tokens, the EOS included."""
        return self.response_mask.sum(-1)


class _LogProbRecorder:
    """Logits processor that records the log-prob of each sampled token under the unprocessed logits.

    It sees the logits of step t before the warpers; the token chosen at step t is only known at step
    t + 1 (the last column of ``input_ids``), so one (N, V) log-softmax is kept between calls and the
    last step is read by :meth:`finish`.
    """

    def __init__(self, temperature: float = 1.0) -> None:
        self._previous: torch.Tensor | None = None
        self.steps: list[torch.Tensor] = []
        self.temperature = temperature

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._previous is not None:
            self.steps.append(self._previous.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self._previous = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, response_ids: torch.Tensor) -> torch.Tensor:
        if self._previous is not None:
            self.steps.append(self._previous.gather(-1, response_ids[:, -1:]).squeeze(-1))
            self._previous = None
        if len(self.steps) != response_ids.shape[1]:
            raise RuntimeError(
                f"recorded {len(self.steps)} log-prob steps for {response_ids.shape[1]} generated tokens; "
                "another logits processor or the model's generation config changed the decoding loop"
            )
        return torch.stack(self.steps, dim=1) if self.steps else response_ids.new_zeros((len(response_ids), 0))


class GenerationMixin:
    """``generate`` and ``generate_joint`` of :class:`agents.policy.MultiAgentPolicy`."""

    def generate(
        self,
        agent: str,
        prompt_ids: ArrayLike,
        prompt_mask: ArrayLike,
        num_samples: int = 1,
        *,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        repetition_penalty: float = 1.0,
        greedy: bool = False,
        logprob_temperature: float = 1.0,
        seeds: Sequence[int] | None = None,
    ) -> Generation:
        """Sample ``num_samples`` responses per prompt with ``agent``'s adapter, in one batched decode.

        Prompts are (B, P) left-padded rows; see :class:`Generation` for the outputs and the module docs
        for what the log-probs are. Sampling draws from torch's global RNG (``torch.manual_seed``), or
        from one generator per row when ``seeds`` (one per prompt row) are given; see
        :meth:`generate_joint`.
        """
        return self.generate_joint(
            {agent: (prompt_ids, prompt_mask)},
            num_samples,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            repetition_penalty=repetition_penalty,
            greedy=greedy,
            logprob_temperature=logprob_temperature,
            seeds=seeds,
        )[agent]

    def generate_joint(
        self,
        prompts: Mapping[str, tuple[ArrayLike, ArrayLike]],
        num_samples: int = 1,
        *,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        repetition_penalty: float = 1.0,
        greedy: bool = False,
        logprob_temperature: float = 1.0,
        seeds: Sequence[int] | None = None,
    ) -> dict[str, Generation]:
        """:meth:`generate` for several agents: ``{agent: (prompt_ids, prompt_mask)}`` in, ``{agent:
        Generation}`` out. With the engine every agent's rows share one decode loop, each row with its
        own adapter; with ``generate``, one call per agent (or one PEFT mixed batch).

        ``seeds``: one int per prompt row (every agent has the same number of rows); sample g of row b
        of an agent is then drawn from its own generator seeded from (``seeds[b]``, the agent's
        name, g), so it does not depend on the rest of the batch. Unset: torch's global RNG.
        ``logprob_temperature``: the recorded log-probs are of ``softmax(logits / logprob_temperature)``
        (1: the raw policy; the sampling temperature: the tempered policy, as TRL scores)."""
        if not isinstance(prompts, Mapping) or not prompts:
            raise ValueError(f"prompts must be a non-empty mapping agent -> (prompt_ids, prompt_mask), got {prompts!r}")
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
        check_sampling(max_new_tokens, temperature, top_p, top_k, repetition_penalty)
        check_temperature(logprob_temperature, "logprob_temperature")
        rows: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for agent, pair in prompts.items():
            self._check_agent(agent)
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise ValueError(f"prompts[{agent!r}] must be a (prompt_ids, prompt_mask) tuple, got {type(pair)}")
            rows[agent] = self._rows(*pair, "prompt")
        if seeds is not None:
            counts = {len(ids) for ids, _ in rows.values()}
            if len(counts) != 1 or len(seeds) != counts.pop():
                raise ValueError(
                    f"seeds must hold one int per prompt row and every agent the same number of rows; got "
                    f"{len(seeds)} seeds for rows {({a: len(r[0]) for a, r in rows.items()})}"
                )
            if any(isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 0 for x in seeds):
                raise ValueError(f"seeds must be ints >= 0, got {list(seeds)[:8]}")
        settings = dict(
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            repetition_penalty=repetition_penalty,
            greedy=greedy,
            logprob_temperature=logprob_temperature,
        )
        if self.engine is not None:
            # The last update's activations are freed by now: give their pages back before decoding.
            release_memory()
            return self._engine_generate(rows, num_samples, seeds, settings)
        if seeds is not None:
            return self._generate_seeded(rows, num_samples, seeds, settings)
        return self._generate_hf(rows, num_samples, settings)

    def _engine_generate(
        self,
        rows: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
        num_samples: int,
        seeds: Sequence[int] | None,
        settings: Mapping[str, Any],
    ) -> dict[str, Generation]:
        from agents.engine import Block, row_seed

        names = list(rows)
        width = max(rows[a][0].shape[1] for a in names)
        ids = torch.cat([left_pad(rows[a][0], width, self.pad_token_id) for a in names])
        mask = torch.cat([left_pad(rows[a][1], width, 0) for a in names])
        blocks = [Block(a if self.lora is not None else None, len(rows[a][0])) for a in names]
        row_seeds = None
        if seeds is not None:
            row_seeds = [
                row_seed(int(seeds[b]), a, g)
                for a in names
                for b in range(len(rows[a][0]))
                for g in range(num_samples)
            ]
        r_ids, r_mask, r_logprobs = self.engine.generate(
            ids,
            mask,
            blocks,
            num_samples=num_samples,
            eos_token_ids=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            seeds=row_seeds,
            **settings,
        )
        out: dict[str, Generation] = {}
        start = 0
        for agent in names:
            p_ids, p_mask = rows[agent]
            n = len(p_ids) * num_samples
            out[agent] = Generation(
                agent=agent,
                num_samples=num_samples,
                prompt_ids=p_ids.repeat_interleave(num_samples, 0),
                prompt_mask=p_mask.repeat_interleave(num_samples, 0),
                response_ids=r_ids[start : start + n],
                response_mask=r_mask[start : start + n],
                logprobs=r_logprobs[start : start + n],
            )
            start += n
        return out

    def _generate_seeded(
        self,
        rows: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
        num_samples: int,
        seeds: Sequence[int],
        settings: Mapping[str, Any],
    ) -> dict[str, Generation]:
        """The ``generate`` backend with per-row seeds: one prompt row (of every agent) at a time, each
        under its own seed in a forked RNG, its padding stripped to its own prompt."""
        from agents.engine import row_seed

        devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
        parts = []
        for b, seed in enumerate(seeds):
            one = {}
            for agent, (ids, mask) in rows.items():
                keep = int(mask[b].sum())
                one[agent] = (ids[b : b + 1, ids.shape[1] - keep :], mask[b : b + 1, mask.shape[1] - keep :])
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(row_seed(int(seed), "", 0))
                parts.append(self._generate_hf(one, num_samples, settings))
        out = {}
        for agent in rows:
            gens = [part[agent] for part in parts]
            width = max(g.prompt_ids.shape[1] for g in gens)
            length = max(g.response_ids.shape[1] for g in gens)
            out[agent] = Generation(
                agent=agent,
                num_samples=num_samples,
                prompt_ids=torch.cat([left_pad(g.prompt_ids, width, self.pad_token_id) for g in gens]),
                prompt_mask=torch.cat([left_pad(g.prompt_mask, width, 0) for g in gens]),
                response_ids=torch.cat([right_pad(g.response_ids, length, self.pad_token_id) for g in gens]),
                response_mask=torch.cat([right_pad(g.response_mask, length, 0) for g in gens]),
                logprobs=torch.cat([right_pad(g.logprobs, length, 0.0) for g in gens]),
            )
        return out

    def _generate_hf(
        self,
        rows: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
        num_samples: int,
        settings: Mapping[str, Any],
    ) -> dict[str, Generation]:
        rows = {
            a: (ids.repeat_interleave(num_samples, 0), m.repeat_interleave(num_samples, 0))
            for a, (ids, m) in rows.items()
        }
        if len(rows) > 1 and self.mixed_batches and self.lora is not None:
            groups = [list(rows)]
        else:
            groups = [[agent] for agent in rows]
        out: dict[str, Generation] = {}
        for group in groups:
            width = max(rows[a][0].shape[1] for a in group)
            ids = torch.cat([left_pad(rows[a][0], width, self.pad_token_id) for a in group])
            mask = torch.cat([left_pad(rows[a][1], width, 0) for a in group])
            names = [a for a in group for _ in range(len(rows[a][0]))]
            r_ids, r_mask, r_logprobs = self._sample(ids, mask, names, **settings)
            start = 0
            for agent in group:
                n = len(rows[agent][0])
                out[agent] = Generation(
                    agent=agent,
                    num_samples=num_samples,
                    prompt_ids=rows[agent][0],
                    prompt_mask=rows[agent][1],
                    response_ids=r_ids[start : start + n],
                    response_mask=r_mask[start : start + n],
                    logprobs=r_logprobs[start : start + n],
                )
                start += n
        return out

    @torch.no_grad()
    def _sample(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        agent_per_row: list[str],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        top_k: int,
        repetition_penalty: float,
        greedy: bool,
        logprob_temperature: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        from transformers import GenerationConfig, LogitsProcessorList
        from transformers.generation.logits_process import (
            RepetitionPenaltyLogitsProcessor,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        recorder = _LogProbRecorder(logprob_temperature)
        # Our processors run after generate's own (none, with this config) and in this order; the
        # recorder comes first so it sees the raw logits.
        processors = LogitsProcessorList([recorder])
        if repetition_penalty != 1.0:
            processors.append(RepetitionPenaltyLogitsProcessor(repetition_penalty))
        if not greedy:
            if temperature != 1.0:
                processors.append(TemperatureLogitsWarper(temperature))
            if top_k > 0:
                processors.append(TopKLogitsWarper(top_k))
            if top_p < 1.0:
                processors.append(TopPLogitsWarper(top_p))
        # Neutral values set explicitly: generate fills unset ones from the model's generation config.
        config = GenerationConfig(
            do_sample=not greedy,
            max_new_tokens=max_new_tokens,
            temperature=1.0 if not greedy else None,
            top_k=0 if not greedy else None,
            top_p=1.0 if not greedy else None,
            repetition_penalty=1.0,
            pad_token_id=self.pad_token_id,
            eos_token_id=list(self.eos_token_ids),
        )
        kwargs: dict[str, Any] = {}
        distinct = sorted(set(agent_per_row))
        if self.lora is not None:
            if len(distinct) == 1:
                self._set_agent(distinct[0])
            else:
                kwargs["adapter_names"] = agent_per_row
        with self._eval_mode():
            sequences = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                generation_config=config,
                logits_processor=processors,
                **kwargs,
            )
        response = sequences[:, ids.shape[1] :]  # (N, T)
        logprobs = recorder.finish(response)
        is_eos = torch.isin(response, torch.tensor(self.eos_token_ids, device=response.device))
        after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
        response_mask = (~after_eos).long()
        response = response.masked_fill(after_eos, self.pad_token_id)
        return response, response_mask, logprobs.masked_fill(after_eos, 0.0)

