"""Every shell command of README.md and docs/*.md parses as written, without running anything: each line of a
fenced ``bash``/``sh``/``shell``/``console`` block that runs ``llm-envs``, ``python``, ``torchrun``, ``accelerate
launch``, ``make``, ``pip`` or ``pytest`` goes through the real parsers (``llm-envs``'s argparse and, for ``train``,
the learner's tyro config; a script's own argparse parser; torchrun's and Accelerate's; the Makefile's targets).
One test per page; the unit tests at the end break a fake page on purpose.

What else is checked:

- A file a command reads (an argument that is a relative path with a data, code or config extension, e.g.
  ``--data-path fixture.jsonl`` or ``python bench/x.py``) exists in the repository or is written by an earlier
  line of the same page (``--output FILE``, ``> FILE``) or by one of its python blocks (``docs-test: file``).
- A command that needs what a new user's machine may not have says so in its comment, with ``needs:``::

      llm-envs train maac --model Qwen/Qwen2.5-Coder-3B --device cuda   # needs: hub, gpu; the 3B coder

  ``needs:`` takes ``hub``, ``gpu`` and ``two machines``, separated by commas, up to a ``;`` or the comment's
  end. A comment line of its own (``# needs: two machines``) marks every command after it in the block. What
  needs them is decided by the real defaults: the hub, a model that is not the embedded default (``--model``,
  ``--agent-models``, ``--critic-model``, ... or a preset's) or an env id whose data source is hub-only and no
  ``--data-path``; a GPU, ``--device cuda`` or ``make test-gpu``; two machines, torchrun's ``--nnodes`` or
  Accelerate's ``--num_machines`` above 1. A ``hub`` mark on a command that needs no hub fails too (stale).
- An all-capitals argument (``ID``, ``RUN_DIR``) is a placeholder: it parses, but names no env or file.
- An unlabelled fence whose first line is one of these commands must be labelled ``bash``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import importlib.util
import io
import re
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import pytest
from test_docs import PAGES, ROOT, fenced_blocks, page_id, python_blocks

SHELL = ("bash", "sh", "shell", "console")
NEEDS = ("hub", "gpu", "two machines")
NEEDS_CLAUSE = re.compile(r"\bneeds:\s*(?P<items>[^;()]*)")
FILE_SUFFIXES = (".jsonl", ".json", ".py", ".conf", ".csv", ".parquet", ".yaml", ".yml", ".toml", ".cfg", ".ini",
                 ".txt")
"""Arguments with these suffixes name files a command reads (unless an output flag precedes them)."""
OUTPUT_FLAGS = ("--output", "--output-dir", "-o", ">", ">>")
OPERATORS = (";", "&", "&&", "||", "|")
OTHER = {"openenv", "mkdir", "nginx", "wait", "cd", "export", ".", "source", "git", "hf", "huggingface-cli",
         "curl", "cat", "echo", "kill", "ls", "docker", "apt-get", "sudo", "uvicorn", "chromium"}
"""Commands that are not this project's: allowed, not parsed."""
LEADING = re.compile(r"^(?:\.venv/bin/)?(?P<name>llm-envs|python3?|torchrun|accelerate|pytest|pip3?|make)$")
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")


class CommandError(Exception):
    """A command line that does not parse, names a missing file or is not marked as its needs require."""


@dataclass
class Command:
    """One logical command line of a shell block: its first line (1-based) in the page, its code (continuation
    lines joined, comment removed), its comment and the needs it is marked with."""

    line: int
    code: str
    comment: str = ""
    marked: set[str] = field(default_factory=set)


# --------------------------------------------------------------------------------------------- reading pages


def split_comment(line: str) -> tuple[str, str]:
    """``(code, comment)`` of a shell line: the comment starts at a ``#`` outside quotes at the line's start or
    after whitespace."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1 :].strip()
    return line.rstrip(), ""


def parse_needs(comment: str, where: str) -> set[str]:
    """The needs a comment's ``needs:`` clauses name (CommandError on an unknown one)."""
    marked = set()
    for match in NEEDS_CLAUSE.finditer(comment):
        for item in match["items"].split(","):
            item = " ".join(item.split())
            if item not in NEEDS:
                raise CommandError(f"{where}: unknown need {item!r} in `needs:`; write one or more of {NEEDS}")
            marked.add(item)
    return marked


