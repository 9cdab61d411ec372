"""Where a team's agents live: each agent's device under a ``--placement``, and the policy over them.

Placement (``--placement``) on a node with several accelerators:

- ``data-parallel``: one process per device (``torchrun --nproc_per_node <devices>``), every process
  holds the base model and all agents' adapters on ``cuda:<LOCAL_RANK>``.
- ``agent-per-device``: the reference implementation's layout, agent i of a process on its own device
  ``cuda:<LOCAL_RANK * n_agents + i>`` (one full base copy per agent, see docs/scaling.md). It needs
  ``n_agents`` CUDA devices per process; on a CPU-only machine it raises a ``ValueError`` saying so.

=========================  ==========================================================================
``device_for``             the device of each agent of this process for a ``--placement``
``build_policy``           the policy for such an assignment: one ``MultiAgentPolicy`` when the agents
                           share a device, else an :class:`AgentPerDevicePolicy`
``AgentPerDevicePolicy``   the ``MultiAgentPolicy`` interface over one single-agent policy per device
=========================  ==========================================================================

See docs/scaling.md for commands and memory figures.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import torch

from agents.persistence import read_manifest, write_manifest

__all__ = ["PLACEMENTS", "AgentPerDevicePolicy", "Placement", "ProcessInfo", "build_policy", "device_for"]

Placement = Literal["data-parallel", "agent-per-device"]
PLACEMENTS: tuple[str, ...] = ("data-parallel", "agent-per-device")


class ProcessInfo(Protocol):
    """What placement reads of where this process sits (``baselines.infra.distributed.DistInfo``)."""

    @property
    def local_rank(self) -> int: ...

    @property
    def local_world_size(self) -> int: ...

    @property
    def distributed(self) -> bool: ...


def device_for(
    placement: str,
    agents: Sequence[str],
    info: ProcessInfo,
    device: str | None = None,
    cuda_devices: int | None = None,
) -> dict[str, str | None]:
    """The device of each agent of this process under ``placement``.

    ``data-parallel``: every agent on ``device`` if given, else ``cuda:<local_rank>`` when CUDA is
    available with several processes, else None (the model loader's default: a GPU when present, else
    the CPU). ``agent-per-device``: agent i on ``cuda:<local_rank * n_agents + i>``; raises
    ``ValueError`` when the node has fewer CUDA devices than ``n_agents`` per process (always on CPU).
    ``cuda_devices`` overrides ``torch.cuda.device_count()`` (tests)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {list(PLACEMENTS)}, got {placement!r}")
    count = torch.cuda.device_count() if cuda_devices is None else cuda_devices
    if placement == "data-parallel":
        if device is None and info.distributed and count > 0:
            if info.local_rank >= count:
                raise ValueError(
                    f"--placement data-parallel with {info.local_world_size} processes on this node needs one CUDA "
                    f"device each, but LOCAL_RANK={info.local_rank} and only {count} devices are visible"
                )
            device = f"cuda:{info.local_rank}"
        return {a: device for a in agents}
    need = len(agents) * info.local_world_size
    if count < need:
        raise ValueError(
            f"--placement agent-per-device puts each of the {len(agents)} agents {list(agents)} of each of the "
            f"{info.local_world_size} process(es) on this node on its own CUDA device ({need} devices), but "
            f"{count} {'is' if count == 1 else 'are'} visible"
            + (" (no CUDA on this machine)" if count == 0 else "")
            + "; use --placement data-parallel (all agents share one base model per device)"
        )
    if device is not None:
        raise ValueError(
            f"--device {device!r} contradicts --placement agent-per-device (devices are assigned per agent)"
        )
    return {a: f"cuda:{info.local_rank * len(agents) + i}" for i, a in enumerate(agents)}


def build_policy(
    agents: Sequence[str], model: str | None, devices: Mapping[str, str | None], **kwargs: Any
) -> Any:
    """The policy for a :func:`device_for` assignment: one ``MultiAgentPolicy`` when every agent shares
    a device (data-parallel), else an :class:`AgentPerDevicePolicy`. ``kwargs`` go to
    ``MultiAgentPolicy.from_pretrained`` (``lora``, ``dtype``, ``value_head``, ...)."""
    from agents import MultiAgentPolicy

    if len(set(devices[a] for a in agents)) == 1:
        return MultiAgentPolicy.from_pretrained(agents, model, device=devices[agents[0]], **kwargs)
    return AgentPerDevicePolicy.from_pretrained(agents, model, devices, **kwargs)


