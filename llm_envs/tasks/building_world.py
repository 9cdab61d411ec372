"""The instances of the building family (:mod:`llm_envs.tasks.building`): the font and the blocks, the
letters and house generators with their levels, the target cells and the oracle's commands (the
maximum reward on every instance)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from llm_envs.core.task import Problem
from llm_envs.procgen import below, check_int, instance_random
from llm_envs.rewards.building import (
    AIR,
    Cell,
    share_limit,
)

ROLES = ("builder_1", "builder_2")
GLYPH = 5
"""Glyphs are GLYPH x GLYPH cells."""
LETTER_GAP = 2
"""Empty columns between letters."""
BUDGET_FACTOR = 1.5
"""The letters command budget is this x the glyph cells, split evenly between the builders."""
RESOURCE_SHARE = 0.6
"""A house builder may fill ceil(this x n) cells of a block the house needs n of."""
SPIDER_CHANCE = {"easy": 0.0, "medium": 0.3, "hard": 0.5}
LETTER_BLOCKS = ("red_wool", "blue_wool", "green_wool", "yellow_wool", "white_wool", "black_wool",
                 "orange_wool", "purple_wool")
FLOOR_BLOCKS = ("oak_planks", "stone", "cobblestone", "spruce_planks", "polished_andesite", "smooth_stone")
WALL_BLOCKS = ("bricks", "stone_bricks", "sandstone", "birch_planks", "oak_log", "white_concrete")
ROOF_BLOCKS = ("dark_oak_planks", "red_sandstone", "deepslate_tiles", "mud_bricks")
GLASS = "glass"
HOUSE_CHARS = {"floor": "F", "wall": "W", "glass": "G", "roof": "R"}
AIR_CHAR = "."

LETTERS_LEVELS: dict[str, dict[str, Any]] = {"easy": {"length": 2}, "medium": {"length": 3}, "hard": {"length": 5}}
LENGTH_RANGE = (1, 8)
HOUSE_LEVELS: dict[str, dict[str, Any]] = {
    "easy": {"width": (3, 5), "depth": (3, 5), "height": 3, "windows": (0, 1)},
    "medium": {"width": (4, 6), "depth": (4, 6), "height": 4, "windows": (1, 2)},
    "hard": {"width": (5, 8), "depth": (5, 8), "height": 5, "windows": (2, 4)},
}
SIDE_RANGE = (3, 10)
HEIGHT_RANGE = (3, 6)

# 5 x 5 capitals, top row first.
FONT: dict[str, tuple[str, ...]] = {
    "A": (".###.", "#...#", "#####", "#...#", "#...#"),
    "B": ("####.", "#...#", "####.", "#...#", "####."),
    "C": (".####", "#....", "#....", "#....", ".####"),
    "D": ("####.", "#...#", "#...#", "#...#", "####."),
    "E": ("#####", "#....", "####.", "#....", "#####"),
    "F": ("#####", "#....", "####.", "#....", "#...."),
    "G": (".####", "#....", "#..##", "#...#", ".###."),
    "H": ("#...#", "#...#", "#####", "#...#", "#...#"),
    "I": ("#####", "..#..", "..#..", "..#..", "#####"),
    "J": ("..###", "...#.", "...#.", "#..#.", ".##.."),
    "K": ("#...#", "#..#.", "###..", "#..#.", "#...#"),
    "L": ("#....", "#....", "#....", "#....", "#####"),
    "M": ("#...#", "##.##", "#.#.#", "#...#", "#...#"),
    "N": ("#...#", "##..#", "#.#.#", "#..##", "#...#"),
    "O": (".###.", "#...#", "#...#", "#...#", ".###."),
    "P": ("####.", "#...#", "####.", "#....", "#...."),
    "Q": (".###.", "#...#", "#.#.#", "#..#.", ".##.#"),
    "R": ("####.", "#...#", "####.", "#..#.", "#...#"),
    "S": (".####", "#....", ".###.", "....#", "####."),
    "T": ("#####", "..#..", "..#..", "..#..", "..#.."),
    "U": ("#...#", "#...#", "#...#", "#...#", ".###."),
    "V": ("#...#", "#...#", "#...#", ".#.#.", "..#.."),
    "W": ("#...#", "#...#", "#.#.#", "##.##", "#...#"),
    "X": ("#...#", ".#.#.", "..#..", ".#.#.", "#...#"),
    "Y": ("#...#", ".#.#.", "..#..", "..#..", "..#.."),
    "Z": ("#####", "...#.", "..#..", ".#...", "#####"),
}
ALPHABET = "".join(FONT)


def glyph_cells(text: str) -> tuple[Cell, ...]:
    """The cells of ``text`` drawn with :data:`FONT`, sorted.

    >>> glyph_cells("I")[:3]
    ((0, 0, 0), (0, 4, 0), (1, 0, 0))
    """
    cells = []
    for i, letter in enumerate(text):
        x0 = i * (GLYPH + LETTER_GAP)
        for r, row in enumerate(FONT[letter]):
            for c, ch in enumerate(row):
                if ch == "#":
                    cells.append((x0 + c, GLYPH - 1 - r, 0))
    return tuple(sorted(cells))


def letters_width(length: int) -> int:
    return length * GLYPH + (length - 1) * LETTER_GAP


def generate_letters(seed: int, length: int = 3) -> dict[str, Any]:
    """The letters instance of ``seed``: ``{"seed", "text", "palettes" (two pairs of blocks), "cells" (the
    glyph cells), "bounds" ((x, y, z) sizes), "budget" (commands per builder)}``.

    >>> p = generate_letters(0, length=2)
    >>> p["text"], p["palettes"], p["bounds"], p["budget"]
    ('CX', (('red_wool', 'white_wool'), ('blue_wool', 'green_wool')), (12, 5, 1), 15)
    """
    check_int("length", length, *LENGTH_RANGE)
    rng = instance_random("letters", (length,), seed)
    text = "".join(ALPHABET[below(rng, len(ALPHABET))] for _ in range(length))
    blocks = [LETTER_BLOCKS[i] for i in _draw_distinct(rng, len(LETTER_BLOCKS), 4)]
    palettes = (tuple(sorted(blocks[:2])), tuple(sorted(blocks[2:])))
    cells = glyph_cells(text)
    return {"seed": seed, "text": text, "palettes": palettes, "cells": cells,
            "bounds": (letters_width(length), GLYPH, 1),
            "budget": math.ceil(BUDGET_FACTOR * len(cells) / 2)}


def _draw_distinct(rng: Any, n: int, k: int) -> list[int]:
    pool = list(range(n))
    out = []
    for _ in range(k):
        out.append(pool.pop(below(rng, len(pool))))
    return out


def _draw_range(rng: Any, low_high: tuple[int, int]) -> int:
    low, high = low_high
    return low + below(rng, high - low + 1)


def generate_house(seed: int, width: tuple[int, int] = (4, 6), depth: tuple[int, int] = (4, 6), height: int = 4,
                   windows: tuple[int, int] = (1, 2), spider_chance: float = 0.3) -> dict[str, Any]:
    """The house instance of ``seed``: ``{"seed", "layers" (per y, rows z of characters x), "inventory"
    ((char, block) pairs), "spiders", "bounds", "resources" ((block, cells per builder) pairs)}``.

    >>> p = generate_house(0, width=(3, 3), depth=(3, 3), height=3, windows=(0, 0), spider_chance=0.0)
    >>> p["layers"]
    (('FFF', 'FFF', 'FFF'), ('W.W', 'W.W', 'WWW'), ('RRR', 'RRR', 'RRR'))
    """
    rng = instance_random("house", (width, depth, height, windows, spider_chance), seed)
    w, d = _draw_range(rng, width), _draw_range(rng, depth)
    floor = FLOOR_BLOCKS[below(rng, len(FLOOR_BLOCKS))]
    wall = WALL_BLOCKS[below(rng, len(WALL_BLOCKS))]
    roof = ROOF_BLOCKS[below(rng, len(ROOF_BLOCKS))]
    door_x = 1 + below(rng, w - 2)
    door_height = min(2, height - 2)
    grid = [[[AIR_CHAR] * w for _ in range(d)] for _ in range(height)]
    for z in range(d):
        for x in range(w):
            grid[0][z][x] = HOUSE_CHARS["floor"]
            grid[height - 1][z][x] = HOUSE_CHARS["roof"]
            for y in range(1, height - 1):
                if x in (0, w - 1) or z in (0, d - 1):
                    grid[y][z][x] = HOUSE_CHARS["wall"]
    for y in range(1, 1 + door_height):
        grid[y][0][door_x] = AIR_CHAR
    # Windows: wall cells of the top wall layer that are not corners nor above the door.
    top = height - 2
    spots = [(z, x) for z in range(d) for x in range(w)
             if grid[top][z][x] == HOUSE_CHARS["wall"] and (x in (0, w - 1)) != (z in (0, d - 1))
             and not (z == 0 and x == door_x)]
    for i in _draw_distinct(rng, len(spots), min(len(spots), _draw_range(rng, windows))):
        z, x = spots[i]
        grid[top][z][x] = HOUSE_CHARS["glass"]
    spiders = rng.random() < spider_chance
    layers = tuple(tuple("".join(row) for row in layer) for layer in grid)
    inventory = tuple((HOUSE_CHARS[k], b) for k, b in (("floor", floor), ("wall", wall), ("glass", GLASS),
                                                         ("roof", roof)) if any(HOUSE_CHARS[k] in r for lay in layers
                                                                                for r in lay))
    counts = {block: sum(row.count(ch) for layer in layers for row in layer) for ch, block in inventory}
    return {"seed": seed, "layers": layers, "inventory": inventory, "spiders": spiders, "bounds": (w, height, d),
            "resources": tuple((block, share_limit(n, RESOURCE_SHARE)) for block, n in counts.items())}


def house_target(problem: Problem) -> dict[Cell, str]:
    """Every cell of the house's bounding box with its block (``air`` included)."""
    blocks = dict(problem["inventory"])
    return {(x, y, z): blocks.get(ch, AIR)
            for y, layer in enumerate(problem["layers"]) for z, row in enumerate(layer) for x, ch in enumerate(row)}


