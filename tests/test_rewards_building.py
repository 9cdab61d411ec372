"""Hand-checked reward tables of the building families (letters, houses) and the command parser."""

from __future__ import annotations

import pytest

from llm_envs.rewards.building import (
    AgentLimits,
    house_components,
    letters_components,
    parse_command,
    parse_commands,
    simulate,
)


# ------------------------------------------------------------------------------------------ parser
@pytest.mark.parametrize(
    "line, expected",
    [
        ("/setblock 1 2 0 red_wool", ("setblock", (1, 2, 0), "red_wool")),
        ("/setblock 1 2 0 minecraft:red_wool", ("setblock", (1, 2, 0), "red_wool")),
        ("/SETBLOCK 1 2 0 Red_Wool", ("setblock", (1, 2, 0), "red_wool")),  # case does not matter
        ("/setblock -1 2 0 red_wool", ("setblock", (-1, 2, 0), "red_wool")),  # parsed; out of bounds later
        ("/fill 0 0 0 3 1 2 stone", ("fill", (0, 0, 0, 3, 1, 2), "stone")),
        ("/fill 3 1 2 0 0 0 air", ("fill", (3, 1, 2, 0, 0, 0), "air")),
        ("/kill", ("kill", (), "")),
        ("/setblock 1 2 red_wool", None),  # a coordinate missing
        ("/setblock 1 2 0 0 red_wool", None),  # one too many
        ("/setblock 1.5 2 0 red_wool", None),  # not an integer
        ("/setblock 1 2 0 red wool", None),
        ("/setblock 1 2 0 9wool", None),  # not a block name
        ("setblock 1 2 0 red_wool", None),  # no slash
        ("/give @p red_wool", None),  # unknown command
        ("/kill @e", None),
        ("Place a red block at (1, 2, 0).", None),
    ],
)
def test_parse_command(line, expected):
    command = parse_command(line)
    if expected is None:
        assert command is None
    else:
        assert (command.name, command.coords, command.block) == expected


def test_parse_commands_counts_ignored_lines_and_reads_fences():
    text = "Here are my commands:\n```\n/setblock 0 0 0 stone\n\n/setblock 1 0 0\n/setblock 2 0 0 dirt\n```\n"
    parsed = parse_commands(text, ("setblock",))
    assert [c.coords for c in parsed.commands] == [(0, 0, 0), (2, 0, 0)]
    assert parsed.ignored == 1  # the fences' prose is dropped with them; blank lines are not counted
    assert parse_commands("/fill 0 0 0 1 1 1 stone", ("setblock",)).ignored == 1  # not an allowed command
    assert parse_commands("/setblock 0 0 0 stone\n" * 500).ignored == 100  # lines beyond MAX_LINES


def test_simulate_bounds_palette_budget_resources_and_order():
    limits = [AgentLimits(frozenset({"a", "b"}), 3), AgentLimits(frozenset({"c"}), 1)]
    build = simulate(["/setblock 0 0 0 a\n/setblock 5 0 0 a\n/setblock 1 0 0 c\n/setblock 1 0 0 b\nhi",
                      "/setblock 0 0 0 c\n/setblock 1 0 0 c"], limits, (2, 1, 1), ("setblock",))
    assert build.world == {(0, 0, 0): "c"}  # builder 2's command applies after builder 1's
    one, two = build.logs
    assert (one.applied, one.out_of_bounds, one.not_allowed, one.over_budget, one.ignored) == (1, 1, 1, 1, 1)
    assert (two.applied, two.over_budget) == (1, 1)
    limits = [AgentLimits(frozenset({"s"}), 9, {"s": 4}), AgentLimits(frozenset({"s"}), 9, {"s": 4})]
    build = simulate(["/fill 0 0 0 1 1 0 s\n/fill 0 0 1 0 0 1 s\n/fill 0 0 0 0 0 0 air\n/kill",
                      "/fill 0 0 0 2 1 0 s\n/setblock 0 0 0 s"], limits, (2, 2, 2), ("fill", "kill"))
    assert build.world == {(1, 0, 0): "s", (0, 1, 0): "s", (1, 1, 0): "s"}
    one, two = build.logs
    assert (one.applied, one.no_resources, one.kills, one.used) == (3, 1, 1, {"s": 4})
    assert (two.out_of_bounds, two.ignored) == (1, 1) and build.killed


