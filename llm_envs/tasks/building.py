"""Block-building teams, generated: two builders write block commands for a pure-Python voxel world.

=====================  ==========================================================================
Ids                    ``building/letters-v0`` (a short string in 5 x 5 letter glyphs, StrBuild),
                       ``building/house-v0`` (a house of layers over an inventory, HouseBuild);
                       both at difficulty ``medium``
Protocol               parallel by default (both builders write at once; builder_1's commands
                       apply first); ``protocol="sequential"``: builder_2 also sees builder_1's
                       commands of the same turn
Agents                 ``builder_1``, ``builder_2``: each writes commands, one per line
Observation / action   token ids (see :mod:`llm_envs.core.base`); max_new_tokens 384 (letters) /
                       512 (house), max_prompt_tokens 3072
Reward                 :mod:`llm_envs.rewards.building` (letters max 2.0, house max 1.0), the same
                       joint value to both agents; components in infos as ``reward_<name>``
Episode                one turn by default; with ``num_turns >= 2`` each builder sees its previous
                       commands and feedback, and the next turn builds again from an empty world
=====================  ==========================================================================

Letters (``building/letters-v0``): the string is drawn with our 5 x 5 font
(:data:`~llm_envs.tasks.building_world.FONT`, A-Z), 2 empty columns between letters, on the plane
``z = 0``: ``x`` counts columns from the left, ``y`` rows from the bottom (``y = 4`` is the glyphs' top row).
World bounds: ``0 <= x < width``, ``0 <= y < 5``, ``z = 0``. Each builder has its own palette of two
blocks and writes ``/setblock x y z block`` lines with them; each may issue ``ceil(0.75 x glyph cells)``
commands (the budget, 1.5 x the cells, split in two).

=========  =========  ==============================
level      letters    example
=========  =========  ==============================
easy       2          ``HI`` (12 columns)
medium     3          ``CAT`` (19 columns)
hard       5          ``QUERY`` (33 columns)
=========  =========  ==============================

Houses (``building/house-v0``): a rectangular house of ``height`` layers over a ``width`` x ``depth``
footprint: a floor layer, wall layers (a perimeter of wall blocks with a door of air in the front row
``z = 0`` and glass windows), a roof layer. The inventory maps characters to blocks (``.`` is air).
Builders write ``/fill x1 y1 z1 x2 y2 z2 block`` (``air`` allowed) and ``/kill``; each may fill at most
``ceil(0.6 x n)`` cells of a block the house needs ``n`` of (its share, with a margin), and issue at most
64 commands. Some instances have spiders: unless a builder issues ``/kill`` they attack (-0.2).

=========  ==================  ========  =======  ======================
level      footprint (w x d)   height    windows  spiders (probability)
=========  ==================  ========  =======  ======================
easy       3-5 x 3-5           3         0-1      0
medium     4-6 x 4-6           4         1-2      0.3
hard       5-8 x 5-8           5         2-4      0.5
=========  ==================  ========  =======  ======================

Feedback (``num_turns >= 2``, task argument ``feedback``): ``"full"`` (default) is all of the following;
``"wrong"``: the wrong cells with the expected block (at most 20; for houses 20 cells and "rectangles
to fix"); ``"targets"``: every target position; ``"score"``: the team's previous score; ``"plain"``:
nothing but the previous commands (self-revision). Every mode but plain also says what became of the
builder's lines (applied, ignored, rejected and why) and, for houses in ``full``, its remaining resources.

Instances: :mod:`llm_envs.tasks.building_world`. Splits, seeding: as every generated family
(:mod:`llm_envs.procgen`): 1000 fixed eval instances, an unbounded train split that never contains them,
separated by instance content.
:meth:`BuildingTask.solve` is the oracle (both builders' commands: the maximum on every instance).

Task arguments: ``difficulty``; letters ``length`` (1-8 letters); house ``width``, ``depth`` (3-10),
``height`` (3-6); ``feedback``.

Version history: v0 (initial).

>>> import llm_envs
>>> env = llm_envs.make("building/letters-v0", max_new_tokens=1024)
>>> _ = env.reset(options={"split": "eval", "task_index": 0})
>>> _, rewards, *_ = env.step(env.task.solve(env.problem))
>>> rewards["builder_1"]
2.0
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from llm_envs.core.registry import register
from llm_envs.core.task import Context, Problem, Prompt, Response, Task
from llm_envs.procgen import GeneratedSplit, check_int, generate_cached, resolve_level
from llm_envs.rewards.building import (
    AIR,
    HOUSE_COMPONENTS,
    HOUSE_MAX_REWARD,
    LETTERS_COMPONENTS,
    LETTERS_MAX_REWARD,
    AgentLimits,
    Build,
    Cell,
    house_components,
    letters_components,
    simulate,
)
from llm_envs.tasks.building_world import (
    AIR_CHAR,
    GLYPH,
    HEIGHT_RANGE,
    HOUSE_LEVELS,
    LENGTH_RANGE,
    LETTERS_LEVELS,
    ROLES,
    SIDE_RANGE,
    SPIDER_CHANCE,
    boxes,
    fill_line,
    generate_house,
    generate_letters,
    house_target,
    solve_house,
    solve_letters,
)

HOUSE_MAX_COMMANDS = 64
MAX_WRONG_SHOWN = 20
MAX_RECTS_SHOWN = 10
FEEDBACK_MODES = ("full", "wrong", "targets", "score", "plain")

LETTERS_TASK = """Two builders build the text "{text}" with blocks in a block world, on the plane z = 0. The target \
is drawn below: # is a cell that must hold a block, . a cell that must stay empty. x counts columns from the \
left (0 to {last_x}), y counts rows from the bottom (0 to 4); z is always 0.