def boxes(cells: Mapping[Cell, str]) -> list[tuple[Cell, Cell, str]]:
    """A cover of ``cells`` (cell -> block) by boxes of one block each: runs along x, merged along z with
    the same x range, block and y. Sorted; used by the oracle and the "rectangles to fix" feedback.

    >>> boxes({(0, 0, 0): "a", (1, 0, 0): "a", (0, 0, 1): "a", (1, 0, 1): "a", (3, 0, 0): "b"})
    [((0, 0, 0), (1, 0, 1), 'a'), ((3, 0, 0), (3, 0, 0), 'b')]
    """
    runs: dict[tuple[int, int, int, str], list[int]] = {}  # (y, x1, x2, block) -> z values
    for y, z in sorted({(c[1], c[2]) for c in cells}):
        xs = sorted(c[0] for c in cells if c[1] == y and c[2] == z)
        start = 0
        for i in range(1, len(xs) + 1):
            if i == len(xs) or xs[i] != xs[i - 1] + 1 or cells[(xs[i], y, z)] != cells[(xs[start], y, z)]:
                runs.setdefault((y, xs[start], xs[i - 1], cells[(xs[start], y, z)]), []).append(z)
                start = i
    out = []
    for (y, x1, x2, block), zs in runs.items():
        first = zs[0]
        for i in range(1, len(zs) + 1):
            if i == len(zs) or zs[i] != zs[i - 1] + 1:
                out.append(((x1, y, first), (x2, y, zs[i - 1]), block))
                if i < len(zs):
                    first = zs[i]
    return sorted(out)


