"""Generated puzzles, Sudoku and Sokoban: a tool agent writes a program that prints the answer; a
planner gives the final answer.

=====================  ==========================================================================
Ids                    ``puzzle/sudoku4-v0`` (4 x 4, difficulty ``medium``), ``puzzle/sudoku9-v0``
                       (9 x 9, ``medium``), ``puzzle/sokoban-v0`` (``medium``: 7 x 7, 2 boxes),
                       ``puzzle/sokoban-easy-v0`` (6 x 6, 1 box)
Protocol               parallel by default (both roles answer at once); ``protocol="sequential"``:
                       the tool's program runs first and the planner sees its printed output
Agents                 ``tool`` writes a Python program that prints the answer (run in the sandbox);
                       ``planner`` gives the answer
Observation / action   token ids (see :mod:`llm_envs.core.base`); max_new_tokens 384,
                       max_prompt_tokens 3072 (room for the worst case: a 16 x 16 board, the tool's
                       longest output and error, the previous answer and feedback)
Reward                 the planner's answer (:mod:`llm_envs.rewards.puzzle`) plus ``tool`` = 0.5 when
                       the program's printed answer solves the instance; the same joint value to both
                       agents; components in infos as ``reward_<name>``
Episode                one turn by default; with ``num_turns >= 2`` each role sees its previous
                       answer and feedback ("row 2 has two 3s", "move 3 pushes the box at (2, 3)
                       into a wall at (2, 4)")
=====================  ==========================================================================

Sudoku (max 2.5)
----------------
The answer is the filled grid: ``n`` lines of ``n`` digits after ``Answer:``. Components: ``format``
0.1 (a grid of n*n digits), ``givens`` 0.3 x fraction of the given cells kept, ``rows`` /
``columns`` / ``boxes`` 0.2 x fraction valid (each digit once), ``solved`` 1.0, ``tool`` 0.5.

Board (blank cells are ``.``; rows, columns and boxes are numbered from 1)::

    1 . | . 4
    . . | 1 .
    ----+----
    . 1 | . .
    4 . | . 1

Tool variables: ``grid`` (list of n lists of n ints, 0 = blank), ``n``, ``box_rows``, ``box_cols``.

Instances: a random solution grid (4 x 4: uniform over all 288; 9 x 9: a base grid under random
digit, row, column, band and stack permutations and transposition), then cells are blanked in a
random order, each only if the puzzle keeps exactly one solution (checked by an exhaustive search),
until ``blanks`` cells are blank. Every puzzle has exactly one solution.

Sokoban (max 2.8)
-----------------
A room in the XSB notation (``#`` wall, ``-`` floor, ``.`` target, ``$`` box, ``*`` box on a target,
``@`` player, ``+`` player on a target); the answer is a move string after ``Answer:`` (``U D L R``,
pushing boxes). Components: ``format`` 0.1, ``valid`` 0.2 x fraction of moves before the first
illegal one, ``boxes`` 0.5 x fraction of boxes on targets, ``solved`` 1.0, ``steps`` 0.5 x (fewest
moves) / (moves) when solved, ``tool`` 0.5.

Tool variables: ``room`` (list of row strings, as on the board), ``player`` ((row, column)),
``boxes`` and ``targets`` (lists of (row, column)).

Instances by reverse play: walls around the room and a few inside (the floor stays connected), the
boxes on their targets, the player on a random floor cell; then random reverse moves (the player
steps, pulling a box behind it with probability 0.6), so the room is solvable by construction. A room
is kept when no box is on a target and its shortest solution (breadth-first search over player and
box positions) has at least ``min_moves`` moves; that solution length is part of the instance.

Levels
------
=========  =================  =============================================================
level      sudoku4 / sudoku9  sokoban
=========  =================  =============================================================
easy       6 / 36 blanks      6 x 6 room, 1 box, 2 inner walls, solution >= 4 moves
medium     8 / 44 blanks      7 x 7 room, 2 boxes, 3 inner walls, solution >= 8 moves
hard       10 / 52 blanks     8 x 8 room, 2 boxes, 5 inner walls, solution >= 12 moves
=========  =================  =============================================================

Task arguments: ``difficulty``; Sudoku ``blanks`` (4 x 4: 1-11, 9 x 9: 1-55); Sokoban ``size``
(6-9), ``boxes`` (1-2), ``inner_walls`` (0 to a sixth of the inside), ``min_moves`` (1 to
``2 (size - 2)``, 2 less with one box);
``tool_timeout_s`` (default 5 s). Splits: 1000 fixed eval instances, an unbounded train split that
never contains them (:mod:`llm_envs.procgen`).
Reference solvers: :func:`solve_sudoku` and :func:`solve_sokoban`.

Version history: v0 (initial).

>>> import llm_envs
>>> env = llm_envs.make("puzzle/sudoku4-v0", protocol="sequential")
>>> env.reset(seed=0, options={"split": "eval", "task_index": 0})
>>> env.step("print(1234)")
>>> "It printed:\\n1234" in env.text("planner")
True
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Sequence
from typing import Any, ClassVar

from llm_envs.core.registry import register
from llm_envs.core.task import Problem
from llm_envs.procgen import (
    TOOL_REWARD,
    TOOL_TIMEOUT_S,
    ToolPlannerTask,
    below,
    check_int,
    instance_random,
    labeled_grid,
    listing,
    resolve_level,
    shuffled,
)
from llm_envs.rewards.planning import MOVES, parse_moves
from llm_envs.rewards.puzzle import (
    BOX_SHAPES,
    SOKOBAN_COMPONENTS,
    SOKOBAN_MAX_REWARD,
    SUDOKU_COMPONENTS,
    SUDOKU_MAX_REWARD,
    parse_room,
    parse_sudoku,
    play_sokoban,
    score_sokoban,
    score_sudoku,
    sokoban_solved,
    sudoku_problems,
    sudoku_solved,
)

MAX_ATTEMPTS = 1000

# ------------------------------------------------------------------------------------------ sudoku
SUDOKU_LEVELS: dict[int, dict[str, dict[str, Any]]] = {
    4: {"easy": {"blanks": 6}, "medium": {"blanks": 8}, "hard": {"blanks": 10}},
    9: {"easy": {"blanks": 36}, "medium": {"blanks": 44}, "hard": {"blanks": 52}},
}
MAX_BLANKS = {4: 11, 9: 55}

SUDOKU_TASK = """Solve this {n}x{n} Sudoku: fill every blank cell (.) with a digit from 1 to {n} so that \
every row, every column and every {bh}x{bw} box holds each digit exactly once. Keep the given digits."""
SUDOKU_ANSWER = ('End your reply with "Answer:" followed by the filled grid, {n} lines of {n} digits, '
                 "for example:\nAnswer:\n{example}")
SUDOKU_TOOL_ANSWER = "the filled grid, {n} lines of {n} digits (for example {example_line} on the first line)"
SUDOKU_INPUTS = """grid: list of {n} lists of {n} ints, the board row by row, 0 for a blank cell
n: {n}, the size; box_rows, box_cols: {bh}, {bw}, the shape of a box"""

SUDOKU_PROGRAM = """\
def fits(r, c, d):
    if d in grid[r] or any(grid[i][c] == d for i in range(n)):
        return False
    br, bc = r - r % box_rows, c - c % box_cols
    return all(grid[br + i][bc + j] != d for i in range(box_rows) for j in range(box_cols))

