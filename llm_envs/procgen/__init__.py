"""What the procedurally generated task families share: seeded instances, the two splits, the tool
agent's sandboxed program, and the tool/planner task skeleton.

Families: :mod:`llm_envs.tasks.planning` (``planning/plan-path-v0``) and :mod:`llm_envs.tasks.puzzle`
(``puzzle/sudoku4-v0``, ``puzzle/sudoku9-v0``, ``puzzle/sokoban-v0``). Docs: ``docs/procgen.md``.

=========  ======================================================================================
splits     seeded instances, the eval and train splits (:class:`GeneratedSplit`), levels
tools      the tool agent's program, run in the sandbox (:func:`run_tool_program`)
skeleton   the tool/planner task every puzzle family extends (:class:`ToolPlannerTask`)
=========  ======================================================================================
"""

from __future__ import annotations

from llm_envs.procgen.skeleton import (
    FEEDBACK_HEADER,
    MAX_PROBLEMS_SHOWN,
    PLANNER_PROMPT,
    PREVIOUS_ANSWER,
    REVISE,
    TOOL_PROMPT,
    TOOL_REWARD,
    TOOL_SECTION,
    ToolPlannerTask,
    listing,
)
from llm_envs.procgen.splits import (
    EVAL_CLASS,
    EVAL_SEEDS_PER_INSTANCE,
    EVAL_SIZE,
    LEVELS,
    MAX_ATTEMPTS,
    MAX_TRAIN_DRAWS,
    TRAIN_SEED_OFFSET,
    TRAIN_SIZE,
    GeneratedSplit,
    Generator,
    below,
    check_fraction,
    check_int,
    generate_cached,
    in_eval_class,
    instance_key,
    instance_random,
    labeled_grid,
    resolve_level,
    shuffled,
    split_size,
)
from llm_envs.procgen.tools import (
    TOOL_MEMORY_MB,
    TOOL_MESSAGE_CHARS,
    TOOL_OUTPUT_CHARS,
    TOOL_STATUSES,
    TOOL_TIMEOUT_S,
    ToolRun,
    printable,
    run_tool_program,
    tool_source,
)

__all__ = [
    "EVAL_CLASS",
    "EVAL_SEEDS_PER_INSTANCE",
    "EVAL_SIZE",
    "FEEDBACK_HEADER",
    "LEVELS",
    "MAX_ATTEMPTS",
    "MAX_PROBLEMS_SHOWN",
    "MAX_TRAIN_DRAWS",
    "PLANNER_PROMPT",
    "PREVIOUS_ANSWER",
    "REVISE",
    "TOOL_MEMORY_MB",
    "TOOL_MESSAGE_CHARS",
    "TOOL_OUTPUT_CHARS",
    "TOOL_PROMPT",
    "TOOL_REWARD",
    "TOOL_SECTION",
    "TOOL_STATUSES",
    "TOOL_TIMEOUT_S",
    "TRAIN_SEED_OFFSET",
    "TRAIN_SIZE",
    "GeneratedSplit",
    "Generator",
    "ToolPlannerTask",
    "ToolRun",
    "below",
    "check_fraction",
    "check_int",
    "generate_cached",
    "in_eval_class",
    "instance_key",
    "instance_random",
    "labeled_grid",
    "listing",
    "printable",
    "resolve_level",
    "run_tool_program",
    "shuffled",
    "split_size",
    "tool_source",
]
