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

Sudoku: :mod:`llm_envs.tasks.sudoku` (its reward, board, tool variables and instances); Sokoban:
:mod:`llm_envs.tasks.sokoban` (the same). This module registers their ids.

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

from llm_envs.core.registry import register
from llm_envs.tasks.sokoban import SokobanTask, generate_sokoban, solve_sokoban
from llm_envs.tasks.sudoku import (
    SudokuTask,
    count_solutions,
    generate_sudoku,
    solve_sudoku,
    solve_sudoku_grid,
    sudoku_board,
)

__all__ = [
    "SokobanTask", "SudokuTask", "count_solutions", "generate_sokoban", "generate_sudoku", "solve_sokoban",
    "solve_sudoku", "solve_sudoku_grid", "sudoku_board",
]

register("puzzle/sudoku4-v0", SudokuTask, protocol="parallel", n=4,
         description="Generated 4x4 Sudoku (one solution each): a tool agent's sandboxed program and a planner "
                     "fill the grid (difficulty medium: 8 blanks).")
register("puzzle/sudoku9-v0", SudokuTask, protocol="parallel", n=9,
         description="Generated 9x9 Sudoku (one solution each): a tool agent's sandboxed program and a planner "
                     "fill the grid (difficulty medium: 44 blanks).")
register("puzzle/sokoban-v0", SokobanTask, protocol="parallel", description=SokobanTask.description)
register("puzzle/sokoban-easy-v0", SokobanTask, protocol="parallel", difficulty="easy",
         description="puzzle/sokoban-v0 at difficulty easy (6x6 rooms, 1 box), trainable from the command line.")
