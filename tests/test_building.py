"""The building families (letters, houses): splits and seeding, the oracle and random commands on 200 eval
instances, the parser through the env, every feedback mode, rendering, the sequential protocol and
argument checks. PettingZoo's official checks on both ids run in test_env_contract.py and
test_token_mode.py (parametrized over the registry)."""

from __future__ import annotations

import random

import pytest

import llm_envs
from llm_envs.procgen import EVAL_SIZE, in_eval_class, instance_key
from llm_envs.tasks.building import FEEDBACK_MODES
from llm_envs.tasks.building_world import (
    FONT,
    GLYPH,
    ROLES,
    boxes,
    generate_house,
    generate_letters,
    glyph_cells,
    house_target,
)

IDS = ["building/letters-v0", "building/house-v0"]
NUM_EVAL = 200


def random_commands(problem, rng: random.Random) -> dict[str, str]:
    """Random in-bounds commands with each builder's own blocks: for letters as many /setblock as the budget,
    for houses ten /fill boxes of random blocks."""
    out = {}
    X, Y, Z = problem["bounds"]
    for i, role in enumerate(ROLES):
        if "palettes" in problem:
            lines = [f"/setblock {rng.randrange(X)} {rng.randrange(Y)} 0 {rng.choice(problem['palettes'][i])}"
                     for _ in range(problem["budget"])]
        else:
            blocks = [b for b, _ in problem["resources"]]
            lines = []
            for _ in range(10):
                x, y, z = rng.randrange(X), rng.randrange(Y), rng.randrange(Z)
                lines.append(f"/fill {x} {y} {z} {rng.randrange(x, X)} {y} {rng.randrange(z, Z)} {rng.choice(blocks)}")
        out[role] = "\n".join(lines)
    return out


def test_ids_are_registered_and_listed(capsys):
    from baselines.infra.cli import main

    assert set(IDS) <= set(llm_envs.list_envs())
    assert main(["list"]) == 0
    listed = capsys.readouterr().out
    assert all(env_id in listed for env_id in IDS)


