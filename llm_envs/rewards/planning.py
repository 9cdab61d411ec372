"""Grid path-planning reward (``planning/plan-path-v0``): a move string from the start to the goal.

The answer is read from the response (or from a tool program's printed output) in two steps:

1. The *answer region*: the text after the last ``Answer:`` (any case) if there is one, else the
   whole text.
2. The *moves*: runs of the capital letters ``U``, ``D``, ``L``, ``R`` not touching other letters,
   optionally separated by spaces or commas (``RRDD``, ``R R D D``, ``R, R, D, D``). With an
   ``Answer:`` marker the first run after it is the answer; without one, the last run of the text.
   Words such as ``RIGHT`` or ``Down`` are not moves.

``U`` is row - 1, ``D`` row + 1, ``L`` column - 1, ``R`` column + 1; cells are ``(row, column)`` from
``(0, 0)`` at the top left. The moves are executed from the start until the first illegal one (a
move that leaves the grid or enters a wall, ``#``), where execution stops.

=============  ======  =================================================================
component      value   when
=============  ======  =================================================================
``format``     0.1     the answer has at least one move
``valid``      0 - 0.2 0.2 x (moves executed before the first illegal one) / (moves)
``goal``       1.0     every move is legal and the walk ends on the goal
``optimal``    0 - 0.5 0.5 x (shortest path length) / (moves), when ``goal`` is earned
=============  ======  =================================================================

The components sum to the total; the maximum, 1.8, is a shortest path. The env adds a ``tool``
component for the tool program's answer (see :mod:`llm_envs.tasks.planning`).

>>> grid = ("S.#", "..#", "#.G")
>>> plan_path_components(completions=["Answer: DRDR"], grid=[grid], start=[(0, 0)], goal=[(2, 2)],
...                      shortest=[4])
[{'format': 0.1, 'valid': 0.2, 'goal': 1.0, 'optimal': 0.5}]
>>> walk(grid, (0, 0), "RR").error
'move 2 (R) walks into a wall at (0, 2)'
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

WALL = "#"
MOVES: dict[str, tuple[int, int]] = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
FORMAT_REWARD = 0.1
VALID_REWARD = 0.2
GOAL_REWARD = 1.0
OPTIMAL_REWARD = 0.5
COMPONENTS = ("format", "valid", "goal", "optimal")
MAX_REWARD = FORMAT_REWARD + VALID_REWARD + GOAL_REWARD + OPTIMAL_REWARD

Cell = tuple[int, int]

_ANSWER_MARKER = re.compile(r"answer\s*:", re.IGNORECASE)
_MOVE_RUN = re.compile(r"(?<![A-Za-z])[UDLR](?:[ ,]*[UDLR])*(?![A-Za-z])")


def answer_region(text: str) -> tuple[str, bool]:
    """The text after the last ``Answer:`` marker (and True), or the whole text (and False).

    >>> answer_region("I think... Answer: RRD")
    (' RRD', True)
    """
    if not isinstance(text, str):
        raise TypeError(f"Expected a string answer, got {type(text).__name__}: {text!r:.80}")
    ends = [m.end() for m in _ANSWER_MARKER.finditer(text)]
    return (text[ends[-1] :], True) if ends else (text, False)


def parse_moves(text: str) -> str:
    """The moves of an answer as a string of ``UDLR`` letters ("" when there are none); see the
    module docstring for the rule.

    >>> parse_moves("Go R, R then D. Answer: R, R, D"), parse_moves("RIGHT then Down"), parse_moves("D L")
    ('RRD', '', 'DL')
    """
    region, marked = answer_region(text)
    runs = _MOVE_RUN.findall(region)
    if not runs:
        return ""
    run = runs[0] if marked else runs[-1]
    return "".join(ch for ch in run if ch in MOVES)


@dataclass(frozen=True)
class Walk:
    """The result of executing moves on a grid from a start cell."""

    moves: str
    """The moves that were given."""
    legal: int
    """How many moves were executed before the first illegal one (all of them if none was)."""
    path: tuple[Cell, ...]
    """Cells visited, the start first; ``path[-1]`` is where execution stopped."""
    error: str | None
    """The first illegal move, in words (``"move 4 (R) walks into a wall at (2, 3)"``), else None."""

    @property
    def end(self) -> Cell:
        return self.path[-1]


def walk(grid: Sequence[str], start: Cell, moves: str) -> Walk:
    """Execute ``moves`` on ``grid`` (rows of characters, ``#`` = wall) from ``start``, stopping at the
    first move that leaves the grid or enters a wall."""
    rows, cols = len(grid), len(grid[0]) if grid else 0
    r, c = start
    path = [(r, c)]
    for i, move in enumerate(moves):
        dr, dc = MOVES[move]
        nr, nc = r + dr, c + dc
        if not (0 <= nr < rows and 0 <= nc < cols):
            return Walk(moves, i, tuple(path), f"move {i + 1} ({move}) leaves the grid at ({nr}, {nc})")
        if grid[nr][nc] == WALL:
            return Walk(moves, i, tuple(path), f"move {i + 1} ({move}) walks into a wall at ({nr}, {nc})")
        r, c = nr, nc
        path.append((r, c))
    return Walk(moves, len(moves), tuple(path), None)


def reaches_goal(grid: Sequence[str], start: Cell, goal: Cell, text: str) -> bool:
    """Whether the answer in ``text`` is a legal walk from ``start`` that ends on ``goal``."""
    moves = parse_moves(text)
    result = walk(grid, start, moves)
    return bool(moves) and result.error is None and result.end == tuple(goal)


def score_moves(moves: str, grid: Sequence[str], start: Cell, goal: Cell, shortest: int) -> dict[str, float]:
    """The components (see the module docstring) of parsed ``moves``."""
    if not moves:
        return dict.fromkeys(COMPONENTS, 0.0)
    result = walk(grid, start, moves)
    reached = result.error is None and result.end == tuple(goal)
    return {
        "format": FORMAT_REWARD,
        "valid": VALID_REWARD * result.legal / len(moves),
        "goal": GOAL_REWARD if reached else 0.0,
        "optimal": OPTIMAL_REWARD * shortest / len(moves) if reached else 0.0,
    }


def plan_path_components(
    *,
    completions: Sequence[str],
    grid: Sequence[Sequence[str]],
    start: Sequence[Cell],
    goal: Sequence[Cell],
    shortest: Sequence[int],
    **kwargs: Any,
) -> list[dict[str, float]]:
    """Per completion: the components of the module docstring (keys :data:`COMPONENTS`). The other
    arguments are per-completion columns, as TRL passes dataset columns."""
    n = len(completions)
    for name, column in (("grid", grid), ("start", start), ("goal", goal), ("shortest", shortest)):
        if len(column) != n:
            raise ValueError(f"Got {n} completions but {len(column)} values of {name!r}; they must pair up.")
    return [
        score_moves(parse_moves(text), g, tuple(s), tuple(e), int(k))
        for text, g, s, e, k in zip(completions, grid, start, goal, shortest, strict=True)
    ]


def plan_path_reward(
    *,
    completions: Sequence[str],
    grid: Sequence[Sequence[str]],
    start: Sequence[Cell],
    goal: Sequence[Cell],
    shortest: Sequence[int],
    **kwargs: Any,
) -> list[float]:
    """The total per completion (the sum of :func:`plan_path_components`; at most :data:`MAX_REWARD`)."""
    parts = plan_path_components(completions=completions, grid=grid, start=start, goal=goal, shortest=shortest)
    return [sum(p.values()) for p in parts]
