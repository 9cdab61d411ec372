"""Puzzle rewards: Sudoku (``puzzle/sudoku4-v0``, ``puzzle/sudoku9-v0``) and Sokoban (``puzzle/sokoban-v0``).

Answers are read from the *answer region* of a response: the text after the last ``Answer:`` (any
case), else the whole text (:func:`llm_envs.rewards.planning.answer_region`).

Sudoku
------
An ``n x n`` grid (n = 4 with 2 x 2 boxes, or n = 9 with 3 x 3 boxes); the answer is the filled grid.
*Grid lines* are the lines of the answer region made only of digits, spaces and the separators
``| , + -``; their digits, in order, are the answer when there are exactly ``n * n`` of them (one line
of 16 digits or four lines of four both work), else the answer has no grid.

=============  ========  ================================================================
component      value     when
=============  ========  ================================================================
``format``     0.1       the answer has a grid of ``n * n`` digits
``givens``     0 - 0.3   0.3 x fraction of the puzzle's given cells kept
``rows``       0 - 0.2   0.2 x fraction of rows holding each digit 1..n once
``columns``    0 - 0.2   0.2 x fraction of columns holding each digit 1..n once
``boxes``      0 - 0.2   0.2 x fraction of boxes holding each digit 1..n once
``solved``     1.0       every row, column and box is valid and every given is kept
=============  ========  ================================================================

Maximum 2.0. Rows, columns and boxes are numbered from 1 at the top left, as Sudoku players do;
boxes row by row.

>>> puzzle = (1, 2, 0, 4,  0, 0, 1, 0,  0, 1, 0, 0,  4, 0, 0, 1)
>>> sudoku_components(completions=["Answer:\\n1234\\n3412\\n2143\\n4321"], puzzle=[puzzle], n=[4])
[{'format': 0.1, 'givens': 0.3, 'rows': 0.2, 'columns': 0.2, 'boxes': 0.2, 'solved': 1.0}]
>>> sudoku_problems(parse_sudoku("1134 3412 2143 4321", 4), puzzle, 4)[:2]
['cell (1, 2) must stay 2 (a given), the answer has 1', 'row 1 has two 1s']

Sokoban
-------
A room in the XSB notation: ``#`` wall, ``-`` floor, ``.`` target, ``$`` box, ``*`` box on a target,
``@`` player, ``+`` player on a target. The answer is a move string parsed exactly as in
:mod:`llm_envs.rewards.planning` (``U D L R``). A move walks the player one cell; walking into a box
pushes it one cell further when that cell is floor or a target (not a wall, not another box). Moves
are executed until the first illegal one (walking into a wall, or pushing a box into a wall or another
box), where execution stops.

=============  ========  ================================================================
component      value     when
=============  ========  ================================================================
``format``     0.1       the answer has at least one move
``valid``      0 - 0.2   0.2 x (moves executed before the first illegal one) / (moves)
``boxes``      0 - 0.5   0.5 x fraction of boxes on targets where execution stopped
``solved``     1.0       every move is legal and every box ends on a target
``steps``      0 - 0.5   0.5 x (fewest moves that solve the room) / (moves), when solved
=============  ========  ================================================================

Maximum 2.3. A box pushed into a corner that is not a target (two perpendicular walls) can never
move again; the reward does not penalise it beyond the boxes it leaves off target, and the
feedback says so.

>>> room = ("#####", "#@$.#", "#####")
>>> sokoban_components(completions=["Answer: R", "Answer: RR"], room=[room, room], optimal=[1, 1])[0]
{'format': 0.1, 'valid': 0.2, 'boxes': 0.5, 'solved': 1.0, 'steps': 0.5}
>>> play_sokoban(room, "RR").error
'move 2 (R) pushes the box at (1, 3) into a wall at (1, 4)'
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llm_envs.rewards.planning import MOVES, answer_region, parse_moves

Cell = tuple[int, int]

# ------------------------------------------------------------------------------------------ sudoku
SUDOKU_FORMAT_REWARD = 0.1
GIVENS_REWARD = 0.3
UNIT_REWARD = 0.2
SOLVED_REWARD = 1.0
SUDOKU_COMPONENTS = ("format", "givens", "rows", "columns", "boxes", "solved")
SUDOKU_MAX_REWARD = SUDOKU_FORMAT_REWARD + GIVENS_REWARD + UNIT_REWARD + UNIT_REWARD + UNIT_REWARD + SOLVED_REWARD
BOX_SHAPES = {4: (2, 2), 9: (3, 3)}
"""Sudoku sizes and their box shapes (rows, columns)."""

_GRID_LINE = re.compile(r"^[0-9\s|,+\-]*[0-9][0-9\s|,+\-]*$")


def check_sudoku_size(n: Any) -> int:
    if n not in BOX_SHAPES or isinstance(n, bool):
        raise ValueError(f"Sudoku size must be one of {sorted(BOX_SHAPES)}, got {n!r}.")
    return int(n)


def parse_sudoku(text: str, n: int) -> tuple[int, ...] | None:
    """The ``n * n`` digits of the answer's grid lines, row by row, or None (see the module docstring).

    >>> parse_sudoku("Here it is.\\n1 2 | 3 4\\n3 4 | 1 2\\n----+----\\n2 1 | 4 3\\n4 3 | 2 1", 4)[:4]
    (1, 2, 3, 4)
    >>> parse_sudoku("Answer: 123", 4) is None
    True
    """
    check_sudoku_size(n)
    region, _ = answer_region(text)
    digits: list[int] = []
    for line in region.splitlines():
        if _GRID_LINE.match(line.strip()):
            digits.extend(int(ch) for ch in line if "0" <= ch <= "9")
    return tuple(digits) if len(digits) == n * n else None


def sudoku_units(n: int) -> dict[str, list[list[int]]]:
    """Cell indices (row-major) of every row, column and box of an ``n x n`` Sudoku."""
    return _units(check_sudoku_size(n))


@functools.cache
def _units(n: int) -> dict[str, list[list[int]]]:
    bh, bw = BOX_SHAPES[n]
    rows = [[r * n + c for c in range(n)] for r in range(n)]
    cols = [[r * n + c for r in range(n)] for c in range(n)]
    boxes = [
        [(br + r) * n + bc + c for r in range(bh) for c in range(bw)]
        for br in range(0, n, bh)
        for bc in range(0, n, bw)
    ]
    return {"rows": rows, "columns": cols, "boxes": boxes}


def _unit_valid(grid: Sequence[int], cells: list[int], n: int) -> bool:
    return sorted(grid[i] for i in cells) == list(range(1, n + 1))


def score_sudoku(grid: tuple[int, ...] | None, puzzle: Sequence[int], n: int) -> dict[str, float]:
    """The components (module docstring) of a parsed grid (None: no grid) for ``puzzle`` (0 = blank)."""
    if grid is None:
        return dict.fromkeys(SUDOKU_COMPONENTS, 0.0)
    units = sudoku_units(n)
    givens = [i for i, v in enumerate(puzzle) if v]
    kept = sum(grid[i] == puzzle[i] for i in givens)
    valid = {name: sum(_unit_valid(grid, cells, n) for cells in unit) for name, unit in units.items()}
    solved = kept == len(givens) and all(v == n for v in valid.values())
    return {
        "format": SUDOKU_FORMAT_REWARD,
        "givens": GIVENS_REWARD * kept / len(givens) if givens else GIVENS_REWARD,
        "rows": UNIT_REWARD * valid["rows"] / n,
        "columns": UNIT_REWARD * valid["columns"] / n,
        "boxes": UNIT_REWARD * valid["boxes"] / n,
        "solved": SOLVED_REWARD if solved else 0.0,
    }


def sudoku_solved(text: str, puzzle: Sequence[int], n: int) -> bool:
    """Whether the answer in ``text`` solves ``puzzle``."""
    return score_sudoku(parse_sudoku(text, n), puzzle, n)["solved"] > 0


_COUNT_WORDS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine"}


def sudoku_problems(grid: tuple[int, ...] | None, puzzle: Sequence[int], n: int) -> list[str]:
    """What is wrong with a grid, in words, most basic first ("row 2 has two 3s", "cell (1, 3) must
    stay 4 (a given), the answer has 2"); empty when it solves the puzzle."""
    if grid is None:
        return [f"no grid of {n * n} digits found: write {n} lines of {n} digits after 'Answer:'"]
    out = []
    for i, v in enumerate(puzzle):
        if v and grid[i] != v:
            out.append(f"cell ({i // n + 1}, {i % n + 1}) must stay {v} (a given), the answer has {grid[i]}")
    bad = sorted({d for d in grid if not 1 <= d <= n})
    if bad:
        out.append(f"digits must be 1 to {n}; the answer has {', '.join(map(str, bad))}")
    for name, unit in sudoku_units(n).items():
        singular = name[:-1] if name != "boxes" else "box"
        for k, cells in enumerate(unit):
            values = [grid[i] for i in cells]
            for d in range(1, n + 1):
                count = values.count(d)
                if count > 1:
                    out.append(f"{singular} {k + 1} has {_COUNT_WORDS.get(count, str(count))} {d}s")
    return out


def sudoku_components(
    *, completions: Sequence[str], puzzle: Sequence[Sequence[int]], n: Sequence[int], **kwargs: Any
) -> list[dict[str, float]]:
    """Per completion: the Sudoku components (keys :data:`SUDOKU_COMPONENTS`); ``puzzle`` holds each
    completion's puzzle, row-major with 0 for blanks, and ``n`` its size."""
    if not len(puzzle) == len(n) == len(completions):
        raise ValueError(
            f"Got {len(completions)} completions, {len(puzzle)} puzzles and {len(n)} sizes; they must pair up."
        )
    return [score_sudoku(parse_sudoku(text, k), p, k) for text, p, k in zip(completions, puzzle, n, strict=True)]


def sudoku_reward(
    *, completions: Sequence[str], puzzle: Sequence[Sequence[int]], n: Sequence[int], **kwargs: Any
) -> list[float]:
    """The total per completion (at most :data:`SUDOKU_MAX_REWARD`)."""
    return [sum(p.values()) for p in sudoku_components(completions=completions, puzzle=puzzle, n=n)]


# ----------------------------------------------------------------------------------------- sokoban
SOKOBAN_FORMAT_REWARD = 0.1
SOKOBAN_VALID_REWARD = 0.2
BOXES_REWARD = 0.5
SOKOBAN_SOLVED_REWARD = 1.0
STEPS_REWARD = 0.5
SOKOBAN_COMPONENTS = ("format", "valid", "boxes", "solved", "steps")
SOKOBAN_MAX_REWARD = (
    SOKOBAN_FORMAT_REWARD + SOKOBAN_VALID_REWARD + BOXES_REWARD + SOKOBAN_SOLVED_REWARD + STEPS_REWARD
)
ROOM_LEGEND = {"#": "wall", "-": "floor", ".": "target", "$": "box", "*": "box on a target", "@": "player",
               "+": "player on a target"}


@dataclass(frozen=True)
class Room:
    """A parsed Sokoban room."""

    rows: int
    cols: int
    walls: frozenset[Cell]
    targets: frozenset[Cell]
    boxes: frozenset[Cell]
    player: Cell

    def dead_corner(self, cell: Cell) -> bool:
        """A non-target cell with walls on two perpendicular sides: a box there never moves again."""
        if cell in self.targets:
            return False
        r, c = cell
        vertical = (r - 1, c) in self.walls or (r + 1, c) in self.walls
        horizontal = (r, c - 1) in self.walls or (r, c + 1) in self.walls
        return vertical and horizontal


@functools.lru_cache(maxsize=4096)
def parse_room(room: tuple[str, ...]) -> Room:
    """Parse a room in the XSB notation of the module docstring (a tuple of equally long rows)."""
    if not isinstance(room, tuple) or not room or not all(isinstance(r, str) for r in room):
        raise ValueError(f"A room must be a non-empty tuple of strings, got {room!r:.120}")
    width = len(room[0])
    walls, targets, boxes, players = set(), set(), set(), []
    for r, line in enumerate(room):
        if len(line) != width:
            raise ValueError(f"Room rows must have the same length; row {r} is {line!r}, row 0 {room[0]!r}.")
        for c, ch in enumerate(line):
            if ch not in ROOM_LEGEND:
                raise ValueError(f"Unknown room character {ch!r} at ({r}, {c}); legend: {sorted(ROOM_LEGEND)}.")
            if ch == "#":
                walls.add((r, c))
            if ch in ".*+":
                targets.add((r, c))
            if ch in "$*":
                boxes.add((r, c))
            if ch in "@+":
                players.append((r, c))
    if len(players) != 1 or len(boxes) != len(targets) or not boxes:
        raise ValueError(
            f"A room needs one player and as many boxes as targets (at least one); got {len(players)} players, "
            f"{len(boxes)} boxes, {len(targets)} targets in {room!r}."
        )
    return Room(len(room), width, frozenset(walls), frozenset(targets), frozenset(boxes), players[0])


@dataclass(frozen=True)
class Play:
    """The result of executing moves in a Sokoban room."""

    moves: str
    legal: int
    """Moves executed before the first illegal one (all of them if none was)."""
    player: Cell
    boxes: frozenset[Cell]
    """Where the boxes are when execution stopped."""
    error: str | None
    """The first illegal move in words, else None."""
    stuck: tuple[str, ...]
    """Pushes that left a box in a dead corner (a non-target corner), in words."""

    def on_target(self, room: Room) -> int:
        return len(self.boxes & room.targets)


def play_sokoban(room: tuple[str, ...], moves: str) -> Play:
    """Execute ``moves`` (``UDLR``) in ``room``, stopping at the first illegal move."""
    parsed = parse_room(room)
    player, boxes = parsed.player, set(parsed.boxes)
    stuck: list[str] = []
    for i, move in enumerate(moves):
        dr, dc = MOVES[move]
        nxt = (player[0] + dr, player[1] + dc)
        if not (0 <= nxt[0] < parsed.rows and 0 <= nxt[1] < parsed.cols) or nxt in parsed.walls:
            return Play(moves, i, player, frozenset(boxes), f"move {i + 1} ({move}) walks into a wall at {nxt}",
                        tuple(stuck))
        if nxt in boxes:
            beyond = (nxt[0] + dr, nxt[1] + dc)
            outside = not (0 <= beyond[0] < parsed.rows and 0 <= beyond[1] < parsed.cols)
            if outside or beyond in parsed.walls or beyond in boxes:
                what = "another box" if beyond in boxes else "a wall"
                return Play(moves, i, player, frozenset(boxes),
                            f"move {i + 1} ({move}) pushes the box at {nxt} into {what} at {beyond}", tuple(stuck))
            boxes.remove(nxt)
            boxes.add(beyond)
            if parsed.dead_corner(beyond):
                stuck.append(f"move {i + 1} ({move}) pushes a box into the corner at {beyond}, which is not a "
                             "target: it can never move again")
        player = nxt
    return Play(moves, len(moves), player, frozenset(boxes), None, tuple(stuck))


def score_sokoban(moves: str, room: tuple[str, ...], optimal: int) -> dict[str, float]:
    """The components (module docstring) of parsed ``moves``; ``optimal`` is the fewest moves that solve
    the room."""
    if not moves:
        return dict.fromkeys(SOKOBAN_COMPONENTS, 0.0)
    parsed = parse_room(room)
    result = play_sokoban(room, moves)
    on_target = result.on_target(parsed)
    solved = result.error is None and on_target == len(parsed.targets)
    return {
        "format": SOKOBAN_FORMAT_REWARD,
        "valid": SOKOBAN_VALID_REWARD * result.legal / len(moves),
        "boxes": BOXES_REWARD * on_target / len(parsed.targets),
        "solved": SOKOBAN_SOLVED_REWARD if solved else 0.0,
        "steps": STEPS_REWARD * optimal / len(moves) if solved else 0.0,
    }


def sokoban_solved(text: str, room: tuple[str, ...]) -> bool:
    """Whether the moves in ``text`` solve ``room``."""
    moves = parse_moves(text)
    if not moves:
        return False
    result = play_sokoban(room, moves)
    return result.error is None and result.boxes == parse_room(room).targets


def sokoban_components(
    *, completions: Sequence[str], room: Sequence[tuple[str, ...]], optimal: Sequence[int], **kwargs: Any
) -> list[dict[str, float]]:
    """Per completion: the Sokoban components (keys :data:`SOKOBAN_COMPONENTS`)."""
    if not len(room) == len(optimal) == len(completions):
        raise ValueError(
            f"Got {len(completions)} completions, {len(room)} rooms and {len(optimal)} optimal lengths; they "
            "must pair up."
        )
    return [
        score_sokoban(parse_moves(text), tuple(r), int(k))
        for text, r, k in zip(completions, room, optimal, strict=True)
    ]


def sokoban_reward(
    *, completions: Sequence[str], room: Sequence[tuple[str, ...]], optimal: Sequence[int], **kwargs: Any
) -> list[float]:
    """The total per completion (at most :data:`SOKOBAN_MAX_REWARD`)."""
    return [sum(p.values()) for p in sokoban_components(completions=completions, room=room, optimal=optimal)]
