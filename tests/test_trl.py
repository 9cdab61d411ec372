"""Every reward the docs call TRL-compatible, called as TRL 1.16's GRPOTrainer calls reward functions: by
hand with exactly its keyword arguments, and by a real GRPOTrainer on a tiny model; the coding adapter's
values; components through ``log_metric``; the single-agent prompts; the converted default model's
tokenizer; and examples/trl_grpo.py on the embedded model (slow)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

from llm_envs.rewards.coding import coding_reward_func
from llm_envs.rewards.math import gsm8k_reward
from llm_envs.rewards.sentiment import sentiment_reward
from llm_envs.rewards.writing import PARAGRAPH_SPLIT, arxiv_reward_func, tldr_reward_func
from llm_envs.tasks.coding import single_agent_prompt as coding_prompt
from llm_envs.tasks.writing import single_agent_prompt as writing_prompt

AUX_MAIN = """def aux(a, b):
    return a + b

def add3(a, b, c):
    s = aux(a, b)
    return s + c
"""
PROBLEM = "def add3(a, b, c):\n    '''Sum of three numbers.'''\n"
TEST = "def check(candidate):\n    assert candidate(1, 2, 3) == 6\n    assert candidate(0, 0, 1) == 1\n"
SUMMARY = f"Paragraph 1: A short summary of the news.\n{PARAGRAPH_SPLIT}\nParagraph 2: " + "Moreover, " * 30

COLUMNS = {
    "answer": ["#### 9", "#### 10"],
    "query": ["This film was", "This film was"],
    "test": [TEST, TEST],
    "entry_point": ["add3", "add3"],
    "code_prompt": [PROBLEM, PROBLEM],
}
COMPLETIONS = [[{"role": "assistant", "content": AUX_MAIN + "\n# 5 + 4 = 9. " + SUMMARY}],
               [{"role": "assistant", "content": "a wonderful, moving film. 10"}]]
REWARD_FUNCS = {
    "tldr": tldr_reward_func,
    "arxiv": arxiv_reward_func,
    "coding": coding_reward_func,
    "sentiment": sentiment_reward,
    "gsm8k": gsm8k_reward,
}
COMPONENTS = {
    "tldr": {"structure", "length", "diversity", "transition", "jaccard", "has_split"},
    "arxiv": {"structure", "length", "diversity", "transition", "jaccard", "has_split"},
    "coding": {"aux_defined", "main_defined", "syntax", "tests", "aux_call", "beyond_wrapper", "ignored_result"},
    "sentiment": {"compound", "pos", "neu", "neg"},
    "gsm8k": {"correct", "has_number"},
}


def trl_call(func, completions, prompts, columns, logged, extra_columns=()):
    """A reward call exactly as TRL 1.16's ``GRPOTrainer._calculate_rewards`` makes it."""
    return func(
        prompts=prompts,
        completions=completions,
        completion_ids=[[1, 2, 3]] * len(completions),
        **columns,
        trainer_state=object(),
        log_extra=lambda column, values: None,
        log_metric=lambda name, value: logged.setdefault(name, []).append(value),
    )


@pytest.mark.parametrize("name", sorted(REWARD_FUNCS))
def test_reward_funcs_take_trls_call(name):
    logged: dict[str, list[float]] = {}
    prompts = [[{"role": "user", "content": "Write."}]] * 2
    scores = trl_call(REWARD_FUNCS[name], COMPLETIONS, prompts, COLUMNS, logged)
    assert len(scores) == 2 and all(isinstance(s, float) and math.isfinite(s) for s in scores)
    assert set(logged) == {f"{name}/{c}" for c in COMPONENTS[name]}
    assert all(len(v) == 1 and math.isfinite(v[0]) for v in logged.values())


def test_reward_values_under_trls_call():
    logged: dict[str, list[float]] = {}
    prompts = [[{"role": "user", "content": "Write."}]] * 2
    # The first completion's last number is the 2 of "Paragraph 2:", not its 9.
    assert trl_call(gsm8k_reward, COMPLETIONS, prompts, COLUMNS, logged) == [0.0, 1.0]
    assert logged["gsm8k/correct"] == [0.5] and logged["gsm8k/has_number"] == [1.0]
    assert trl_call(coding_reward_func, COMPLETIONS, prompts, COLUMNS, logged) == [4.0, 0.0]
    assert logged["coding/tests"] == [0.5] and logged["coding/beyond_wrapper"] == [0.5]
    scores = trl_call(tldr_reward_func, COMPLETIONS, prompts, COLUMNS, logged)
    assert scores[0] > 0 and scores[1] == 0.0 and logged["tldr/has_split"] == [0.5]


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        (AUX_MAIN, 4.0),  # every level: aux 0.4 + main 0.6 + syntax 0.5 + tests 1 + aux_call 0.5 + beyond 1
        ("def add3(a, b, c):\n    return a + b + c\n", 2.1),  # no aux: the reference's single-agent levels
        ("def add3(a, b, c):\n    return aux(a, b) + c\n\ndef aux(a, b):\n    return a + b\n", 3.0),  # thin wrapper
        ("```python\n" + AUX_MAIN + "```\nThat's it.", 4.0),  # fences and chatter around the code
        ("no code at all", 0.0),
    ],
)
def test_coding_reward_func_one_model_writes_both_functions(completion, expected):
    assert coding_reward_func(completions=[completion], prompts=[PROBLEM], test=[TEST],
                              entry_point=["add3"]) == [pytest.approx(expected)]


