"""One seat of a served multi-agent env, trained with TRL's ``GRPOTrainer(environment_factory=...)`` (TRL >= 1.16,
transformers >= 5.2): the other seats are played by a partner policy you give, the reward is the env's.

    # another shell: llm-envs serve writing/xsum-v0 --port 8000
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from llm_envs.serve.trl import seat_dataset, served_seat

    Seat = served_seat("http://127.0.0.1:8000", "brief", partner=lambda agent, prompt: "A longer summary ...")
    trainer = GRPOTrainer(model=..., args=GRPOConfig(...), environment_factory=Seat,
                          train_dataset=Dataset.from_list(seat_dataset(64)))

How TRL drives it (``trl/trainer/grpo_trainer.py``), and what this class does at each call:

====================  ===============================================================================================
``Seat()``            TRL builds one instance per rollout of a batch (and one probe), keeps them in a pool and
                      reuses them: an instance connects to the server on its first ``reset`` (one WebSocket
                      session, :func:`llm_envs.remote.connect`) and keeps that session for every later episode
``reset(**row)``      TRL passes every dataset column (``prompt`` too). ``seed`` and ``task_index`` (and
                      ``split``) reset the served env, so the G rollouts of a group (same row) get the same
                      problem; under the sequential protocol the seats before the trained one act first (the
                      partner). Returns the trained seat's prompt as text (the env's chat template taken off),
                      which TRL appends to the row's last user message
the tool              every public method of the class except ``reset`` and ``get_reward`` is a tool, its
                      docstring the description the model reads: here one, ``submit(answer)`` (the name and the
                      description can be changed). It plays the turn: the trained seat's answer, the partner's
                      answers for the other seats (at the same time under the parallel protocol; in turn order
                      around the trained seat under the sequential one), and returns the turn's reward and, on a
                      multi-turn episode, the seat's next prompt (the model may call the tool again)
``get_reward()``      called once per rollout after generation: the sum of the trained seat's env rewards over the
                      episode; a rollout that never called the tool gets ``no_answer_reward`` (default: the
                      task's ``min_reward``, 0.0 where that is not finite). TRL logs it as
                      ``rewards/<class name>/mean``
====================  ===============================================================================================

Partners (``partner=``): a callable ``(agent, prompt_text) -> str`` (``prompt_text`` is ``env.text(agent)``, the
served env's prompt with its chat template); ``"reference"``, the problem's reference answer where the task has one
(:func:`reference_answer`: HumanEval's canonical solution, GSM8K's worked answer, ClassEval's solution code,
Sokoban's solution; the XSum problems carry no summary, so ``writing/xsum-v0`` needs another partner); a fixed HF
model through :func:`model_policy`; or a mapping ``{agent: one of those}``.

The model needs a chat template that renders tool calls (TRL checks this): SmolLM2's does not, and
``trl.chat_template_utils.qwen2_5_chat_template`` (ChatML, the tokens SmolLM2 already has) does, with a parser TRL
knows. No torch is imported here until :func:`model_policy`'s callable runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from llm_envs.remote import RemoteEnvError, connect

Partner = Callable[[str, str], str]
"""``(agent, prompt_text) -> answer``: plays a seat that is not trained."""

REFERENCE = "reference"
"""``partner="reference"``: the other seats answer with the problem's reference answer (:func:`reference_answer`)."""

REFERENCE_FIELDS = ("canonical_solution", "solution_code", "summary", "answer", "solution")
"""The problem fields :func:`reference_answer` reads, first found first."""

DEFAULT_TOOL_DOC = (
    "Submit your answer as the {seat} of this task. Call it once with your complete answer; on a task of several "
    "turns it returns your next prompt, and you may call it again with a revised answer."
)
DEFAULT_INSTRUCTION = "Read the task below and give your answer by calling the submit tool.\n\n"
_SPLIT_MARK = "\x00LLM-ENVS-PROMPT\x00"


