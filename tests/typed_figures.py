"""The rules of tests/test_typed_figures.py: what a measured figure typed by hand and a verdict word look like in
a docs page's hand-written text (everything outside the rendered sections, code and links)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
"""Every page the guard reads: README and every docs page."""

RENDERED = re.compile(r"<!-- (figures|results):(\S+):begin.*?<!-- \1:\2:end[^\n]*", re.S)
"""A section that a script writes (``bench/figures.py``'s figures, ``bench/results.py``'s tables and readings)."""

ELSEWHERE = re.compile(r"<!-- not-reproducible:begin (?P<note>[^\n]*?) -->(?P<body>.*?)<!-- not-reproducible:end -->",
                       re.S)
"""Figures only a GPU gives, typed from a run whose JSON was not kept: the begin marker says where and when, and
the text in between says so too."""
ELSEWHERE_NOTE = re.compile(r"^measured on (?P<machine>[^,]*(?:GPU|NVIDIA|H100|H200|A100|L4|CUDA)[^,]*), "
                            r"(?P<date>\d{4}-\d{2}-\d{2}), not reproducible here$")
"""A not-reproducible block's note: the GPU that measured it, the date, and the words the reader sees."""

UNIT = (r"GB/s|TB/s|MB/s|[a-z]+/s|CPU-s|s/it|ms|µs|us|ns|GiB|MiB|KiB|GB|MB|"
        r"KB|kB|TB|seconds?|minutes?|min|hours?|s|%")
FIGURES = {
    "a number with a unit of time, memory, rate or share": re.compile(
        rf"(?<![\w.])(?<![A-Za-z_]-)~?-?\d[\d,]*(?:\.\d+)?\s?(?:{UNIT})(?![\w-])"),
    "a ratio (2.5x)": re.compile(r"(?<![\w.])\d+(?:\.\d+)?[x×](?![\w])"),
    "a number faster or slower": re.compile(r"\d[\d.,]*\s*(?:%\s*)?(?:times\s+)?(?:faster|slower|cheaper)\b"),
    "a measured change (a -> b)": re.compile(r"-?\d+\.\d+\s*(?:->|→)\s*-?\d+\.\d+"),
    "a measured value (three decimals or more)": re.compile(r"(?<![\w.])-?\d+\.\d{3,}(?![\d.])"),
    "a measured count (N of M pairs, responses, runs, samples)": re.compile(
        r"\b(?:none|\d+) of (?:the )?\d+\s+(?:\w+\s+)?(?:pairs|responses|runs|samples|problems)\b", re.I),
    "a measured value (a metric, accuracy or score given a number)": re.compile(
        r"\b(?:accuracy|scored?|goes from|measured)\s+(?:of\s+|at\s+)?-?\d+\.\d+", re.I),
}
"""What a figure measured looks like: a rule's name -> its pattern."""

WORDS = {
    "a verdict word (significant, beats, better)": re.compile(
        r"\b(?:significant|significantly|significance|beats?|beaten|better)\b", re.I),
    "a verdict 'holds' (a claim holding, not a thing holding another)": re.compile(
        r"\b(?:(?:does|did|do|would|may)(?: not|n't) hold\b|holds?\s+(?:up|true|against|across|in direction)\b|"
        r"(?:claim|effect|result|difference|finding|conclusion|comparison|reading|gain)s?\s+(?:still\s+)?holds?\b)",
        re.I),
}
"""Words that state a verdict, which only a rendered reading may state."""

