"""HF policies for the llm-envs environments: one base model, one LoRA adapter per agent.

See :mod:`agents.policy` for the policy, built from one module per concept: :mod:`agents.settings`
(LoRA and sampling settings), :mod:`agents.generation` (``generate``/``generate_joint``),
:mod:`agents.scoring` (log-probs, values, the reference), :mod:`agents.acting` (acting on env
observations), :mod:`agents.persistence` (``state``/``save``/``load``); :mod:`agents.engine` and
:mod:`agents.decoder` for the rollout engine and the fused forward (:mod:`agents.sampling` the draw,
:mod:`agents.head` the LM head's chunked log-probs); :mod:`agents.placement` for the agents' devices under
``--placement``; :mod:`agents.models` for loading models (the embedded SmolLM2-135M-Instruct default
included); :mod:`agents.expert` for a model as an env's turn transition.
"""

from agents.expert import ExpertTransition
from agents.models import DEFAULT_MODEL, convert_default_model, default_device, load_model
from agents.policy import Generation, LoraSettings, MultiAgentPolicy, Sampling

__all__ = [
    "DEFAULT_MODEL",
    "ExpertTransition",
    "Generation",
    "LoraSettings",
    "MultiAgentPolicy",
    "Sampling",
    "convert_default_model",
    "default_device",
    "load_model",
]
