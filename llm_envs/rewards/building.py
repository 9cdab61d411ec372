"""Block-building rewards (``building/letters-v0``, ``building/house-v0``): a command parser, a pure-Python
voxel world, and the two scores. No game server: the world is a dict from ``(x, y, z)`` to a block name.

Commands, one per line (markdown fences removed; blank lines skipped):

==============================================  =============================================================
``/setblock x y z block``                        put ``block`` at ``(x, y, z)`` (letters)
``/fill x1 y1 z1 x2 y2 z2 block``                put ``block`` in every cell of the box between the two
                                                 corners, both included (houses; ``air`` empties cells)
``/kill``                                        remove hostile mobs (houses: stops a spider attack)
==============================================  =============================================================

Coordinates are integers; a block is a lower-case name (``oak_planks``; a ``minecraft:`` prefix is
dropped). Any other line (prose, a wrong number of arguments, a coordinate that is not an integer, an
unknown command) is *ignored* and counted. A parsed command is *rejected*, and counted, when a
coordinate is out of the world's bounds, the block is not the agent's to use, it would exceed the
agent's resources, or the agent's command budget is spent. The agents' commands apply in agent order
(agent 1's, then agent 2's), each in the order written; a later block replaces an earlier one.

Letters (StrBuild): the target is a string drawn as 5 x 5 glyphs on the plane ``z = 0``.

==================  ========  ===============================================================
component           value     when
==================  ========  ===============================================================
``coverage``        0 .. 2    2 x (glyph cells holding a block) / (glyph cells)
``extra``           -1.5 .. 0 -1.5 x (blocks on cells outside the glyphs) / (blocks placed)
``same_block``      -1 .. 0   -1 x (touching pairs of blocks with the same block) / (touching pairs)
``palette``         -0.5 .. 0 -0.25 per agent none of whose blocks is in the build
==================  ========  ===============================================================

Maximum 2.0 (every glyph cell filled, nothing else, no two touching blocks alike, both palettes used).
Touching = sharing a face (6-neighbourhood).

Houses (HouseBuild): the target gives a block or air for every cell of the house's bounding box.

==================  ========  ===============================================================
component           value     when
==================  ========  ===============================================================
``match``           0 .. 1    (cells of the bounding box whose block is the target's, air
                              included) / (cells of the bounding box)
``spiders``         -0.2 / 0  spiders attack (the instance says so) and no agent issued ``/kill``
==================  ========  ===============================================================

Maximum 1.0.

>>> parse_commands("/setblock 1 2 0 red_wool\\nplace it\\n/setblock 1 x 0 red_wool").ignored
2
>>> letters_components({(0, 0, 0): "red_wool", (1, 0, 0): "red_wool"}, {(0, 0, 0)}, [("red_wool",), ("blue_wool",)])
{'coverage': 2.0, 'extra': -0.75, 'same_block': -1.0, 'palette': -0.25}
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from llm_envs.rewards.coding import strip_fences

AIR = "air"
COMMANDS = ("setblock", "fill", "kill")
ARITY = {"setblock": 4, "fill": 7, "kill": 0}
"""Arguments after the command name."""

COVERAGE_REWARD = 2.0
EXTRA_PENALTY = -1.5
SAME_BLOCK_PENALTY = -1.0
PALETTE_PENALTY = -0.25
LETTERS_COMPONENTS = ("coverage", "extra", "same_block", "palette")
LETTERS_MAX_REWARD = COVERAGE_REWARD

MATCH_REWARD = 1.0
SPIDER_PENALTY = -0.2
HOUSE_COMPONENTS = ("match", "spiders")
HOUSE_MAX_REWARD = MATCH_REWARD

MAX_LINES = 400
"""Lines of one response read (the rest are ignored and counted): bounds the work of a hostile reply."""

Cell = tuple[int, int, int]
_BLOCK = re.compile(r"^(?:minecraft:)?([a-z][a-z0-9_]*)$")
_INT = re.compile(r"^[+-]?\d{1,6}$")
_NEIGHBOURS = ((1, 0, 0), (0, 1, 0), (0, 0, 1))


@dataclass(frozen=True)
class Command:
    """One parsed command line."""

    name: str
    """``setblock``, ``fill`` or ``kill``."""
    coords: tuple[int, ...]
    """3 (setblock), 6 (fill) or 0 (kill) integers."""
    block: str
    """The block name ("" for kill)."""
    line: str

    @property
    def cells(self) -> tuple[Cell, Cell]:
        """The box's two corners, lowest first on each axis (one cell for setblock)."""
        c = self.coords if self.name == "fill" else self.coords * 2
        lo = (min(c[0], c[3]), min(c[1], c[4]), min(c[2], c[5]))
        hi = (max(c[0], c[3]), max(c[1], c[4]), max(c[2], c[5]))
        return lo, hi

    @property
    def volume(self) -> int:
        lo, hi = self.cells
        return (hi[0] - lo[0] + 1) * (hi[1] - lo[1] + 1) * (hi[2] - lo[2] + 1)