def looks_like_command(line: str) -> bool:
    code, _ = split_comment(line.removeprefix("$ "))
    words = code.split()
    while words and re.match(r"^[A-Za-z_]\w*=", words[0]):
        words = words[1:]
    return bool(words) and LEADING.match(words[0]) is not None


def shell_commands(text: str, name: str) -> tuple[list[Command], list[str]]:
    """The commands of a page's shell blocks, and the problems found while reading them (a malformed ``needs:``,
    an unlabelled fence of commands)."""
    commands, problems = [], []
    for info, first, lines in fenced_blocks(text):
        if info == "":
            if lines and looks_like_command(lines[0]):
                problems.append(f"{name}:{first}: a block of shell commands: label its fence ```bash")
            continue
        if info not in SHELL:
            continue
        block_marks: set[str] = set()
        k = 0
        while k < len(lines):
            start, raw = first + k, lines[k]
            k += 1
            if info == "console":
                if not raw.startswith("$ "):
                    continue  # output
                raw = raw[2:]
            code, comment = split_comment(raw)
            try:
                if not code.strip():
                    if comment.startswith("needs:"):
                        block_marks |= parse_needs(comment, f"{name}:{start}")
                    continue
                parts, comments = [code], [comment]
                while parts[-1].endswith("\\") and k < len(lines):
                    parts[-1] = parts[-1][:-1]
                    code, comment = split_comment(lines[k])
                    k += 1
                    parts.append(code)
                    comments.append(comment)
                comment = "; ".join(c for c in comments if c)
                marked = block_marks | parse_needs(comment, f"{name}:{start}")
            except CommandError as err:
                problems.append(str(err))
                continue
            commands.append(Command(start, " ".join(p.strip() for p in parts), comment, marked))
    return commands, problems


# --------------------------------------------------------------------------------------------- parsing commands


@dataclass
class Outcome:
    """What parsing one simple command found: the needs (need -> why), the files it reads and writes."""

    needs: dict[str, str] = field(default_factory=dict)
    reads: list[str] = field(default_factory=list)
    writes: list[str] = field(default_factory=list)
    analysed: bool = False  # whether its hub needs were worked out (a command of ours, fully parsed)