def solve():
    for r in range(n):
        for c in range(n):
            if grid[r][c] == 0:
                for d in range(1, n + 1):
                    if fits(r, c, d):
                        grid[r][c] = d
                        if solve():
                            return True
                        grid[r][c] = 0
                return False
    return True

solve()
print("\\n".join("".join(map(str, row)) for row in grid))
"""
"""The reference tool program for Sudoku (plain backtracking over the predefined ``grid``)."""


@functools.cache
def _all_sudoku4() -> tuple[tuple[int, ...], ...]:
    """Every solved 4 x 4 Sudoku grid (288), in lexicographic order."""
    out: list[tuple[int, ...]] = []
    _enumerate([0] * 16, 0, 4, out)
    return tuple(out)


def _enumerate(grid: list[int], i: int, n: int, out: list[tuple[int, ...]]) -> None:
    if i == n * n:
        out.append(tuple(grid))
        return
    for d in range(1, n + 1):
        if d not in _peer_values(grid, i, n):
            grid[i] = d
            _enumerate(grid, i + 1, n, out)
            grid[i] = 0


def _peer_values(grid: Sequence[int], i: int, n: int) -> set[int]:
    return {grid[j] for j in _peers(n)[i]}


@functools.cache
def _peers(n: int) -> tuple[tuple[int, ...], ...]:
    bh, bw = BOX_SHAPES[n]
    out = []
    for i in range(n * n):
        r, c = divmod(i, n)
        br, bc = r - r % bh, c - c % bw
        cells = {r * n + k for k in range(n)} | {k * n + c for k in range(n)}
        cells |= {(br + a) * n + bc + b for a in range(bh) for b in range(bw)}
        cells.discard(i)
        out.append(tuple(sorted(cells)))
    return tuple(out)


@functools.cache
def _sudoku4_masks() -> tuple[tuple[int, ...], ...]:
    """masks[cell][digit]: bit g set when grid g of :func:`_all_sudoku4` has ``digit`` at ``cell``."""
    grids = _all_sudoku4()
    masks = [[0] * 5 for _ in range(16)]
    for g, grid in enumerate(grids):
        for cell, digit in enumerate(grid):
            masks[cell][digit] |= 1 << g
    return tuple(tuple(m) for m in masks)


def count_solutions(puzzle: Sequence[int], n: int, limit: int = 2) -> int:
    """How many solutions ``puzzle`` (row-major, 0 = blank) has, counting up to ``limit``."""
    return _search(list(puzzle), n, limit, [])


def _search(grid: list[int], n: int, limit: int, found: list[tuple[int, ...]]) -> int:
    """Depth-first search with bit masks, branching on the blank cell with fewest candidates."""
    full = (1 << (n + 1)) - 2
    peers = _peers(n)
    blanks = [i for i, v in enumerate(grid) if v == 0]
    for i, v in enumerate(grid):
        if v and any(grid[j] == v for j in peers[i]):
            return 0
    count = 0

    def candidates(i: int) -> int:
        used = 0
        for j in peers[i]:
            used |= 1 << grid[j]
        return full & ~used

    def go() -> None:
        nonlocal count
        best, best_mask, best_n = -1, 0, n + 1
        for i in blanks:
            if grid[i] == 0:
                mask = candidates(i)
                k = mask.bit_count()
                if k < best_n:
                    best, best_mask, best_n = i, mask, k
                    if k <= 1:
                        break
        if best < 0:
            count += 1
            if len(found) < 1:
                found.append(tuple(grid))
            return
        if best_n == 0:
            return
        mask = best_mask
        while mask and count < limit:
            bit = mask & -mask
            mask ^= bit
            grid[best] = bit.bit_length() - 1
            go()
        grid[best] = 0

    go()
    return count


def solve_sudoku_grid(puzzle: Sequence[int], n: int) -> tuple[int, ...] | None:
    """A solution of ``puzzle`` (row-major, 0 = blank), or None when it has none."""
    found: list[tuple[int, ...]] = []
    _search(list(puzzle), n, 1, found)
    return found[0] if found else None


def _sudoku9_solution(rng: Any) -> list[int]:
    """A random solved 9 x 9 grid: the base pattern under random symmetries."""
    def perm(k: int) -> list[int]:
        return shuffled(rng, range(k))

    bands, stacks = perm(3), perm(3)
    rows = [3 * b + r for b in bands for r in perm(3)]
    cols = [3 * s + c for s in stacks for c in perm(3)]
    digits = [d + 1 for d in perm(9)]
    transpose = rng.random() < 0.5
    grid = []
    for r in rows:
        for c in cols:
            rr, cc = (c, r) if transpose else (r, c)
            grid.append(digits[(3 * (rr % 3) + rr // 3 + cc) % 9])
    return grid


def generate_sudoku(seed: int, n: int = 4, blanks: int = 8) -> dict[str, Any]:
    """The instance of instance seed ``seed``: ``{"seed", "n", "blanks", "puzzle" (row-major, 0 =
    blank), "solution"}``, with exactly one solution.

    >>> p = generate_sudoku(0, n=4, blanks=8)
    >>> p["puzzle"], p["solution"]
    ((4, 2, 0, 0, 0, 0, 0, 0, 1, 4, 3, 2, 2, 0, 0, 1), (4, 2, 1, 3, 3, 1, 2, 4, 1, 4, 3, 2, 2, 3, 4, 1))
    """
    if n not in BOX_SHAPES or isinstance(n, bool):
        raise ValueError(f"n must be one of {sorted(BOX_SHAPES)}, got {n!r}.")
    check_int("blanks", blanks, 1, MAX_BLANKS[n])
    rng = instance_random(f"sudoku{n}", (blanks,), seed)
    for _ in range(MAX_ATTEMPTS):
        if n == 4:
            grids = _all_sudoku4()
            solution = list(grids[below(rng, len(grids))])
            puzzle = _blank_sudoku4(rng, solution, blanks)
        else:
            solution = _sudoku9_solution(rng)
            puzzle = _blank_sudoku9(rng, solution, blanks)
        if puzzle is not None:
            return {"seed": seed, "n": n, "blanks": blanks, "puzzle": tuple(puzzle), "solution": tuple(solution)}
    raise RuntimeError(f"No {n}x{n} puzzle with {blanks} blanks and one solution in {MAX_ATTEMPTS} attempts.")


def _blank_sudoku4(rng: Any, solution: list[int], blanks: int) -> list[int] | None:
    masks = _sudoku4_masks()
    given = [True] * 16
    removed = 0
    for cell in shuffled(rng, range(16)):
        consistent = -1
        for j in range(16):
            if given[j] and j != cell:
                consistent &= masks[j][solution[j]]
        if consistent & (consistent - 1) == 0:  # exactly one grid (the solution) fits the givens
            given[cell] = False
            removed += 1
            if removed == blanks:
                return [v if g else 0 for v, g in zip(solution, given)]
    return None


def _blank_sudoku9(rng: Any, solution: list[int], blanks: int) -> list[int] | None:
    puzzle = list(solution)
    removed = 0
    for cell in shuffled(rng, range(81)):
        value, puzzle[cell] = puzzle[cell], 0
        if removed < 20 or count_solutions(puzzle, 9, 2) == 1:  # 20 blanks never admit a 2nd solution
            removed += 1
            if removed == blanks:
                return puzzle
        else:
            puzzle[cell] = value
    return None


def solve_sudoku(problem: Problem) -> str:
    """The reference answer for an instance: ``"Answer:"`` and the solved grid, one row per line."""
    n = problem["n"]
    grid = solve_sudoku_grid(problem["puzzle"], n)
    if grid is None:
        raise ValueError(f"The puzzle has no solution: {problem['puzzle']}")
    return "Answer:\n" + "\n".join("".join(map(str, grid[r * n : (r + 1) * n])) for r in range(n))


def sudoku_board(puzzle: Sequence[int], n: int) -> str:
    """The puzzle as text: digits, ``.`` for blanks, ``|`` and ``-`` between boxes.

    >>> print(sudoku_board((1, 0, 0, 4, 0, 0, 1, 0, 0, 1, 0, 0, 4, 0, 0, 1), 4))
    1 . | . 4
    . . | 1 .
    ----+----
    . 1 | . .
    4 . | . 1
    """
    bh, bw = BOX_SHAPES[n]
    lines = []
    for r in range(n):
        if r and r % bh == 0:
            stacks = n // bw
            lines.append("+".join("-" * (2 * bw + (0 if k in (0, stacks - 1) else 1)) for k in range(stacks)))
        cells = [str(v) if v else "." for v in puzzle[r * n : (r + 1) * n]]
        lines.append(" | ".join(" ".join(cells[c : c + bw]) for c in range(0, n, bw)))
    return "\n".join(lines)


class SudokuTask(ToolPlannerTask):
    """Generated Sudoku with a tool and a planner (see the module docstring).

    Args:
        n: 4 or 9.
        difficulty: ``"easy"``, ``"medium"`` or ``"hard"``.
        blanks: blank cells, overriding the level's (4 x 4: 1-11; 9 x 9: 1-55).
        tool_timeout_s: wall-clock limit of the tool's program.
    """

    generator = staticmethod(generate_sudoku)
    key_fields: ClassVar[tuple[str, ...]] = ("puzzle",)
    answer_components: ClassVar[tuple[str, ...]] = SUDOKU_COMPONENTS
    reward_components: ClassVar[tuple[str, ...]] = (*SUDOKU_COMPONENTS, "tool")
    max_reward: ClassVar[float] = SUDOKU_MAX_REWARD + TOOL_REWARD
    description: ClassVar[str] = "Generated Sudoku with one solution: a tool agent's sandboxed program and a planner."
    reference_program: ClassVar[str] = SUDOKU_PROGRAM

    def __init__(
        self, n: int = 4, difficulty: str = "medium", blanks: int | None = None, tool_timeout_s: float = TOOL_TIMEOUT_S
    ) -> None:
        super().__init__(tool_timeout_s)
        if n not in BOX_SHAPES or isinstance(n, bool):
            raise ValueError(f"n must be one of {sorted(BOX_SHAPES)}, got {n!r}.")
        params = resolve_level(difficulty, SUDOKU_LEVELS[n], {"blanks": blanks})
        self.n, self.difficulty = n, difficulty
        self.blanks = check_int("blanks", params["blanks"], 1, MAX_BLANKS[n])
        bh, bw = BOX_SHAPES[n]
        self.task_text = SUDOKU_TASK.format(n=n, bh=bh, bw=bw)  # type: ignore[misc]
        self.inputs_text = SUDOKU_INPUTS.format(n=n, bh=bh, bw=bw)  # type: ignore[misc]

    def answer_prompt(self, problem: Problem) -> str:
        return SUDOKU_ANSWER.format(n=problem["n"], example=_example_grid(problem))

    def tool_answer_prompt(self, problem: Problem) -> str:
        return SUDOKU_TOOL_ANSWER.format(n=problem["n"], example_line=_example_grid(problem).split("\n")[0])

    def params(self) -> tuple[Any, ...]:
        return (self.n, self.blanks)

    def board(self, problem: Problem) -> str:
        return sudoku_board(problem["puzzle"], problem["n"])

    def tool_inputs(self, problem: Problem) -> dict[str, Any]:
        n = problem["n"]
        bh, bw = BOX_SHAPES[n]
        rows = [list(problem["puzzle"][r * n : (r + 1) * n]) for r in range(n)]
        return {"grid": rows, "n": n, "box_rows": bh, "box_cols": bw}

    def score_answer(self, problem: Problem, text: str) -> dict[str, float]:
        return score_sudoku(parse_sudoku(text, problem["n"]), problem["puzzle"], problem["n"])

    def solves(self, problem: Problem, text: str) -> bool:
        return sudoku_solved(text, problem["puzzle"], problem["n"])

    def diagnose(self, problem: Problem, text: str) -> list[str]:
        return sudoku_problems(parse_sudoku(text, problem["n"]), problem["puzzle"], problem["n"])

    def render_answer(self, problem: Problem, text: str) -> str:
        n = problem["n"]
        grid = parse_sudoku(text, n)
        if grid is None:
            return f"(no grid of {n * n} digits in the answer)"
        problems = self.diagnose(problem, text)
        return sudoku_board(grid, n) + "\n" + (listing(problems) if problems else "solved")

    def solve(self, problem: Problem) -> str:
        return solve_sudoku(problem)


def _example_grid(problem: Problem) -> str:
    """The prompt's format example: a solved grid (the base pattern) that is not this instance's
    solution (its digits shifted by one when it would be), so the example never gives the answer away."""
    n = problem["n"]
    bh, bw = BOX_SHAPES[n]
    grid = [(bw * (r % bh) + r // bh + c) % n + 1 for r in range(n) for c in range(n)]
    if tuple(grid) == tuple(problem["solution"]):
        grid = [d % n + 1 for d in grid]
    return "\n".join("".join(map(str, grid[r * n : (r + 1) * n])) for r in range(n))


# ----------------------------------------------------------------------------------------- sokoban
SOKOBAN_LEVELS: dict[str, dict[str, Any]] = {
    "easy": {"size": 6, "boxes": 1, "inner_walls": 2, "min_moves": 4},
    "medium": {"size": 7, "boxes": 2, "inner_walls": 3, "min_moves": 8},
    "hard": {"size": 8, "boxes": 2, "inner_walls": 5, "min_moves": 12},
}
SOKOBAN_SIZE_RANGE = (6, 9)
SOKOBAN_BOX_RANGE = (1, 2)


def max_inner_walls(size: int) -> int:
    """The most wall cells inside a room of ``size`` (a sixth of the inside)."""
    return (size - 2) ** 2 // 6


def max_min_moves(size: int, boxes: int) -> int:
    """The largest ``min_moves`` accepted for a room of ``size`` with ``boxes`` boxes: reverse play reaches
    solutions this long in at least about 1 room in 20 (longer ones get too rare to draw)."""
    return 2 * (size - 2) - (2 if boxes == 1 else 0)

PULL_PROBABILITY = 0.6
REVERSE_STEPS_PER_CELL = 3
_DIRECTIONS = tuple(MOVES.items())

SOKOBAN_TASK = """Solve this Sokoban room: push every box onto a target.
Legend: # wall, - floor, . target, $ box, * box on a target, @ you (the player), + you on a target. \
Cells are (row, column), numbered from 0 at the top left as on the labels.
Moves: U (up, row - 1), D (down, row + 1), L (left, column - 1), R (right, column + 1). Walking into a \
box pushes it one cell further, unless a wall or another box is there. You cannot pull boxes."""
SOKOBAN_ANSWER = ('Give the shortest sequence of moves that puts every box on a target. End your reply '
                  'with one line "Answer: <moves>", for example "Answer: RRDLU".')
SOKOBAN_TOOL_ANSWER = "the moves as one string of the letters U, D, L, R (for example RRDLU)"
SOKOBAN_INPUTS = """room: list of str, one string per row with the characters of the board (room[r][c])
player: (row, column) tuple of the player
boxes, targets: lists of (row, column) tuples"""

SOKOBAN_PROGRAM = """\
from collections import deque
walls = {(r, c) for r, row in enumerate(room) for c, ch in enumerate(row) if ch == "#"}
goal = frozenset(targets)
start = (player, frozenset(boxes))
prev = {start: None}
queue = deque([start])
end = None
while queue:
    state = queue.popleft()
    if state[1] == goal:
        end = state
        break
    (pr, pc), on = state
    for move, (dr, dc) in (("U", (-1, 0)), ("D", (1, 0)), ("L", (0, -1)), ("R", (0, 1))):
        nxt = (pr + dr, pc + dc)
        if nxt in walls:
            continue
        moved = on
        if nxt in on:
            beyond = (nxt[0] + dr, nxt[1] + dc)
            if beyond in walls or beyond in on:
                continue
            moved = (on - {nxt}) | {beyond}
        new = (nxt, moved)
        if new not in prev:
            prev[new] = (state, move)
            queue.append(new)
