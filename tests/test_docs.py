"""Every example of README.md and docs/*.md runs as written: each page's fenced ``python`` blocks, in page
order and in one namespace (as if concatenated into one script), in a fresh temporary folder, offline
(HF_HUB_OFFLINE=1, tests/conftest.py). One test per page.

A block that cannot run here says so with an HTML comment on the line right before its fence:

    <!-- docs-test: skip (needs the HF hub) -->        not run; the reason in parentheses is compulsory
    <!-- docs-test: raises EnvCheckError -->            must raise that exception (the page shows a failure)
    <!-- docs-test: file my_tasks.py -->               compiled and written to that file, not run (a module or
                                                       a test file of the page's)

A marker is a line of its own (one in running text, as here, is no marker). Anything else after
``docs-test:``, a skip without its reason or a marker that is not right before a ``python`` block fails the
page's test.
"""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

CLIENTS = ("supersuit", "torchrl")
"""The MARL libraries of the ``clients`` extra that docs/marl-integration.md's blocks import."""

FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`\s]*)")
MARKER = re.compile(r"^[ ]{0,3}<!--\s*docs-test:(?P<body>.*?)-->", re.S | re.M)  # on lines of its own
SKIP = re.compile(r"^skip\s+\((?P<reason>[^()]*\S[^()]*)\)$")
RAISES = re.compile(r"^raises\s+(?P<error>[A-Za-z_][\w.]*)$")
FILE = re.compile(r"^file\s+(?P<name>[\w./-]+\.py)$")


@dataclass(frozen=True)
class Block:
    """One fenced python block: its first code line (1-based) in the page, its code and its marker."""

    line: int
    code: str
    action: str = "run"  # run | skip | raises | file
    argument: str = ""  # the skip's reason, the exception's name or the file's name


def parse_marker(text: str, where: str) -> tuple[str, str]:
    """``(action, argument)`` of a ``docs-test:`` comment's text; a ValueError naming ``where`` if it is malformed."""
    body = " ".join(text.split())
    for action, pattern in (("skip", SKIP), ("raises", RAISES), ("file", FILE)):
        match = pattern.match(body)
        if match:
            return action, next(iter(match.groupdict().values())).strip()
    raise ValueError(
        f"{where}: malformed marker <!-- docs-test: {body} -->; write `skip (the reason it cannot run here)`, "
        "`raises ExceptionName` or `file name.py`"
    )


def python_blocks(page: Path) -> list[Block]:
    """The page's fenced python blocks with their markers (ValueError on a malformed or stray marker)."""
    text = page.read_text(encoding="utf-8")
    lines = text.splitlines()
    name = page.relative_to(ROOT)
    blocks: list[Block] = []
    markers = {}  # the line (0-based) of the fence a marker stands right before -> (action, argument)
    for match in MARKER.finditer(text):
        end_line = text.count("\n", 0, match.end())
        where = f"{name}:{end_line + 1}"
        nxt = end_line + 1
        fence = FENCE.match(lines[nxt]) if nxt < len(lines) else None
        if fence is None or fence["info"] not in ("python", "py"):
            raise ValueError(f"{where}: a docs-test marker must be on the line right before a ```python fence")
        markers[nxt] = parse_marker(match["body"], where)
    for info, first, code_lines in fenced_blocks(text):
        if info in ("python", "py"):
            action, argument = markers.get(first - 2, ("run", ""))
            blocks.append(Block(first, "\n".join(code_lines), action, argument))
    return blocks


