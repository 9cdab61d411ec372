"""Hand-checked reward tables of the generated families: plan-path moves, Sudoku grids, Sokoban pushes."""

from __future__ import annotations

import pytest

from llm_envs.rewards.planning import (
    answer_region,
    parse_moves,
    plan_path_components,
    plan_path_reward,
    walk,
)
from llm_envs.rewards.puzzle import (
    parse_room,
    parse_sudoku,
    play_sokoban,
    sokoban_components,
    sokoban_reward,
    sudoku_components,
    sudoku_problems,
    sudoku_reward,
)
from llm_envs.tasks.planning import shortest_path
from llm_envs.tasks.puzzle import count_solutions, solve_sokoban

# ------------------------------------------------------------------------------------------ plan-path
#    0 1 2 3
# 0  S . # .
# 1  . . # .
# 2  # . . .
# 3  . . # G        shortest path: 6 moves (DRDRRD or RDDRRD)
GRID = ("S.#.", "..#.", "#...", "..#G")
START, GOAL, SHORTEST = (0, 0), (3, 3), 6


def test_the_hand_checked_grid_has_the_stated_shortest_path():
    assert len(shortest_path(GRID, START, GOAL)) == SHORTEST


@pytest.mark.parametrize(
    "answer, expected, error",
    [
        # format, valid, goal, optimal
        ("Answer: DRDRRD", (0.1, 0.2, 1.0, 0.5), None),
        ("Answer: RDDRRD", (0.1, 0.2, 1.0, 0.5), None),  # another shortest path
        ("DRDRRD", (0.1, 0.2, 1.0, 0.5), None),  # no marker: the last run of moves
        ("Go D then R. Answer: D R D R R D", (0.1, 0.2, 1.0, 0.5), None),  # spaces between moves
        ("Answer: D, R, D, R, R, D.", (0.1, 0.2, 1.0, 0.5), None),
        ("Answer: DRDRRD. Then U.", (0.1, 0.2, 1.0, 0.5), None),  # the first run after the marker
        ("First RR, finally DRDRRD", (0.1, 0.2, 1.0, 0.5), None),
        ("Answer: DRDRRUDD", (0.1, 0.2, 1.0, 0.5 * 6 / 8), None),  # reaches G in 8 moves
        ("Answer: RR", (0.1, 0.1, 0.0, 0.0), "move 2 (R) walks into a wall at (0, 2)"),
        ("Answer: U", (0.1, 0.0, 0.0, 0.0), "move 1 (U) leaves the grid at (-1, 0)"),
        ("Answer: DDRRRD", (0.1, 0.2 / 6, 0.0, 0.0), "move 2 (D) walks into a wall at (2, 0)"),
        ("Answer: DRD", (0.1, 0.2, 0.0, 0.0), None),  # legal, but stops at (2, 1)
        ("Answer: DRDRRDD", (0.1, 0.2 * 6 / 7, 0.0, 0.0), "move 7 (D) leaves the grid at (4, 3)"),
        ("", (0.0, 0.0, 0.0, 0.0), None),
        ("Answer: right, down", (0.0, 0.0, 0.0, 0.0), None),  # words are not moves
        ("Answer: d r d r r d", (0.0, 0.0, 0.0, 0.0), None),  # lower case is not accepted
        ("DRDRRDX", (0.0, 0.0, 0.0, 0.0), None),  # a run touching other letters is a word
    ],
)
def test_plan_path_reward_table(answer, expected, error):
    (parts,) = plan_path_components(completions=[answer], grid=[GRID], start=[START], goal=[GOAL], shortest=[SHORTEST])
    assert list(parts) == ["format", "valid", "goal", "optimal"]
    assert tuple(parts.values()) == pytest.approx(expected)
    (total,) = plan_path_reward(completions=[answer], grid=[GRID], start=[START], goal=[GOAL], shortest=[SHORTEST])
    assert total == pytest.approx(sum(expected))
    assert walk(GRID, START, parse_moves(answer)).error == error