moves = []
while prev[end] is not None:
    end, move = prev[end]
    moves.append(move)
print("".join(reversed(moves)))
"""
"""The reference tool program for Sokoban (a breadth-first search over player and box positions)."""


def _room_rows(
    rows: int, cols: int, walls: set[int], targets: set[int], boxes: set[int], player: int
) -> tuple[str, ...]:
    """The room in XSB characters; cells are indices ``row * cols + column``."""
    out = []
    for r in range(rows):
        line = []
        for c in range(cols):
            i = r * cols + c
            if i in walls:
                line.append("#")
            elif i in boxes:
                line.append("*" if i in targets else "$")
            elif i == player:
                line.append("+" if i in targets else "@")
            else:
                line.append("." if i in targets else "-")
        out.append("".join(line))
    return tuple(out)


def _connected(size: int, floor: set[int]) -> bool:
    start = next(iter(floor))
    seen, order = {start}, [start]
    for cell in order:
        for _, (dr, dc) in _DIRECTIONS:
            nb = cell + dr * size + dc
            if nb in floor and nb not in seen:
                seen.add(nb)
                order.append(nb)
    return len(seen) == len(floor)


def generate_sokoban(
    seed: int, size: int = 7, boxes: int = 2, inner_walls: int = 3, min_moves: int = 8
) -> dict[str, Any]:
    """The instance of instance seed ``seed`` by reverse play: ``{"seed", "size", "boxes",
    "inner_walls", "min_moves", "room" (row strings), "optimal" (fewest moves), "solution" (a
    shortest move string)}``.

    >>> p = generate_sokoban(0, size=6, boxes=1, inner_walls=2, min_moves=4)
    >>> p["room"], p["optimal"]
    (('######', '#----#', '#@-#$#', '#----#', '#--#.#', '######'), 6)
    """
    check_int("size", size, *SOKOBAN_SIZE_RANGE)
    check_int("boxes", boxes, *SOKOBAN_BOX_RANGE)
    check_int("inner_walls", inner_walls, 0, max_inner_walls(size))
    check_int("min_moves", min_moves, 1, max_min_moves(size, boxes))
    rng = instance_random("sokoban", (size, boxes, inner_walls, min_moves), seed)
    inside = [r * size + c for r in range(1, size - 1) for c in range(1, size - 1)]
    border = {i for i in range(size * size) if i not in set(inside)}
    for _ in range(MAX_ATTEMPTS):
        floor = set(inside)
        for cell in shuffled(rng, inside):
            if len(floor) == len(inside) - inner_walls:
                break
            floor.discard(cell)
            if not _connected(size, floor):
                floor.add(cell)
        if len(floor) != len(inside) - inner_walls:
            continue
        cells = shuffled(rng, sorted(floor))
        targets = set(cells[:boxes])
        player = cells[boxes]
        box_set = set(targets)
        for _ in range(REVERSE_STEPS_PER_CELL * len(floor)):
            _, (dr, dc) = _DIRECTIONS[below(rng, 4)]
            step = dr * size + dc
            nxt = player + step
            if nxt not in floor or nxt in box_set:
                continue
            behind = player - step
            if behind in box_set and rng.random() < PULL_PROBABILITY:
                box_set.remove(behind)
                box_set.add(player)
            player = nxt
        if box_set & targets:
            continue
        room = _room_rows(size, size, border | (set(inside) - floor), targets, box_set, player)
        solution = solve_sokoban(room)
        if solution is None:
            raise RuntimeError(f"Reverse play made an unsolvable room (a bug): {room}")
        if len(solution) >= min_moves:
            return {"seed": seed, "size": size, "boxes": boxes, "inner_walls": inner_walls, "min_moves": min_moves,
                    "room": room, "optimal": len(solution), "solution": solution}
    raise RuntimeError(f"No Sokoban room with a solution of >= {min_moves} moves in {MAX_ATTEMPTS} attempts "
                       f"(seed {seed}, size {size}, boxes {boxes}, inner_walls {inner_walls}).")


def _live_cells(rows: int, cols: int, walls: frozenset, targets: frozenset) -> set[tuple[int, int]]:
    """Cells from which a box can still be pushed onto some target (targets reached by pulling)."""
    def open_cell(cell: tuple[int, int]) -> bool:
        return 0 <= cell[0] < rows and 0 <= cell[1] < cols and cell not in walls

    live = set(targets)
    order = list(targets)
    for box in order:
        for dr, dc in MOVES.values():
            prev = (box[0] + dr, box[1] + dc)  # the box came from here, pushed by a player one further
            player = (box[0] + 2 * dr, box[1] + 2 * dc)
            if open_cell(prev) and open_cell(player) and prev not in live:
                live.add(prev)
                order.append(prev)
    return live


def solve_sokoban(room: tuple[str, ...]) -> str | None:
    """A shortest move string that solves ``room`` (breadth-first search over the player's and the
    boxes' positions, never pushing a box onto a cell from which no target can be reached), or None.

    >>> solve_sokoban(("#####", "#@$.#", "#####"))
    'R'
    """
    parsed = parse_room(tuple(room))
    live = _live_cells(parsed.rows, parsed.cols, parsed.walls, parsed.targets)
    targets = parsed.targets
    start = (parsed.player, frozenset(parsed.boxes))
    if start[1] == targets:
        return ""
    parent: dict[Any, Any] = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        player, box_set = state
        for move, (dr, dc) in _DIRECTIONS:
            nxt = (player[0] + dr, player[1] + dc)
            if nxt in parsed.walls:
                continue
            if nxt in box_set:
                beyond = (nxt[0] + dr, nxt[1] + dc)
                if beyond in parsed.walls or beyond in box_set or beyond not in live:
                    continue
                new_boxes = (box_set - {nxt}) | {beyond}
            else:
                new_boxes = box_set
            new = (nxt, new_boxes)
            if new in parent:
                continue
            parent[new] = (state, move)
            if new_boxes == targets:
                moves = []
                step = parent[new]
                while step is not None:
                    state, move = step
                    moves.append(move)
                    step = parent[state]
                return "".join(reversed(moves))
            queue.append(new)
    return None


class SokobanTask(ToolPlannerTask):
    """Generated Sokoban (reverse play) with a tool and a planner (see the module docstring).

    Args:
        difficulty: ``"easy"``, ``"medium"`` or ``"hard"``.
        size: room side including the outer walls (6-9).
        boxes: 1 or 2.
        inner_walls: wall cells inside the room (0 to :func:`max_inner_walls`).
        min_moves: shortest solution length at least this (1 to :func:`max_min_moves`).
        tool_timeout_s: wall-clock limit of the tool's program.
    """

    generator = staticmethod(generate_sokoban)
    key_fields: ClassVar[tuple[str, ...]] = ("room",)
    answer_components: ClassVar[tuple[str, ...]] = SOKOBAN_COMPONENTS
    reward_components: ClassVar[tuple[str, ...]] = (*SOKOBAN_COMPONENTS, "tool")
    max_reward: ClassVar[float] = SOKOBAN_MAX_REWARD + TOOL_REWARD
    description: ClassVar[str] = (
        "Generated Sokoban rooms (reverse play, solvable): a tool agent's sandboxed program and a planner "
        "push the boxes onto targets (difficulty medium: 7x7, 2 boxes)."
    )
    task_text: ClassVar[str] = SOKOBAN_TASK
    answer_text: ClassVar[str] = SOKOBAN_ANSWER
    tool_answer_text: ClassVar[str] = SOKOBAN_TOOL_ANSWER
    inputs_text: ClassVar[str] = SOKOBAN_INPUTS
    reference_program: ClassVar[str] = SOKOBAN_PROGRAM

    def __init__(
        self,
        difficulty: str = "medium",
        size: int | None = None,
        boxes: int | None = None,
        inner_walls: int | None = None,
        min_moves: int | None = None,
        tool_timeout_s: float = TOOL_TIMEOUT_S,
    ) -> None:
        super().__init__(tool_timeout_s)
        params = resolve_level(difficulty, SOKOBAN_LEVELS, {"size": size, "boxes": boxes, "inner_walls": inner_walls,
                                                            "min_moves": min_moves})
        self.difficulty = difficulty
        self.size = check_int("size", params["size"], *SOKOBAN_SIZE_RANGE)
        self.boxes = check_int("boxes", params["boxes"], *SOKOBAN_BOX_RANGE)
        self.inner_walls = check_int("inner_walls", params["inner_walls"], 0, max_inner_walls(self.size))
        self.min_moves = check_int("min_moves", params["min_moves"], 1, max_min_moves(self.size, self.boxes))

    def params(self) -> tuple[Any, ...]:
        return (self.size, self.boxes, self.inner_walls, self.min_moves)

    def board(self, problem: Problem) -> str:
        parsed = parse_room(problem["room"])
        return (f"{labeled_grid(problem['room'])}\nYou are at {parsed.player}. Boxes: "
                f"{', '.join(map(str, sorted(parsed.boxes)))}. Targets: {', '.join(map(str, sorted(parsed.targets)))}.")

    def tool_inputs(self, problem: Problem) -> dict[str, Any]:
        parsed = parse_room(problem["room"])
        return {"room": list(problem["room"]), "player": parsed.player, "boxes": sorted(parsed.boxes),
                "targets": sorted(parsed.targets)}

    def score_answer(self, problem: Problem, text: str) -> dict[str, float]:
        return score_sokoban(parse_moves(text), problem["room"], problem["optimal"])

    def solves(self, problem: Problem, text: str) -> bool:
        return sokoban_solved(text, problem["room"])

    def diagnose(self, problem: Problem, text: str) -> list[str]:
        moves = parse_moves(text)
        if not moves:
            return ['no moves found: end with one line "Answer: <moves>" using the letters U, D, L, R']
        parsed = parse_room(problem["room"])
        result = play_sokoban(problem["room"], moves)
        out = list(result.stuck)
        if result.error is not None:
            out.append(result.error)
            return out
        left = len(parsed.targets) - result.on_target(parsed)
        if left:
            out.append(f"after the last move {left} of {len(parsed.targets)} boxes are not on a target")
        elif len(moves) > problem["optimal"]:
            out.append(f"solved in {len(moves)} moves, but it can be done in {problem['optimal']}")
        return out

    def render_answer(self, problem: Problem, text: str) -> str:
        parsed = parse_room(problem["room"])
        moves = parse_moves(text)
        result = play_sokoban(problem["room"], moves)
        cols = parsed.cols
        room = _room_rows(
            parsed.rows, cols, {r * cols + c for r, c in parsed.walls}, {r * cols + c for r, c in parsed.targets},
            {r * cols + c for r, c in result.boxes}, result.player[0] * cols + result.player[1],
        )
        problems = self.diagnose(problem, text)
        summary = (f"moves {moves or '(none)'}: {result.legal} of {len(moves)} executed; "
                   + (listing(problems) if problems else "solved in the fewest moves"))
        return labeled_grid(room) + "\n" + summary

    def solve(self, problem: Problem) -> str:
        return f"Answer: {problem['solution']}"


register("puzzle/sudoku4-v0", SudokuTask, protocol="parallel", n=4,
         description="Generated 4x4 Sudoku (one solution each): a tool agent's sandboxed program and a planner "
                     "fill the grid (difficulty medium: 8 blanks).")
register("puzzle/sudoku9-v0", SudokuTask, protocol="parallel", n=9,
         description="Generated 9x9 Sudoku (one solution each): a tool agent's sandboxed program and a planner "
                     "fill the grid (difficulty medium: 44 blanks).")
register("puzzle/sokoban-v0", SokobanTask, protocol="parallel", description=SokobanTask.description)
register("puzzle/sokoban-easy-v0", SokobanTask, protocol="parallel", difficulty="easy",
         description="puzzle/sokoban-v0 at difficulty easy (6x6 rooms, 1 box), trainable from the command line.")
