"""Grid path planning, generated: find a path from S to G on a grid with walls. A tool agent writes a
program that prints the moves; a planner gives the final answer.

=====================  ==========================================================================
Ids                    ``planning/plan-path-v0`` (difficulty ``medium``), ``planning/plan-path-easy-v0``
                       (the same task at ``difficulty="easy"``)
Protocol               parallel by default (both roles answer at once); ``protocol="sequential"``:
                       the tool's program runs first and the planner sees its printed output
Agents                 ``tool`` writes a Python program that prints the moves (run in the sandbox);
                       ``planner`` answers with the moves
Observation / action   token ids (see :mod:`llm_envs.core.base`); max_new_tokens 384,
                       max_prompt_tokens 3072 (room for the worst case: a 16 x 16 board, the tool's
                       longest output and error, the previous answer and feedback)
Reward                 the planner's answer (:mod:`llm_envs.rewards.planning`, max 1.8) plus
                       ``tool`` = 0.5 when the program's printed moves reach the goal: max 2.3, the
                       same joint value to both agents; components in infos as ``reward_<name>``
Episode                one turn by default; with ``num_turns >= 2`` each role sees its previous
                       answer and feedback ("move 4 (R) walks into a wall at (2, 3)")
=====================  ==========================================================================

Reward (the components sum to the total):

=============  ======  =================================================================
component      value   when
=============  ======  =================================================================
``format``     0.1     the planner's answer has at least one move
``valid``      0-0.2   0.2 x (moves before the first illegal one) / (moves)
``goal``       1.0     every move is legal and the walk ends on the goal
``optimal``    0-0.5   0.5 x (shortest path length) / (moves), when ``goal`` is earned
``tool``       0.5     the tool program ran and its printed moves reach the goal
=============  ======  =================================================================

Board (both roles; ``(r, c)`` is row r, column c, from 0 at the top left)::

       0 1 2 3 4
    0  S . # . .
    1  . . # . #
    2  # . . . .
    3  . # # . .
    4  . . . # G
    Start: (0, 0). Goal: (4, 4).

Legend: ``S`` start, ``G`` goal, ``#`` wall, ``.`` free. Moves ``U`` (row - 1), ``D`` (row + 1),
``L`` (column - 1), ``R`` (column + 1). The planner ends its reply with ``Answer: <moves>``. The tool
program has the variables ``grid`` (list of row strings, as on the board), ``start`` and ``goal``
(``(row, column)`` tuples) and prints only the moves.

Instances (:mod:`llm_envs.procgen`): walls are drawn cell by cell with probability
``wall_fraction``; the start is a random free cell; the goal is a random cell reachable from it at
least ``size - 1`` moves away and at least half as far as the farthest reachable cell (grids where
nothing is that far are drawn again). Every instance is solvable by
construction; its shortest path length (BFS) is part of the instance. Splits: 1000 fixed eval
instances, an unbounded train split that never contains them (:mod:`llm_envs.procgen`).

=========  =======  ===============  ===========================================
level      size     wall_fraction    shortest path, 200 instances (median)
=========  =======  ===============  ===========================================
easy       5 x 5    0.2              4-10 moves (5)
medium     7 x 7    0.3              6-19 moves (7)
hard       10 x 10  0.35             9-27 moves (11)
=========  =======  ===============  ===========================================

Task arguments: ``difficulty`` (``easy`` | ``medium`` | ``hard``), ``size`` (3-16) and
``wall_fraction`` (0-0.5) override the level's values; ``tool_timeout_s`` (default 5 s).
:func:`solve_plan_path` is the reference solver (BFS, a shortest path).

Version history: v0 (initial).

>>> import llm_envs
>>> env = llm_envs.make("planning/plan-path-easy-v0")
>>> obs, infos = env.reset(seed=0, options={"split": "eval", "task_index": 3})
>>> answer = solve_plan_path(env.problem)
>>> _, rewards, *_ = env.step({"tool": f"print({answer[8:]!r})", "planner": answer})
>>> rewards["planner"], env.task.max_reward
(2.3, 2.3)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, ClassVar

from llm_envs.core.registry import register
from llm_envs.core.task import Problem
from llm_envs.procgen import (
    TOOL_REWARD,
    TOOL_TIMEOUT_S,
    ToolPlannerTask,
    check_fraction,
    check_int,
    instance_random,
    labeled_grid,
    listing,
    resolve_level,
)
from llm_envs.rewards.planning import (
    COMPONENTS,
    MAX_REWARD,
    MOVES,
    parse_moves,
    reaches_goal,
    score_moves,
    walk,
)

FAMILY = "plan-path"
LEVELS: dict[str, dict[str, Any]] = {
    "easy": {"size": 5, "wall_fraction": 0.2},
    "medium": {"size": 7, "wall_fraction": 0.3},
    "hard": {"size": 10, "wall_fraction": 0.35},
}
SIZE_RANGE = (3, 16)
WALL_FRACTION_RANGE = (0.0, 0.5)
MAX_ATTEMPTS = 1000
FREE, WALL, START, GOAL = ".", "#", "S", "G"
_ORDER = tuple(MOVES)  # neighbour order of the BFS: U, D, L, R

TASK_TEXT = """Find a path on the grid below from the start S to the goal G.
Legend: S start, G goal, # wall, . free cell. Cells are (row, column), numbered from 0 at the top left \
as on the labels.
Moves: U (up, row - 1), D (down, row + 1), L (left, column - 1), R (right, column + 1). A move may not \
leave the grid or enter a wall."""
ANSWER_TEXT = ('Give the shortest sequence of moves from S to G. End your reply with one line '
               '"Answer: <moves>", for example "Answer: RRDDL".')
TOOL_ANSWER_TEXT = "the moves as one string of the letters U, D, L, R (for example RRDDL)"
INPUTS_TEXT = """grid: list of str, one string per row with the characters of the board (grid[r][c])
start: (row, column) tuple of the start
goal: (row, column) tuple of the goal"""

PLAN_PATH_PROGRAM = """\
from collections import deque
rows, cols = len(grid), len(grid[0])
prev = {start: None}
queue = deque([start])
while queue:
    cell = queue.popleft()
    if cell == goal:
        break
    for move, (dr, dc) in (("U", (-1, 0)), ("D", (1, 0)), ("L", (0, -1)), ("R", (0, 1))):
        nxt = (cell[0] + dr, cell[1] + dc)
        if 0 <= nxt[0] < rows and 0 <= nxt[1] < cols and grid[nxt[0]][nxt[1]] != "#" and nxt not in prev:
            prev[nxt] = (cell, move)
            queue.append(nxt)
