"""Task families. Importing this package registers every built-in env id."""

from llm_envs.tasks import building, classeval, coding, math, planning, puzzle, sentiment, writing, writing_single  # noqa: F401
