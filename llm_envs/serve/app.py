"""The app an ASGI server imports (``uvicorn llm_envs.serve.app:app``, the ``app`` of openenv.yaml): the env of
``LLM_ENVS_ID`` (default ``writing/xsum-v0``) with ``LLM_ENVS_MAKE_KWARGS`` (a JSON object) and ``MAX_SESSIONS``.
``llm-envs serve`` is the same app with SIGTERM draining; prefer it where you choose the command.

The app is built when first asked for (``module.app``), not at import, so that importing this module (pytest's
doctest collection, a linter) builds no env."""

from __future__ import annotations

import json
import os
from typing import Any

_APP: Any = None


def __getattr__(name: str) -> Any:
    global _APP
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if _APP is None:
        from llm_envs.serve import create_app

        _APP = create_app(os.environ.get("LLM_ENVS_ID", "writing/xsum-v0"),
                          max_sessions=int(os.environ.get("MAX_SESSIONS", "64")),
                          **json.loads(os.environ.get("LLM_ENVS_MAKE_KWARGS", "{}")))
    return _APP
