"""Small datasets in the schemas of the hub-only sources, for tests (no hub is reachable here)."""

from __future__ import annotations

import json
from pathlib import Path

AREA_PROMPT = "import math\n\n\ndef area(r: float) -> float:\n    '''Area of a circle of radius r.'''\n"
AREA_TEST = "def check(candidate):\n    assert abs(candidate(1) - math.pi) < 1e-9\n    assert candidate(0) == 0\n"


def coophumaneval_rows() -> list[dict]:
    """Rows in the schema of ``OpenMLRL/CoopHumanEval`` (task_id, prompt, test, entry_point)."""
    return [
        {"task_id": f"CoopHumanEval/{i}", "prompt": AREA_PROMPT.replace("area", f"area{i}"),
         "test": AREA_TEST, "entry_point": f"area{i}"}
        for i in range(20)
    ]


def mbpp_rows() -> list[dict]:
    """Rows in the schema of ``google-research-datasets/mbpp`` config ``sanitized``."""
    return [
        {"source_file": "x", "task_id": 600 + i, "prompt": f"Write a function to add {i} to a number.",
         "code": f"def helper(n):\n    return n\n\ndef add_{i}(n: int):\n    return helper(n) + {i}",
         "test_imports": ["import math"], "test_list": [f"assert add_{i}(1) == {1 + i}", f"assert add_{i}(0) == {i}"]}
        for i in range(40)
    ]


WORDS = (
    "the study shows that careful measurement of river flow helps towns plan for floods while farmers "
    "adjust planting schedules because seasonal rain patterns shift across decades"
).split()


def _text(n_words: int, offset: int = 0) -> str:
    return " ".join(WORDS[(i + offset) % len(WORDS)] for i in range(n_words))


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    return path


def hub_fixture_rows(env_id: str) -> list[dict] | None:
    """Rows in the schema of the hub dataset behind ``env_id`` (None: the id needs no fixture)."""
    if env_id == "writing/tldr-v0":
        return [
            {"prompt": f"SUBREDDIT: r/test\nTITLE: Post {i}\nPOST: {_text(60, i)}\nTL;DR:", "completion": " ok"}
            for i in range(6)
        ]
    if env_id == "writing/arxiv-v0":
        return [{"abstract_text": _text(150, i)} for i in range(6)]
    if env_id == "coding/coophumaneval-v0":
        return coophumaneval_rows()
    if env_id == "coding/mbpp-v0":
        return mbpp_rows()
    if env_id == "coding/classeval-v0":
        return classeval_rows()
    return None




