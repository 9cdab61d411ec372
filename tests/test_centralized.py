"""The centralised wrapper (llm_envs.core.centralized) and ``--centralized``: the parse rules, PettingZoo's
official checks on wrapped envs, the reward against the wrapped env's and hand-checked values, token
mode, vector envs, errors, and MAGRPO / PPO smoke runs on a tiny model (resume and ``eval --checkpoint``)."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import pickle

import numpy as np
import pytest

import llm_envs
from llm_envs.core.centralized import CentralizedEnv, CentralizedTask, parse_sections
from llm_envs.testing import assert_same, check_env

ROLES = ("brief", "detailed")
BRIEF = "A short summary of the post in eight words."
DETAILED = ("A longer elaboration that adds context, details and more vocabulary, while however keeping the "
            "summary's core facts intact.")
# llm_envs.rewards.writing's doctest: tldr_reward(BRIEF, DETAILED) by hand.
DOC_TOTAL = 2.8
DOC_COMPONENTS = {"structure": 0.5, "length": 1.0, "diversity": 0.5, "transition": 0.2, "jaccard": 0.6}


# ------------------------------------------------------------------------------------ parse rules
@pytest.mark.parametrize(
    ("text", "expected", "found"),
    [
        pytest.param("<brief>b</brief><detailed>d</detailed>", ("b", "d"), 2, id="well-formed"),
        pytest.param("<detailed>d</detailed>\n<brief>b</brief>", ("b", "d"), 2, id="out-of-order"),
        pytest.param("<brief>b</brief>", ("b", ""), 1, id="missing-section"),
        pytest.param("b and d, no tags", ("", ""), 0, id="no-section"),
        pytest.param("", ("", ""), 0, id="empty-response"),
        pytest.param("<brief>first</brief><brief>second</brief><detailed>d</detailed>", ("first", "d"), 2,
                     id="repeated-tag-first-wins"),
        pytest.param("<brief>b</brief><detailed>cut at max_new_tokens", ("b", "cut at max_new_tokens"), 2,
                     id="unclosed-last-runs-to-end"),
        pytest.param("<brief>b <detailed>d</detailed>", ("b", "d"), 2, id="unclosed-runs-to-next-tag"),
        pytest.param("<brief>b</detailed> after</brief>", ("b", ""), 1, id="ends-at-another-roles-closing-tag"),
        pytest.param("<brief>x<detailed>y</detailed></brief>", ("x", "y"), 2, id="nested"),
        pytest.param("<brief>\n  b  \n</brief><detailed>\td\n</detailed>", ("b", "d"), 2, id="whitespace-trimmed"),
        pytest.param("Sure! <brief>b</brief> and then <detailed>d</detailed> Done.", ("b", "d"), 2,
                     id="outside-text-ignored"),
        pytest.param("< BRIEF >b</ Brief ><Detailed>d</detailed >", ("b", "d"), 2, id="case-and-spaces-in-tags"),
        pytest.param("</brief>stray<brief>b</brief>", ("b", ""), 1, id="stray-closing-tag"),
        pytest.param("<brief></brief><detailed>d</detailed>", ("", "d"), 2, id="empty-section-counts-as-found"),
        pytest.param("<briefing>x</briefing><brief>b</brief>", ("b", ""), 1, id="other-tags-are-text"),
    ],
)
def test_parse_rules(text, expected, found):
    texts, n = parse_sections(text, ROLES)
    assert texts == dict(zip(ROLES, expected)) and n == found
    assert llm_envs.split_sections(text, ROLES) == texts


# -------------------------------------------------------------------------------- official checks
CHECKED_IDS = ["writing/xsum-v0", "coding/humaneval-v0", "math/gsm8k-v0", "puzzle/sudoku4-v0"]


def tiny_kwargs(env_id: str) -> dict:
    kw = {"max_new_tokens": 4, "centralized": True}
    if env_id.startswith("writing/"):
        kw["max_source_words"] = 30
    if env_id != "math/gsm8k-v0":  # single-turn task
        kw["num_turns"] = 2
    return kw


@pytest.mark.parametrize("env_id", CHECKED_IDS)
def test_the_env_contract(env_id):
    """Every check of llm_envs.testing.check_env (PettingZoo's official checks included) on the centralised env."""
    env = llm_envs.make(env_id, **tiny_kwargs(env_id))
    assert isinstance(env, CentralizedEnv) and env.possible_agents == ["central"]
    report = check_env(env_id, **tiny_kwargs(env_id))
    expected_skips = {"pettingzoo_max_cycles", "truncation"} if env_id == "math/gsm8k-v0" else set()
    assert set(report.skipped) == expected_skips


def test_pettingzoo_checks_in_token_mode_and_flat_through_centralize():
    base = llm_envs.make("writing/xsum-v0", max_source_words=30, max_new_tokens=2, num_turns=2,
                         step_unit="token", obs_format="flat")
    env = llm_envs.centralize(base, max_new_tokens=4)
    assert env.step_unit == "token" and env.obs_format == "flat" and env.num_turns == 2
    # An env object is deep-copied for each of PettingZoo's checks (3 x max_new_tokens cycles in token mode).
    report = check_env(env, checks=["pettingzoo_parallel", "pettingzoo_aec", "pettingzoo_seed", "spaces", "infos",
                                    "determinism"])
    assert sorted(report.passed) == sorted(report.what)


# ------------------------------------------------------------------------------------------ reward
def step_both(env_id: str, team: dict[str, str], central: str, **kw):
    """One turn of the team env and of its centralised env on the same problem."""
    pair = []
    for env, action in ((llm_envs.make(env_id, **kw), team),
                        (llm_envs.make(env_id, centralized=True, **kw), {"central": central})):
        env.reset(seed=0, options={"task_index": 3})
        _, rewards, _, _, infos = env.step(action)
        pair.append((env, rewards, infos))
    return pair


@pytest.mark.parametrize(
    ("central", "team"),
    [
        pytest.param(f"<brief>{BRIEF}</brief><detailed>{DETAILED}</detailed>", (BRIEF, DETAILED), id="well-formed"),
        pytest.param(f"Here: <detailed>{DETAILED}</detailed> <brief> {BRIEF}</brief>", (BRIEF, DETAILED),
                     id="out-of-order"),
        pytest.param(f"<brief>{BRIEF}</brief>", (BRIEF, ""), id="missing-section"),
        pytest.param(f"{BRIEF} {DETAILED}", ("", ""), id="no-section"),
    ],
)
def test_reward_is_the_wrapped_envs_joint_reward(central, team):
    (team_env, team_rewards, team_infos), (env, rewards, infos) = step_both(
        "writing/xsum-v0", dict(zip(ROLES, team)), central, max_new_tokens=64)
    assert rewards["central"] == team_rewards["brief"] == team_rewards["detailed"]
    team_info, info = team_infos["brief"], infos["central"]
    for key, value in team_info.items():
        if key.startswith("reward_"):
            assert info[key] == value, key
    assert info["reward_sections_found"] == sum(bool(t) for t in team) / 2
    assert set(info) == set(team_info) | {"reward_sections_found"}
    assert env.history[-1].outputs["central"].text == central.strip()


def test_reward_by_hand():
    # Writing: the rewards module's hand-worked case, wrapped out of order with chatter around it.
    (_, _, _), (env, rewards, infos) = step_both(
        "writing/xsum-v0", dict(zip(ROLES, (BRIEF, DETAILED))),
        f"Sure.\n<detailed>{DETAILED}</detailed>\n<brief>{BRIEF}</brief>\nDone.", max_new_tokens=64)
    assert rewards["central"] == pytest.approx(DOC_TOTAL)
    for name, value in DOC_COMPONENTS.items():
        assert infos["central"][f"reward_{name}"] == pytest.approx(value), name
    assert infos["central"]["reward_sections_found"] == 1.0
    # GSM8K (one role): the reference answer inside the section scores 1; outside it, 0.
    env = llm_envs.make("math/gsm8k-v0", centralized=True)
    for text, expected, found in [("<agent>So {r}.</agent>", 1.0, 1.0), ("<agent>So 0.</agent> {r}", 0.0, 1.0),
                                  ("So {r}.", 0.0, 0.0)]:
        env.reset(seed=0)
        _, rewards, _, _, infos = env.step({"central": text.format(r=env.problem["reference"])})
        assert rewards["central"] == expected and infos["central"]["reward_correct"] == expected, text
        assert infos["central"]["reward_sections_found"] == found


def test_individual_rewards_give_way_to_the_joint_one():
    task = CentralizedTask(llm_envs.make("math/gsm8k-v0").task)
    assert task.agent_rewards({}, {"central": ""}, 0.5, {}) == {"central": 0.5}


# ------------------------------------------------------------------------------------ the env itself
def test_prompt_shows_every_role_and_the_format():
    env = llm_envs.make("writing/xsum-v0", centralized=True, max_source_words=30)
    env.reset(seed=0)
    text = env.text("central")
    team = llm_envs.make("writing/xsum-v0", max_source_words=30, chat_template=False)
    team.reset(seed=0)
    for role in ROLES:
        assert f"### Role: {role}\n" in text and team.text(role).strip() in text
    assert "<brief>\n...\n</brief>\n<detailed>\n...\n</detailed>" in text
    assert text.startswith("<|im_start|>")  # the chat template, as for the other envs
    assert text.index("### Role: brief") < text.index("### Role: detailed") < text.index("<brief>\n...")


def test_defaults_and_settings_carried_by_centralize():
    env = llm_envs.make("writing/xsum-v0", centralized=True)
    assert (env.max_new_tokens, env.max_prompt_tokens) == (2 * 256, 2 * 2048 + 256)
    base = llm_envs.make("coding/humaneval-v0", max_new_tokens=32, max_prompt_tokens=900, num_turns=2,
                         render_mode="ansi", stop_token_ids=[7])
    wrapped = llm_envs.centralize(base)
    assert (wrapped.max_new_tokens, wrapped.max_prompt_tokens, wrapped.num_turns) == (64, 2 * 900 + 256, 2)
    assert wrapped.render_mode == "ansi" and 7 in wrapped.stop_token_ids and wrapped.env_id == base.env_id
    assert wrapped.roles == ("helper", "main") and base.possible_agents == ["helper", "main"]
    assert llm_envs.centralize(base, max_new_tokens=10).max_new_tokens == 10
    assert llm_envs.make("writing/xsum-v0", centralized=True, max_new_tokens=40).max_new_tokens == 40


def test_multi_turn_prompt_carries_each_roles_section_and_feedback():
    env = llm_envs.make("writing/xsum-v0", centralized=True, num_turns=2, max_source_words=30, render_mode="ansi")
    env.reset(seed=0)
    _, _, terms, _, _ = env.step({"central": "<brief>Short one.</brief><detailed>A longer one, however."})
    assert not terms["central"]
    text = env.text("central")
    for role, answer in (("brief", "Short one."), ("detailed", "A longer one, however.")):
        block = text[text.index(f"### Role: {role}"):]
        assert f"Your previous answer:\n{answer}" in block
    assert "The brief part had 2 words" in text  # the wrapped task's feedback, per role
    _, _, terms, _, _ = env.step({"central": "no tags"})
    assert terms["central"] and not env.agents
    turns = env.transcript_turns()
    assert turns[0]["responses"] == {"central": "<brief>Short one.</brief><detailed>A longer one, however.",
                                     "brief": "Short one.", "detailed": "A longer one, however."}
    assert turns[1]["responses"] == {"central": "no tags", "brief": "", "detailed": ""}
    assert sorted(turns[0]["feedback"]) == ["brief", "detailed"] and turns[0]["agent_rewards"].keys() == {"central"}
    rendered = env.render()
    assert "--- section [brief] ---\nShort one.\n--- section [detailed] ---\nA longer one, however." in rendered


def test_token_mode_equals_response_mode():
    text = f"<brief>{BRIEF}</brief><detailed>{DETAILED}</detailed>"
    whole = llm_envs.make("writing/xsum-v0", centralized=True, max_new_tokens=64)
    ids = whole.tokenizer(text, add_special_tokens=False)["input_ids"]
    tokens = llm_envs.make("writing/xsum-v0", centralized=True, max_new_tokens=64, step_unit="token")
    whole.reset(seed=1)
    _, expected, _, _, expected_infos = whole.step({"central": np.array(ids)})
    obs, _ = tokens.reset(seed=1)
    assert obs["central"]["action_mask"].all()
    for token in [*ids, tokens.pad_token_id]:
        _, rewards, _, _, infos = tokens.step({"central": token})
    assert not tokens.agents and rewards == expected and rewards["central"] == pytest.approx(DOC_TOTAL)
    assert_same(infos, expected_infos)


def test_make_vec_and_copies():
    venv = llm_envs.make_vec("writing/xsum-v0", 3, centralized=True, max_new_tokens=64)
    assert type(venv).__name__ == "VectorEnv" and venv.possible_agents == ["central"]
    obs, infos = venv.reset(seed=0, options={"task_index": 5})
    assert obs["central"]["observation"].shape == (3, 2 * 2048 + 256)
    texts = [f"<brief>{BRIEF}</brief><detailed>{DETAILED}</detailed>", f"<brief>{BRIEF}</brief>", "none"]
    _, rewards, terms, _, infos = venv.step({"central": texts})
    assert terms["central"].all() and rewards["central"][0] == pytest.approx(DOC_TOTAL)
    assert infos["central"]["reward_sections_found"].tolist() == [1.0, 0.5, 0.0]
    assert rewards["central"][2] == 0.0
    env = venv.envs[0]
    for clone in (copy.deepcopy(env), pickle.loads(pickle.dumps(env))):
        assert clone.transcript() == env.transcript() and clone.roles == ROLES


def test_errors_are_clear():
    with pytest.raises(ValueError, match="centralized=True needs a parallel env.*'sentiment/imdb-cory-v0'"):
        llm_envs.make("sentiment/imdb-cory-v0", centralized=True)
    with pytest.raises(ValueError, match="needs a parallel env"):
        llm_envs.make_vec("writing/xsum-sequential-v0", 2, centralized=True)
    with pytest.raises(ValueError, match="needs a parallel env"):
        llm_envs.make("writing/xsum-v0", protocol="sequential", centralized=True)
    with pytest.raises(ValueError, match="only a parallel env can be centralised"):
        llm_envs.centralize(llm_envs.make("sentiment/imdb-cory-v0"))
    with pytest.raises(ValueError, match="centralised already"):
        llm_envs.centralize(llm_envs.make("writing/xsum-v0", centralized=True))
    with pytest.raises(ValueError, match="centralized must be True or False, got 'yes'"):
        llm_envs.make("writing/xsum-v0", centralized="yes")


def test_tokenizer_mappings():
    from tiny_models import byte_bpe

    from llm_envs.tokenizers import load_tokenizer

    tok = load_tokenizer(None)
    same = llm_envs.make("writing/xsum-v0", centralized=True, tokenizer={"brief": tok, "detailed": tok},
                         stop_token_ids={"brief": [5], "detailed": [6]})
    assert same.tokenizer is tok and {5, 6} <= same.stop_token_ids
    other = byte_bpe(300, ["some words for a tiny vocabulary"] * 4)
    with pytest.raises(ValueError, match="one model and one tokenizer.*role 'detailed'"):
        llm_envs.make("writing/xsum-v0", centralized=True, tokenizer={"brief": tok, "detailed": other})
    mixed = llm_envs.make("writing/xsum-v0", tokenizer={"brief": tok, "detailed": other})
    with pytest.raises(ValueError, match="different tokenizers"):
        llm_envs.centralize(mixed)


# ----------------------------------------------------------------------------------- learners
@pytest.fixture
def varied_central_reward(monkeypatch):
    """A random tiny model writes no tags, so every split is empty and every reward equal, and a batch of
    equal rewards teaches nothing: add a small bonus per character of the whole response."""
    real = CentralizedTask.reward

    def reward(self, problem, outputs):
        total, components = real(self, problem, outputs)
        return total + 1e-3 * len(outputs[self.agent]), components

    monkeypatch.setattr(CentralizedTask, "reward", reward)


def trained_b_norm(run_dir) -> dict[str, float]:
    from test_magrpo import adapter_state

    return {agent: sum(float(v.abs().sum()) for k, v in state.items() if "lora_B" in k)
            for agent, state in adapter_state(run_dir).items()}


def test_magrpo_centralized_smoke_resume_and_eval(tiny_model_dir, tmp_path, capsys, varied_central_reward):
    from test_magrpo import tiny_config

    from baselines.infra.cli import main as cli
    from baselines.infra.samples import read_samples
    from baselines.learners import magrpo

    config = tiny_config(tiny_model_dir, tmp_path, centralized=True, num_iterations=1, samples_every=1)
    assert config.env_kwargs()["centralized"] is True
    magrpo.main(config)
    result = magrpo.main(dataclasses.replace(config, num_iterations=2, resume=True))
    assert all(math.isfinite(v) for v in result.values() if isinstance(v, float))
    for key in ("reward/total", "reward/sections_found", "agent_central/loss", "eval/total", "eval/sections_found"):
        assert key in result, key
    norms = trained_b_norm(config.run_dir())
    assert list(norms) == ["central"] and norms["central"] > 0
    samples = read_samples(config.run_dir())
    assert {r["kind"] for r in samples} == {"eval", "train"}
    assert all(set(r["turns"][0]["responses"]) == {"central", *ROLES} for r in samples)

    assert cli(["eval", "--checkpoint", str(config.run_dir()), "--num-problems", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["env"] == "writing/xsum-v0" and "eval/sections_found" in out


def test_ppo_centralized_smoke(tiny_model_dir, tmp_path, varied_central_reward):
    from test_ppo import tiny_ppo

    from baselines.learners import ppo

    config = tiny_ppo(tiny_model_dir, tmp_path, env="writing/xsum-v0", max_source_words=20, centralized=True,
                      num_eval_problems=1)
    result = ppo.main(config)
    assert all(math.isfinite(v) for v in result.values() if isinstance(v, float))
    assert "agent_central/policy_loss" in result and "reward/sections_found" in result
    norms = trained_b_norm(config.run_dir())
    assert list(norms) == ["central"] and norms["central"] > 0


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["train", "cory", "--centralized"], "--centralized trains one model on a parallel env with magrpo or ppo "
                                             "or madpo or marlhf, not cory"),
        (["train", "maac", "--centralized"], "not maac"),
        (["train", "ppo", "--env", "sentiment/imdb-cory-v0", "--centralized"],
         "--centralized needs a parallel env, and 'sentiment/imdb-cory-v0' is sequential"),
    ],
)
def test_cli_refuses_bad_combinations(argv, expected, capsys):
    from baselines.infra.cli import main as cli

    with pytest.raises(SystemExit) as exit_info:
        cli(argv)
    err = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]
    assert exit_info.value.code == 2 and len(err) == 1 and expected in err[0], err