def test_font_has_every_capital_as_5_by_5_glyphs():
    assert sorted(FONT) == [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    assert all(len(g) == GLYPH and all(len(r) == GLYPH and set(r) <= {"#", "."} for r in g) for g in FONT.values())
    assert len(set(FONT.values())) == 26
    # Two letters side by side: 5 columns, 2 empty ones, 5 columns.
    assert {x for x, _, _ in glyph_cells("II")} == {0, 1, 2, 3, 4, 7, 8, 9, 10, 11}


@pytest.mark.parametrize("env_id", IDS)
@pytest.mark.parametrize("difficulty", ["easy", "medium", "hard"])
def test_oracle_gets_the_maximum_and_random_commands_score_low_on_200_eval_instances(env_id, difficulty):
    task = llm_envs.make(env_id, difficulty=difficulty).task
    eval_split = task.problems("eval")
    rng = random.Random(0)
    oracle, randoms = [], []
    for i in range(NUM_EVAL):
        problem = eval_split[i]
        oracle.append(task.reward(problem, task.solve(problem))[0])
        randoms.append(task.reward(problem, random_commands(problem, rng))[0])
    assert oracle == [task.max_reward] * NUM_EVAL
    assert max(randoms) < 0.8 * task.max_reward and sum(randoms) / NUM_EVAL < 0.5 * task.max_reward


@pytest.mark.parametrize("env_id", IDS)
def test_splits_are_disjoint_by_instance_and_seeds_repeat(env_id):
    task = llm_envs.make(env_id).task
    eval_split, train = task.problems("eval"), task.problems("train")
    assert len(eval_split) == EVAL_SIZE
    eval_keys = {instance_key(eval_split[i], task.key_fields) for i in range(NUM_EVAL)}
    assert len(eval_keys) == NUM_EVAL and all(in_eval_class(k) for k in eval_keys)
    train_keys = {instance_key(train[i], task.key_fields) for i in range(2000)}
    assert not train_keys & eval_keys and not any(in_eval_class(k) for k in train_keys)
    # The generator is a pure function of the seed (no cache involved) and seeds differ.
    params = task.params()
    assert task.generator(123, *params) == task.generator(123, *params)
    assert len({repr(instance_key(task.generator(s, *params), task.key_fields)) for s in range(50)}) > 40


@pytest.mark.parametrize("env_id", IDS)
def test_same_seed_same_instance_through_the_env(env_id):
    a, b = llm_envs.make(env_id), llm_envs.make(env_id)
    a.reset(seed=7)
    b.reset(seed=7)
    assert a.problem == b.problem and a.text("builder_1") == b.text("builder_1")
    b.reset(seed=8)
    assert a.problem != b.problem


def test_generators_at_fixed_seeds():
    p = generate_letters(5, length=4)
    assert len(p["text"]) == 4 and p["bounds"] == (26, 5, 1)
    assert len(set(p["palettes"][0] + p["palettes"][1])) == 4
    h = generate_house(3, width=(5, 5), depth=(6, 6), height=5, windows=(2, 2), spider_chance=1.0)
    assert h["bounds"] == (5, 5, 6) and h["spiders"]
    assert sum(row.count("G") for row in h["layers"][3]) == 2
    assert h["layers"][1][0].count(".") == 1 and h["layers"][2][0].count(".") == 1  # the door, 2 high
    target = house_target(h)
    assert len(target) == 5 * 5 * 6
    counts = {b: sum(v == b for v in target.values()) for b, _ in h["resources"]}
    assert all(n == -(-counts[b] * 6 // 10) for b, n in h["resources"])  # ceil(0.6 x count)


def test_boxes_cover_exactly_the_cells():
    rng = random.Random(1)
    cells = {(rng.randrange(6), rng.randrange(3), rng.randrange(6)): rng.choice("ab") for _ in range(60)}
    covered = {}
    for lo, hi, block in boxes(cells):
        for x in range(lo[0], hi[0] + 1):
            for y in range(lo[1], hi[1] + 1):
                for z in range(lo[2], hi[2] + 1):
                    assert (x, y, z) not in covered
                    covered[(x, y, z)] = block
    assert covered == cells


def test_letters_env_step_counts_bad_lines_and_renders_the_world():
    env = llm_envs.make("building/letters-v0", difficulty="easy", render_mode="ansi", max_new_tokens=1024)
    env.reset(options={"split": "eval", "task_index": 0})
    problem = env.problem
    mine = env.task.solve(problem)
    (x, y, z), block = problem["cells"][0], problem["palettes"][0][0]
    text = mine["builder_1"] + f"\nI am done.\n/setblock {x} 9 0 {block}\n/setblock {x} {y} {z}"
    _, rewards, _, _, infos = env.step({"builder_1": text, "builder_2": mine["builder_2"]})
    assert rewards["builder_1"] == 2.0 and infos["builder_2"]["reward_coverage"] == 2.0
    build = env.task.build(problem, {"builder_1": text, "builder_2": mine["builder_2"]})
    assert (build.logs[0].ignored, build.logs[0].out_of_bounds) == (2, 1)
    board = env.render()
    assert "world after both builders' commands" in board and "1 out of bounds" in board
    assert "2 ignored lines" in board and "+" not in board.split("world after")[1].split("legend")[0]


@pytest.mark.parametrize("mode", FEEDBACK_MODES)
def test_letters_feedback_modes(mode):
    env = llm_envs.make("building/letters-v0", difficulty="easy", num_turns=2, feedback=mode)
    env.reset(options={"split": "eval", "task_index": 1})
    problem = env.problem
    (x, y, z), extra = problem["cells"][0], (GLYPH, 0, 0)  # the first gap column is always empty
    block = problem["palettes"][0][0]
    env.step({"builder_1": f"/setblock {x} {y} {z} {block}\n/setblock {extra[0]} 0 0 {block}", "builder_2": ""})
    prompt = env.text("builder_1")
    assert "Your previous commands:" in prompt and "/setblock" in prompt.split("Your previous commands:")[1]
    has = {
        "score": "Team score:" in prompt,
        "wrong": f"({extra[0]}, 0, 0): {block}, expected empty" in prompt,
        "targets": "Target cells (each must hold a block): (" in prompt,
        "log": "Your commands: 2 applied" in prompt,
    }
    expected = {
        "full": {"score", "wrong", "targets", "log"}, "wrong": {"score", "wrong", "log"},
        "targets": {"score", "targets", "log"}, "score": {"score", "log"}, "plain": set(),
    }[mode]
    assert {k for k, v in has.items() if v} == expected
    if mode != "plain":
        assert "none of builder 2's blocks" in prompt or mode in ("targets", "score")


@pytest.mark.parametrize("mode", FEEDBACK_MODES)
def test_house_feedback_modes(mode):
    env = llm_envs.make("building/house-v0", num_turns=2, feedback=mode)
    env.reset(options={"split": "eval", "task_index": 2})
    problem = env.problem
    floor = dict(problem["inventory"])["F"]
    env.step({"builder_1": f"/fill 0 0 0 0 0 0 {floor}\n/fill 0 0 0 99 0 0 {floor}", "builder_2": "/kill"})
    prompt = env.text("builder_1")
    has = {
        "score": "Team score:" in prompt,
        "wrong": "expected " in prompt and "Wrong cells (" in prompt,
        "rects": "Rectangles to fix:\n/fill" in prompt,
        "targets": "Target positions:\nlayer y = 0:" in prompt,
        "resources": f"Your remaining resources: {floor} {dict(problem['resources'])[floor] - 1}" in prompt,
        "log": "Your commands: 1 applied, 1 out of bounds." in prompt,
    }
    expected = {
        "full": {"score", "wrong", "rects", "targets", "resources", "log"},
        "wrong": {"score", "wrong", "rects", "log"}, "targets": {"score", "targets", "log"},
        "score": {"score", "log"}, "plain": set(),
    }[mode]
    assert {k for k, v in has.items() if v} == expected


def test_house_spiders_resources_and_render():
    env = llm_envs.make("building/house-v0", difficulty="hard", render_mode="ansi", max_new_tokens=2048)
    eval_split = env.task.problems("eval")
    index = next(i for i in range(100) if eval_split[i]["spiders"])
    env.reset(options={"split": "eval", "task_index": index})
    problem = env.problem
    solution = env.task.solve(problem)
    assert solution["builder_1"].startswith("/kill")
    no_kill = {"builder_1": solution["builder_1"].replace("/kill\n", ""), "builder_2": solution["builder_2"]}
    total, components = env.task.reward(problem, no_kill)
    assert total == pytest.approx(0.8) and components == {"match": 1.0, "spiders": -0.2}
    # One builder alone cannot build the house: its share of each block is about 60 %.
    both = "\n".join(solution.values()).replace("/kill\n", "")
    total, components = env.task.reward(problem, {"builder_1": both, "builder_2": "/kill"})
    assert components["match"] < 1.0
    assert env.task.build(problem, {"builder_1": both, "builder_2": ""}).logs[0].no_resources > 0
    _, rewards, *_ = env.step(solution)
    assert rewards["builder_2"] == 1.0
    board = env.render()
    assert "layer y = 0: built | wrong | target" in board and "spiders: killed" in board


def test_sequential_builder_2_sees_builder_1s_commands():
    env = llm_envs.make("building/letters-v0", protocol="sequential")
    env.reset(seed=0)
    env.step("/setblock 0 0 0 red_wool")
    assert "Builder 1 wrote these commands" in env.text("builder_2") and "/setblock 0 0 0 red_wool" in env.text(
        "builder_2")


@pytest.mark.parametrize(
    "env_id, kwargs, message",
    [
        ("building/letters-v0", {"difficulty": "extreme"}, "difficulty must be one of"),
        ("building/letters-v0", {"length": 9}, r"length must be an int in \[1, 8\], got 9"),
        ("building/letters-v0", {"feedback": "verbose"}, "feedback must be one of"),
        ("building/house-v0", {"width": 2}, r"width must be an int in \[3, 10\], got 2"),
        ("building/house-v0", {"height": 7}, r"height must be an int in \[3, 6\], got 7"),
    ],
)
def test_bad_arguments_fail_at_make(env_id, kwargs, message):
    with pytest.raises(ValueError, match=message):
        llm_envs.make(env_id, **kwargs)


def test_explicit_sizes_override_the_level():
    env = llm_envs.make("building/house-v0", difficulty="easy", width=7, depth=3, height=6)
    env.reset(seed=0)
    assert env.problem["bounds"] == (7, 6, 3)
    env = llm_envs.make("building/letters-v0", length=1)
    env.reset(seed=0)
    assert len(env.problem["text"]) == 1 and env.problem["bounds"] == (5, 5, 1)
