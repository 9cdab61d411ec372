"""No measured figure is typed by hand in README or a docs page, and no verdict word stands outside a rendered
reading (issue #62, item 8): a figure comes from a kept JSON through ``bench/figures.py`` (or a record through
``bench/results.py``), or, when only a GPU gives it and its JSON was not kept, sits in a not-reproducible block
that says where and when it was measured. The rules and the allow-list are in tests/typed_figures.py."""

from __future__ import annotations

import pytest
from typed_figures import ALLOWED, PAGES, ROOT, findings, hand_written, unmarked_blocks

NAMES = [str(page.relative_to(ROOT)) for page in PAGES]


@pytest.mark.parametrize("page", NAMES)
def test_no_typed_figure_or_verdict_word(page) -> None:
    text = (ROOT / page).read_text(encoding="utf-8")
    typed = [f"{page}:{number}: {rule}: {line}" for number, rule, line, why in findings(page, text) if why is None]
    assert typed == [], ("typed by hand (render it with bench/figures.py, remove it, or allow it in "
                         "tests/typed_figures.py with its reason):\n" + "\n".join(typed))
    assert unmarked_blocks(text) == [], f"{page}: a not-reproducible block must name its GPU and date"


def test_every_allowance_is_used_and_has_a_reason() -> None:
    for page, fragment, why in ALLOWED:
        assert why.strip() and page in NAMES, (page, fragment)
        text = (ROOT / page).read_text(encoding="utf-8")
        assert any(line and fragment in line for line in hand_written(text).splitlines()), (
            f"stale allowance {page!r}: {fragment!r} is not on the page's hand-written lines")


FAKE = """# A page

Hand-written: the env has two roles.

<!-- figures:demo:begin (written by `python bench/figures.py`) -->
The engine is 3.2x faster: 4.1 ms a step, 812.5 tokens/s; MAGRPO beats PPO significantly.
<!-- figures:demo:end (written by `python bench/figures.py`) -->

<!-- results:reading:begin (written by `python bench/results.py render`) -->
The difference holds (p 0.004); MAGRPO's reward is better.
<!-- results:reading:end (written by `python bench/results.py render`) -->

```bash
llm-envs train magrpo --num-iterations 12   # 1 min 46 s here
```

<!-- not-reproducible:begin measured on NVIDIA H100 80GB HBM3, 2026-11-26, not reproducible here -->
Measured on NVIDIA H100 80GB HBM3, 2026-11-26, not reproducible here: 3.07 ms a step.
<!-- not-reproducible:end -->
"""


def rules(text: str, allowed=()) -> list[str]:
    return sorted({rule for _, rule, _, why in findings("docs/fake.md", text, allowed) if why is None})


def test_the_guard_passes_rendered_sections_code_and_marked_gpu_figures() -> None:
    assert rules(FAKE) == []
    assert unmarked_blocks(FAKE) == []


@pytest.mark.parametrize("typed, rule", [
    ("A decode step takes 4.1 ms on this CPU.", "a number with a unit"),
    ("The run took 1 min 46 s and peaked at 1.30 GB.", "a number with a unit"),
    ("It makes 812 tokens/s.", "a number with a unit"),
    ("It measured 8.11 responses/s for the tree.", "a number with a unit"),
    ("The reward model's 0.60 held-out accuracy of 0.60 was low.", "a measured value (a metric"),
    ("The share goes from 0.0 to 0.66 with the prefill.", "a measured value (a metric"),
    ("77 of 105 pairs differ with AVX2's kernels.", "a measured count"),
    ("None of 8 greedy responses held a tag.", "a measured count"),
    ("Packing cut 43% of the positions.", "a number with a unit"),
    ("The engine is 3.86x plain generate.", "a ratio"),
    ("Shared prompts make it 2 times faster.", "a number faster or slower"),
    ("The eval went 0.561 -> 0.720.", "a measured change"),
    ("| run | 0.196 | 1.09 |", "a measured value"),
    ("MAGRPO beats every baseline significantly.", "a verdict word"),
    ("The pair writes better summaries.", "a verdict word"),
    ("The effect holds against one split only.", "a verdict 'holds'"),
    ("Section 5's claim does not hold.", "a verdict 'holds'"),
])
def test_the_guard_fails_on_a_typed_figure_or_a_verdict_word(typed, rule) -> None:
    page = FAKE.replace("Hand-written: the env has two roles.", typed)
    assert any(found.startswith(rule) for found in rules(page)), (typed, rules(page))


def test_a_forbidden_word_in_a_figure_block_counts_once_the_block_is_broken() -> None:
    """A figure typed inside a block with no end marker is hand-written text: the guard reads it."""
    broken = FAKE.replace("<!-- figures:demo:end (written by `python bench/figures.py`) -->\n", "")
    assert "a verdict word (significant, beats, better)" in rules(broken)


def test_a_gpu_block_without_its_gpu_date_or_words_is_read_as_typed() -> None:
    for note in ("measured on AMD EPYC, 2026-11-26, not reproducible here",   # a CPU: run it here instead
                 "measured on NVIDIA H100, last week, not reproducible here",
                 "measured on NVIDIA H100, 2026-11-26"):
        page = FAKE.replace("measured on NVIDIA H100 80GB HBM3, 2026-11-26, not reproducible here -->",
                            note + " -->")
        assert unmarked_blocks(page) == [note]
        assert "a number with a unit of time, memory, rate or share" in rules(page)


def test_a_holding_thing_is_no_verdict_and_an_allowance_excuses_only_its_line() -> None:
    assert rules(FAKE.replace("the env has two roles", "the observer's prompt holds the pioneer's answer")) == []
    page = FAKE.replace("Hand-written: the env has two roles.", "Limits: memory [512 MB].\nA step took 3 ms.")
    allowed = (("docs/fake.md", "memory [512 MB]", "a limit the sandbox sets"),)
    assert rules(page, allowed) == ["a number with a unit of time, memory, rate or share"]
    assert rules(page.replace("A step took 3 ms.", ""), allowed) == []