# ClassEval (FudanSELab/ClassEval, split "test"): hand-written classes in its schema, each repeated under
# numbered class names to make the dataset's 100 rows (train = rows 0-65, eval = rows 66-81).
COUNTER_SKELETON = '''class Counter:
    """A counter of events."""

    def __init__(self, start=0):
        self.value = start

    def get(self):
        """The current value."""

    def reset(self):
        """Set the value to 0 and return it."""
        pass

    def add(self, n):
        """Add n to the value and return the new value."""
        raise NotImplementedError
'''
COUNTER_SOLUTION = '''class Counter:
    """A counter of events."""

    def __init__(self, start=0):
        self.value = start

    def get(self):
        return self.value

    def reset(self):
        self.value = 0
        return self.value

    def add(self, n):
        self.value += n
        return self.value
'''
COUNTER_TEST = '''import unittest


class CounterTestGet(unittest.TestCase):
    def test_get(self):
        self.assertEqual(Counter(3).get(), 3)

    def test_reset(self):
        counter = Counter(5)
        self.assertEqual(counter.reset(), 0)
        self.assertEqual(counter.get(), 0)


class CounterTestAdd(unittest.TestCase):
    def test_add(self):
        counter = Counter(1)
        self.assertEqual(counter.add(2), 3)
        self.assertEqual(counter.get(), 3)

    def test_add_negative(self):
        self.assertEqual(Counter().add(-4), -4)
'''
STACK_SKELETON = '''import copy


class Stack:
    """A last-in first-out stack."""

    def __init__(self):
        self.items = []

    def push(self, item):
        """Put item on top."""

    def pop(self):
        """Remove and return the top item (None when empty)."""

    def size(self):
        """How many items."""
        ...

    @staticmethod
    def merge(first, second):
        """A new list: first's items then second's."""
'''
STACK_SOLUTION = '''import copy


class Stack:
    """A last-in first-out stack."""

    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        return self.items.pop() if self.items else None

    def size(self):
        return len(self.items)

    @staticmethod
    def merge(first, second):
        return copy.copy(first) + list(second)
'''
STACK_TEST = '''import unittest


class StackTest(unittest.TestCase):
    def setUp(self):
        self.stack = Stack()

    def test_push_pop(self):
        self.stack.push(1)
        self.stack.push(2)
        self.assertEqual(self.stack.pop(), 2)

    def test_pop_empty(self):
        self.assertIsNone(self.stack.pop())

    def test_size(self):
        self.stack.push("a")
        self.assertEqual(self.stack.size(), 1)

    def test_merge(self):
        self.assertEqual(Stack.merge([1], (2, 3)), [1, 2, 3])
'''
CLASSEVAL_TEMPLATES = (
    ("Counter", COUNTER_SKELETON, COUNTER_TEST, COUNTER_SOLUTION, ("get", "reset", "add")),
    ("Stack", STACK_SKELETON, STACK_TEST, STACK_SOLUTION, ("push", "pop", "size", "merge")),
)


def classeval_row(index: int, name: str, skeleton: str, test: str, solution: str, methods: tuple[str, ...],
                  suffix: str = "") -> dict:
    """One row in the schema of ``FudanSELab/ClassEval`` (class ``name`` renamed ``name + suffix``)."""
    import re

    new = name + suffix

    def rename(text: str) -> str:
        return re.sub(rf"\b{name}\b", new, text)

    imports = [line for line in skeleton.splitlines() if line.startswith(("import ", "from "))]
    return {
        "task_id": f"ClassEval_{index}", "class_name": new, "skeleton": rename(skeleton), "test": rename(test),
        "solution_code": rename(solution), "class_description": f"class {new}", "import_statement": imports,
        "class_constructor": "", "fields": [], "test_classes": [],
        "methods_info": [{"method_name": m, "method_description": "", "test_class": "", "test_code": "",
                          "solution_code": "", "dependencies": {}} for m in methods],
    }


def classeval_rows() -> list[dict]:
    """100 rows in the schema of ``FudanSELab/ClassEval`` (split ``test``)."""
    return [classeval_row(i, *CLASSEVAL_TEMPLATES[i % len(CLASSEVAL_TEMPLATES)], suffix=str(i)) for i in range(100)]


def build_parser():
    """``python tests/hub_fixtures.py ENV_ID --output FILE.jsonl``: write the fixture of a hub-only env id
    (docs/classeval.md trains on the ClassEval one, ``--data-path FILE.jsonl``); without ``--output``, to stdout."""
    import argparse

    parser = argparse.ArgumentParser(description="Write the test fixture of a hub-only env id as a jsonl file.")
    parser.add_argument("hub_id", metavar="ENV_ID", help="a hub-only env id, e.g. coding/classeval-v0")
    parser.add_argument("--output", default=None, help="the jsonl file to write (default: stdout)")
    return parser


if __name__ == "__main__":
    import sys

    args = build_parser().parse_args()
    rows = hub_fixture_rows(args.hub_id)
    if rows is None:
        raise SystemExit(f"{args.hub_id} needs no fixture (its data ships offline, or it is not a hub-only id)")
    if args.output is None:
        sys.stdout.writelines(json.dumps(row) + "\n" for row in rows)
    else:
        print(write_jsonl(Path(args.output), rows))
