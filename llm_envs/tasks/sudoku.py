"""Generated Sudoku (``puzzle/sudoku4-v0``, ``puzzle/sudoku9-v0``), max reward 2.5: the family, its ids,
levels and task arguments are :mod:`llm_envs.tasks.puzzle`'s.

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
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, ClassVar

from llm_envs.core.task import Problem
from llm_envs.procgen import (
    MAX_ATTEMPTS,
    TOOL_REWARD,
    TOOL_TIMEOUT_S,
    ToolPlannerTask,
    below,
    check_int,
    instance_random,
    listing,
    resolve_level,
    shuffled,
)
from llm_envs.rewards.puzzle import (
    BOX_SHAPES,
    SUDOKU_COMPONENTS,
    SUDOKU_MAX_REWARD,
    parse_sudoku,
    score_sudoku,
    sudoku_problems,
    sudoku_solved,
)

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