{drawing}

Rules: fill every # cell and nothing else; two blocks that touch must be different blocks. Each builder uses \
only its own two blocks, and each builder's blocks should appear in the build.
Builder 1's blocks: {palette_1}. Builder 2's blocks: {palette_2}. Builder 1's commands run first, then \
builder 2's; a later block replaces an earlier one."""

LETTERS_ANSWER = """You are builder {number}. Write your commands, one per line, in the form
/setblock x y z block
using only your blocks ({palette}). You may write at most {budget} commands; your teammate writes its own. \
Output ONLY the commands."""

HOUSE_TASK = """Two builders build a house in a block world. The house is given layer by layer from the bottom \
(y = 0) to the top (y = {last_y}); in each layer the rows are z = 0 (the front) to z = {last_z} and the \
columns x = 0 to {last_x}. Every cell of the box must get exactly its block; . is air (leave it empty).
Blocks: {legend}.

{layers}

Commands: /fill x1 y1 z1 x2 y2 z2 block fills every cell of the box between the two corners (both included) \
with the block (air empties cells); /kill removes hostile mobs. Builder 1's commands run first, then \
builder 2's; a later block replaces an earlier one.{spiders}"""

SPIDERS_TEXT = " Spiders are around: unless one of you writes /kill, they attack."

HOUSE_ANSWER = """You are builder {number}. You may fill at most these numbers of cells (air is free): {resources}. \
A fill larger than what you have left is refused. Your teammate has its own share. At most {budget} commands.
Write your commands, one per line. Output ONLY the commands."""

PREVIOUS_COMMANDS = "\n\nYour previous commands:\n"
FEEDBACK_HEADER = "\n\nFeedback on that attempt:\n"
REVISE = "\nWrite all your commands again, fixed (the world starts empty again). Output ONLY the commands."
SEQUENTIAL_TEAMMATE = "\n\nBuilder 1 wrote these commands (they run before yours):\n"


# ------------------------------------------------------------------------------------------ text
def labeled_plane(rows: Sequence[str], top_y: int) -> str:
    """Rows of characters (top row first) with x labels under them and y labels on the left.

    >>> print(labeled_plane(["#.", ".#"], 1))
    y 1  # .
    y 0  . #
    x    0 1
    """
    width = max(len(str(len(rows[0]) - 1)), 1)
    lines = [f"y {top_y - r}  " + " ".join(ch.rjust(width) for ch in row) for r, row in enumerate(rows)]
    lines.append("x    " + " ".join(str(x).rjust(width) for x in range(len(rows[0]))))
    return "\n".join(lines)


def house_layers_text(layers: Sequence[Sequence[str]]) -> str:
    parts = []
    for y, layer in enumerate(layers):
        rows = [f"  z {z}  {' '.join(row)}" for z, row in enumerate(layer)]
        parts.append(f"layer y = {y}:\n" + "\n".join(rows))
    width = len(layers[0][0])
    parts.append("  x    " + " ".join(str(x % 10) for x in range(width)))
    return "\n".join(parts)


def _team_score(total: float, max_reward: float, components: Mapping[str, float]) -> str:
    parts = ", ".join(f"{k} {v:.2f}" for k, v in components.items())
    return f"Team score: {total:.2f} of {max_reward:.2f} ({parts})."


def _listed(lines: list[str], limit: int) -> str:
    """The first ``limit`` lines, then how many more there are."""
    more = f"\n... and {len(lines) - limit} more" if len(lines) > limit else ""
    return "\n".join(lines[:limit]) + more


def _cell(cell: Cell) -> str:
    return f"({cell[0]}, {cell[1]}, {cell[2]})"


def _log_line(build: Build, index: int) -> str:
    log = build.logs[index]
    parts = [f"{log.applied} applied"]
    for name, count in (("ignored lines (not a command)", log.ignored), ("out of bounds", log.out_of_bounds),
                        ("not your block", log.not_allowed), ("beyond your resources", log.no_resources),
                        ("over your command budget", log.over_budget)):
        if count:
            parts.append(f"{count} {name}")
    return "Your commands: " + ", ".join(parts) + "."


# ------------------------------------------------------------------------------------------ tasks
class BuildingTask(Task):
    """Shared by the two building families (see the module docstring): prompts with the previous
    commands and feedback, the simulation cached per (problem, outputs), the oracle."""

    roles: ClassVar[tuple[str, ...]] = ROLES
    default_max_prompt_tokens: ClassVar[int] = 3072
    family: ClassVar[str] = ""
    generator: ClassVar[Any]
    key_fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, feedback: str = "full") -> None:
        if feedback not in FEEDBACK_MODES:
            raise ValueError(f"feedback must be one of {FEEDBACK_MODES}, got {feedback!r}.")
        self.feedback_mode = feedback

    # -- subclass interface
    def params(self) -> tuple[Any, ...]:
        raise NotImplementedError

    def task_text(self, problem: Problem) -> str:
        raise NotImplementedError

    def answer_text(self, problem: Problem, index: int) -> str:
        raise NotImplementedError

    def build(self, problem: Problem, outputs: Mapping[str, str]) -> Build:
        """The world after both builders' commands."""
        raise NotImplementedError

    def solve(self, problem: Problem) -> dict[str, str]:
        """The oracle's commands per builder (the maximum reward)."""
        raise NotImplementedError

    # -- the Task interface
    def generate(self, seed: int) -> Problem:
        return generate_cached(type(self).generator, self.params(), seed)

    def problems(self, split: str) -> Sequence[Problem]:
        return GeneratedSplit(type(self).generator, self.params(), self.key_fields, self.check_split(split))

    def prompt(self, role: str, problem: Problem, context: Context) -> Prompt:
        if role not in self.roles:
            raise KeyError(f"Unknown role {role!r}; this task's roles are {self.roles}.")
        index = self.roles.index(role)
        parts: list[str | Response] = [self.task_text(problem) + "\n\n" + self.answer_text(problem, index)]
        if "builder_1" in context.visible and role == "builder_2":
            parts += [SEQUENTIAL_TEAMMATE, context.visible["builder_1"]]
        previous = context.previous(role)
        if previous is not None:
            feedback = context.feedback(role) or ""
            parts += [PREVIOUS_COMMANDS, previous, (FEEDBACK_HEADER + feedback) if feedback else "", REVISE]
        return parts

    def _check_outputs(self, outputs: Mapping[str, str]) -> None:
        missing = [r for r in self.roles if not isinstance(outputs.get(r), str)]
        if missing:
            raise ValueError(f"outputs need a string for each role {self.roles}; missing {missing}.")