@dataclass(frozen=True)
class Parsed:
    """The commands of one response and how many lines were ignored."""

    commands: tuple[Command, ...]
    ignored: int
    """Non-blank lines that are not a well-formed command of the allowed kinds."""


def parse_command(line: str, allowed: Sequence[str] = COMMANDS) -> Command | None:
    """One line as a command, or None when it is not a well-formed one of ``allowed``.

    >>> parse_command("/fill 0 0 0 2 1 0 minecraft:stone")
    Command(name='fill', coords=(0, 0, 0, 2, 1, 0), block='stone', line='/fill 0 0 0 2 1 0 minecraft:stone')
    >>> parse_command("/setblock 1 2 red_wool") is None, parse_command("setblock 1 2 0 red_wool") is None
    (True, True)
    """
    words = line.split()
    if not words or not words[0].startswith("/"):
        return None
    name = words[0][1:].lower()
    if name not in allowed or name not in ARITY:
        return None
    args = words[1:]
    if len(args) != ARITY[name]:
        return None
    if name == "kill":
        return Command(name, (), "", line)
    *numbers, block = args
    match = _BLOCK.match(block.lower())
    if match is None or not all(_INT.match(n) for n in numbers):
        return None
    return Command(name, tuple(int(n) for n in numbers), match.group(1), line)


def parse_commands(text: str, allowed: Sequence[str] = COMMANDS) -> Parsed:
    """The commands of a response (see the module docstring): fences removed, blank lines skipped,
    every other line that is not a command of ``allowed`` counted in ``ignored``."""
    if not isinstance(text, str):
        raise TypeError(f"Expected a response string, got {type(text).__name__}: {text!r:.80}")
    lines = [line.strip() for line in strip_fences(text).splitlines()]
    lines = [line for line in lines if line]
    commands, ignored = [], max(0, len(lines) - MAX_LINES)
    for line in lines[:MAX_LINES]:
        command = parse_command(line, allowed)
        if command is None:
            ignored += 1
        else:
            commands.append(command)
    return Parsed(tuple(commands), ignored)


@dataclass(frozen=True)
class AgentLimits:
    """What one agent may do: its blocks, its command budget, its resources per block."""

    blocks: frozenset[str]
    """Blocks it may place (``air`` is always allowed in a fill)."""
    max_commands: int
    """Parsed commands it may issue; later ones are rejected (``over_budget``)."""
    resources: Mapping[str, int] | None = None
    """Cells of each block it may fill in all (None: no limit)."""


@dataclass
class AgentLog:
    """What became of one agent's response."""

    applied: int = 0
    ignored: int = 0
    out_of_bounds: int = 0
    not_allowed: int = 0
    """The block is not the agent's."""
    no_resources: int = 0
    over_budget: int = 0
    kills: int = 0
    used: dict[str, int] = field(default_factory=dict)
    """Cells filled per block (air excluded)."""

    @property
    def rejected(self) -> int:
        return self.out_of_bounds + self.not_allowed + self.no_resources + self.over_budget


@dataclass(frozen=True)
class Build:
    """The world after every agent's commands."""

    world: dict[Cell, str]
    """Non-air cells."""
    logs: tuple[AgentLog, ...]
    """One per agent, in agent order."""

    @property
    def killed(self) -> bool:
        return any(log.kills for log in self.logs)


def in_bounds(cell: Sequence[int], bounds: Sequence[int]) -> bool:
    return all(0 <= c < b for c, b in zip(cell, bounds, strict=True))