def reference_answer(problem: Mapping[str, Any]) -> str:
    """The problem's reference answer as a seat would write it: ``prompt + canonical_solution`` (HumanEval: the
    whole function), else the first text field of :data:`REFERENCE_FIELDS` (ClassEval's ``solution_code``, a
    ``summary``, GSM8K's worked ``answer``, Sokoban's ``solution``).

    Raises:
        ValueError: the problem has none of them (XSum, the planning and building tasks, Sudoku's grid tuple).
    """
    if isinstance(problem.get("canonical_solution"), str):
        prompt = problem.get("prompt")
        return (prompt if isinstance(prompt, str) else "") + problem["canonical_solution"]
    for field in REFERENCE_FIELDS[1:]:
        if isinstance(problem.get(field), str):
            return problem[field]
    raise ValueError(
        f"This env's problems carry no reference answer (looked for the text fields {list(REFERENCE_FIELDS)}; the "
        f"problem has {sorted(problem)}): pass partner= a callable (agent, prompt_text) -> str or model_policy(...).")


def model_policy(model: Any, tokenizer: Any, *, max_new_tokens: int = 64, do_sample: bool = False,
                 apply_chat_template: bool = False, **generate_kwargs: Any) -> Partner:
    """A fixed HF model as a partner: ``(agent, prompt_text) -> str`` through ``model.generate`` (no gradients).

    ``prompt_text`` is the served env's prompt with the env's chat template already applied (the default): it is
    tokenized as it is. Serve with ``--make-kwargs '{"chat_template": false}'`` and pass ``apply_chat_template=True``
    to use this tokenizer's template instead (a partner whose tokenizer is not the env's).
    """
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}.")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id

    def policy(agent: str, prompt_text: str) -> str:
        import torch

        text = prompt_text
        if apply_chat_template:
            text = tokenizer.apply_chat_template([{"role": "user", "content": prompt_text}], tokenize=False,
                                                 add_generation_prompt=True)
        encoded = tokenizer(text, return_tensors="pt", add_special_tokens=False).to(model.device)
        with torch.no_grad():
            out = model.generate(**encoded, max_new_tokens=max_new_tokens, do_sample=do_sample, pad_token_id=pad_id,
                                 **generate_kwargs)
        return tokenizer.decode(out[0, encoded["input_ids"].shape[1]:], skip_special_tokens=True)

    policy.__name__ = f"model_policy({type(model).__name__})"
    return policy


def seat_dataset(num_rows: int, *, instruction: str = DEFAULT_INSTRUCTION, split: str | None = None,
                 num_problems: int | None = None, seed: int = 0) -> list[dict[str, Any]]:
    """Rows for ``datasets.Dataset.from_list``: ``prompt`` (one user message, the instruction; TRL appends the
    seat's prompt from ``reset``), ``seed`` and ``task_index`` (row ``i`` is problem ``i % num_problems``), and
    ``split`` when given. Every rollout of a row gets the same problem, as GRPO's groups need."""
    if not isinstance(num_rows, int) or num_rows < 1:
        raise ValueError(f"num_rows must be a positive int, got {num_rows!r}.")
    if num_problems is not None and (not isinstance(num_problems, int) or num_problems < 1):
        raise ValueError(f"num_problems must be a positive int or None, got {num_problems!r}.")
    rows = []
    for i in range(num_rows):
        row = {"prompt": [{"role": "user", "content": instruction}], "seed": seed + i,
               "task_index": i if num_problems is None else i % num_problems}
        if split is not None:
            row["split"] = split
        rows.append(row)
    return rows


