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
from agents.settings import Sampling, check_temperature
from agents.team import BaseGroup


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


class _OutOfVocabularyMask:
    """Logits processor that masks the ids at or beyond the tokenizer's size (rows of the LM head that
    are no token: the envs refuse them) to -inf, ahead of the recorder, so that neither greedy nor
    sampled decoding can choose them and the recorded log-probs are of the masked distribution, the
    one scoring recomputes."""

    def __init__(self, token_count: int) -> None:
        self.token_count = token_count

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores = scores.clone()
        scores[:, self.token_count :] = float("-inf")
        return scores


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
        stop: Sequence[str] = (),
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
            stop=stop,
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
        stop: Sequence[str] = (),
        logprob_temperature: float | Mapping[str, float] = 1.0,
        seeds: Sequence[int] | None = None,
        sampling: Mapping[str, Sampling] | None = None,
    ) -> dict[str, Generation]:
        """:meth:`generate` for several agents: ``{agent: (prompt_ids, prompt_mask)}`` in, ``{agent:
        Generation}`` out. With the engine every agent's rows share one decode loop, each row with its
        own adapter; with ``generate``, one call per agent (or one PEFT mixed batch). In a team of
        bases (:mod:`agents.team`) each base's agents decode together, base after base.

        ``sampling``: per-agent settings (:class:`Sampling`) that replace the keywords for the agents
        it names, in the same decode loop (a greedy agent beside a sampling one; each stops at its own
        ``max_new_tokens``). ``stop``: strings that end a response: it is cut after the token that
        completes the first one (decoded with the agent's tokenizer); the log-probs of what remains are
        those it was sampled with. ``seeds``: one int per prompt row (every agent has the same number
        of rows); sample g of row b of an agent is then drawn from its own generator seeded from
        (``seeds[b]``, the agent's name, g), so it does not depend on the rest of the batch. Unset:
        torch's global RNG. ``logprob_temperature`` (one value or per agent): the recorded log-probs are
        of ``softmax(logits / logprob_temperature)`` (1: the raw policy; the sampling temperature: the
        tempered policy, as TRL scores)."""
        if not isinstance(prompts, Mapping) or not prompts:
            raise ValueError(f"prompts must be a non-empty mapping agent -> (prompt_ids, prompt_mask), got {prompts!r}")
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
        shared = Sampling(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                          repetition_penalty=repetition_penalty, greedy=greedy, stop=tuple(stop))
        chosen: dict[str, Sampling] = {}
        for agent in prompts:
            self._check_agent(agent)
            own = shared if sampling is None else sampling.get(agent, shared)
            if not isinstance(own, Sampling):
                raise TypeError(f"sampling[{agent!r}] must be a Sampling, got {own!r}")
            chosen[agent] = own
        if sampling is not None:
            unknown = sorted(set(sampling) - set(self.agents))
            if unknown:
                raise KeyError(f"sampling names unknown agents {unknown}; this policy's agents are {list(self.agents)}")
        temps = logprob_temperature if isinstance(logprob_temperature, Mapping) else {}
        settings: dict[str, dict[str, Any]] = {}
        for agent, own in chosen.items():
            lt = temps.get(agent, 1.0) if isinstance(logprob_temperature, Mapping) else logprob_temperature
            check_temperature(lt, "logprob_temperature")
            settings[agent] = dict(
                max_new_tokens=own.max_new_tokens, temperature=own.temperature, top_p=own.top_p, top_k=own.top_k,
                repetition_penalty=own.repetition_penalty, greedy=own.greedy, logprob_temperature=float(lt),
            )
        rows: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for agent, pair in prompts.items():
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise ValueError(f"prompts[{agent!r}] must be a (prompt_ids, prompt_mask) tuple, got {type(pair)}")
            rows[agent] = self._rows(*pair, "prompt", self._group_of[agent])
        if seeds is not None:
            counts = {len(ids) for ids, _ in rows.values()}
            if len(counts) != 1 or len(seeds) != counts.pop():
                raise ValueError(
                    f"seeds must hold one int per prompt row and every agent the same number of rows; got "
                    f"{len(seeds)} seeds for rows {({a: len(r[0]) for a, r in rows.items()})}"
                )
            if any(isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 0 for x in seeds):
                raise ValueError(f"seeds must be ints >= 0, got {list(seeds)[:8]}")
        out: dict[str, Generation] = {}
        released = False
        for group in self.groups:
            mine = {a: rows[a] for a in rows if self._group_of[a] is group}
            if not mine:
                continue
            if group.engine is not None:
                if not released:
                    # The last update's activations are freed by now: give their pages back before decoding.
                    release_memory()
                    released = True
                out.update(self._engine_generate(group, mine, num_samples, seeds, settings))
            elif seeds is not None:
                out.update(self._generate_seeded(group, mine, num_samples, seeds, settings))
            else:
                out.update(self._generate_hf(group, mine, num_samples, settings))
        for agent, gen in out.items():
            limit = chosen[agent].max_new_tokens
            if gen.response_ids.shape[1] > limit:  # a team's decode ran to the longest agent's limit
                gen.response_ids, gen.response_mask = gen.response_ids[:, :limit], gen.response_mask[:, :limit]
                gen.logprobs = gen.logprobs[:, :limit]
            if chosen[agent].stop:
                group = self._group_of[agent]
                cut_at_stop(gen, chosen[agent].stop, group.tokenizer, group.pad_token_id)
        return {agent: out[agent] for agent in prompts}

    def _engine_generate(
        self,
        group: BaseGroup,
        rows: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
        num_samples: int,
        seeds: Sequence[int] | None,
        settings: Mapping[str, Mapping[str, Any]],
    ) -> dict[str, Generation]:
        from agents.engine import Block
        from agents.sampling import row_seed

        names = list(rows)
        width = max(rows[a][0].shape[1] for a in names)
        ids = torch.cat([left_pad(rows[a][0], width, group.pad_token_id) for a in names])
        mask = torch.cat([left_pad(rows[a][1], width, 0) for a in names])
        blocks = [Block(a if not group.full else None, len(rows[a][0])) for a in names]
        row_seeds = None
        if seeds is not None:
            row_seeds = [
                row_seed(int(seeds[b]), a, g)
                for a in names
                for b in range(len(rows[a][0]))
                for g in range(num_samples)
            ]
        assert group.engine is not None
        kinds = [settings[a] for a in names]
        uniform = all(k == kinds[0] for k in kinds)
        r_ids, r_mask, r_logprobs = group.engine.generate(
            ids,
            mask,
            blocks,
            num_samples=num_samples,
            eos_token_ids=group.eos_token_ids,
            pad_token_id=group.pad_token_id,
            seeds=row_seeds,
            block_settings=None if uniform else kinds,
            token_count=group.token_count if group.token_count < group.vocab_size else None,
            **kinds[0],
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
        group: BaseGroup,
        rows: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
        num_samples: int,
        seeds: Sequence[int],
        settings: Mapping[str, Mapping[str, Any]],
    ) -> dict[str, Generation]:
        """The ``generate`` backend with per-row seeds: one prompt row (of every agent) at a time, each
        under its own seed in a forked RNG, its padding stripped to its own prompt."""
        from agents.sampling import row_seed

        devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
        parts = []
        for b, seed in enumerate(seeds):
            one = {}
            for agent, (ids, mask) in rows.items():
                keep = int(mask[b].sum())
                one[agent] = (ids[b : b + 1, ids.shape[1] - keep :], mask[b : b + 1, mask.shape[1] - keep :])
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(row_seed(int(seed), "", 0))
                parts.append(self._generate_hf(group, one, num_samples, settings))
        out = {}
        for agent in rows:
            gens = [part[agent] for part in parts]
            width = max(g.prompt_ids.shape[1] for g in gens)
            length = max(g.response_ids.shape[1] for g in gens)
            out[agent] = Generation(
                agent=agent,
                num_samples=num_samples,
                prompt_ids=torch.cat([left_pad(g.prompt_ids, width, group.pad_token_id) for g in gens]),
                prompt_mask=torch.cat([left_pad(g.prompt_mask, width, 0) for g in gens]),
                response_ids=torch.cat([right_pad(g.response_ids, length, group.pad_token_id) for g in gens]),
                response_mask=torch.cat([right_pad(g.response_mask, length, 0) for g in gens]),
                logprobs=torch.cat([right_pad(g.logprobs, length, 0.0) for g in gens]),
            )
        return out

    def _generate_hf(
        self,
        group: BaseGroup,
        rows: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
        num_samples: int,
        settings: Mapping[str, Mapping[str, Any]],
    ) -> dict[str, Generation]:
        rows = {
            a: (ids.repeat_interleave(num_samples, 0), m.repeat_interleave(num_samples, 0))
            for a, (ids, m) in rows.items()
        }
        if len(rows) > 1 and self.mixed_batches and not group.full:
            # One PEFT mixed batch per distinct sampling setting.
            batches: dict[tuple[Any, ...], list[str]] = {}
            for agent in rows:
                batches.setdefault(tuple(sorted(settings[agent].items())), []).append(agent)
            calls = list(batches.values())
        else:
            calls = [[agent] for agent in rows]
        out: dict[str, Generation] = {}
        for call in calls:
            width = max(rows[a][0].shape[1] for a in call)
            ids = torch.cat([left_pad(rows[a][0], width, group.pad_token_id) for a in call])
            mask = torch.cat([left_pad(rows[a][1], width, 0) for a in call])
            names = [a for a in call for _ in range(len(rows[a][0]))]
            r_ids, r_mask, r_logprobs = self._sample(group, ids, mask, names, **settings[call[0]])
            start = 0
            for agent in call:
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
        group: BaseGroup,
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
        # recorder comes first (after the mask of ids beyond the tokenizer) so it sees the raw logits.
        processors = LogitsProcessorList([recorder])
        if group.token_count < group.vocab_size:
            processors.insert(0, _OutOfVocabularyMask(group.token_count))
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
            pad_token_id=group.pad_token_id,
            eos_token_id=list(group.eos_token_ids),
        )
        kwargs: dict[str, Any] = {}
        distinct = sorted(set(agent_per_row))
        if not group.full:
            if len(distinct) == 1:
                group.set_agent(distinct[0])
            else:
                kwargs["adapter_names"] = agent_per_row
        with self._eval_mode():
            sequences = group.model.generate(
                input_ids=ids,
                attention_mask=mask,
                generation_config=config,
                logits_processor=processors,
                **kwargs,
            )
        response = sequences[:, ids.shape[1] :]  # (N, T)
        logprobs = recorder.finish(response)
        is_eos = torch.isin(response, torch.tensor(group.eos_token_ids, device=response.device))
        after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
        response_mask = (~after_eos).long()
        response = response.masked_fill(after_eos, group.pad_token_id)
        return response, response_mask, logprobs.masked_fill(after_eos, 0.0)



def cut_at_stop(gen: Generation, stop: Sequence[str], tokenizer: Any, pad_token_id: int) -> None:
    """End each response of ``gen`` after the token that completes the first of the ``stop`` strings
    (decoded with ``tokenizer``), in place: later tokens become pads with mask and log-prob 0. The
    response is a prefix of what was sampled, so its log-probs are still exactly its own."""
    for row in range(len(gen.response_ids)):
        length = int(gen.response_mask[row].sum())
        ids = gen.response_ids[row, :length].tolist()
        text = tokenizer.decode(ids, skip_special_tokens=False)
        if not any(s in text for s in stop):
            continue
        end = next(t for t in range(1, length + 1)
                   if any(s in tokenizer.decode(ids[:t], skip_special_tokens=False) for s in stop))
        gen.response_ids[row, end:] = pad_token_id
        gen.response_mask[row, end:] = 0
        gen.logprobs[row, end:] = 0.0