class LettersTask(BuildingTask):
    """StrBuild: two builders write a short string in 5 x 5 letter glyphs (see the module docstring).

    Args:
        difficulty: ``"easy"`` (2 letters), ``"medium"`` (3) or ``"hard"`` (5).
        length: letters, 1-8, overriding the level's.
        feedback: one of :data:`FEEDBACK_MODES`.
    """

    reward_components: ClassVar[tuple[str, ...]] = LETTERS_COMPONENTS
    max_reward: ClassVar[float] = LETTERS_MAX_REWARD
    default_max_new_tokens: ClassVar[int] = 384
    family = "letters"
    generator = staticmethod(generate_letters)
    key_fields: ClassVar[tuple[str, ...]] = ("text", "palettes")
    description: ClassVar[str] = (
        "Two builders place /setblock commands to write a 3-letter string in 5x5 glyphs (StrBuild; generated, "
        "seeded, pure-Python world)."
    )

    def __init__(self, difficulty: str = "medium", length: int | None = None, feedback: str = "full") -> None:
        super().__init__(feedback)
        params = resolve_level(difficulty, LETTERS_LEVELS, {"length": length})
        self.difficulty = difficulty
        self.length = check_int("length", params["length"], *LENGTH_RANGE)

    def params(self) -> tuple[Any, ...]:
        return (self.length,)

    def drawing(self, problem: Problem) -> list[str]:
        """The target as rows of ``#`` and ``.``, top row (y = 4) first."""
        width = problem["bounds"][0]
        cells = set(problem["cells"])
        return ["".join("#" if (x, y, 0) in cells else "." for x in range(width)) for y in range(GLYPH - 1, -1, -1)]

    def task_text(self, problem: Problem) -> str:
        p1, p2 = problem["palettes"]
        return LETTERS_TASK.format(text=problem["text"], last_x=problem["bounds"][0] - 1,
                                   drawing=labeled_plane(self.drawing(problem), GLYPH - 1),
                                   palette_1=", ".join(p1), palette_2=", ".join(p2))

    def answer_text(self, problem: Problem, index: int) -> str:
        return LETTERS_ANSWER.format(number=index + 1, palette=", ".join(problem["palettes"][index]),
                                     budget=problem["budget"])

    def limits(self, problem: Problem) -> list[AgentLimits]:
        return [AgentLimits(frozenset(p), problem["budget"]) for p in problem["palettes"]]

    def build(self, problem: Problem, outputs: Mapping[str, str]) -> Build:
        self._check_outputs(outputs)
        return simulate([outputs[r] for r in self.roles], self.limits(problem), problem["bounds"], ("setblock",))

    def reward(self, problem: Problem, outputs: Mapping[str, str]) -> tuple[float, dict[str, float]]:
        build = self.build(problem, outputs)
        components = letters_components(build.world, problem["cells"], problem["palettes"])
        return sum(components.values()), components

    def solve(self, problem: Problem) -> dict[str, str]:
        return solve_letters(problem)

    def wrong(self, problem: Problem, build: Build) -> list[str]:
        """What is wrong with the build in words: missing palettes, extra blocks, touching blocks alike,
        then empty glyph cells."""
        targets = set(problem["cells"])
        world = build.world
        used = set(world.values())
        out = [f"none of builder {i + 1}'s blocks ({', '.join(palette)}) is in the build"
               for i, palette in enumerate(problem["palettes"]) if not used.intersection(palette)]
        out += [f"{_cell(c)}: {world[c]}, expected empty" for c in sorted(world) if c not in targets]
        for (x, y, z), block in sorted(world.items()):
            for other in ((x + 1, y, z), (x, y + 1, z)):
                if world.get(other) == block:
                    out.append(f"{_cell((x, y, z))} and {_cell(other)}: both {block}, expected different blocks")
        out += [f"{_cell(c)}: empty, expected a block" for c in sorted(targets) if c not in world]
        return out

    def feedback(
        self, problem: Problem, outputs: Mapping[str, str], total: float, components: Mapping[str, float]
    ) -> dict[str, str]:
        build = self.build(problem, outputs)
        mode = self.feedback_mode
        if mode == "plain":
            return dict.fromkeys(self.roles, "")
        score = _team_score(total, self.max_reward, components)
        common = []
        if mode in ("full", "wrong"):
            wrong = self.wrong(problem, build)
            common.append("Wrong cells: " + ("none" if not wrong else "\n" + _listed(wrong, MAX_WRONG_SHOWN)))
        if mode in ("full", "targets"):
            common.append("Target cells (each must hold a block): " + " ".join(_cell(c) for c in problem["cells"]))
        return {role: "\n".join([_log_line(build, i), *common, score]) for i, role in enumerate(self.roles)}

    def render_world(self, problem: Problem, build: Build) -> str:
        """The plane z = 0: a glyph cell's block as its palette letter (A, B builder 1's, C, D builder 2's),
        a block outside the glyphs in lower case, ``+`` a glyph cell left empty, ``.`` empty."""
        symbols = {b: "ABCD"[2 * i + j] for i, p in enumerate(problem["palettes"]) for j, b in enumerate(p)}
        targets = set(problem["cells"])
        rows = []
        for y in range(GLYPH - 1, -1, -1):
            row = []
            for x in range(problem["bounds"][0]):
                block = build.world.get((x, y, 0))
                if block is None:
                    row.append("+" if (x, y, 0) in targets else ".")
                else:
                    symbol = symbols.get(block, "?")
                    row.append(symbol if (x, y, 0) in targets else symbol.lower())
            rows.append("".join(row))
        legend = ", ".join(f"{s} {b}" for b, s in symbols.items())
        return labeled_plane(rows, GLYPH - 1) + f"\nlegend: {legend}; lower case: outside the glyphs; + missing"

    def render_turn(self, problem: Problem, outputs: Mapping[str, str]) -> str | None:
        build = self.build(problem, outputs)
        logs = "\n".join(f"{role}: " + _log_line(build, i)[len("Your commands: "):]
                         for i, role in enumerate(self.roles))
        return f"world after both builders' commands:\n{self.render_world(problem, build)}\n{logs}"


