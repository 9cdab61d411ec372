"""Persistence: a policy's trained state (``state``), written to a directory (``save``: one
safetensors file per agent's adapter and value head, then ``policy.json``) and read back (``load``:
everything checked before any weight changes)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from agents.settings import LoraSettings

CHECKPOINT_FORMAT = "llm-envs-policy-v1"
MANIFEST_NAME = "policy.json"


class PersistenceMixin:
    """``state``, ``save`` and ``load`` of :class:`agents.policy.MultiAgentPolicy`."""

    def _manifest(self) -> dict[str, Any]:
        full = [self.lora_of[a] is None for a in self.agents]
        one = self.groups[0] if len(self.groups) == 1 else None
        return {
            "format": CHECKPOINT_FORMAT,
            "agents": list(self.agents),
            "mode": "full" if all(full) else "lora" if not any(full) else "mixed",
            "lora": None if self.lora is None else _lora_json(self.lora),
            "value_head": self.value_heads is not None,
            "base_model": None if one is None else one.describe(),
            # Each agent's base, tokenizer and adapter settings (a team may differ in all three).
            "team": {
                agent: {
                    "base": self._group_of[agent].describe(),
                    "tokenizer": self._group_of[agent].tokenizer_record(),
                    "lora": None if self.lora_of[agent] is None else _lora_json(self.lora_of[agent]),
                }
                for agent in self.agents
            },
        }

    def _agent_state(self, agent: str) -> dict[str, torch.Tensor]:
        group = self._group_of[agent]
        if group.full:
            return {n: p for n, p in group.model.state_dict().items()}
        from peft import get_peft_model_state_dict

        return get_peft_model_state_dict(group.model, adapter_name=agent)

    def state(self, agents: Sequence[str] | None = None) -> dict[str, dict[str, torch.Tensor]]:
        """A copy of everything :meth:`save` writes, as ``{file name: {key: CPU tensor}}``: the trained
        state at one moment, which later updates do not change (``save(dir, state)`` writes it).
        ``agents``: only these agents' files (all by default)."""
        files: dict[str, dict[str, torch.Tensor]] = {}
        for agent in self.agents if agents is None else agents:
            self._check_agent(agent)
            state = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in self._agent_state(agent).items()}
            if self._group_of[agent].full:
                state = _untie(state)
            files[f"{agent}.adapter.safetensors"] = state
            if self.value_heads is not None:
                files[f"{agent}.value_head.safetensors"] = {
                    k: v.detach().to("cpu", copy=True).contiguous()
                    for k, v in self.value_heads[agent].state_dict().items()
                }
        return files

    def save(
        self, directory: str | os.PathLike[str], state: Mapping[str, Mapping[str, torch.Tensor]] | None = None
    ) -> Path:
        """Write each agent's adapter (``<agent>.adapter.safetensors``; the whole model under full
        fine-tuning) and value head, then ``policy.json`` naming agents and settings. Returns the dir.
        ``state``: a :meth:`state` taken earlier, written instead of the live weights."""
        from safetensors.torch import save_file

        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        files = self.state() if state is None else state
        for name, tensors in files.items():
            tmp = root / f".{name}.tmp"
            save_file(dict(tensors), str(tmp))
            os.replace(tmp, root / name)
        # The manifest goes last: a directory without it is an unfinished save.
        write_manifest(root, self._manifest())
        return root

    def describe_agents(self, agents: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        """Each agent's base, tokenizer and adapter settings, as :meth:`save` records them (``agents``:
        only these)."""
        team = self._manifest()["team"]
        return {a: team[a] for a in (self.agents if agents is None else agents)}

    def load(self, directory: str | os.PathLike[str], agents: Sequence[str] | None = None) -> None:
        """Load a :meth:`save` directory into this policy. Everything is read and checked (agent names,
        mode, LoRA settings, base model, tensor names and shapes) before any weight changes.
        ``agents``: only these agents' files are read (the directory must hold them: a :meth:`save` of
        ``state(agents)``), and only their records checked; the other agents keep their weights."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        root = Path(directory)
        manifest_path = root / MANIFEST_NAME
        manifest = read_manifest(root)
        if not isinstance(manifest, dict) or manifest.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{manifest_path} is not a {CHECKPOINT_FORMAT} manifest: {manifest!r:.200}")
        ours = self._manifest()
        subset = agents is not None
        wanted = list(self.agents) if agents is None else list(dict.fromkeys(agents))
        for agent in wanted:
            self._check_agent(agent)
        held = manifest.get("agents", [])
        if (subset and not set(wanted) <= set(held)) or (not subset and sorted(held) != sorted(self.agents)):
            raise ValueError(f"checkpoint {str(root)!r} holds agents {held}, this policy "
                             f"{'loads' if subset else 'has'} {wanted}")
        team = manifest.get("team")
        if subset and not isinstance(team, dict):
            raise ValueError(f"checkpoint {str(root)!r} records no per-agent bases: load it whole")
        if isinstance(team, dict):  # each agent's base and tokenizer, named in the error
            for agent in wanted:
                check_agent_record(root, agent, team.get(agent), ours["team"][agent])
        # The policy-wide records; loading some agents, their per-agent records above are what matters.
        for key in () if subset else ("mode", "lora", "value_head", "base_model"):
            theirs, mine = manifest.get(key), ours[key]
            if key == "base_model" and (theirs is None or mine is None) and isinstance(team, dict):
                continue  # a team: compared agent by agent above
            if key == "base_model" and isinstance(theirs, dict):
                # Same architecture is what matters; a renamed local copy of the model is fine.
                theirs = {k: v for k, v in theirs.items() if k != "name_or_path"}
                mine = {k: v for k, v in mine.items() if k != "name_or_path"}
            if theirs != mine:
                raise ValueError(f"checkpoint {str(root)!r} has {key}={theirs!r}, this policy has {key}={mine!r}")

        if subset and bool(manifest.get("value_head")) != (self.value_heads is not None):
            raise ValueError(f"checkpoint {str(root)!r} has value_head={manifest.get('value_head')!r}, this policy "
                             f"has value_head={self.value_heads is not None!r}")
        staged: dict[str, tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]] = {}
        for agent in wanted:
            parts = []
            for kind, expected in (
                ("adapter", self._agent_state(agent)),
                ("value_head", None if self.value_heads is None else self.value_heads[agent].state_dict()),
            ):
                if expected is None:
                    parts.append(None)
                    continue
                path = root / f"{agent}.{kind}.safetensors"
                try:
                    state = load_file(str(path), device="cpu")
                except FileNotFoundError as err:
                    raise FileNotFoundError(f"checkpoint file {path} is missing") from err
                except (SafetensorError, OSError, ValueError) as err:
                    raise ValueError(f"corrupt checkpoint file {path}: {err}") from err
                if self._group_of[agent].full:
                    state = _retie(state, expected)
                _check_state(path, state, expected)
                parts.append(state)
            staged[agent] = (parts[0], parts[1])

        with torch.no_grad():
            for agent, (adapter, head) in staged.items():
                group = self._group_of[agent]
                if group.full:
                    group.model.load_state_dict(adapter)
                else:
                    from peft import set_peft_model_state_dict

                    result = set_peft_model_state_dict(group.model, adapter, adapter_name=agent)
                    if result.unexpected_keys:
                        raise RuntimeError(f"PEFT did not place {result.unexpected_keys[:5]} for agent {agent!r}")
                if head is not None:
                    self.value_heads[agent].load_state_dict(head)
        # load_state_dict keeps the Parameter objects, so optimizers built earlier still hold them.
        for group in self.groups:
            active, group.active = group.active, None
            group.set_agent(active or group.agents[0])


def read_manifest(root: Path) -> Any:
    """The parsed manifest of the saved policy in ``root``: ``FileNotFoundError`` when it has none (not a
    saved policy, or an unfinished save), ``ValueError`` when it does not parse."""
    path = root / MANIFEST_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: {str(root)!r} is not a saved policy")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"corrupt checkpoint manifest {path}: {err}") from err


def write_manifest(root: Path, manifest: Mapping[str, Any]) -> None:
    """Write ``manifest`` as ``root``'s manifest in one step (a temporary file, then a rename): the last
    file of a save, so a directory without it is an unfinished one."""
    tmp = root / f".{MANIFEST_NAME}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2))
    os.replace(tmp, root / MANIFEST_NAME)


def check_agent_record(root: Path, agent: str, theirs: Any, mine: Mapping[str, Any]) -> None:
    """Refuse a checkpoint whose ``agent`` was trained on another base, tokenizer or adapter shape
    than this policy gives it (a renamed local copy of the same model is fine: names are not compared)."""
    if not isinstance(theirs, dict):
        raise ValueError(f"checkpoint {str(root)!r} records no base for agent {agent!r}")

    def strip(record: Any) -> Any:
        return {k: v for k, v in record.items() if k != "name_or_path"} if isinstance(record, dict) else record

    for key, what in (("base", "base model"), ("tokenizer", "tokenizer"), ("lora", "LoRA settings")):
        if strip(theirs.get(key)) != strip(mine[key]):
            raise ValueError(
                f"checkpoint {str(root)!r}: agent {agent!r} was trained with {what} {theirs.get(key)!r}, this policy "
                f"gives it {mine[key]!r}; build the policy with the agent's own {what} (or a fresh run)"
            )


def _lora_json(lora: LoraSettings) -> dict[str, Any]:
    data = asdict(lora)
    if not isinstance(data["target_modules"], str):
        data["target_modules"] = list(data["target_modules"])
    return data



def _check_state(path: Path, state: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]) -> None:
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [
        f"{k}: {tuple(state[k].shape)} in the file, {tuple(expected[k].shape)} here"
        for k in sorted(set(state) & set(expected))
        if state[k].shape != expected[k].shape
    ]
    if missing or unexpected or wrong:
        raise ValueError(
            f"checkpoint file {path} does not fit this policy: missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}, wrong shapes {wrong[:5]}"
        )



def _untie(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors that share memory (tied embeddings): store each once."""
    seen: dict[int, str] = {}
    out = {}
    for key, tensor in state.items():
        ptr = tensor.untyped_storage().data_ptr()
        if ptr in seen:
            continue
        seen[ptr] = key
        out[key] = tensor
    return out


def _retie(state: dict[str, torch.Tensor], expected: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Inverse of :func:`_untie` against the live state dict: fill keys that alias a saved tensor."""
    ptrs = {tensor.untyped_storage().data_ptr(): key for key, tensor in expected.items() if key in state}
    out = dict(state)
    for key, tensor in expected.items():
        if key not in out:
            source = ptrs.get(tensor.untyped_storage().data_ptr())
            if source is not None:
                out[key] = state[source]
    return out

