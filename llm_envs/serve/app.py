"""The app an ASGI server imports (``uvicorn llm_envs.serve.app:app``, the ``app`` of openenv.yaml): the env of
``LLM_ENVS_ID`` (default ``writing/xsum-v0``) with ``LLM_ENVS_MAKE_KWARGS`` (a JSON object) and ``MAX_SESSIONS``.
``llm-envs serve`` is the same app with SIGTERM draining; prefer it where you choose the command."""

from __future__ import annotations

import json
import os

from llm_envs.serve import create_app

app = create_app(os.environ.get("LLM_ENVS_ID", "writing/xsum-v0"),
                 max_sessions=int(os.environ.get("MAX_SESSIONS", "64")),
                 **json.loads(os.environ.get("LLM_ENVS_MAKE_KWARGS", "{}")))