class ServedSeat:
    """One rollout's episode of a served env, from the trained seat's side (the module docstring). Build the class
    to give TRL with :func:`served_seat`; the class attributes below are its settings.

    Attributes set on each instance (read them after a rollout): ``env`` (the remote env), ``answers`` (the
    trained seat's answers this episode), ``partner_answers`` (``{agent: [answers]}``), ``turn_rewards`` (the seat's
    reward per step), ``done`` (the episode is over), ``episode_id``.
    """

    url: ClassVar[str] = ""
    seat: ClassVar[str] = ""
    _partner: ClassVar[Any] = None  # private: TRL makes every public function on the class a tool, a callable too
    split: ClassVar[str | None] = None
    no_answer_reward: ClassVar[float | None] = None
    strip_chat_template: ClassVar[bool] = True
    timeout_s: ClassVar[float] = 300.0

    def __init__(self) -> None:
        if not type(self).url or not type(self).seat:
            raise TypeError("Build the class with served_seat(url, seat, partner=...), then pass it to GRPOTrainer.")
        self.env: Any = None
        self.answers: list[str] = []
        self.partner_answers: dict[str, list[str]] = {}
        self.turn_rewards: list[float] = []
        self.done = False
        self.episode_id: str | None = None
        self._templates: dict[str, tuple[str, str] | None] = {}

    # ------------------------------------------------------------------------------------------ TRL's calls
    def reset(self, seed: int | None = None, task_index: int | None = None, split: str | None = None,
              **columns: Any) -> str:
        """Start an episode of the served env (``seed``, ``task_index``, ``split`` from the dataset row; the other
        columns are ignored) and return the trained seat's prompt."""
        options: dict[str, Any] = {}
        if task_index is not None:
            options["task_index"] = int(task_index)
        split = split if split is not None else type(self).split
        if split is not None:
            options["split"] = split
        seed = None if seed is None else int(seed)
        self._connect()
        try:
            self.env.reset(seed=seed, options=options or None)
        except RemoteEnvError:  # the session is gone (server restarted, expired): one more try on a new one
            self._close()
            self._connect()
            self.env.reset(seed=seed, options=options or None)
        self.answers, self.turn_rewards, self.done = [], [], False
        self.partner_answers = {a: [] for a in self.env.possible_agents if a != self.seat}
        self.episode_id = self.env.episode_id
        if self.partner_answers and type(self)._partner is None:
            raise ValueError(f"{self.env.env_id} has the seats {self.env.possible_agents}: pass partner= to "
                             f"served_seat() to play the ones other than {self.seat!r}.")
        for agent in self.partner_answers:
            if self._partner_of(agent) == REFERENCE:
                reference_answer(self.env.problem)  # no reference: a clear error now, not inside the tool
        if self.env.protocol == "sequential":
            self._play_partners()
        return self._prompt(self.seat)

    def submit(self, answer: str) -> str:
        """(replaced by served_seat(); see DEFAULT_TOOL_DOC)

        Args:
            answer: your complete answer.
        """
        return self._submit(answer)

    def get_reward(self) -> float:
        """The trained seat's env reward for the episode (the sum over its turns); ``no_answer_reward`` when the
        model never called the tool."""
        if not self.answers:
            value = type(self).no_answer_reward
            if value is None:
                value = float(self.env.spec["task"]["min_reward"]) if self.env is not None else 0.0
            return value if math.isfinite(value) else 0.0
        return float(sum(self.turn_rewards))

    # ------------------------------------------------------------------------------------------ the episode
    def _submit(self, answer: Any) -> str:
        if self.env is None or self.episode_id is None:
            raise RuntimeError("No episode: reset() first.")
        if self.done:
            raise RuntimeError("The episode is over: your answer was already submitted.")
        if not isinstance(answer, str):
            raise TypeError(f"answer must be a string, got {type(answer).__name__}.")
        env = self.env
        if env.protocol == "parallel":
            actions = {self.seat: self._action(self.seat, answer)}
            for agent in env.agents:
                if agent != self.seat:
                    actions[agent] = self._action(agent, self._partner_answer(agent))
            _, rewards, terms, truncs, _ = env.step(actions)
            self.answers.append(answer)
            self.turn_rewards.append(float(rewards.get(self.seat, 0.0)))
            self.done = not env.agents or bool(terms.get(self.seat) or truncs.get(self.seat))
        else:
            if env.agent_selection != self.seat:
                raise RuntimeError(f"It is {env.agent_selection!r}'s turn, not {self.seat!r}'s.")
            env.step(self._action(self.seat, answer))
            self.answers.append(answer)
            self.turn_rewards.append(float(env.rewards.get(self.seat, 0.0)))
            self._play_partners()
        last = self.turn_rewards[-1] if env.protocol == "parallel" else None
        if self.done:
            return f"Submitted. The episode is over; your reward: {sum(self.turn_rewards):.4g}."
        shown = "" if last is None else f"Reward for this turn: {last:.4g}. "
        return f"{shown}Your next prompt:\n{self._prompt(self.seat)}"

    def _play_partners(self) -> None:
        """Sequential protocol: the other seats act in turn order until it is the trained seat's turn or the episode
        ends; every step's reward of the trained seat is added to its rewards."""
        env = self.env
        while True:
            if not env.agents or env.terminations.get(self.seat) or env.truncations.get(self.seat):
                self.done = True
                return
            agent = env.agent_selection
            if agent == self.seat:
                return
            env.step(self._action(agent, self._partner_answer(agent)))
            if self.answers:  # rewards of the turns the seat took part in
                self.turn_rewards.append(float(env.rewards.get(self.seat, 0.0)))

    def _partner_of(self, agent: str) -> Any:
        partner = type(self)._partner
        if isinstance(partner, Mapping):
            if agent not in partner:
                raise KeyError(f"partner= has no policy for seat {agent!r} (it has {sorted(partner)}).")
            partner = partner[agent]
        return partner

    def _partner_answer(self, agent: str) -> str:
        partner = self._partner_of(agent)
        if partner == REFERENCE:
            answer = reference_answer(self.env.problem)
        elif callable(partner):
            answer = partner(agent, self.env.text(agent))
        else:
            raise TypeError(f"The partner of seat {agent!r} must be a callable (agent, prompt_text) -> str or "
                            f"'reference', got {partner!r}.")
        if not isinstance(answer, str):
            raise TypeError(f"The partner of seat {agent!r} returned {type(answer).__name__}, not a str.")
        self.partner_answers[agent].append(answer)
        return answer

    def _action(self, agent: str, text: str) -> Any:
        """The text, or its first ``max_new_tokens`` token ids where it is longer (the env would refuse it)."""
        limit = self.env.max_new_tokens
        if len(text.encode()) <= limit:  # a token covers at least one byte
            return text
        try:
            tok = self.env.tokenizer_of(agent)
        except RuntimeError:  # the server's tokenizer is an object: send the text, the env decides
            return text
        ids = list(tok(text, add_special_tokens=False)["input_ids"])
        return text if len(ids) <= limit else ids[:limit]

    # ------------------------------------------------------------------------------------------ prompts
    def _prompt(self, agent: str) -> str:
        text = self.env.text(agent)
        if not type(self).strip_chat_template or not self.env.spec["agents"][agent].get("chat_template"):
            return text
        template = self._template(agent)
        if template is None:
            return text
        head, tail = template
        if not text.startswith(head):
            return text
        body = text[len(head):]
        end = body.rfind(tail)
        if end < 0:
            return text
        rest = body[end + len(tail):]  # a task's response prefix, if any
        return body[:end] + (f"\n\n{rest}" if rest.strip() else "")

    def _template(self, agent: str) -> tuple[str, str] | None:
        """The text the env's chat template puts before and after a user message (for taking it off)."""
        if agent not in self._templates:
            try:
                tok = self.env.tokenizer_of(agent)
                rendered = tok.apply_chat_template([{"role": "user", "content": _SPLIT_MARK}], tokenize=False,
                                                   add_generation_prompt=True)
                head, _, tail = rendered.partition(_SPLIT_MARK)
                self._templates[agent] = (head, tail) if _ else None
            except Exception:
                self._templates[agent] = None
        return self._templates[agent]

    # ------------------------------------------------------------------------------------------ the connection
    def _connect(self) -> None:
        if self.env is not None:
            return
        env = connect(type(self).url, timeout_s=type(self).timeout_s)
        if self.seat not in env.possible_agents:
            env.close()
            raise ValueError(f"{env.env_id} has no seat {self.seat!r}; its seats are {env.possible_agents}.")
        if env.step_unit != "response":
            env.close()
            raise ValueError(f"{env.env_id} is served with step_unit={env.step_unit!r}: a tool call answers a whole "
                             "response, serve it with step_unit 'response' (the default).")
        self.env = env

    def _close(self) -> None:
        if self.env is not None:
            try:
                self.env.close()
            except Exception:
                pass
        self.env = None