def run_parser(what: str, parse) -> object:
    """``parse()`` with its printing captured; CommandError with argparse's (or tyro's) one-line error."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            return parse()
    except SystemExit as exit_:
        if not exit_.code:
            return None  # --help
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        message = lines[-1] if lines else f"exit status {exit_.code}"
        raise CommandError(f"{what} does not parse: {message}") from None


def model_values(value: object) -> Iterator[str]:
    """Model names in a config value: a name, ``agent=MODEL`` entries, a mapping agent -> model."""
    if value is None:
        return
    if isinstance(value, dict):
        for item in value.values():
            yield from model_values(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from model_values(item)
    elif isinstance(value, str):
        yield value.partition("=")[2] if "=" in value else value


def model_needs(values: dict[str, object], outcome: Outcome) -> None:
    """Hub need of every model-valued setting (a name containing ``model``) that is a hub id."""
    from llm_envs.tokenizers import DEFAULT_TOKENIZER, looks_like_hub_id

    for key, value in values.items():
        if "model" not in key:
            continue
        for name in model_values(value):
            if not name or name == DEFAULT_TOKENIZER or PLACEHOLDER.match(name) or (ROOT / name).exists():
                continue
            if looks_like_hub_id(name):
                outcome.needs.setdefault("hub", f"the model {name!r} ({key.replace('_', '-')}) is not the embedded "
                                                "default")


class _HubRead(Exception):
    """Raised in place of reading a dataset (the hub's when ``data_path`` is None)."""

    def __init__(self, dataset: str, data_path: str | None) -> None:
        super().__init__(dataset)
        self.dataset, self.data_path = dataset, data_path


def env_needs(env_id: str | None, data_path: str | None, outcome: Outcome) -> None:
    """Check that ``env_id`` is registered and record a hub need when its data source is hub-only (its task
    asks for a hub dataset with no ``data_path``); nothing is read."""
    if env_id is None or PLACEHOLDER.match(env_id):
        return
    import llm_envs
    import llm_envs.data
    from llm_envs.core import registry

    if env_id not in llm_envs.list_envs():
        raise CommandError(f"unknown env id {env_id!r} (llm-envs list)")
    spec = registry._REGISTRY[env_id]
    params = spec.task_params()
    kwargs = dict(spec.kwargs)
    if data_path is not None and (params is None or "data_path" in params):
        kwargs["data_path"] = data_path

    def read(dataset, config, split, path):
        raise _HubRead(dataset, path)

    with mock.patch.object(llm_envs.data, "_load_rows", read):
        task = spec.task(**{k: v for k, v in kwargs.items() if params is None or k in params})
        for split in ("train", "eval"):
            try:
                task.problems(split)
            except _HubRead as hub:
                if hub.data_path is None:
                    outcome.needs.setdefault("hub", f"{env_id} reads the hub dataset {hub.dataset!r} (no "
                                                    "--data-path)")
                return


def device_needs(device: object, outcome: Outcome) -> None:
    if device is not None and str(device).startswith("cuda"):
        outcome.needs.setdefault("gpu", f"--device {device}")


def check_train(algo: str, rest: list[str], outcome: Outcome) -> None:
    from baselines.infra.cli import parse_train_config

    config = run_parser(f"llm-envs train {algo}", lambda: parse_train_config(algo, rest))
    if config is None:  # --help
        return
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    model_needs(values, outcome)
    env_needs(config.env, config.data_path, outcome)
    device_needs(config.device, outcome)
    outcome.analysed = True


def check_llm_envs(args: list[str], outcome: Outcome) -> None:
    from baselines.infra.cli import build_parser

    ns = run_parser("llm-envs", lambda: build_parser().parse_args([a for a in args if a != "--debug"]))
    if ns is None:
        return
    if ns.command == "train":
        check_train(ns.algo, list(ns.rest), outcome)
    elif ns.command == "eval":
        model_needs({"model": ns.model}, outcome)
        env_needs(ns.env if ns.env or ns.checkpoint else "writing/xsum-v0", ns.data_path, outcome)
        device_needs(ns.device, outcome)
        outcome.analysed = True
    elif ns.command in ("serve", "demo"):
        env_needs(ns.env_id if ns.command == "serve" else ns.env, None, outcome)
        outcome.analysed = True


def script_parser(path: Path) -> argparse.ArgumentParser:
    """The argparse parser of a script: its ``build_parser()``, or else the one its ``main()`` builds (caught
    at ``parse_args``, before anything runs)."""
    spec = importlib.util.spec_from_file_location(f"_docs_script_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    # As `python path/script.py` runs it: its folder first on sys.path; in sys.modules while it loads (dataclasses
    # look their module up there). The modules it imports stay loaded (numpy's cannot be loaded twice).
    with mock.patch.object(sys, "path", [str(path.parent), str(ROOT), *sys.path]):
        sys.modules[spec.name] = module
        try:
            spec.loader.exec_module(module)
        finally:
            sys.modules.pop(spec.name, None)
        if hasattr(module, "build_parser"):
            return module.build_parser()

        class Caught(Exception):
            pass

        def catch(self, *args, **kwargs):
            raise Caught(self)

        with mock.patch.object(argparse.ArgumentParser, "parse_args", catch), \
                mock.patch.object(argparse.ArgumentParser, "parse_known_args", catch), \
                mock.patch.object(sys, "argv", [str(path)]):
            try:
                module.main()
            except Caught as caught:
                return caught.args[0]
    raise CommandError(f"{path.relative_to(ROOT)} has no build_parser() and its main() builds no argparse parser")


def check_python(args: list[str], outcome: Outcome) -> None:
    if args[:1] == ["-m"]:
        module, rest = args[1], args[2:]
        if module == "baselines.infra.cli":
            return check_llm_envs(rest, outcome)
        if module.startswith("baselines.learners."):
            return check_train(module.rsplit(".", 1)[1], rest, outcome)
        if importlib.util.find_spec(module) is None:
            raise CommandError(f"no module {module!r}")
        return
    if not args or not args[0].endswith(".py"):
        raise CommandError(f"python {' '.join(args[:1])}: not a script of the repository (python path/script.py)")
    script, rest = args[0], args[1:]
    path = ROOT / script
    if not path.is_file():
        raise CommandError(f"no script {script} in the repository")
    ns = run_parser(f"python {script}", lambda: script_parser(path).parse_args(rest))
    if ns is None:
        return
    values = vars(ns)
    model_needs(values, outcome)
    env = values.get("env_id", values.get("env"))
    if isinstance(env, str):
        env_needs(env, values.get("data_path"), outcome)
    device_needs(values.get("device"), outcome)
    outcome.analysed = True


def check_torchrun(args: list[str], outcome: Outcome) -> None:
    from torch.distributed.run import get_args_parser

    ns = run_parser("torchrun", lambda: get_args_parser().parse_args(args))
    if max(int(n) for n in str(ns.nnodes).split(":")) > 1:
        outcome.needs.setdefault("two machines", f"--nnodes {ns.nnodes}")
    script = ["-m", ns.training_script] if ns.module else [ns.training_script]
    check_python([*script, *ns.training_script_args], outcome)


def check_accelerate(args: list[str], outcome: Outcome) -> None:
    if args[:1] != ["launch"]:
        raise CommandError(f"accelerate {' '.join(args[:1])}: only `accelerate launch` is checked")
    from accelerate.commands.launch import launch_command_parser

    ns = run_parser("accelerate launch", lambda: launch_command_parser().parse_args(args[1:]))
    if ns.num_machines is not None and int(ns.num_machines) > 1:
        outcome.needs.setdefault("two machines", f"--num_machines {ns.num_machines}")
    script = ["-m", ns.training_script] if ns.module else [ns.training_script]
    check_python([*script, *ns.training_script_args], outcome)


def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return {m for m in re.findall(r"^([A-Za-z][\w.-]*)\s*:(?!=)", text, re.M)}


def check_make(args: list[str], outcome: Outcome) -> None:
    targets = [a for a in args if not a.startswith("-") and "=" not in a] or ["setup"]
    for target in targets:
        if target not in makefile_targets():
            raise CommandError(f"make {target}: no such target in the Makefile")
        if target == "test-gpu":
            outcome.needs.setdefault("gpu", "make test-gpu")


def check_pip(args: list[str], outcome: Outcome) -> None:
    import tomllib

    if args[:1] != ["install"]:
        return
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    for arg in args[1:]:
        match = re.fullmatch(r"\.\[(?P<extras>[\w,-]+)\]", arg)
        if match:
            unknown = set(match["extras"].split(",")) - extras
            if unknown:
                raise CommandError(f"pip install {arg}: no extra {sorted(unknown)} in pyproject.toml "
                                   f"({sorted(extras)})")


def check_pytest(args: list[str], outcome: Outcome, page_modules: set[str]) -> None:
    for i, arg in enumerate(args):
        if arg == "--llm-envs-check" and i + 1 < len(args):
            module, _, env_id = args[i + 1].rpartition(":")
            if module and module not in page_modules and importlib.util.find_spec(module) is None:
                raise CommandError(f"--llm-envs-check {args[i + 1]}: no module {module!r} (nor a file of the page's)")
            if not module:
                env_needs(env_id, None, outcome)


def simple_commands(code: str) -> list[list[str]]:
    """The simple commands of a line (split at ``;``, ``&``, ``&&``, ``||``, ``|``), as word lists."""
    lexer = shlex.shlex(code, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in OPERATORS:
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def file_arguments(words: list[str], outcome: Outcome) -> list[str]:
    """The words without redirections; the files they read and write recorded in ``outcome``."""
    kept, previous = [], None
    for word in words:
        value = word.partition("=")[2] if word.startswith("--") and "=" in word else word
        value = re.sub(r"^\$\{?PWD\}?/", "", value)
        if previous in OUTPUT_FLAGS:
            outcome.writes.append(value)
        elif (value.endswith(FILE_SUFFIXES) and not value.startswith(("-", "/")) and "://" not in value
              and not PLACEHOLDER.match(Path(value).stem)):
            outcome.reads.append(value)
        if word not in (">", ">>", "<") and previous not in (">", ">>", "<"):
            kept.append(word)
        previous = word.partition("=")[0] if word.startswith("--") and "=" in word else word
    return kept


def check_command(command: Command, written: set[str], page_modules: set[str]) -> list[str]:
    """Problems of one command (empty when it parses, its files exist and its needs are marked); the files it
    writes are added to ``written``."""
    try:
        words_of = simple_commands(command.code)
    except ValueError as err:  # an unclosed quote
        return [f"line {command.line}: `{command.code}`: {err}"]
    problems, needs, analysed = [], {}, False
    for words in words_of:
        outcome = Outcome()
        try:
            words = file_arguments(words, outcome)
            while words and re.match(r"^[A-Za-z_]\w*=", words[0]):
                words = words[1:]
            if not words:
                continue
            leading = LEADING.match(words[0])
            name, args = (leading["name"] if leading else words[0]), words[1:]
            if name == "llm-envs":
                check_llm_envs(args, outcome)
            elif name in ("python", "python3"):
                check_python(args, outcome)
            elif name == "torchrun":
                check_torchrun(args, outcome)
            elif name == "accelerate":
                check_accelerate(args, outcome)
            elif name == "make":
                check_make(args, outcome)
            elif name in ("pip", "pip3"):
                check_pip(args, outcome)
            elif name == "pytest":
                check_pytest(args, outcome, page_modules)
            elif name not in OTHER:
                raise CommandError(f"unknown command {name!r}")
            for path in outcome.reads:
                if not (ROOT / path).exists() and path not in written:
                    raise CommandError(f"{path} is neither in the repository nor written by an earlier line of the "
                                       "page (--output FILE, > FILE)")
        except CommandError as err:
            problems.append(f"line {command.line}: `{' '.join(words)}`: {err}")
            continue
        written.update(outcome.writes)
        for need, why in outcome.needs.items():
            needs.setdefault(need, why)
        analysed = analysed or outcome.analysed
    if not problems:
        for need, why in needs.items():
            if need not in command.marked:
                problems.append(f"line {command.line}: `{command.code}` needs {'the ' if need == 'hub' else ''}"
                                f"{need} ({why}): end its comment with `# needs: {need}`")
        if "hub" in command.marked and "hub" not in needs and analysed:
            problems.append(f"line {command.line}: `{command.code}` is marked `needs: hub` but reads no model or "
                            "dataset from the hub")
    return problems


def check_page(page: Path) -> list[str]:
    """Every problem of a page's shell commands, each naming the page and the line."""
    name = page_id(page) if page.is_relative_to(ROOT) else page.name
    text = page.read_text(encoding="utf-8")
    commands, problems = shell_commands(text, name)
    files = [b.argument for b in python_blocks(page) if b.action == "file"] if page.is_relative_to(ROOT) else []
    page_modules = {file.removesuffix(".py") for file in files}
    written = set(files)
    for command in commands:
        problems += [f"{name}:{problem.removeprefix('line ')}" for problem in check_command(command, written,
                                                                                              page_modules)]
    return problems


# --------------------------------------------------------------------------------------------- the tests

COMMAND_PAGES = [page for page in PAGES if shell_commands(page.read_text(encoding="utf-8"), page.name)[0]
                 or shell_commands(page.read_text(encoding="utf-8"), page.name)[1]]


@pytest.mark.parametrize("page", COMMAND_PAGES, ids=page_id)
def test_page_commands_parse(page):
    problems = check_page(page)
    assert not problems, "\n".join(problems)


def test_every_page_with_commands_is_checked():
    assert {page_id(p) for p in COMMAND_PAGES} >= {"README.md", "docs/classeval.md", "docs/scaling.md"}


@pytest.fixture
def fake_page(tmp_path, monkeypatch):
    """A page of our own, read against the real repository."""
    page = tmp_path / "page.md"

    def write(body: str) -> list[str]:
        page.write_text(f"Text.\n\n```bash\n{body}\n```\n", encoding="utf-8")
        return check_page(page)

    return write


def test_a_good_page_passes(fake_page):
    assert fake_page(
        "python tests/hub_fixtures.py coding/classeval-v0 --output fixture.jsonl\n"
        "llm-envs train magrpo --env coding/classeval-v0 --data-path fixture.jsonl --num-iterations 2 \\\n"
        "    --num-problems 2   # a comment\n"
        "llm-envs train maac --model Qwen/Qwen2.5-0.5B-Instruct --device cuda   # needs: hub, gpu; on a GPU\n"
        "# needs: two machines\n"
        "torchrun --nnodes 2 --nproc_per_node 4 -m baselines.learners.magrpo --env writing/xsum-v0\n"
        "make test-gpu GPU_PY=python   # needs: gpu\n"
        "llm-envs train magrpo --help\n"
        "llm-envs serve ID --port 8000 & openenv validate --url http://127.0.0.1:8000\n"
    ) == []


@pytest.mark.parametrize("body, message", [
    ("llm-envs train magrpo --num-iteration 2", "page.md:4: `llm-envs train magrpo --num-iteration 2`: llm-envs "
                                                "train magrpo does not parse: "),
    ("llm-envs eval --env writing/xsum-v0 --samples 3", "llm-envs does not parse: "),
    ("llm-envs train ppo --env nope/missing-v0", "unknown env id 'nope/missing-v0'"),
    ("python bench/decode_step.py --shape 9b", "python bench/decode_step.py does not parse: "),
    ("python bench/missing.py", "no script bench/missing.py"),
    ("make tests", "make tests: no such target"),
    ("frobnicate --all", "unknown command 'frobnicate'"),
    ("pip install -e '.[trian]'", "no extra ['trian']"),
    ("llm-envs train magrpo --env coding/classeval-v0 --data-path fixture.jsonl",
     "fixture.jsonl is neither in the repository nor written by an earlier line"),
    ("llm-envs train maac --model Qwen/Qwen2.5-0.5B-Instruct   # the Qwen",
     "needs the hub (the model 'Qwen/Qwen2.5-0.5B-Instruct' (model) is not the embedded default)"),
    ("llm-envs train cory --agent-models model_1=Qwen/Qwen2.5-0.5B-Instruct", "needs the hub"),
    ("llm-envs train magrpo --env writing/tldr-v0", "needs the hub (writing/tldr-v0 reads the hub dataset "
                                                    "'trl-lib/tldr' (no --data-path))"),
    ("llm-envs eval --env writing/xsum-v0 --device cuda", "needs gpu (--device cuda): end its comment with "
                                                          "`# needs: gpu`"),
    ("make test-gpu", "needs gpu (make test-gpu)"),
    ("torchrun --nnodes 2 --nproc_per_node 4 -m baselines.learners.magrpo", "needs two machines (--nnodes 2)"),
    ("llm-envs train magrpo --preset demo   # needs: hub", "is marked `needs: hub` but reads no model"),
    ("llm-envs list   # needs: cloud", "unknown need 'cloud'"),
])
def test_a_broken_line_fails(fake_page, body, message):
    problems = fake_page(body)
    assert len(problems) == 1 and problems[0].startswith("page.md:4: ") and message in problems[0], problems


def test_an_unlabelled_block_of_commands_fails(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```\nllm-envs list\n```\n\n```\nplain output\n```\n", encoding="utf-8")
    assert check_page(page) == ["page.md:2: a block of shell commands: label its fence ```bash"]


def test_a_written_file_counts_only_after_its_line(fake_page):
    problems = fake_page("llm-envs train magrpo --env coding/classeval-v0 --data-path f.jsonl --num-iterations 1\n"
                         "python tests/hub_fixtures.py coding/classeval-v0 --output f.jsonl")
    assert len(problems) == 1 and "f.jsonl is neither" in problems[0]
    assert fake_page("python tests/hub_fixtures.py coding/classeval-v0 > f.jsonl\n"
                     "llm-envs train magrpo --env coding/classeval-v0 --data-path f.jsonl") == []


def test_console_blocks_read_only_prompt_lines(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```console\n$ llm-envs list\nwriting/xsum-v0  ...\n$ llm-envs lst\n```\n", encoding="utf-8")
    problems = check_page(page)
    assert len(problems) == 1 and problems[0].startswith("page.md:4: `llm-envs lst`: llm-envs does not parse")