def fenced_blocks(text: str) -> Iterator[tuple[str, int, list[str]]]:
    """``(info, first line 1-based, lines)`` of every fenced block of a page, the fence's indent taken off."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        close = re.compile(rf"^ {{0,3}}{opening['fence'][0]}{{{len(opening['fence'])},}}\s*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        indent = len(opening["indent"])
        yield opening["info"], i + 2, [line[indent:] if line[:indent].isspace() else line for line in lines[i + 1 : j]]
        i = j + 1


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


# Pages with a python fence (a malformed marker fails their tests, not the collection of this file).
RUNNABLE = [page for page in PAGES if re.search(r"^ {0,3}(`{3,}|~{3,})\s*py(thon)?\b", page.read_text(), re.M)]
SLOW = {
    "docs/agents.md": "the default model acts on a parallel and an AEC env",
    "docs/marl-integration.md": "the default model acts token by token on a vector env; TorchRL's import",
    "docs/teams.md": "two bases of the default model",
    "docs/trl.md": "two GRPO steps of the default model (TRL)",
}
"""Pages whose blocks load and run the embedded model (pytest -m slow, as the suite's other such tests)."""


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_markers_are_well_formed(page):
    """Parsing raises on a malformed or stray marker; a skip always says why."""
    for block in python_blocks(page):
        assert block.action != "skip" or block.argument, (page_id(page), block.line)


def test_a_marker_without_a_reason_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    page = tmp_path / "page.md"
    for marker, message in [
        ("<!-- docs-test: skip -->", "malformed marker"),
        ("<!-- docs-test: skip () -->", "malformed marker"),
        ("<!-- docs-test: ignore (why) -->", "malformed marker"),
        ("<!-- docs-test: skip (why) -->\n\n", "right before a ```python fence"),
    ]:
        page.write_text(f"Text.\n\n{marker}\n```python\nprint(1)\n```\n")
        with pytest.raises(ValueError, match=re.escape(message)):
            python_blocks(page)
    page.write_text("<!-- docs-test: skip (needs the\n HF hub) -->\n```python\nx = 1\n```\n\n```py\ny = 2\n```\n"
                    "Mark it `<!-- docs-test: skip (why) -->` in running text: no marker.\n")
    assert python_blocks(page) == [Block(4, "x = 1", "skip", "needs the HF hub"), Block(8, "y = 2")]


@pytest.fixture
def page_sandbox(tmp_path, monkeypatch):
    """A fresh folder as the working directory and first on sys.path (as ``python page.py`` in it), a
    module of its own for the page's names (functions defined there pickle), and the env registry as
    the built-in ids left it: the ids a page registers (and other tests' ``mine/...``) do not leak."""
    import llm_envs
    from llm_envs.core import registry

    llm_envs.list_envs()  # the built-in ids
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    saved = dict(registry._REGISTRY)
    for env_id, spec in saved.items():
        if not registry._is_builtin(spec):
            del registry._REGISTRY[env_id]
    before = set(sys.modules)
    module = types.ModuleType("docs_page")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    yield module
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved)
    for name in set(sys.modules) - before:  # modules the page wrote and imported (my_tasks)
        if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]


def test_the_slow_pages_exist():
    assert set(SLOW) <= {page_id(page) for page in RUNNABLE}, "a page in SLOW has no python block (any more)"


@pytest.mark.parametrize(
    "page", [pytest.param(page, marks=[pytest.mark.slow] if page_id(page) in SLOW else []) for page in RUNNABLE],
    ids=page_id,
)
def test_page_examples_run(page, page_sandbox):
    namespace = page_sandbox.__dict__
    for block in python_blocks(page):
        if block.action == "skip":
            continue
        if block.action == "file":  # a module or test file of the page's: it must at least compile
            compile(block.code, f"{page_id(page)}:{block.line} ({block.argument})", "exec")
            Path(block.argument).write_text(block.code + "\n", encoding="utf-8")
            continue
        # Line numbers of a traceback are the page's own.
        code = compile("\n" * (block.line - 1) + block.code, str(page), "exec")
        if block.action == "raises":
            with pytest.raises(Exception) as info:  # the type is checked by name below
                exec(code, namespace)
            assert type(info.value).__name__ == block.argument.rsplit(".", 1)[-1], (
                f"{page_id(page)}:{block.line}: raised {type(info.value).__name__}, the page says {block.argument}"
            )
        else:
            try:
                exec(code, namespace)
            except ModuleNotFoundError as err:
                if err.name and err.name.split(".")[0] in CLIENTS:
                    pytest.fail(f"{page_id(page)}:{block.line}: {err}; the `clients` extra installs it: "
                                'pip install -e ".[clients]" (scripts/setup.sh does)')
                raise
