"""Independent PPO (IPPO) on a token-mode env, in the style of CleanRL's ``ppo.py``: one file, one config
dataclass, one main loop.

Paper: Schulman et al., "Proximal Policy Optimization Algorithms" (2017); independent learners per
agent as in de Witt et al., "Is Independent Learning All You Need in the StarCraft Multi-Agent
Challenge?" (2020).

1. Make N copies of a parallel env with ``step_unit="token"``: each step every agent picks one token
   id (``Discrete(V)``) from its observation (prompt + its response so far, with an action mask).
2. Each agent has its own tiny causal LM (a 2-layer Llama built in process) with a value head; the
   next-token logits at the last position, masked by ``action_mask``, are the policy.
3. Collect ``num_steps`` steps, compute GAE per agent (the task's reward arrives on the step that
   resolves a turn, 0 elsewhere); steps of envs that have already finished are masked out.
4. Update each agent with the clipped surrogate, value loss and entropy bonus for a few epochs.

    python examples/independent_ppo_token.py --env-id writing/xsum-v0 --iterations 10

This is a demonstration of the env interface for generic MARL code, not a recipe for good LLMs:
the model is random and tiny. For real models use the baselines (MAGRPO, PPO, CORY).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import numpy as np
import torch
from torch import nn

from llm_envs.core.vector import VectorEnv


@dataclass
class Config:
    env_id: str = field(default="writing/xsum-v0", metadata={"help": "a registered id with the parallel protocol"})
    seed: int = field(default=1, metadata={"help": "seed of the envs, the models and the sampling"})
    num_envs: int = field(default=4, metadata={"help": "parallel envs N"})
    num_steps: int = field(default=32, metadata={"help": "steps per rollout (per env)"})
    iterations: int = field(default=10, metadata={"help": "rollout + update iterations"})
    max_new_tokens: int = field(default=8, metadata={"help": "longest response, in tokens"})
    max_prompt_tokens: int = field(default=256, metadata={"help": "prompts longer than this keep their last tokens"})
    num_turns: int = field(default=1, metadata={"help": "turns per episode"})
    hidden_size: int = field(default=64, metadata={"help": "width of each agent's tiny Llama"})
    num_layers: int = field(default=2, metadata={"help": "layers of each agent's tiny Llama"})
    shared_model: bool = field(default=False, metadata={"help": "one model for all agents (parameter sharing)"})
    learning_rate: float = field(default=3e-4, metadata={"help": "Adam learning rate"})
    gamma: float = field(default=1.0, metadata={"help": "discount per token step"})
    gae_lambda: float = field(default=0.95, metadata={"help": "GAE lambda"})
    update_epochs: int = field(default=2, metadata={"help": "epochs per update"})
    num_minibatches: int = field(default=2, metadata={"help": "minibatches per epoch"})
    clip_coef: float = field(default=0.2, metadata={"help": "surrogate clipping"})
    ent_coef: float = field(default=0.01, metadata={"help": "entropy bonus"})
    vf_coef: float = field(default=0.5, metadata={"help": "value loss coefficient"})
    max_grad_norm: float = field(default=0.5, metadata={"help": "gradient clipping"})

    def __post_init__(self) -> None:
        for name in ("num_envs", "num_steps", "iterations", "max_new_tokens", "max_prompt_tokens", "num_turns",
                     "hidden_size", "num_layers", "update_epochs", "num_minibatches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}.")
        if (self.num_envs * self.num_steps) % self.num_minibatches:
            raise ValueError(
                f"num_envs * num_steps = {self.num_envs * self.num_steps} must be divisible by "
                f"num_minibatches={self.num_minibatches}."
            )
        for name in ("learning_rate", "clip_coef", "max_grad_norm"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}.")
        if not (0 <= self.gamma <= 1 and 0 <= self.gae_lambda <= 1):
            raise ValueError(f"gamma and gae_lambda must be in [0, 1], got {self.gamma!r}, {self.gae_lambda!r}.")


class TokenPolicy(nn.Module):
    """A tiny causal LM with a value head: next-token logits and a value at the last position."""

    def __init__(self, vocab_size: int, max_len: int, hidden_size: int, num_layers: int) -> None:
        super().__init__()
        from transformers import AutoModelForCausalLM, LlamaConfig

        config = LlamaConfig(
            vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
            num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=max_len, tie_word_embeddings=True,
        )
        self.lm = AutoModelForCausalLM.from_config(config)
        self.value_head = nn.Linear(hidden_size, 1)

    def forward(self, ids: torch.Tensor, attention: torch.Tensor, action_mask: torch.Tensor):
        # ids, attention: (B, L) left-padded; action_mask: (B, V) -> logits (B, V), value (B,)
        positions = (attention.long().cumsum(-1) - 1).clamp(min=0)
        hidden = self.lm.model(input_ids=ids, attention_mask=attention.long(), position_ids=positions).last_hidden_state
        last = hidden[:, -1]  # the latest token is always the last position (left padding)
        logits = self.lm.lm_head(last)
        logits = logits.masked_fill(action_mask == 0, torch.finfo(logits.dtype).min)
        return logits, self.value_head(last).squeeze(-1)


def act(policy: TokenPolicy, obs: dict[str, torch.Tensor], action: torch.Tensor | None = None):
    """(action, log-prob, entropy, value), sampling the action if none is given. All (B,)."""
    logits, value = policy(obs["observation"], obs["attention_mask"], obs["action_mask"])
    dist = torch.distributions.Categorical(logits=logits)
    if action is None:
        action = dist.sample()
    return action, dist.log_prob(action), dist.entropy(), value


def gae(rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor, next_value: torch.Tensor,
        gamma: float, lam: float) -> torch.Tensor:
    """Advantages. rewards, values, dones: (S, N), ``dones[t]``: the episode ended at step t;
    next_value: (N,) value after the last step -> (S, N)."""
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(next_value)
    for t in reversed(range(rewards.shape[0])):
        following = next_value if t == rewards.shape[0] - 1 else values[t + 1]
        alive = 1.0 - dones[t]
        delta = rewards[t] + gamma * following * alive - values[t]
        last = delta + gamma * lam * alive * last
        advantages[t] = last
    return advantages


def to_tensors(obs: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in obs.items()}


def main(config: Config) -> dict[str, object]:
    """Train; returns the policies and the metrics of each iteration (for tests and notebooks)."""
    torch.manual_seed(config.seed)
    np.random.seed(config.seed)
    venv = VectorEnv(
        config.env_id, num_envs=config.num_envs, step_unit="token", max_new_tokens=config.max_new_tokens,
        max_prompt_tokens=config.max_prompt_tokens, prompt_overflow="truncate_left", num_turns=config.num_turns,
    )
    env0 = venv.envs[0]
    agents, V, L = venv.possible_agents, env0.vocab_size, env0.obs_length
    if config.shared_model:
        shared = TokenPolicy(V, L, config.hidden_size, config.num_layers)
        policies = dict.fromkeys(agents, shared)
    else:
        policies = {a: TokenPolicy(V, L, config.hidden_size, config.num_layers) for a in agents}
    models = list({id(p): p for p in policies.values()}.values())
    optimizers = {id(p): torch.optim.Adam(p.parameters(), lr=config.learning_rate, eps=1e-5) for p in models}

    S, N = config.num_steps, config.num_envs
    buffers = {a: {"observation": torch.zeros(S, N, L, dtype=torch.long),
                   "attention_mask": torch.zeros(S, N, L, dtype=torch.int8),
                   "action_mask": torch.zeros(S, N, V, dtype=torch.int8),
                   "actions": torch.zeros(S, N, dtype=torch.long), "logprobs": torch.zeros(S, N),
                   "rewards": torch.zeros(S, N), "values": torch.zeros(S, N), "dones": torch.zeros(S, N)}
               for a in agents}
    valid = torch.zeros(S, N)  # 0 on steps of envs that had already finished (they only wait)
    episode_seed = config.seed * 10_000
    obs, _ = venv.reset(seed=episode_seed)
    episode_returns, running = [], np.zeros(N)
    history = []
    start = time.time()
    for iteration in range(config.iterations):
        for step in range(S):
            if not venv.agents:  # every env of the batch has finished: start the next batch
                episode_seed += N
                obs, _ = venv.reset(seed=episode_seed)
            valid[step] = torch.from_numpy(~venv.done).float()
            actions = {}
            with torch.no_grad():
                for a in agents:
                    o = to_tensors(obs[a])
                    action, logprob, _, value = act(policies[a], o)
                    buf = buffers[a]
                    for k in ("observation", "attention_mask", "action_mask"):
                        buf[k][step] = o[k]
                    buf["actions"][step], buf["logprobs"][step], buf["values"][step] = action, logprob, value
                    actions[a] = action.numpy()
            was_done = venv.done.copy()
            obs, rewards, terms, truncs, _ = venv.step(actions)
            for a in agents:
                buffers[a]["rewards"][step] = torch.from_numpy(rewards[a]).float()
                buffers[a]["dones"][step] = torch.from_numpy(terms[a] | truncs[a]).float()
            running += np.where(was_done, 0.0, rewards[agents[0]])
            for i in np.flatnonzero(venv.done & ~was_done):
                episode_returns.append(float(running[i]))
                running[i] = 0.0

        metrics: dict[str, float] = {"charts/iteration": float(iteration)}
        for a in agents:
            buf, policy = buffers[a], policies[a]
            with torch.no_grad():
                _, _, _, next_value = act(policy, to_tensors(obs[a]))
            next_value = next_value * torch.from_numpy(~venv.done).float()
            advantages = gae(buf["rewards"], buf["values"], buf["dones"], next_value, config.gamma, config.gae_lambda)
            returns = advantages + buf["values"]
            flat = {k: v.reshape(S * N, *v.shape[2:]) for k, v in buf.items()}
            b_adv, b_ret, b_valid = advantages.reshape(-1), returns.reshape(-1), valid.reshape(-1)
            optimizer = optimizers[id(policy)]
            batch = torch.randperm(S * N)
            size = S * N // config.num_minibatches
            for _ in range(config.update_epochs):
                batch = batch[torch.randperm(S * N)]
                for lo in range(0, S * N, size):
                    idx = batch[lo : lo + size]
                    w = b_valid[idx]
                    count = w.sum().clamp(min=1.0)
                    o = {k: flat[k][idx] for k in ("observation", "attention_mask", "action_mask")}
                    _, logprob, entropy, value = act(policy, o, flat["actions"][idx])
                    ratio = (logprob - flat["logprobs"][idx]).exp()
                    adv = b_adv[idx]
                    adv = (adv - adv.mean()) / (adv.std() + 1e-8) if idx.numel() > 1 else adv
                    pg_loss = (torch.max(-adv * ratio, -adv * ratio.clamp(1 - config.clip_coef, 1 + config.clip_coef))
                               * w).sum() / count
                    v_loss = 0.5 * (((value - b_ret[idx]) ** 2) * w).sum() / count
                    ent = (entropy * w).sum() / count
                    loss = pg_loss - config.ent_coef * ent + config.vf_coef * v_loss
                    optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(policy.parameters(), config.max_grad_norm)
                    optimizer.step()
            metrics.update({f"losses/{a}/policy": pg_loss.item(), f"losses/{a}/value": v_loss.item(),
                            f"losses/{a}/entropy": ent.item()})
        if episode_returns:
            metrics["charts/episodic_return"] = float(np.mean(episode_returns[-N:]))
        metrics["charts/steps_per_s"] = (iteration + 1) * S * N / (time.time() - start)
        history.append(metrics)
        print(" ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
    return {"policies": policies, "metrics": history, "episode_returns": episode_returns}


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (tests/test_docs_commands.py parses the docs' command lines with it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for f in dataclasses.fields(Config):
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default, help=f.metadata["help"])
        else:
            kind = {"int": int, "float": float, "str": str}[f.type if isinstance(f.type, str) else f.type.__name__]
            parser.add_argument(flag, type=kind, default=f.default, help=f.metadata["help"])
    return parser


def parse_args(argv: Sequence[str] | None = None) -> Config:
    parser = build_parser()
    return Config(**vars(parser.parse_args(argv)))


if __name__ == "__main__":
    main(parse_args())