# ------------------------------------------------------------------------------------------ prefill
def test_prefill_writes_the_first_tag_and_the_reward_reads_it():
    """``prefill=True``: the prompt ends with ``<brief>`` after the chat template's assistant header, and
    the response is read as that tag followed by what the model wrote."""
    plain = llm_envs.make("writing/xsum-v0", centralized=True, max_source_words=30, max_new_tokens=64)
    env = llm_envs.make("writing/xsum-v0", centralized=True, prefill=True, max_source_words=30, max_new_tokens=64)
    obs, _ = env.reset(seed=0, options={"task_index": 3})
    plain_obs, _ = plain.reset(seed=0, options={"task_index": 3})
    tok = env.tokenizer
    tag = tok("<brief>", add_special_tokens=False)["input_ids"]
    ids, plain_ids = (o["central"]["observation"][o["central"]["attention_mask"] == 1].tolist()
                      for o in (obs, plain_obs))
    assert ids == plain_ids + tag  # the plain prompt (ending with the assistant header), then the tag
    assert tok.decode(plain_ids).endswith("<|im_start|>assistant\n")
    # The model's text starts inside the brief: the hand-worked case scores as the team's.
    _, rewards, _, _, infos = env.step({"central": f"{BRIEF}</brief><detailed>{DETAILED}</detailed>"})
    assert rewards["central"] == pytest.approx(DOC_TOTAL) and infos["central"]["reward_sections_found"] == 1.0
    assert env.split("b") == {"brief": "b", "detailed": ""} and plain.split("b") == {"brief": "", "detailed": ""}
    # The same text without the prefill finds no section: the reference's format.
    plain.step({"central": f"{BRIEF}</brief><detailed>{DETAILED}</detailed>"})
    assert plain.history[-1].reward == 0.0
    wrapped = llm_envs.centralize(llm_envs.make("writing/xsum-v0", max_source_words=30), prefill=True)
    assert wrapped.task.response_prefix("central") == "<brief>" and wrapped.task.prefill
    report = check_env("writing/xsum-v0", centralized=True, prefill=True, max_source_words=30, max_new_tokens=8)
    assert not report.failed


def test_prefill_errors():
    with pytest.raises(ValueError, match="prefill=True .* needs centralized=True"):
        llm_envs.make("writing/xsum-v0", prefill=True)
    with pytest.raises(ValueError, match="prefill must be True or False"):
        llm_envs.make("writing/xsum-v0", centralized=True, prefill="yes")
    from test_magrpo import tiny_config

    with pytest.raises(ValueError, match="--prefill .* needs --centralized"):
        tiny_config("unused", "unused", prefill=True)
    kwargs = tiny_config("unused", "unused", centralized=True, prefill=True).env_kwargs()
    assert kwargs["centralized"] is True and kwargs["prefill"] is True
    assert "prefill" not in tiny_config("unused", "unused", centralized=True).env_kwargs()


def test_eval_cli_prefill_needs_centralized(capsys):
    from baselines.infra.cli import main as cli

    assert cli(["eval", "--env", "writing/xsum-v0", "--prefill", "--num-problems", "1"]) == 2
    assert "--prefill needs --centralized" in capsys.readouterr().err