def test_answer_region_and_column_checks():
    assert answer_region("a ANSWER: x answer : y") == (" y", True)
    assert answer_region("no marker") == ("no marker", False)
    with pytest.raises(ValueError, match="2 values of 'grid'"):
        plan_path_components(completions=["x"], grid=[GRID, GRID], start=[START], goal=[GOAL], shortest=[6])
    with pytest.raises(TypeError, match="string answer"):
        parse_moves(None)


# ------------------------------------------------------------------------------------------ sudoku
PUZZLE = (1, 2, 0, 4, 0, 0, 1, 0, 0, 1, 0, 0, 4, 0, 0, 1)  # the unique solution is SOLVED below
SOLVED = "1234\n3412\n2143\n4321"


def test_the_hand_checked_puzzle_has_one_solution():
    assert count_solutions(PUZZLE, 4, limit=5) == 1


@pytest.mark.parametrize(
    "answer, expected, first_problem",
    [
        # format, givens, rows, columns, boxes, solved
        ("Answer:\n" + SOLVED, (0.1, 0.3, 0.2, 0.2, 0.2, 1.0), None),
        ("Answer:\n1 2 | 3 4\n3 4 | 1 2\n----+----\n2 1 | 4 3\n4 3 | 2 1", (0.1, 0.3, 0.2, 0.2, 0.2, 1.0), None),
        ("Answer: 1234341221434321", (0.1, 0.3, 0.2, 0.2, 0.2, 1.0), None),  # one line of 16 digits
        ("Row 1 is 1 2 3 4.\n" + SOLVED, (0.1, 0.3, 0.2, 0.2, 0.2, 1.0), None),  # lines with words are not grid
        # A duplicate digit in a blank cell: row 1, column 3 and box 2 hold two 4s (and no 3).
        ("Answer:\n1244\n3412\n2143\n4321", (0.1, 0.3, 0.15, 0.15, 0.15, 0.0), "row 1 has two 4s"),
        # Digits 1 and 2 swapped everywhere: a valid grid that keeps only 2 of the 7 givens.
        ("Answer:\n2134\n3421\n1243\n4312", (0.1, 0.3 * 2 / 7, 0.2, 0.2, 0.2, 0.0),
         "cell (1, 1) must stay 1 (a given), the answer has 2"),
        ("Answer:\n1254\n3412\n2143\n4321", (0.1, 0.3, 0.15, 0.15, 0.15, 0.0),
         "digits must be 1 to 4; the answer has 5"),
        ("Answer:\n1234\n3412\n2143\n432", (0,) * 6, "no grid of 16 digits found"),  # 15 digits
        ("Answer:\n1234\n3412\n2143\n4321\n1", (0,) * 6, "no grid of 16 digits found"),  # 17 digits
        ("", (0,) * 6, "no grid of 16 digits found"),
    ],
)
def test_sudoku_reward_table(answer, expected, first_problem):
    (parts,) = sudoku_components(completions=[answer], puzzle=[PUZZLE], n=[4])
    assert list(parts) == ["format", "givens", "rows", "columns", "boxes", "solved"]
    assert tuple(parts.values()) == pytest.approx(expected)
    assert sudoku_reward(completions=[answer], puzzle=[PUZZLE], n=[4]) == [pytest.approx(sum(expected))]
    problems = sudoku_problems(parse_sudoku(answer, 4), PUZZLE, 4)
    assert (problems[0].startswith(first_problem) if first_problem else problems == [])


def test_sudoku_problems_name_every_duplicate():
    problems = sudoku_problems(parse_sudoku("1134 3412 2143 4321", 4), PUZZLE, 4)
    assert problems == ["cell (1, 2) must stay 2 (a given), the answer has 1", "row 1 has two 1s",
                        "column 2 has two 1s", "box 1 has two 1s"]
    grid = tuple(int(c) for c in "3333" "3412" "2143" "4321")
    assert "row 1 has four 3s" in sudoku_problems(grid, (0,) * 16, 4)
    with pytest.raises(ValueError, match="Sudoku size must be one of \\[4, 9\\], got 5"):
        parse_sudoku("1", 5)