moves, cell = [], goal
while prev[cell] is not None:
    cell, move = prev[cell]
    moves.append(move)
print("".join(reversed(moves)))
"""
"""The reference tool program (a BFS over the predefined ``grid``, ``start``, ``goal``): an oracle tool
agent, used by the tests and the bench."""


@functools.cache
def _neighbours(size: int) -> tuple[tuple[tuple[int, str], ...], ...]:
    """For each cell index of a size x size grid: its in-grid neighbours (index, move), in U D L R order."""
    out = []
    for i in range(size * size):
        r, c = divmod(i, size)
        cells = []
        for move in _ORDER:
            dr, dc = MOVES[move]
            nr, nc = r + dr, c + dc
            if 0 <= nr < size and 0 <= nc < size:
                cells.append((nr * size + nc, move))
        out.append(tuple(cells))
    return tuple(out)


def generate_plan_path(seed: int, size: int = 7, wall_fraction: float = 0.3) -> dict[str, Any]:
    """The instance of instance seed ``seed``: ``{"seed", "size", "wall_fraction", "grid" (row
    strings), "start", "goal" ((row, column) tuples), "shortest" (moves of a shortest path)}``.

    >>> p = generate_plan_path(0, size=4, wall_fraction=0.25)
    >>> p["grid"], p["start"], p["goal"], p["shortest"]
    (('.###', '#S..', '...G', '..#.'), (1, 1), (2, 3), 3)
    """
    check_int("size", size, *SIZE_RANGE)
    wall_fraction = check_fraction("wall_fraction", wall_fraction, *WALL_FRACTION_RANGE)
    rng = instance_random(FAMILY, (size, wall_fraction), seed)
    rnd = rng.random
    n2 = size * size
    neighbours = _neighbours(size)
    for _ in range(MAX_ATTEMPTS):
        free = [rnd() >= wall_fraction for _ in range(n2)]
        cells = [i for i in range(n2) if free[i]]
        if len(cells) < 2:
            continue
        start = cells[int(rnd() * len(cells))]
        dist = [-1] * n2
        dist[start] = 0
        order = [start]
        for cell in order:  # BFS: `order` grows while it is walked
            d = dist[cell] + 1
            for nb, _move in neighbours[cell]:
                if free[nb] and dist[nb] < 0:
                    dist[nb] = d
                    order.append(nb)
        farthest = dist[order[-1]]
        if farthest < size - 1:
            continue
        threshold = max(size - 1, (farthest + 1) // 2)
        candidates = [c for c in order if dist[c] >= threshold]
        goal = candidates[int(rnd() * len(candidates))]
        chars = [FREE if f else WALL for f in free]
        chars[start], chars[goal] = START, GOAL
        grid = tuple("".join(chars[r * size : (r + 1) * size]) for r in range(size))
        return {"seed": seed, "size": size, "wall_fraction": wall_fraction, "grid": grid,
                "start": divmod(start, size), "goal": divmod(goal, size), "shortest": dist[goal]}
    raise RuntimeError(f"No solvable grid in {MAX_ATTEMPTS} attempts (seed {seed}, size {size}, "
                       f"wall_fraction {wall_fraction}).")


def shortest_path(grid: Sequence[str], start: tuple[int, int], goal: tuple[int, int]) -> str | None:
    """A shortest move string from ``start`` to ``goal`` (BFS, neighbours in U D L R order), or None
    when the goal cannot be reached.

    >>> shortest_path(("S.#", "..#", "#.G"), (0, 0), (2, 2))
    'DRDR'
    """
    rows, cols = len(grid), len(grid[0])
    parent: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {tuple(start): None}
    order = [tuple(start)]
    for cell in order:
        if cell == tuple(goal):
            moves = []
            step = parent[cell]
            while step is not None:
                cell, move = step
                moves.append(move)
                step = parent[cell]
            return "".join(reversed(moves))
        r, c = cell
        for move in _ORDER:
            dr, dc = MOVES[move]
            nxt = (r + dr, c + dc)
            if 0 <= nxt[0] < rows and 0 <= nxt[1] < cols and grid[nxt[0]][nxt[1]] != WALL and nxt not in parent:
                parent[nxt] = (cell, move)
                order.append(nxt)
    return None


def solve_plan_path(problem: Problem) -> str:
    """The reference answer for an instance: ``"Answer: <a shortest move string>"``."""
    moves = shortest_path(problem["grid"], problem["start"], problem["goal"])
    if moves is None:
        raise ValueError(f"The grid has no path from {problem['start']} to {problem['goal']}: {problem['grid']}")
    return f"Answer: {moves}"


class PlanPathTask(ToolPlannerTask):
    """Generated grid path planning with a tool and a planner (see the module docstring).

    Args:
        difficulty: ``"easy"``, ``"medium"`` or ``"hard"`` (see the level table).
        size: grid side (3-16), overriding the level's.
        wall_fraction: probability that a cell is a wall (0-0.5), overriding the level's.
        tool_timeout_s: wall-clock limit of the tool's program.
    """

    generator = staticmethod(generate_plan_path)
    key_fields: ClassVar[tuple[str, ...]] = ("grid", "start", "goal")
    answer_components: ClassVar[tuple[str, ...]] = COMPONENTS
    reward_components: ClassVar[tuple[str, ...]] = (*COMPONENTS, "tool")
    max_reward: ClassVar[float] = MAX_REWARD + TOOL_REWARD
    description: ClassVar[str] = (
        "Generated grid path planning: a tool agent's sandboxed program and a planner find a move string "
        "from S to G (difficulty medium: 7x7)."
    )
    task_text: ClassVar[str] = TASK_TEXT
    answer_text: ClassVar[str] = ANSWER_TEXT
    tool_answer_text: ClassVar[str] = TOOL_ANSWER_TEXT
    inputs_text: ClassVar[str] = INPUTS_TEXT
    reference_program: ClassVar[str] = PLAN_PATH_PROGRAM

    def __init__(
        self,
        difficulty: str = "medium",
        size: int | None = None,
        wall_fraction: float | None = None,
        tool_timeout_s: float = TOOL_TIMEOUT_S,
    ) -> None:
        super().__init__(tool_timeout_s)
        params = resolve_level(difficulty, LEVELS, {"size": size, "wall_fraction": wall_fraction})
        self.difficulty = difficulty
        self.size = check_int("size", params["size"], *SIZE_RANGE)
        self.wall_fraction = check_fraction("wall_fraction", params["wall_fraction"], *WALL_FRACTION_RANGE)

    def params(self) -> tuple[Any, ...]:
        return (self.size, self.wall_fraction)

    def board(self, problem: Problem) -> str:
        return f"{labeled_grid(problem['grid'])}\nStart: {problem['start']}. Goal: {problem['goal']}."

    def tool_inputs(self, problem: Problem) -> dict[str, Any]:
        return {"grid": list(problem["grid"]), "start": problem["start"], "goal": problem["goal"]}

    def score_answer(self, problem: Problem, text: str) -> dict[str, float]:
        return score_moves(parse_moves(text), problem["grid"], problem["start"], problem["goal"], problem["shortest"])

    def solves(self, problem: Problem, text: str) -> bool:
        return reaches_goal(problem["grid"], problem["start"], problem["goal"], text)

    def diagnose(self, problem: Problem, text: str) -> list[str]:
        moves = parse_moves(text)
        if not moves:
            return ['no moves found: end with one line "Answer: <moves>" using the letters U, D, L, R']
        result = walk(problem["grid"], problem["start"], moves)
        if result.error is not None:
            return [result.error]
        if result.end != problem["goal"]:
            return [f"the moves end at {result.end}, not on the goal {problem['goal']}"]
        if len(moves) > problem["shortest"]:
            return [f"the path reaches the goal in {len(moves)} moves, but the shortest path has "
                    f"{problem['shortest']}"]
        return []

    def render_answer(self, problem: Problem, text: str) -> str:
        grid = [list(row) for row in problem["grid"]]
        moves = parse_moves(text)
        result = walk(problem["grid"], problem["start"], moves)
        for r, c in result.path[1:]:
            if grid[r][c] == FREE:
                grid[r][c] = "*"
        end = result.end
        if grid[end[0]][end[1]] == "*":
            grid[end[0]][end[1]] = "@"
        problems = self.diagnose(problem, text)
        summary = (f"moves {moves or '(none)'}: {result.legal} of {len(moves)} executed, stops at {end}; "
                   + (listing(problems) if problems else "a shortest path"))
        return labeled_grid(["".join(row) for row in grid]) + "\n" + summary

    def solve(self, problem: Problem) -> str:
        return solve_plan_path(problem)


register(
    "planning/plan-path-v0",
    PlanPathTask,
    protocol="parallel",
    description=PlanPathTask.description,
)
register(
    "planning/plan-path-easy-v0",
    PlanPathTask,
    protocol="parallel",
    difficulty="easy",
    description="planning/plan-path-v0 at difficulty easy (5x5 grids, 20% walls), trainable from the command line.",
)