def simulate(
    responses: Sequence[str],
    limits: Sequence[AgentLimits],
    bounds: Cell,
    allowed: Sequence[str] = COMMANDS,
) -> Build:
    """Apply each agent's response (in agent order) to an empty world of ``bounds`` = (X, Y, Z) cells:
    ``0 <= x < X`` and so on.

    >>> limits = [AgentLimits(frozenset({"stone"}), 2), AgentLimits(frozenset({"dirt"}), 2)]
    >>> b = simulate(["/setblock 0 0 0 stone\\n/setblock 9 0 0 stone", "/setblock 0 0 0 dirt"], limits, (2, 1, 1))
    >>> b.world, b.logs[0].out_of_bounds
    ({(0, 0, 0): 'dirt'}, 1)
    """
    if len(responses) != len(limits):
        raise ValueError(f"Got {len(responses)} responses for {len(limits)} agents.")
    world: dict[Cell, str] = {}
    logs = []
    for text, limit in zip(responses, limits, strict=True):
        parsed = parse_commands(text, allowed)
        log = AgentLog(ignored=parsed.ignored)
        left = dict(limit.resources) if limit.resources is not None else None
        for i, command in enumerate(parsed.commands):
            if i >= limit.max_commands:
                log.over_budget += 1
                continue
            if command.name == "kill":
                log.kills += 1
                log.applied += 1
                continue
            lo, hi = command.cells
            if not (in_bounds(lo, bounds) and in_bounds(hi, bounds)):
                log.out_of_bounds += 1
                continue
            block = command.block
            if (block != AIR and block not in limit.blocks) or (block == AIR and command.name != "fill"):
                log.not_allowed += 1
                continue
            volume = command.volume
            if block != AIR and left is not None:
                if left.get(block, 0) < volume:
                    log.no_resources += 1
                    continue
                left[block] -= volume
            for x in range(lo[0], hi[0] + 1):
                for y in range(lo[1], hi[1] + 1):
                    for z in range(lo[2], hi[2] + 1):
                        if block == AIR:
                            world.pop((x, y, z), None)
                        else:
                            world[(x, y, z)] = block
            if block != AIR:
                log.used[block] = log.used.get(block, 0) + volume
            log.applied += 1
        logs.append(log)
    return Build(world, tuple(logs))


def touching_pairs(world: Mapping[Cell, str]) -> tuple[int, int]:
    """(pairs of face-touching blocks, those pairs made of the same block)."""
    pairs = same = 0
    for (x, y, z), block in world.items():
        for dx, dy, dz in _NEIGHBOURS:
            other = world.get((x + dx, y + dy, z + dz))
            if other is not None:
                pairs += 1
                same += other == block
    return pairs, same


def letters_components(
    world: Mapping[Cell, str], targets: Iterable[Cell], palettes: Sequence[Sequence[str]]
) -> dict[str, float]:
    """The letters components (module docstring) of a built ``world`` for the glyph cells ``targets``
    and each agent's palette."""
    targets = set(targets)
    if not targets:
        raise ValueError("The letters target has no cells.")
    placed = len(world)
    covered = sum(cell in world for cell in targets)
    extra = placed - covered
    pairs, same = touching_pairs(world)
    used = set(world.values())
    missing = sum(not used.intersection(palette) for palette in palettes)
    return {
        "coverage": COVERAGE_REWARD * covered / len(targets),
        "extra": EXTRA_PENALTY * extra / placed if placed else 0.0,
        "same_block": SAME_BLOCK_PENALTY * same / pairs if pairs else 0.0,
        "palette": PALETTE_PENALTY * missing,
    }


def house_components(
    world: Mapping[Cell, str], target: Mapping[Cell, str], *, spiders: bool, killed: bool
) -> dict[str, float]:
    """The house components (module docstring): ``target`` gives every cell of the bounding box its block
    (``air`` included).

    >>> house_components({(0, 0, 0): "stone"}, {(0, 0, 0): "stone", (1, 0, 0): "air"}, spiders=True, killed=False)
    {'match': 1.0, 'spiders': -0.2}
    """
    if not target:
        raise ValueError("The house target has no cells.")
    matched = sum(world.get(cell, AIR) == block for cell, block in target.items())
    return {
        "match": MATCH_REWARD * matched / len(target),
        "spiders": SPIDER_PENALTY if spiders and not killed else 0.0,
    }


def share_limit(count: int, share: float) -> int:
    """``ceil(count x share)``: an agent's allowance of a block the house needs ``count`` of."""
    return math.ceil(count * share - 1e-9)
