"""Task families. Importing this package registers every built-in env id."""

from llm_envs.tasks import (  # noqa: F401
    building,
    classeval,
    coding,
    coding_single,
    math,
    planning,
    puzzle,
    sentiment,
    writing,
    writing_single,
)
