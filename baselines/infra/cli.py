"""The ``llm-envs`` command line.

    llm-envs list                      registered env ids with one-line descriptions
    llm-envs demo [--env ID] [--episodes N] [--seed S]
                                       a scripted rollout (no model): prints transcripts and rewards
    llm-envs train magrpo [--preset demo] [--FIELD VALUE ...]
                                       train with MAGRPO (``llm-envs train magrpo --help`` lists fields)
    llm-envs train ppo [--FIELD VALUE ...]    independent PPO per agent (docs/ppo.md)
    llm-envs train iac [--FIELD VALUE ...]    the same learner under the reference's name (IAC)
    llm-envs train maac [--FIELD VALUE ...]   actors with one centralised critic (docs/maac.md)
    llm-envs train cory [--FIELD VALUE ...]   CORY: two PPO models swapping pioneer/observer (docs/cory.md)
    llm-envs train madpo [--iterative] [--FIELD VALUE ...]   joint preference optimisation (docs/madpo.md)
    llm-envs train marlhf [--iterative] [--FIELD VALUE ...]  a learned joint reward, then MAGRPO (docs/marlhf.md)
    llm-envs eval [--env ID | --checkpoint RUN] [--num-problems N] [--num-samples n] [--k 1 5] [--device D]
                                       mean reward and components on the eval split; pass@k on coding
                                       and math envs (llm-envs eval --env math/gsm8k-v0 --num-samples 5)
    llm-envs serve ID [--host H] [--port P] [--max-sessions N] [--import MODULE] [--make-kwargs JSON]
                                       serve an env over OpenEnv (WebSocket sessions that survive a dropped
                                       connection; docs/serving.md); needs the 'serve' extra
    llm-envs plot RUN_DIR_OR_JSONL [--output PNG]
                                       learning curves per reward component
    llm-envs report RUN_DIR [--output HTML]
                                       one self-contained HTML page: config, curves, eval table and
                                       the agents' transcripts before and after training

Bad input (an unknown env, a bad flag value, a damaged checkpoint) ends with one line on stderr and
exit status 2 (1 for other errors); ``--debug`` anywhere on the command line shows the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SENTENCE = re.compile(r"(?<=[.!?])\s+")


def lead_sentences(text: str, k: int) -> str:
    """The first ``k`` sentences of ``text`` (an extractive 'lead-k' summary)."""
    return " ".join(SENTENCE.split(text.strip())[:k])


def scripted_actions(env) -> dict[str, str]:
    """A no-model policy for the writing envs: lead-1 for the first role, lead-3 with transitions for
    the second. It shows the env loop and the reward's components without any download."""
    source = env.problem["source"]
    first, second = env.possible_agents
    detailed = lead_sentences(source, 3)
    return {
        first: lead_sentences(source, 1),
        second: f"In summary, {detailed[:1].lower()}{detailed[1:]} "
        "Moreover, this matters because it shows the context.",
    }