def test_coding_reward_func_problem_code_comes_from_code_prompt():
    """The problem's own helpers (HumanEval/38's encode_cyclic, ...) come from its code, which a wrapped
    prompt does not provide: ``code_prompt`` carries it."""
    problem = "def shift(s):\n    return s[1:] + s[:1]\n\n\ndef unshift(s):\n    '''Undo shift.'''\n"
    test = "def check(candidate):\n    assert candidate(shift('abc')) == 'abc'\n"
    completion = "def unshift(s):\n    return s[-1:] + s[:-1]\n"
    wrapped = [coding_prompt(problem, "unshift")]
    assert coding_reward_func(completions=[completion], prompts=wrapped, code_prompt=[problem], test=[test],
                              entry_point=["unshift"]) == [pytest.approx(2.1)]
    # Without code_prompt the instructions around the code hide shift(): the test cannot run it.
    assert coding_reward_func(completions=[completion], prompts=wrapped, test=[test],
                              entry_point=["unshift"]) == [pytest.approx(1.1)]


def test_coding_reward_func_missing_columns_say_which():
    with pytest.raises(ValueError, match=r"needs the dataset columns 'test' and 'entry_point'.*\['tests'\]"):
        coding_reward_func(completions=["x"], prompts=["p"], tests=["t"])
    with pytest.raises(ValueError, match="needs the problem's code"):
        coding_reward_func(completions=["x"], test=[TEST], entry_point=["add3"])
    with pytest.raises(TypeError, match=r"completions\[0\] must be a str or a list of messages"):
        coding_reward_func(completions=[3], prompts=["p"], test=[TEST], entry_point=["add3"])


def test_single_agent_prompts():
    text = writing_prompt("The council approved the new bridge.")
    assert "The council approved the new bridge." in text and text.count(PARAGRAPH_SPLIT) == 2
    assert "background and motivation" in writing_prompt("An abstract.", "arxiv")
    with pytest.raises(ValueError, match="variant must be one of"):
        writing_prompt("x", "xsum")
    with pytest.raises(ValueError, match="source must be a non-empty str"):
        writing_prompt("  ")
    helper = coding_prompt(PROBLEM, "add3")
    assert PROBLEM in helper and "def aux(...):" in helper and "def add3(a, b, c):" in helper
    alone = coding_prompt(PROBLEM, "add3", helper=False)
    assert "aux" not in alone and "Implement ONLY the 'add3' function" in alone


def test_a_real_grpo_trainer_calls_every_reward(tiny_model_dir, tmp_path):
    """TRL's GRPOTrainer (one step, a tiny random model) calls each reward function and logs its
    components: the calling convention is TRL's own, not our reading of it."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    rows = [
        {"prompt": [{"role": "user", "content": "Solve and summarise."}],
         **{k: v[i] for k, v in COLUMNS.items()}}
        for i in range(2)
    ]
    args = GRPOConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=8, logging_steps=1, save_strategy="no", report_to="none",
                      use_cpu=True, disable_tqdm=True)
    trainer = GRPOTrainer(model=tiny_model_dir, reward_funcs=list(REWARD_FUNCS.values()), args=args,
                          train_dataset=Dataset.from_list(rows))
    trainer.train()
    logged = {k for row in trainer.state.log_history for k in row}
    for name, components in COMPONENTS.items():
        assert {f"{name}/{c}" for c in components} <= logged, name
    for func in REWARD_FUNCS.values():
        assert f"rewards/{func.__name__}/mean" in logged


@pytest.mark.slow
def test_converted_default_model_dir_loads_with_auto_tokenizer():
    from transformers import AutoTokenizer

    from agents.models import convert_default_model
    from llm_envs.tokenizers import load_tokenizer

    path = convert_default_model()
    tok, ours = AutoTokenizer.from_pretrained(str(path)), load_tokenizer(None)
    text = ours.apply_chat_template([{"role": "user", "content": "Hi there"}], tokenize=False)
    assert tok(text)["input_ids"] == ours(text)["input_ids"] and tok.eos_token == ours.eos_token


def test_an_old_converted_dir_gets_its_tokenizer(tmp_path, monkeypatch):
    """A directory converted before tokenizer files were saved there gets them added on the next call,
    without converting the weights again."""
    from transformers import AutoTokenizer

    from agents import models
    from llm_envs.tokenizers import load_tokenizer

    monkeypatch.setenv("LLM_ENVS_CACHE", str(tmp_path))
    target = models.default_model_weights_dir()
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    (target / "model.safetensors").write_bytes(b"weights")
    assert models.convert_default_model() == target
    assert (target / "model.safetensors").read_bytes() == b"weights"
    tok = AutoTokenizer.from_pretrained(str(target))
    assert tok("Hello world")["input_ids"] == load_tokenizer(None)("Hello world")["input_ids"]
    assert not [p for p in target.parent.iterdir() if p.name.startswith(".tokenizer")]


@pytest.mark.slow
def test_example_trains_grpo_with_our_rewards_on_the_embedded_model(capsys):
    path = Path(__file__).resolve().parents[1] / "examples" / "trl_grpo.py"
    spec = importlib.util.spec_from_file_location("examples_trl_grpo", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    histories = module.main(["--max-steps", "2", "--num-prompts", "1", "--max-completion-length", "12"])
    prefixes = {"writing": "tldr", "coding": "coding", "sentiment": "sentiment"}
    for task, history in histories.items():
        steps = [row for row in history if "reward" in row]
        assert [int(row["step"]) for row in steps] == [1, 2], task
        for row in steps:
            assert math.isfinite(row["reward"]) and math.isfinite(row["loss"])
            components = {k for k in row if k.startswith(prefixes[task] + "/")}
            assert components >= {f"{prefixes[task]}/{c}" for c in COMPONENTS[prefixes[task]]}, (task, row)
    out = capsys.readouterr().out
    assert "writing step 2: reward" in out and "coding step 1" in out and "sentiment step 2" in out