# ------------------------------------------------------------------------------------------ sokoban
#    0 1 2 3 4 5 6
# 0  # # # # # # #
# 1  # - - - - - #
# 2  # - $ - . - #       fewest moves: LURR (4)
# 3  # - @ - - - #
# 4  # # # # # # #
ROOM = ("#######", "#-----#", "#-$-.-#", "#-@---#", "#######")
TWO_BOXES = ("#######", "#--@--#", "#.-$--#", "#--$-.#", "#-----#", "#######")  # fewest moves: 7


def test_the_hand_checked_room_has_the_stated_solution():
    assert solve_sokoban(ROOM) == "LURR"
    room = parse_room(ROOM)
    assert room.player == (3, 2) and room.boxes == {(2, 2)} and room.targets == {(2, 4)}
    assert room.dead_corner((1, 1)) and not room.dead_corner((1, 2)) and not room.dead_corner((2, 4))


@pytest.mark.parametrize(
    "room, answer, expected, error, stuck",
    [
        # format, valid, boxes, solved, steps
        (ROOM, "Answer: LURR", (0.1, 0.2, 0.5, 1.0, 0.5), None, False),
        (ROOM, "Answer: LURRLR", (0.1, 0.2, 0.5, 1.0, 0.5 * 4 / 6), None, False),  # solved in 6 moves
        (ROOM, "Answer: LURRR", (0.1, 0.2, 0.0, 0.0, 0.0), None, False),  # pushed past the target
        (ROOM, "Answer: D", (0.1, 0.0, 0.0, 0.0, 0.0), "move 1 (D) walks into a wall at (4, 2)", False),
        (ROOM, "Answer: UU", (0.1, 0.1, 0.0, 0.0, 0.0), "move 2 (U) pushes the box at (1, 2) into a wall at (0, 2)",
         False),
        # Up, then around the box, then left: the box lands in the corner (1, 1) for good.
        (ROOM, "Answer: URUL", (0.1, 0.2, 0.0, 0.0, 0.0), None, True),
        (TWO_BOXES, "Answer: D", (0.1, 0.0, 0.0, 0.0, 0.0),
         "move 1 (D) pushes the box at (2, 3) into another box at (3, 3)", False),
        (TWO_BOXES, "Answer: RDLL", (0.1, 0.2, 0.25, 0.0, 0.0), None, False),  # one box of two on its target
        (TWO_BOXES, "Answer: RDLLDRR", (0.1, 0.2, 0.5, 1.0, 0.5), None, False),
        (ROOM, "", (0.0,) * 5, None, False),
        (ROOM, "Answer: left up right right", (0.0,) * 5, None, False),
    ],
)
def test_sokoban_reward_table(room, answer, expected, error, stuck):
    optimal = len(solve_sokoban(room))
    (parts,) = sokoban_components(completions=[answer], room=[room], optimal=[optimal])
    assert list(parts) == ["format", "valid", "boxes", "solved", "steps"]
    assert tuple(parts.values()) == pytest.approx(expected)
    assert sokoban_reward(completions=[answer], room=[room], optimal=[optimal]) == [pytest.approx(sum(expected))]
    result = play_sokoban(room, parse_moves(answer))
    assert result.error == error
    assert bool(result.stuck) == stuck
    if stuck:
        assert result.stuck[0] == ("move 4 (L) pushes a box into the corner at (1, 1), which is not a target: it "
                                   "can never move again")


def test_sokoban_rooms_are_checked():
    with pytest.raises(ValueError, match="one player and as many boxes as targets"):
        parse_room(("#####", "#@$-#", "#####"))
    with pytest.raises(ValueError, match="Unknown room character 'x' at \\(1, 1\\)"):
        parse_room(("#####", "#x$.#", "#####"))
    with pytest.raises(ValueError, match="same length"):
        parse_room(("#####", "#@$.", "#####"))