def served_seat(url: str, seat: str, partner: Partner | str | Mapping[str, Partner | str] | None = None, *,
                split: str | None = None, tool_name: str = "submit", tool_description: str | None = None,
                no_answer_reward: float | None = None, strip_chat_template: bool = True,
                timeout_s: float = 300.0, class_name: str = "ServedSeat") -> type[ServedSeat]:
    """The class to pass as ``GRPOTrainer(environment_factory=...)``: each instance plays one rollout of the env
    served at ``url`` from ``seat``'s side (the module docstring).

    Args:
        url: the server (``llm-envs serve ID``), ``http://127.0.0.1:8000``.
        seat: the trained agent (one of the env's ``possible_agents``).
        partner: plays the other seats: a callable ``(agent, prompt_text) -> str``, ``"reference"``,
            :func:`model_policy` of a model, or ``{agent: one of those}``. Not needed for a one-seat env.
        split: the env's split when the rows have no ``split`` column (the server's default otherwise: train).
        tool_name: the tool's name (a Python identifier).
        tool_description: what the model reads about the tool (default: :data:`DEFAULT_TOOL_DOC`).
        no_answer_reward: the reward of a rollout that never called the tool (default: the task's min_reward).
        strip_chat_template: take the env's chat template off the seat's prompt (TRL wraps it in the model's).
        timeout_s: how long one request to the server may take.
        class_name: the class's name (TRL logs the reward as ``rewards/<class_name>/mean``).
    """
    reserved = ("reset", "get_reward")
    public = isinstance(tool_name, str) and tool_name.isidentifier() and not tool_name.startswith("_")
    if not public or tool_name in reserved:
        raise ValueError(f"tool_name must be a public Python identifier other than {reserved}, got {tool_name!r}.")
    if not isinstance(seat, str) or not seat:
        raise ValueError(f"seat must be an agent name, got {seat!r}.")
    if partner is not None and partner != REFERENCE and not callable(partner) and not isinstance(partner, Mapping):
        raise TypeError(f"partner must be a callable (agent, prompt_text) -> str, 'reference' or a mapping "
                        f"{{agent: ...}}, got {partner!r}.")
    description = (tool_description or DEFAULT_TOOL_DOC).format(seat=seat)

    def tool(self, answer: str) -> str:  # no hint on self: transformers reads every hint into the schema
        return self._submit(answer)

    tool.__name__ = tool_name
    tool.__qualname__ = f"{class_name}.{tool_name}"
    tool.__doc__ = (f"{description}\n\nArgs:\n    answer: your complete answer as the {seat}.\n\n"
                    "Returns:\n    The reward of the turn, and your next prompt if the task goes on.")
    attrs: dict[str, Any] = {
        "url": url, "seat": seat, "_partner": partner, "split": split, "no_answer_reward": no_answer_reward,
        "strip_chat_template": bool(strip_chat_template), "timeout_s": float(timeout_s), tool_name: tool,
        "__module__": __name__, "__doc__": f"{seat!r} of the env served at {url} (llm_envs.serve.trl.served_seat).",
    }
    if tool_name != "submit":
        attrs["submit"] = None  # hides the base class's tool: TRL lists functions only
    return type(class_name, (ServedSeat,), attrs)
