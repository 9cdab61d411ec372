"""GRPO with TRL on one seat of a served multi-agent env: ``GRPOTrainer(environment_factory=...)`` over OpenEnv.

The embedded default model (SmolLM2-135M-Instruct, converted once by ``agents.models.convert_default_model``, with a
LoRA adapter) plays the ``brief`` seat of ``writing/xsum-v0`` served by ``llm-envs serve``: each rollout resets the
served env (``llm_envs.serve.trl.served_seat``), the model answers by calling the ``submit`` tool, the ``detailed``
seat is played by a partner (a frozen copy of the same model by default, or a fixed text), and the reward is the
served env's reward of the seat. This script starts nothing: run the server in another shell first.

    llm-envs serve writing/xsum-v0 --port 8000 --make-kwargs '{"max_new_tokens": 64}'
    python examples/trl_openenv.py --url http://127.0.0.1:8000                   # 2 steps (minutes on 2 CPU cores)
    python examples/trl_openenv.py --partner fixed --max-steps 20 --output-dir runs/trl-openenv

SmolLM2's own chat template cannot render tool calls, which TRL needs: the tokenizer gets TRL's ChatML template with
tools (``qwen2_5_chat_template``: the same ``<|im_start|>``/``<|im_end|>`` tokens). A 135M model rarely calls a tool
unprompted: rollouts that do not call it get the task's minimum reward (0.0), so the first thing GRPO teaches it is to
call the tool. Needs the ``trl`` and ``remote`` extras (``pip install -e ".[train,trl,remote]"``).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

FIXED_PARTNER_TEXT = ("Moreover, the article explains the background of the events in more detail, and additionally "
                      "describes what the people involved said and what is expected to happen next.")
INSTRUCTION = "Summarise the post below in one or two sentences, and submit the summary with the submit tool.\n\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the llm-envs serve server")
    parser.add_argument("--seat", default="brief", help="the trained agent")
    parser.add_argument("--partner", choices=("model", "fixed"), default="model",
                        help="the other seats: a frozen copy of the model, or a fixed text")
    parser.add_argument("--max-steps", type=int, default=2)
    parser.add_argument("--num-generations", type=int, default=2, help="rollouts per problem (the GRPO group)")
    parser.add_argument("--max-completion-length", type=int, default=128,
                        help="tokens per rollout: the tool call, its answer and what follows")
    parser.add_argument("--partner-max-new-tokens", type=int, default=48)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", default=None, help="where TRL writes (default: a temporary directory)")
    return parser


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    config = build_parser().parse_args(argv)
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen2_5_chat_template

    from agents.models import convert_default_model
    from llm_envs.serve.trl import model_policy, seat_dataset, served_seat

    path = str(convert_default_model())  # safetensors and tokenizer files of the embedded model
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = qwen2_5_chat_template  # renders tools and tool calls; TRL parses its calls
    if config.partner == "model":
        # The served env's prompts carry its own chat template (SmolLM2's): the partner tokenizes them as they are.
        partner = model_policy(AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path),
                               max_new_tokens=config.partner_max_new_tokens)
    else:
        def partner(agent: str, prompt_text: str) -> str:
            return FIXED_PARTNER_TEXT

    Seat = served_seat(config.url, config.seat, partner, class_name="XSumSeat")
    rows = seat_dataset(config.max_steps, instruction=INSTRUCTION, seed=config.seed)
    with tempfile.TemporaryDirectory() as tmp:
        args = GRPOConfig(
            output_dir=config.output_dir or tmp,
            max_steps=config.max_steps,
            per_device_train_batch_size=config.num_generations,  # one problem per step
            num_generations=config.num_generations,
            max_completion_length=config.max_completion_length,
            max_tool_calling_iterations=2,
            learning_rate=config.learning_rate,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            seed=config.seed,
            bf16=False,
            use_cpu=True,
            disable_tqdm=True,
        )
        trainer = GRPOTrainer(
            model=path,
            processing_class=tokenizer,
            args=args,
            train_dataset=Dataset.from_list(rows),
            environment_factory=Seat,
            peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"),
        )
        trainer.train()
    history = [dict(row) for row in trainer.state.log_history]
    for row in history:
        if "rewards/XSumSeat/mean" in row:
            print(f"step {int(row['step'])}: env reward {row['rewards/XSumSeat/mean']:.3f}, "
                  f"tool calls {row.get('tools/call_frequency', 0.0):.2f}, loss {row['loss']:.4f}")
    return history


if __name__ == "__main__":
    main()