ALLOWED: tuple[tuple[str, str, str], ...] = (
    ("docs/building.md", "spiders in 30 % of instances", "the generator's setting, not a measurement"),
    ("docs/classeval.md", "default 5 s; the class", "a default time limit"),
    ("docs/classeval.md", "default 30 s); a test that hangs", "a default time limit"),
    ("docs/classeval.md", "a 5 s timeout (ClassEval_35)", "a time limit written in the dataset's test"),
    ("docs/classeval.md", "(a 5 s test in ClassEval_35)", "a time limit written in the dataset's test"),
    ("docs/coding.md", "(one assertion, 3 s)", "a default time limit"),
    ("docs/coding.md", "(whole program, 10 s)", "a default time limit"),
    ("docs/magrpo.md", "2510.11062", "an arXiv id"),
    ("docs/magrpo.md", "bound the float32 peak: a 1 MiB mmap", "the allocator's threshold, a setting"),
    ("docs/magrpo.md", "(blocks from 1 MiB up handed back", "the allocator's threshold, a setting"),
    ("docs/cory-envs.md", "seeded split (seed 0, 20 %)", "the split's setting and the dataset's size"),
    ("docs/cory-envs.md", "seed 0, 20 %): 1055 / 264", "the split's setting and the dataset's size"),
    ("docs/marlhf.md", "blocks from 1 MiB handed back", "the allocator's threshold, a setting"),
    ("docs/marlhf.md", "target is a peak under 1.5 GB", "the issue's target, not a measurement"),
    ("docs/marlhf.md", "already maps blocks from 1 MiB", "the allocator's threshold, a setting"),
    ("docs/procgen.md", "2510.11062", "an arXiv id"),
    ("docs/procgen.md", "7 x 7 grid, 30% walls", "the generator's setting"),
    ("docs/procgen.md", "(5 x 5, 20% walls)", "the generator's setting"),
    ("docs/procgen.md", "5 s wall clock (task argument", "the tool's limits, settings"),
    ("docs/procgen.md", "row 2 has two 3s", "an example of the feedback's text"),
    ("docs/sandbox.md", "stops answering (10 s)", "a time limit the sandbox sets"),
    ("docs/sandbox.md", "wall clock per program [10 s]", "the sandbox's default limits"),
    ("docs/sandbox.md", "CPU time [10 s]", "the sandbox's default limits"),
    ("docs/sandbox.md", "memory [512 MB]", "the sandbox's default limits"),
    ("docs/sandbox.md", "file size [8 MB]", "the sandbox's default limits"),
    ("docs/sandbox.md", "total disk [16 MB, 512 files]", "the sandbox's default limits"),
    ("docs/sandbox.md", "captured output [16 KB each", "the sandbox's default limits"),
    ("docs/sandbox.md", "returned value size [1 MB]", "the sandbox's default limits"),
    ("docs/sandbox.md", "printing 1 GB", "what a hostile test program does"),
    ("docs/sandbox.md", "memory bombs that fill 512 MB in 16 MB", "what the bench's hostile programs do"),
    ("docs/sandbox.md", "memory bombs fill 512 MB on each of", "what the bench's hostile programs do"),
    ("docs/scaling.md", "134.5 M: 538 MB in fp32", "the model's parameter count times the dtype's bytes"),
    ("docs/scaling.md", "4.88 M parameters: 19.5 MB fp32", "the adapter's parameter count times 4 bytes"),
    ("docs/scaling.md", "about 78 MB fp32", "four copies of the adapter's parameters, arithmetic"),
    ("docs/scaling.md", "time out after 30 minutes", "a default timeout"),
    ("docs/serving.md", "(default 60 s) resumes", "a default timeout"),
    ("docs/serving.md", "(default 900 s) is told", "a default timeout"),
    ("docs/serving.md", "(default 1 MiB)", "a default limit"),
    ("docs/serving.md", "drops 20% of the episodes", "the bench's fault setting"),
    ("docs/testing.md", "a pickled env is under 1 MB", "the checker's limit"),
)
"""(page, a fragment of the line, why it is no measurement): the explicit exceptions, each one used."""


def hand_written(text: str) -> str:
    """The page's text a person typed: rendered sections, valid not-reproducible blocks, code blocks, inline code,
    HTML comments and link targets blanked (their lines kept, so line numbers stay the page's)."""
    blank = lambda m: "\n" * m.group(0).count("\n")  # noqa: E731
    text = RENDERED.sub(blank, text)
    text = ELSEWHERE.sub(lambda m: blank(m) if ELSEWHERE_NOTE.match(m.group("note"))
                         and "not reproducible here" in m.group("body") else m.group(0), text)
    text = re.sub(r"^(`{3,}|~{3,}).*?^\1", blank, text, flags=re.S | re.M)
    text = re.sub(r"<!--.*?-->", blank, text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "CODE", text)
    return re.sub(r"\]\([^)]*\)", "]", text)


def findings(page: str, text: str, allowed=ALLOWED) -> list[tuple[int, str, str, str | None]]:
    """Every typed figure and verdict word of a page's hand-written text: (line number, rule, the line, the
    allow-list reason when an entry excuses it)."""
    found = []
    for number, line in enumerate(hand_written(text).splitlines(), 1):
        for rule, pattern in {**FIGURES, **WORDS}.items():
            if pattern.search(line):
                reason = next((why for where, fragment, why in allowed if where == page and fragment in line), None)
                found.append((number, rule, line.strip(), reason))
    return found


def unmarked_blocks(text: str) -> list[str]:
    """Not-reproducible blocks whose note or text does not say where, when and that it is not reproducible here."""
    return [m.group("note") for m in ELSEWHERE.finditer(text)
            if not (ELSEWHERE_NOTE.match(m.group("note")) and "not reproducible here" in m.group("body"))]