class AgentPerDevicePolicy:
    """The ``MultiAgentPolicy`` interface over one single-agent policy per device (``--placement
    agent-per-device``): each agent's base model copy and adapter live on its own accelerator, as in
    the reference implementation. Generations stay on their agent's device; checkpoints have the
    same layout as a ``MultiAgentPolicy`` of the same agents, so either can load the other's."""

    def __init__(self, policies: Mapping[str, Any]) -> None:
        if not policies:
            raise ValueError("AgentPerDevicePolicy needs at least one agent")
        for agent, policy in policies.items():
            if tuple(policy.agents) != (agent,):
                raise ValueError(f"policies[{agent!r}] must be a single-agent policy of {agent!r}, has {policy.agents}")
        self.policies = dict(policies)
        self.agents: tuple[str, ...] = tuple(policies)
        first = self.policies[self.agents[0]]
        self.pad_token_id = first.pad_token_id
        self.eos_token_ids = first.eos_token_ids
        self.tokenizer = first.tokenizer
        self.devices = [p.device for p in self.policies.values()]
        self.device = first.device

    @classmethod
    def from_pretrained(
        cls, agents: Sequence[str], model: str | None, devices: Mapping[str, str | None], **kwargs: Any
    ) -> AgentPerDevicePolicy:
        from agents import MultiAgentPolicy

        def own(value: Any, agent: str) -> Any:  # an agent's entry of a team's mapping
            return value[agent] if isinstance(value, Mapping) else value

        return cls({
            a: MultiAgentPolicy.from_pretrained(
                [a], own(model, a), device=devices[a], **{k: own(v, a) if k == "lora" else v for k, v in kwargs.items()}
            )
            for a in agents
        })

    def tokenizer_of(self, agent: str) -> Any:
        return self._of(agent).tokenizer_of(agent)

    def pad_token_id_of(self, agent: str) -> int:
        return self._of(agent).pad_token_id_of(agent)

    def eos_token_ids_of(self, agent: str) -> tuple[int, ...]:
        return self._of(agent).eos_token_ids_of(agent)

    @property
    def model(self) -> Any:
        """The first agent's model (its ``training`` flag is every agent's: :meth:`train` sets all)."""
        return self.policies[self.agents[0]].model

    def _of(self, agent: str) -> Any:
        if agent not in self.policies:
            raise KeyError(f"unknown agent {agent!r}; this policy's agents are {list(self.agents)}")
        return self.policies[agent]

    def generate_joint(self, prompts: Mapping[str, tuple[Any, Any]], num_samples: int = 1, **kwargs: Any) -> dict:
        if not isinstance(prompts, Mapping) or not prompts:
            raise ValueError(f"prompts must be a non-empty mapping agent -> (prompt_ids, prompt_mask), got {prompts!r}")
        out = {}
        for a, pair in prompts.items():
            own = dict(kwargs)
            # Per-agent settings (a team's ``sampling`` and ``logprob_temperature`` mappings) go to the
            # agent's own policy, which knows no other agent.
            for key in ("sampling", "logprob_temperature"):
                value = own.pop(key, None)
                if not isinstance(value, Mapping):
                    if value is not None:
                        own[key] = value
                elif a in value:
                    own[key] = {a: value[a]}
            out[a] = self._of(a).generate_joint({a: pair}, num_samples, **own)[a]
        return out

    def generate(self, agent: str, *args: Any, **kwargs: Any) -> Any:
        return self._of(agent).generate(agent, *args, **kwargs)

    def forward(self, agent: str, *args: Any, **kwargs: Any) -> Any:
        return self._of(agent).forward(agent, *args, **kwargs)

    def checked_rows(self, agent: str, *args: Any) -> Any:
        return self._of(agent).checked_rows(agent, *args)

    def logprobs_of(self, agent: str, rows: Any, **kwargs: Any) -> torch.Tensor:
        return self._of(agent).logprobs_of(agent, rows, **kwargs)

    def logprobs(self, agent: str, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self._of(agent).logprobs(agent, *args, **kwargs)

    def ref_logprobs(self, agent: str, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self._of(agent).ref_logprobs(agent, *args, **kwargs)

    def values(self, agent: str, *args: Any) -> torch.Tensor:
        return self._of(agent).values(agent, *args)

    def parameters(self, agent: str, **kwargs: Any) -> list[torch.nn.Parameter]:
        return self._of(agent).parameters(agent, **kwargs)

    def value_head_parameters(self, agent: str) -> list[torch.nn.Parameter]:
        return self._of(agent).value_head_parameters(agent)

    def optimizer(self, agent: str, lr: float, **kwargs: Any) -> torch.optim.Optimizer:
        return self._of(agent).optimizer(agent, lr, **kwargs)

    def act(self, observations: Mapping[str, Any], agent: str | None = None, **kwargs: Any) -> Any:
        if agent is not None:
            return self._of(agent).act(observations, agent, **kwargs)
        return {a: self._of(a).act({a: obs}, **kwargs)[a] for a, obs in observations.items()}

    def train(self, mode: bool = True) -> AgentPerDevicePolicy:
        for policy in self.policies.values():
            policy.train(mode)
        return self

    def eval(self) -> AgentPerDevicePolicy:
        return self.train(False)

    def state(self, agents: Sequence[str] | None = None) -> dict[str, dict[str, torch.Tensor]]:
        """A copy of what :meth:`save` writes (``MultiAgentPolicy.state``), agent by agent."""
        files: dict[str, dict[str, torch.Tensor]] = {}
        for agent in self.agents if agents is None else agents:
            files.update(self._of(agent).state(agents=[agent]))
        return files

    def save(
        self, directory: str | os.PathLike[str], state: Mapping[str, Mapping[str, torch.Tensor]] | None = None
    ) -> Path:
        """Every agent's files side by side and one manifest naming all agents (``MultiAgentPolicy``
        layout); the manifest goes last. ``state``: a :meth:`state` taken earlier, written instead of
        the live weights."""
        import shutil
        import tempfile

        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        manifest: dict[str, Any] | None = None
        team: dict[str, Any] = {}
        bases = []
        for agent, policy in self.policies.items():
            tmp = Path(tempfile.mkdtemp(prefix=f".{agent}.", dir=root))
            try:
                own_state = None if state is None else {k: v for k, v in state.items() if k.startswith(f"{agent}.")}
                policy.save(tmp, own_state)
                for file in tmp.glob(f"{agent}.*.safetensors"):
                    os.replace(file, root / file.name)
                own = read_manifest(tmp)
                manifest = manifest or own
                team.update(own.get("team", {}))
                bases.append(own.get("base_model"))
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        assert manifest is not None
        manifest["agents"] = list(self.agents)
        manifest["team"] = team
        if any(b != bases[0] for b in bases):  # a team of bases: compared agent by agent on load
            manifest["base_model"] = None
        write_manifest(root, manifest)
        return root

    def load(self, directory: str | os.PathLike[str]) -> None:
        """Load a ``MultiAgentPolicy`` (or :meth:`save`) directory holding exactly these agents. Every
        agent's part is checked before any weight changes."""
        import shutil
        import tempfile

        root = Path(directory)
        manifest = read_manifest(root)
        if not isinstance(manifest, dict) or sorted(manifest.get("agents", [])) != sorted(self.agents):
            theirs = manifest.get("agents") if isinstance(manifest, dict) else manifest
            raise ValueError(f"checkpoint {str(root)!r} holds agents {theirs}, this policy has {list(self.agents)}")
        staging = Path(tempfile.mkdtemp(prefix=".load.", dir=root))
        try:
            views = {}
            for agent in self.agents:
                view = staging / agent
                view.mkdir()
                for file in root.glob(f"{agent}.*.safetensors"):
                    os.symlink(file.resolve(), view / file.name)
                write_manifest(view, {**manifest, "agents": [agent]})
                views[agent] = view
            # Each sub-policy checks its own files before changing a weight; checking presence for
            # all agents first keeps a missing file from leaving only some agents loaded.
            for agent, view in views.items():
                if not any(view.glob(f"{agent}.adapter.safetensors")):
                    raise FileNotFoundError(f"checkpoint file {root / (agent + '.adapter.safetensors')} is missing")
            for agent, view in views.items():
                self.policies[agent].load(view)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