def fill_line(lo: Cell, hi: Cell, block: str) -> str:
    return f"/fill {lo[0]} {lo[1]} {lo[2]} {hi[0]} {hi[1]} {hi[2]} {block}"


def solve_letters(problem: Problem) -> dict[str, str]:
    """The oracle's commands: the glyph cells in order, the first half builder 1's; a cell's block is its
    builder's first block when x + y is even, else its second (touching cells differ in parity, and the
    builders' palettes differ, so no two touching blocks are alike)."""
    cells = problem["cells"]
    half = math.ceil(len(cells) / 2)
    out = {}
    for i, role in enumerate(ROLES):
        mine = cells[:half] if i == 0 else cells[half:]
        palette = problem["palettes"][i]
        out[role] = "\n".join(f"/setblock {x} {y} {z} {palette[(x + y) % 2]}" for x, y, z in mine)
    return out


def solve_house(problem: Problem) -> dict[str, str]:
    """The oracle's commands: each block's cells in (y, z, x) order, the first half builder 1's, each
    builder's cells covered by :func:`boxes`; builder 1 writes ``/kill`` when spiders are around."""
    target = house_target(problem)
    mine: list[dict[Cell, str]] = [{}, {}]
    for block in dict(problem["resources"]):
        cells = sorted((c for c, b in target.items() if b == block), key=lambda c: (c[1], c[2], c[0]))
        half = math.ceil(len(cells) / 2)
        for j, cell in enumerate(cells):
            mine[0 if j < half else 1][cell] = block
    out = {}
    for i, role in enumerate(ROLES):
        lines = ["/kill"] if i == 0 and problem["spiders"] else []
        lines += [fill_line(lo, hi, block) for lo, hi, block in boxes(mine[i])]
        out[role] = "\n".join(lines)
    return out
