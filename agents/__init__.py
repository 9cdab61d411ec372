"""HF policies for the llm-envs environments: one base model, one LoRA adapter per agent.

See :mod:`agents.policy` for the policy and :mod:`agents.models` for loading models (the embedded
SmolLM2-135M-Instruct default included); :mod:`agents.expert` for a model as an env's turn transition.
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
