"""The episode as text and as data: :meth:`Transcript.transcript` (what ``render()`` shows) and
:meth:`Transcript.transcript_turns` (one dict per turn)."""

from __future__ import annotations

from typing import Any

import gymnasium


class Transcript:
    """Mixin of :class:`~llm_envs.core.base.LLMEnvCore`: the transcript it keeps, rendered. The env
    appends ``(kind, role, text)`` entries to ``_transcript`` as the episode goes."""

    env_id: str
    render_mode: str | None
    possible_agents: list[str]
    task: Any
    _transcript: list[tuple[str, str, str]]
    _history: list[Any]
    _problem: Any
    _split: str
    _task_index: int | None
    _started: bool

    def transcript(self) -> str:
        """The episode so far as text: prompts, responses, rewards and feedback, turn by turn."""
        lines = [f"=== {self.env_id} | split={self._split} task_index={self._task_index} ==="]
        turn = 0
        for kind, role, text in self._transcript:
            if kind == "prompt":
                lines.append(f"--- prompt [{role}] ---\n{text}")
            elif kind == "response":
                lines.append(f"--- response [{role}] ---\n{text}")
            elif kind == "reward":
                lines.append(f"--- reward: {text}")
                if turn < len(self._history):
                    outputs = {r: o.text for r, o in self._history[turn].outputs.items()}
                    board = self.task.render_turn(self._problem, outputs)
                    if board:
                        lines.append(f"--- board ---\n{board}")
                turn += 1
            else:  # feedback, and any other kind of entry a subclass adds (a centralised env's sections)
                lines.append(f"--- {kind} [{role}] ---\n{text}")
        return "\n".join(lines)

    def transcript_turns(self) -> list[dict[str, Any]]:
        """The episode so far as data, one dict per turn (what :meth:`transcript` prints): ``prompts``
        ({role: prompt text as tokenized}), ``responses`` ({role: text}), ``reward`` (the joint one),
        ``components``, ``agent_rewards`` ({role: reward}) and ``feedback`` ({role: text}). A turn still
        in progress has its prompts so far, ``reward`` None and the rest empty."""
        turns: list[dict[str, Any]] = []
        prompts: dict[str, str] = {}
        for kind, role, text in self._transcript:
            if kind == "prompt":
                prompts[role] = text
            elif kind == "reward":
                record = self._history[len(turns)]
                turns.append(
                    {
                        "prompts": prompts,
                        "responses": {r: record.outputs[r].text for r in self.possible_agents},
                        "reward": record.reward,
                        "components": dict(record.components),
                        "agent_rewards": dict(record.agent_rewards),
                        "feedback": dict(record.feedback),
                    }
                )
                prompts = {}
        if prompts:
            turns.append(
                {"prompts": prompts, "responses": {}, "reward": None, "components": {}, "agent_rewards": {},
                 "feedback": {}}
            )
        return turns

    def render(self) -> str | None:
        if self.render_mode is None:
            gymnasium.logger.warn(
                "You are calling render() without a render_mode; make the env with render_mode='ansi' or 'human'."
            )
            return None
        if not self._started:
            return "" if self.render_mode == "ansi" else None
        text = self.transcript()
        if self.render_mode == "human":
            print(text)
            return None
        return text

