"""Generated Sokoban (``puzzle/sokoban-v0``, ``puzzle/sokoban-easy-v0``), max reward 2.8: the family, its
ids, levels and task arguments are :mod:`llm_envs.tasks.puzzle`'s.

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
"""

from __future__ import annotations

from collections import deque
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
    labeled_grid,
    listing,
    resolve_level,
    shuffled,
)
from llm_envs.rewards.planning import MOVES, parse_moves
from llm_envs.rewards.puzzle import (
    SOKOBAN_COMPONENTS,
    SOKOBAN_MAX_REWARD,
    parse_room,
    play_sokoban,
    score_sokoban,
    sokoban_solved,
)

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