class HouseTask(BuildingTask):
    """HouseBuild: two builders fill a house's layers within their shares of the blocks (see the module
    docstring).

    Args:
        difficulty: ``"easy"``, ``"medium"`` or ``"hard"``.
        width, depth: footprint (3-10), overriding the level's range with one value.
        height: layers (3-6), overriding the level's.
        feedback: one of :data:`FEEDBACK_MODES`.
    """

    reward_components: ClassVar[tuple[str, ...]] = HOUSE_COMPONENTS
    max_reward: ClassVar[float] = HOUSE_MAX_REWARD
    default_max_new_tokens: ClassVar[int] = 512
    family = "house"
    generator = staticmethod(generate_house)
    key_fields: ClassVar[tuple[str, ...]] = ("layers", "inventory", "spiders")
    description: ClassVar[str] = (
        "Two builders fill a generated house (floor, walls, door, windows, roof) with /fill commands within "
        "their shares of each block, and /kill spiders (HouseBuild; pure-Python world)."
    )

    def __init__(self, difficulty: str = "medium", width: int | None = None, depth: int | None = None,
                 height: int | None = None, feedback: str = "full") -> None:
        super().__init__(feedback)
        overrides = {k: (v, v) if isinstance(v, int) and not isinstance(v, bool) else v
                     for k, v in (("width", width), ("depth", depth))}
        params = resolve_level(difficulty, HOUSE_LEVELS, {**overrides, "height": height})
        for name in ("width", "depth"):
            for value in params[name]:
                check_int(name, value, *SIDE_RANGE)
        self.difficulty = difficulty
        self.width, self.depth = tuple(params["width"]), tuple(params["depth"])
        self.height = check_int("height", params["height"], *HEIGHT_RANGE)
        self.windows = tuple(params["windows"])
        self.spider_chance = SPIDER_CHANCE[difficulty]

    def params(self) -> tuple[Any, ...]:
        return (self.width, self.depth, self.height, self.windows, self.spider_chance)

    def task_text(self, problem: Problem) -> str:
        w, h, d = problem["bounds"]
        legend = ", ".join(f"{ch} = {block}" for ch, block in problem["inventory"]) + ", . = air"
        return HOUSE_TASK.format(last_y=h - 1, last_z=d - 1, last_x=w - 1, legend=legend,
                                 layers=house_layers_text(problem["layers"]),
                                 spiders=SPIDERS_TEXT if problem["spiders"] else "")

    def answer_text(self, problem: Problem, index: int) -> str:
        resources = ", ".join(f"{block} {n}" for block, n in problem["resources"])
        return HOUSE_ANSWER.format(number=index + 1, resources=resources, budget=HOUSE_MAX_COMMANDS)

    def limits(self, problem: Problem) -> list[AgentLimits]:
        resources = dict(problem["resources"])
        return [AgentLimits(frozenset(resources), HOUSE_MAX_COMMANDS, resources) for _ in self.roles]

    def build(self, problem: Problem, outputs: Mapping[str, str]) -> Build:
        self._check_outputs(outputs)
        return simulate([outputs[r] for r in self.roles], self.limits(problem), problem["bounds"], ("fill", "kill"))

    def reward(self, problem: Problem, outputs: Mapping[str, str]) -> tuple[float, dict[str, float]]:
        build = self.build(problem, outputs)
        components = house_components(build.world, house_target(problem), spiders=problem["spiders"],
                                      killed=build.killed)
        return sum(components.values()), components

    def solve(self, problem: Problem) -> dict[str, str]:
        return solve_house(problem)

    def wrong_cells(self, problem: Problem, build: Build) -> dict[Cell, str]:
        """Cells whose block differs from the target's, with the expected block."""
        return {c: b for c, b in sorted(house_target(problem).items()) if build.world.get(c, AIR) != b}

    def feedback(
        self, problem: Problem, outputs: Mapping[str, str], total: float, components: Mapping[str, float]
    ) -> dict[str, str]:
        build = self.build(problem, outputs)
        mode = self.feedback_mode
        if mode == "plain":
            return dict.fromkeys(self.roles, "")
        score = _team_score(total, self.max_reward, components)
        common = []
        if mode in ("full", "wrong"):
            wrong = self.wrong_cells(problem, build)
            lines = [f"{_cell(c)}: {build.world.get(c, AIR)}, expected {b}" for c, b in wrong.items()]
            common.append(f"Wrong cells ({len(lines)}): " + ("none" if not lines else
                                                          "\n" + _listed(lines, MAX_WRONG_SHOWN)))
            rects = boxes(wrong)
            if rects:
                fills = [fill_line(lo, hi, b) for lo, hi, b in rects]
                common.append("Rectangles to fix:\n" + _listed(fills, MAX_RECTS_SHOWN))
        if mode in ("full", "targets"):
            common.append("Target positions:\n" + house_layers_text(problem["layers"]))
        if problem["spiders"] and mode != "targets":
            common.append("The spiders were " + ("killed." if build.killed else "not killed: they attacked."))
        out = {}
        for i, role in enumerate(self.roles):
            lines = [_log_line(build, i), *common]
            if mode == "full":
                used = build.logs[i].used
                left = ", ".join(f"{block} {n - used.get(block, 0)}" for block, n in problem["resources"])
                lines.append(f"Your remaining resources: {left}.")
            out[role] = "\n".join([*lines, score])
        return out

    def render_world(self, problem: Problem, build: Build) -> str:
        """Each layer as built, with the inventory's characters (``?`` a block not in it, ``.`` air),
        beside the target layer; wrong cells marked with ``!`` in the middle column."""
        chars = {block: ch for ch, block in problem["inventory"]}
        w, h, d = problem["bounds"]
        out = []
        for y in range(h):
            out.append(f"layer y = {y}: built | wrong | target")
            for z in range(d):
                built = "".join(chars.get(build.world.get((x, y, z), AIR), "?") if (x, y, z) in build.world
                                else AIR_CHAR for x in range(w))
                target = problem["layers"][y][z]
                marks = "".join("!" if b != t else " " for b, t in zip(built, target, strict=True))
                out.append(f"  z {z}  {built} | {marks} | {target}")
        return "\n".join(out)

    def render_turn(self, problem: Problem, outputs: Mapping[str, str]) -> str | None:
        build = self.build(problem, outputs)
        logs = "\n".join(f"{role}: " + _log_line(build, i)[len("Your commands: "):]
                         for i, role in enumerate(self.roles))
        spiders = ""
        if problem["spiders"]:
            spiders = "\nspiders: " + ("killed" if build.killed else "attacked (nobody wrote /kill)")
        return f"world after both builders' commands:\n{self.render_world(problem, build)}\n{logs}{spiders}"


register("building/letters-v0", LettersTask, protocol="parallel", description=LettersTask.description)
register("building/house-v0", HouseTask, protocol="parallel", description=HouseTask.description)
