"""One config vocabulary: the fields the learners share are defined once (baselines/infra/config.py) with one
docstring; ``llm-envs train <learner> --help`` lists every flag, and every flag that existed before the
shared config keeps its name and parses to its field."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import math

import pytest
import tyro

from baselines.infra import config as shared
from baselines.infra.cli import main as cli
from baselines.learners import cory, maac, magrpo, ppo

LEARNERS = {"magrpo": magrpo, "ppo": ppo, "cory": cory, "maac": maac}

# The fields of each learner's Config before the shared config (main at a069b70): their flags must keep working.
BEFORE = {
    "magrpo": """env model max_source_words data_path num_turns seed rollout joint_mode termination_threshold
        transition expert_model expert_max_new_tokens grouping num_iterations num_problems num_generations
        max_new_tokens temperature top_p top_k logprob_temperature learning_rate lora_rank lora_alpha baseline
        normalize_std loss_aggregation num_epochs clip_eps kl_coef gamma max_grad_norm micro_batch_size
        micro_batch_tokens eval_every num_eval_problems eval_greedy samples_every output_dir run_name
        checkpoint_every resume overwrite tensorboard wandb_project progress device dtype backend threads
        placement seed_per_problem""",
    "ppo": """env model data_path seed num_iterations batch_size minibatch_size num_ppo_epochs min_new_tokens
        max_new_tokens temperature top_p top_k logprob_temperature repetition_penalty learning_rate lora_rank
        lora_alpha init_kl_coef adaptive_kl kl_target kl_horizon gamma lam clip_eps clip_value vf_coef
        whiten_advantages max_grad_norm eta eval_every num_eval_problems eval_greedy samples_every output_dir
        run_name checkpoint_every resume tensorboard wandb_project progress device dtype backend threads
        seed_per_episode""",
    "maac": """env model max_source_words data_path num_turns transition seed num_iterations num_problems
        num_generations max_new_tokens temperature top_p top_k learning_rate critic_learning_rate lora_rank
        lora_alpha num_epochs clip_eps clip_value whiten_advantages gamma loss_aggregation max_grad_norm
        num_eval_problems output_dir run_name overwrite tensorboard progress device dtype threads""",
}
BEFORE["cory"] = BEFORE["ppo"] + " swap_every"

# Values for fields whose default is None (any valid value will do).
SAMPLES = {"model": "some/model", "data_path": "data.jsonl", "max_source_words": 20, "transition": "plain",
           "expert_model": "some/expert", "termination_threshold": 0.5, "run_name": "r", "wandb_project": "w",
           "device": "cpu", "dtype": "float32", "threads": 1, "seed_per_problem": True, "seed_per_episode": True}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@pytest.mark.parametrize("learner", list(LEARNERS))
def test_every_flag_is_listed_in_help(learner, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli(["train", learner, "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    missing = [f.name for f in dataclasses.fields(LEARNERS[learner].Config) if flag(f.name) not in text]
    assert missing == []
    # A shared field keeps its one docstring where a learner only changes its default.
    assert "Nucleus sampling mass." in text and "Seeds python, numpy, torch and the envs." in text


@pytest.mark.parametrize("learner", list(LEARNERS))
def test_flags_that_existed_before_keep_their_names(learner):
    """Every old flag, given on one command line with a non-None value, lands in its field."""
    config_class = LEARNERS[learner].Config
    default = config_class()
    names = BEFORE[learner].split()
    assert set(names) <= {f.name for f in dataclasses.fields(config_class)}
    args, expected = [], {}
    for name in names:
        value = getattr(default, name)
        if isinstance(value, bool):
            value = not value if name not in ("resume", "overwrite") else value
            args.append(flag(name) if value else "--no-" + name.replace("_", "-"))
        else:
            value = SAMPLES[name] if value is None else value
            args += [flag(name), str(value)]
        expected[name] = value
    parsed = tyro.cli(config_class, args=args)
    assert {name: getattr(parsed, name) for name in names} == expected


def test_shared_fields_have_one_docstring():
    """A learner may re-declare a shared field to change its default, never to describe it again."""
    shared_names = {f.name for f in dataclasses.fields(shared.LearnerConfig)}
    for name, module in LEARNERS.items():
        body = ast.parse(inspect.getsource(module.Config)).body[0].body
        for node, after in zip(body, [*body[1:], None]):
            if isinstance(node, ast.AnnAssign) and node.target.id in shared_names:
                documented = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                assert not documented, f"{name}.Config documents the shared field {node.target.id!r} again"
    # Every learner shares the core fields, with their definitions from baselines/infra/config.py.
    for module in LEARNERS.values():
        assert issubclass(module.Config, shared.CoreConfig)
    assert all(issubclass(m.Config, shared.LearnerConfig) for m in (magrpo, ppo, cory, maac))


@pytest.mark.parametrize("learner", list(LEARNERS))
@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("temperature", 0.0, "temperature must be > 0, got 0.0"),
        ("top_p", 1.5, "top_p must be in (0, 1], got 1.5"),
        ("gamma", math.nan, "gamma must be in [0, 1], got nan"),
        ("num_turns", 0, "num_turns must be an int >= 1, got 0"),
        ("lora_rank", True, "lora_rank must be an int >= 1, got True"),
        ("logprob_temperature", "hot", "logprob_temperature must be 'raw' or 'sampling', got 'hot'"),
        ("backend", "vllm", "backend must be 'auto', 'engine' or 'generate', got 'vllm'"),
        ("threads", 0, "threads must be a positive int or None, got 0"),
        ("activation_budget_mb", -1.0, "activation_budget_mb must be >= 0 and finite, got -1.0"),
        ("activation_budget_mb", math.inf, "activation_budget_mb must be >= 0 and finite, got inf"),
        ("kl_in", "both", "kl_in must be 'reward' or 'loss', got 'both'"),
    ],
)
def test_shared_checks_apply_to_every_learner(learner, field, value, message):
    with pytest.raises(ValueError) as err:
        LEARNERS[learner].Config(**{field: value})
    assert str(err.value) == message


def test_env_kwargs_and_run_dir_are_shared():
    config = ppo.Config(model="m", max_source_words=30, num_turns=2, transition="plain", data_path="d", seed=3)
    assert config.env_kwargs() == {"num_turns": 2, "tokenizer": "m", "max_source_words": 30, "data_path": "d",
                                   "transition": "plain"}
    assert "transition" not in magrpo.Config(transition="expert").env_kwargs()  # an object, built separately
    assert str(config.run_dir()) == "runs/ppo__sentiment_imdb-v0__s3"
    assert str(cory.Config().run_dir()) == "runs/cory__sentiment_imdb-cory-v0__s0"
    assert str(maac.Config(run_name="x", output_dir="out").run_dir()) == "out/x"


def test_kl_in_keeps_each_learners_computation_by_default():
    """One --kl-in, each learner's own default: MAGRPO's KL was a loss term, PPO's and CORY's a reward
    penalty; MAAC had none (coefficient 0) and takes the reference code's form."""
    assert magrpo.Config().kl_in == "loss" and magrpo.Config().kl_coef == 0.0
    assert ppo.Config().kl_in == cory.Config().kl_in == maac.Config().kl_in == "reward"
    assert maac.Config().kl_coef == 0.0
    assert tyro.cli(maac.Config, args=["--kl-in", "loss", "--kl-coef", "0.1"]).kl_in == "loss"