def cmd_list(_: argparse.Namespace) -> int:
    import llm_envs

    envs = llm_envs.describe_envs()
    width = max(map(len, envs))
    for env_id, text in envs.items():
        print(f"{env_id:<{width}}  {text}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    import llm_envs

    env = llm_envs.make(args.env, render_mode="ansi")
    if not env.possible_agents or len(env.possible_agents) != 2:
        print(f"The scripted demo policy writes for two roles; {args.env} has {env.possible_agents}.", file=sys.stderr)
        return 2
    totals = []
    for episode in range(args.episodes):
        env.reset(seed=args.seed + episode)
        while env.agents:
            _, rewards, *_ = env.step(scripted_actions(env))
        print(env.render())
        print()
        totals.append(next(iter(rewards.values())))
    mean = sum(totals) / len(totals)
    print(f"{args.env}: {len(totals)} episodes, mean joint reward {mean:.3f} "
          f"(max {env.task.max_reward:.1f}), per episode {[round(t, 3) for t in totals]}")
    return 0


LEARNERS = ("magrpo", "ppo", "iac", "maac", "cory", "madpo", "marlhf")
ALIASES = {"iac": "ppo"}
"""Other names of a learner: IAC (independent actor-critic, the reference's name) is our PPO with one
value head per agent."""


def learner_module(name: str) -> Any:
    """The module of learner ``name`` (one of :data:`LEARNERS`): ``baselines.learners.<name>``."""
    import importlib

    return importlib.import_module(f"baselines.learners.{ALIASES.get(name, name)}")


class PresetError(SystemExit):
    """A bad ``--preset`` (its one line already printed): exit status 2."""


def parse_train_config(algo: str, rest: Sequence[str]) -> Any:
    """The learner config that ``llm-envs train <algo> <rest...>`` trains with: ``--preset NAME`` applied,
    then the flags parsed by tyro. Nothing is loaded or run (tests/test_docs_commands.py parses the docs'
    command lines with it). Bad flags print one line on stderr and raise ``SystemExit(2)``, as argparse's
    errors (a bad ``--preset``: :class:`PresetError`); ``--help`` prints the help and raises ``SystemExit(0)``."""
    import tyro

    learner = learner_module(algo)
    presets = getattr(learner, "PRESETS", {})
    rest = list(rest)
    preset = None
    if "--preset" in rest:
        i = rest.index("--preset")
        if not presets:
            print(f"{algo} has no presets; set its flags (llm-envs train {algo} --help)", file=sys.stderr)
            raise PresetError(2)
        if i + 1 >= len(rest):
            print(f"--preset needs a name: one of {sorted(presets)}", file=sys.stderr)
            raise PresetError(2)
        preset = rest[i + 1]
        del rest[i : i + 2]
    if preset is not None and preset not in presets:
        print(f"unknown preset {preset!r}; choose one of {sorted(presets)}", file=sys.stderr)
        raise PresetError(2)
    default = learner.apply_preset(preset) if preset else learner.Config()
    description = (learner.__doc__ or "").split("\n\n")[0]
    if presets:
        description += f" Use --preset {{{', '.join(sorted(presets))}}} for named settings."
    prog = f"llm-envs train {algo}"
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            return tyro.cli(learner.Config, args=rest, default=default, prog=prog, description=description)
    except SystemExit as exit_:
        if exit_.code:  # not --help: tyro's boxed message as one line, exit status 2 as argparse's errors
            print(f"{prog}: error: {tyro_error_line(captured.getvalue())} (see {prog} --help)", file=sys.stderr)
        raise


def cmd_train(args: argparse.Namespace) -> int:
    learner = learner_module(args.algo)
    try:
        config = parse_train_config(args.algo, args.rest)
    except PresetError:  # printed its line
        return 2
    try:
        result = learner.main(config)
    except KeyboardInterrupt:
        return 130
    print(learner.summary(result))
    from baselines.infra import distributed

    if distributed.rank() == 0:
        from baselines.infra.report import write_report

        print(f"report: {write_report(result['run_dir'])}")
    return 0


def tyro_error_line(text: str) -> str:
    """tyro's boxed error message as one line: the text of the box's first section (the border, what
    follows the first rule or the "For full helptext" line, and line wraps removed).

    >>> tyro_error_line("╭─ Value error ─╮\\n│ Error parsing --x: bad │\\n│ ──── │\\n│ Argument helptext: │\\n╰─╯")
    'Error parsing --x: bad'
    """
    lines = []
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith(("╭", "╰")):
            continue
        inner = line.strip("│").strip()
        if inner and set(inner) <= set("─"):
            break  # the rule before tyro's helptext
        if inner.startswith("For full helptext"):
            break
        if inner:
            lines.append(inner)
    return " ".join(" ".join(lines).split()) or "invalid arguments"


def cmd_eval(args: argparse.Namespace) -> int:
    import llm_envs
    from agents import LoraSettings, MultiAgentPolicy
    from baselines.infra.checkpoints import CheckpointError, find_checkpoint
    from baselines.infra.config import parse_agent_models, parse_agent_settings
    from baselines.infra.evaluation import evaluate
    from baselines.infra.play import team_env_kwargs

    env_id, model = args.env, args.model
    env_kwargs: dict = {}
    lora: Any = LoraSettings()  # one for every agent, or agent -> its own (a team)
    checkpoint = None
    learner, trainer = None, {}
    team_models: dict[str, str] = {}  # a team's agents on their own bases, as trained
    team_settings: dict[str, dict] = {}
    if args.checkpoint is not None:
        checkpoint = find_checkpoint(args.checkpoint)
        trainer_path = checkpoint / "trainer.json"
        try:
            trainer = json.loads(trainer_path.read_text(encoding="utf-8"))
            learner, saved = trainer.get("learner"), dict(trainer["config"])
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise CheckpointError(f"corrupt checkpoint file {trainer_path}: {type(err).__name__}: {err}") from err
        env_id = env_id or saved["env"]
        model = model if model is not None else saved.get("model")
        lora = LoraSettings(rank=saved["lora_rank"], alpha=saved["lora_alpha"])
        team_models = parse_agent_models(saved.get("agent_models") or ())
        team_settings = parse_agent_settings(saved.get("agent_settings") or ())
        for key in ("max_source_words", "data_path"):
            if saved.get(key) is not None:
                env_kwargs[key] = saved[key]
        if saved.get("centralized"):
            env_kwargs["centralized"] = True  # the checkpoint's one agent writes every role
            if saved.get("prefill"):
                env_kwargs["prefill"] = True  # ... after the first role's opening tag, written by the env
        if args.max_new_tokens is None:
            args.max_new_tokens = saved["max_new_tokens"]
    env_id = env_id or "writing/xsum-v0"
    if args.max_source_words is not None:
        env_kwargs["max_source_words"] = args.max_source_words
    if args.data_path is not None:
        env_kwargs["data_path"] = args.data_path
    if args.num_turns != 1:
        env_kwargs["num_turns"] = args.num_turns
    if args.centralized:
        env_kwargs["centralized"] = True
    if args.prefill:
        if not env_kwargs.get("centralized"):
            print("--prefill needs --centralized (or a centralised checkpoint)", file=sys.stderr)
            return 2
        env_kwargs["prefill"] = True
    if env_id not in llm_envs.list_envs():
        print(f"unknown env {env_id!r}; see `llm-envs list`", file=sys.stderr)
        return 2
    if args.top_k < 0:
        print(f"--top-k must be >= 0 (0 disables it), got {args.top_k}", file=sys.stderr)
        return 2
    if args.k is not None and max(args.k) > args.num_samples:
        print(f"--k {max(args.k)} needs --num-samples >= {max(args.k)}, got {args.num_samples}", file=sys.stderr)
        return 2
    if model is not None:
        env_kwargs["tokenizer"] = model
    env = llm_envs.make(env_id, **env_kwargs)
    agents, max_new_tokens = list(env.possible_agents), args.max_new_tokens or env.max_new_tokens
    adapters = {a: a for a in agents}
    models = agents
    if "adapters" in trainer.get("extra", {}):
        # The models a learner trained, each in the role it played at the end of training (CORY swaps them).
        adapters, models = dict(trainer["extra"]["adapters"]), list(trainer["extra"]["models"])
    elif learner == "cory":
        raise CheckpointError(f"{checkpoint} is a CORY checkpoint of llm-envs < 0.2.0, which does not record "
                              "the roles its models played last; evaluate it with llm-envs 0.1.0")
    # A team: each agent on its base and with its LoRA settings, as the learner built it (its config's
    # model_of and lora_of: a mapping only where agents differ).
    bases: str | dict[str, str | None] | None = {m: team_models.get(m, model) for m in models} if team_models else model
    own = {m: LoraSettings(rank=team_settings.get(m, {}).get("lora_rank", lora.rank),
                           alpha=team_settings.get(m, {}).get("lora_alpha", lora.alpha)) for m in models}
    if any(settings != lora for settings in own.values()):
        lora = own
    if learner == "maac" or trainer.get("config", {}).get("critic") == "central":
        from baselines.infra.config import CRITIC, with_critic

        # The critic sits on the run's --critic-model, else the first model's base, at its LoRA settings.
        bases = with_critic(bases, models, saved.get("critic_model"))
        if isinstance(lora, dict):
            lora[CRITIC] = LoraSettings(rank=saved["lora_rank"], alpha=saved["lora_alpha"])
        models = [*models, CRITIC]  # the centralised critic's adapter is part of the checkpoint
    policy = MultiAgentPolicy.from_pretrained(
        models, bases, lora=lora, mixed_batches=False, value_head=learner in ("ppo", "cory", "maac"),
        device=args.device, dtype=args.dtype,
    )
    if checkpoint is not None:
        policy.load(checkpoint / "policy")
    # Each role's env speaks the tokenizer of the model playing it and stops at its EOS ids (a team of
    # tokenizers; CORY's models in the roles they played last).
    env_kwargs = team_env_kwargs(env_kwargs, policy, adapters)
    greedy = args.num_samples == 1 and not args.sample
    ks = args.k if args.k is not None else [k for k in (1, 5, 10) if k <= args.num_samples]
    result = evaluate(
        policy, env_id, num_problems=args.num_problems, num_samples=args.num_samples,
        max_new_tokens=max_new_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        greedy=greedy, ks=ks, seed=args.seed, env_kwargs=env_kwargs, adapters=adapters,
    )
    print(json.dumps({"env": env_id, "checkpoint": None if checkpoint is None else str(checkpoint),
                      "greedy": greedy, **result}, indent=2))
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from baselines.infra.metrics import METRICS_FILE
    from baselines.infra.plots import plot_metrics

    path = Path(args.path)
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.is_file():
        print(f"no metrics file at {str(path)!r}: pass a run directory or its {METRICS_FILE}", file=sys.stderr)
        return 2
    try:
        out = plot_metrics(path, args.output, smoothing=args.smoothing)
    except ValueError as err:
        print(f"cannot plot {str(path)!r}: {err}", file=sys.stderr)
        return 2
    print(out)
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with its usage errors on one line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def cmd_serve(args: argparse.Namespace) -> int:
    from llm_envs.serve import serve

    try:
        make_kwargs = json.loads(args.make_kwargs)
    except ValueError as err:
        raise ValueError(f"--make-kwargs must be a JSON object: {err}") from err
    if not isinstance(make_kwargs, dict):
        raise ValueError(f"--make-kwargs must be a JSON object, got {args.make_kwargs!r}.")
    if args.protocol is not None:
        make_kwargs["protocol"] = args.protocol
    serve(args.env_id, announce=True, host=args.host, port=args.port, imports=args.imports, log_level=args.log_level,
          max_sessions=args.max_sessions, resume_timeout_s=args.resume_timeout_s, idle_timeout_s=args.idle_timeout_s,
          max_message_bytes=args.max_message_bytes, drain_timeout_s=args.drain_timeout_s, replica=args.replica,
          **({} if args.max_concurrent_steps is None else {"max_concurrent_steps": args.max_concurrent_steps}),
          **make_kwargs)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from baselines.infra.report import write_report

    print(write_report(args.run_dir, args.output))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="llm-envs", description=__doc__.split("\n")[0])
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error (anywhere on the line)")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("list", help="registered env ids with one-line descriptions")
    p.set_defaults(func=cmd_list)
    p = sub.add_parser("demo", help="a scripted rollout on a writing env (no model needed)")
    p.add_argument("--env", default="writing/xsum-v0", help="env id (default: %(default)s)")
    p.add_argument("--episodes", type=int, default=3, help="number of episodes (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the first episode (default: %(default)s)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser(
        "train", help="train agents with a baseline learner (magrpo, ppo/iac, maac, cory, madpo, marlhf)",
        add_help=False
    )
    p.add_argument("algo", choices=LEARNERS, help="learner")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="learner flags (see `llm-envs train <algo> --help`)")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", help="evaluate a policy (default model or a checkpoint) on the eval split")
    p.add_argument("--env", default=None, help="env id (default: the checkpoint's, else writing/xsum-v0)")
    p.add_argument("--model", default=None, help="HF model id or local dir (default: embedded SmolLM2-135M)")
    p.add_argument("--checkpoint", default=None, help="a run directory or checkpoint directory to load adapters from")
    p.add_argument("--num-problems", type=int, default=8, help="eval problems (default: %(default)s)")
    p.add_argument("--num-samples", type=int, default=1, help="samples per problem (default: %(default)s)")
    p.add_argument("--k", type=int, nargs="+", default=None,
                   help="pass@k values on coding and math envs (default: those of 1, 5, 10 <= --num-samples)")
    p.add_argument("--sample", action="store_true", help="sample even with one sample per problem (default: greedy)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (default: %(default)s)")
    p.add_argument("--top-p", type=float, default=0.9, help="nucleus mass (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=0, help="top-k sampling, 0 disables it (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="response length (default: the checkpoint's, else the env's: 256 on GSM8K)")
    p.add_argument("--max-source-words", type=int, default=None, help="writing envs: cut sources to N words")
    p.add_argument("--data-path", default=None, help="local copy of a hub dataset")
    p.add_argument("--num-turns", type=int, default=1, help="turns per episode (default: %(default)s)")
    p.add_argument("--centralized", action="store_true",
                   help="one model writes every role as tagged sections (default: the checkpoint's setting)")
    p.add_argument("--prefill", action="store_true",
                   help="with --centralized: the env writes the first role's opening tag at the start of each response")
    p.add_argument("--seed", type=int, default=0, help="seed (default: %(default)s)")
    p.add_argument("--device", default=None,
                   help="torch device, e.g. cpu, cuda, cuda:1 (default: a GPU when one is visible, else the CPU)")
    p.add_argument("--dtype", default=None,
                   help="the base model's dtype, e.g. bfloat16, float32 (default: bfloat16 on a GPU or a CPU with "
                        "native bf16, else float32)")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("serve", help="serve an env over OpenEnv (docs/serving.md; needs the 'serve' extra)")
    p.add_argument("env_id", help="registered env id (llm-envs list)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s, this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default: %(default)s)")
    p.add_argument("--max-sessions", type=int, default=64,
                   help="sessions at once, connected or awaiting a resume; past it OpenEnv's capacity error "
                        "(default: %(default)s)")
    p.add_argument("--resume-timeout-s", type=float, default=60.0,
                   help="how long a session whose connection dropped waits for a resume (default: %(default)s)")
    p.add_argument("--idle-timeout-s", type=float, default=900.0,
                   help="how long a connected socket may stay silent (default: %(default)s)")
    p.add_argument("--max-message-bytes", type=int, default=1 << 20,
                   help="longest message read; longer ones get MESSAGE_TOO_LARGE (default: %(default)s)")
    p.add_argument("--drain-timeout-s", type=float, default=30.0,
                   help="on SIGTERM, how long steps in flight may take to finish (default: %(default)s)")
    p.add_argument("--max-concurrent-steps", type=int, default=None,
                   help="resets and steps run at once, whatever the sessions (default: twice the cores); a code env "
                        "runs at most that many programs")
    p.add_argument("--replica", default=None,
                   help="this replica's name, the prefix of its session ids, for a proxy in front of several "
                        "(docs/serving.md, replicas)")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import a module first (one that registers tasks of your own); repeatable")
    p.add_argument("--protocol", choices=["parallel", "sequential"], default=None,
                   help="serve the env under this protocol (default: the id's)")
    p.add_argument("--make-kwargs", default="{}", metavar="JSON",
                   help='more arguments of llm_envs.make as a JSON object, e.g. \'{"max_new_tokens": 64}\'')
    p.add_argument("--log-level", default="warning", help="uvicorn's log level (default: %(default)s)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("plot", help="PNG learning curves per reward component from a run's metrics.jsonl")
    p.add_argument("path", help="run directory or metrics.jsonl")
    p.add_argument("--output", default=None, help="PNG path (default: learning_curves.png next to the JSONL)")
    p.add_argument("--smoothing", type=int, default=5, help="moving-average window (default: %(default)s)")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("report", help="one self-contained HTML page of a run: config, curves, eval, transcripts")
    p.add_argument("run_dir", help="run directory (holds metrics.jsonl and samples.jsonl)")
    p.add_argument("--output", default=None, help="HTML path (default: report.html in the run directory)")
    p.set_defaults(func=cmd_report)
    return parser


INPUT_ERRORS = (ValueError, TypeError, LookupError, OSError)
"""Exceptions that mean bad input (values, names, paths, files): exit status 2; anything else: 1."""


def one_line(err: BaseException) -> str:
    """An exception's message on one line (a KeyError without its quotes)."""
    text = err.args[0] if isinstance(err, KeyError) and len(err.args) == 1 else str(err)
    return " ".join(str(text).split()) or type(err).__name__


def _warnings_in_one_line(default):
    """``warnings.showwarning`` that prints llm-envs' own warnings as one line (others as before)."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        from baselines.infra.checkpoints import CheckpointFallbackWarning

        if issubclass(category, CheckpointFallbackWarning):
            print(f"llm-envs: warning: {' '.join(str(message).split())}", file=file or sys.stderr)
        else:
            default(message, category, filename, lineno, file, line)

    return show


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status. Errors are one line on stderr unless --debug."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    args = build_parser().parse_args([a for a in argv if a != "--debug"])
    with warnings.catch_warnings():
        if not debug:
            warnings.showwarning = _warnings_in_one_line(warnings.showwarning)
        try:
            return int(args.func(args))
        except Exception as err:
            if debug:
                raise
            status = 2 if isinstance(err, INPUT_ERRORS) else 1
            kind = "" if isinstance(err, INPUT_ERRORS) else f"{type(err).__name__}: "
            name = " ".join(["llm-envs", args.command, *([args.algo] if args.command == "train" else [])])
            print(f"{name}: error: {kind}{one_line(err)} (--debug shows the traceback)", file=sys.stderr)
            return status


if __name__ == "__main__":
    raise SystemExit(main())