# ------------------------------------------------------------------------------------------ letters
# The target: an L of 3 cells on the plane z = 0 (x, y):  (0, 1)
#                                                         (0, 0) (1, 0)
L_CELLS = {(0, 0, 0), (0, 1, 0), (1, 0, 0)}
PALETTES = [("a", "b"), ("c", "d")]


@pytest.mark.parametrize(
    "world, expected",
    [
        # coverage, extra, same_block, palette
        ({(0, 0, 0): "a", (0, 1, 0): "c", (1, 0, 0): "d"}, (2.0, 0.0, 0.0, 0.0)),  # perfect
        ({(0, 0, 0): "a", (0, 1, 0): "b", (1, 0, 0): "c"}, (2.0, 0.0, 0.0, 0.0)),  # perfect too
        ({}, (0.0, 0.0, 0.0, -0.5)),  # empty: both palettes missing
        ({(0, 0, 0): "a", (0, 1, 0): "b", (1, 0, 0): "b"}, (2.0, 0.0, 0.0, -0.25)),  # builder 2 missing
        ({(0, 0, 0): "a", (0, 1, 0): "a", (1, 0, 0): "c"}, (2.0, 0.0, -0.5, 0.0)),  # 1 of 2 pairs alike
        ({(0, 0, 0): "a", (0, 1, 0): "a", (1, 0, 0): "a"}, (2.0, 0.0, -1.0, -0.25)),
        ({(0, 0, 0): "a", (0, 1, 0): "c", (1, 0, 0): "d", (3, 3, 0): "b"}, (2.0, -1.5 / 4, 0.0, 0.0)),  # 1 extra
        ({(0, 0, 0): "a", (5, 0, 0): "c"}, (2.0 / 3, -0.75, 0.0, 0.0)),
        ({(2, 0, 0): "a", (3, 0, 0): "c"}, (0.0, -1.5, 0.0, 0.0)),  # only extra blocks
        ({(0, 0, 0): "a", (0, 0, 1): "a", (1, 0, 0): "c"}, (4 / 3, -0.5, -0.5, 0.0)),  # touching along z
    ],
)
def test_letters_reward_table(world, expected):
    components = letters_components(world, L_CELLS, PALETTES)
    assert list(components) == ["coverage", "extra", "same_block", "palette"]
    assert tuple(components.values()) == pytest.approx(expected)


# ------------------------------------------------------------------------------------------ houses
# A 2 x 1 x 1 target: stone at (0, 0, 0), air at (1, 0, 0); plus a glass cell above the stone.
TARGET = {(0, 0, 0): "stone", (1, 0, 0): "air", (0, 1, 0): "glass", (1, 1, 0): "air"}


@pytest.mark.parametrize(
    "world, spiders, killed, expected",
    [
        # match, spiders
        ({(0, 0, 0): "stone", (0, 1, 0): "glass"}, False, False, (1.0, 0.0)),  # perfect
        ({(0, 0, 0): "stone", (0, 1, 0): "glass"}, True, True, (1.0, 0.0)),  # perfect, spiders killed
        ({(0, 0, 0): "stone", (0, 1, 0): "glass"}, True, False, (1.0, -0.2)),  # nobody wrote /kill
        ({(0, 0, 0): "stone", (0, 1, 0): "glass"}, False, True, (1.0, 0.0)),  # /kill without spiders: no cost
        ({}, False, False, (0.5, 0.0)),  # empty: the air cells match
        ({(0, 0, 0): "stone", (0, 1, 0): "glass", (1, 0, 0): "stone"}, False, False, (0.75, 0.0)),  # extra block
        ({(0, 0, 0): "glass", (0, 1, 0): "stone"}, False, False, (0.5, 0.0)),  # blocks swapped
        ({(0, 0, 0): "dirt", (1, 0, 0): "dirt", (0, 1, 0): "dirt", (1, 1, 0): "dirt"}, True, False, (0.0, -0.2)),
    ],
)
def test_house_reward_table(world, spiders, killed, expected):
    components = house_components(world, TARGET, spiders=spiders, killed=killed)
    assert list(components) == ["match", "spiders"]
    assert tuple(components.values()) == pytest.approx(expected)
