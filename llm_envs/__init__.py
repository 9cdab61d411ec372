"""llm-envs: multi-agent environments in which language models collaborate on text tasks.

``make(id)`` builds one env (PettingZoo's parallel or AEC API, by the id's protocol); ``make_vec(id, n)``
a batch of n envs stepped together (:mod:`llm_envs.core.vector`); ``make(id, centralized=True)`` or
``centralize(env)`` one agent writing every role of a parallel env (:mod:`llm_envs.core.centralized`).
Nothing here imports torch.

>>> import llm_envs
>>> "writing/xsum-v0" in llm_envs.list_envs()
True
"""

from llm_envs.core.base import MixedTokenizersError
from llm_envs.core.centralized import CentralizedEnv, CentralizedTask, centralize, split_sections
from llm_envs.core.registry import describe_envs, list_envs, make, make_aec, register, spec
from llm_envs.core.task import Context, Response, Task, TemplateTask, TurnRecord
from llm_envs.core.vector import SequentialVectorEnv, VectorEnv, make_vec

__version__ = "0.2.0"

__all__ = [
    "CentralizedEnv",
    "CentralizedTask",
    "Context",
    "MixedTokenizersError",
    "Response",
    "SequentialVectorEnv",
    "Task",
    "TemplateTask",
    "TurnRecord",
    "VectorEnv",
    "__version__",
    "centralize",
    "describe_envs",
    "list_envs",
    "make",
    "make_aec",
    "make_vec",
    "register",
    "spec",
    "split_sections",
]
