"""ClassEval (``coding/classeval-v0``): a hand-checked reward table on a class of the fixture (perfect,
empty, partial, overlapping methods, a class that does not compile, hanging and hostile methods, a
dataset test that hangs), a hostile suite (forged verdicts earn no more test credit than empty methods),
what crosses between the tests' process and the class's (files, attribute and argument mutation,
exceptions, class attributes, special methods, standard-library values, the tests' own objects), the
method split rules, hub loading and its error, the oracle, feedback and the sequential protocol. The
fixture is in ClassEval's schema (tests/hub_fixtures.py)."""

from __future__ import annotations

import pytest
from hub_fixtures import (
    CLASSEVAL_TEMPLATES,
    COUNTER_SKELETON,
    COUNTER_SOLUTION,
    COUNTER_TEST,
    classeval_row,
    classeval_rows,
    write_jsonl,
)

import llm_envs
from llm_envs.rewards.classeval import assign_methods, extract_methods, methods_to_write, score_class, unittest_ids
from llm_envs.sandbox import SandboxLimits

LIMITS = SandboxLimits(timeout_s=20, test_timeout_s=1.0)
OWNERS = (0, 0, 1)  # get, reset -> coder_1 (self only); add -> coder_2
GET = "def get(self):\n    return self.value\n"
RESET = "def reset(self):\n    self.value = 0\n    return self.value\n"
ADD = "def add(self, n):\n    self.value += n\n    return self.value\n"
HANG = "def get(self):\n    while True:\n        pass\n"


@pytest.fixture(scope="module")
def data_path(tmp_path_factory) -> str:
    return str(write_jsonl(tmp_path_factory.mktemp("classeval") / "classeval.jsonl", classeval_rows()))


@pytest.mark.parametrize(
    "coder_1, coder_2, expected",
    [
        # valid, tests, overlap
        (GET + RESET, ADD, (2.0, 4.0, 0.0)),  # perfect: 6.0
        ("", "", (0.0, 0.0, 0.0)),  # empty: the stubs fail every test
        (GET + RESET, "", (4 / 3, 2.0, 0.0)),  # coder_2 wrote nothing: the add tests fail
        (GET + RESET + ADD, GET + RESET + ADD, (2.0, 4.0, -1.0)),  # every method written twice
        (GET + RESET + ADD, ADD, (2.0, 4.0, -1 / 3)),  # add written by both
        (GET + RESET, "def add(self, n):\n    return n\n", (2.0, 3.0, 0.0)),  # wrong add: 3 of 4 tests pass
        (GET + RESET, "def add(self, n)\n    return n\n", (4 / 3, 2.0, 0.0)),  # add does not parse
        (GET + RESET, "def add(self, n):\n    break\n", (0.0, 0.0, 0.0)),  # parses; the class does not compile
        ("```python\nclass Counter:\n    " + GET.replace("\n", "\n    ") + "\n    "
         + RESET.replace("\n", "\n    ") + "```", ADD, (2.0, 4.0, 0.0)),  # inside a class and fences
        (HANG + RESET, ADD, (2.0, 0.0, 0.0)),  # get hangs: 3 tests time out, the 4th is not run
        (GET + RESET, "def add(self, n):\n    import os\n    os._exit(0)\n", (2.0, 2.0, 0.0)),  # exit: no pass
        # names a deny-list refused before: honest code using them is judged like any other
        (GET + "def reset(self):\n    import unittest\n    self.value = eval('0')\n    return self.value\n", ADD,
         (2.0, 4.0, 0.0)),
        (GET + "def reset(self):\n    return globals()['__name__']\n", ADD, (2.0, 3.0, 0.0)),  # returns a str: 1 fails
    ],
)
def test_reward_table(coder_1, coder_2, expected):
    score = score_class([coder_1, coder_2], COUNTER_SKELETON, COUNTER_TEST, "Counter", OWNERS, LIMITS)
    assert tuple(score.components.values()) == pytest.approx(expected)
    assert score.total == pytest.approx(sum(expected))


def test_a_dataset_test_that_hangs_fails_and_the_others_count():
    test = COUNTER_TEST.replace("    def test_add_negative(self):",
                                "    def test_forever(self):\n        while True:\n            pass\n\n"
                                "    def test_add_negative(self):")
    methods = extract_methods(COUNTER_SOLUTION, ["get", "reset", "add"])
    score = score_class([methods["get"] + methods["reset"], methods["add"]], COUNTER_SKELETON, test, "Counter",
                        OWNERS, LIMITS)
    assert score.components == {"valid": 2.0, "tests": pytest.approx(4.0 * 4 / 5), "overlap": 0.0}
    timed_out = [i for i, o in zip(score.test_ids, score.execution.outcomes) if o.status == "timeout"]
    assert timed_out == ["CounterTestAdd.test_forever"]


def test_methods_to_write_and_split_rules():
    row = classeval_row(0, *CLASSEVAL_TEMPLATES[1])
    methods = methods_to_write(row["skeleton"], "Stack")
    assert methods == [("push", False), ("pop", True), ("size", True), ("merge", False)]
    assert assign_methods(methods, "reference") == (1, 0, 0, 1)
    assert assign_methods(methods, "round_robin") == (0, 1, 0, 1)
    assert assign_methods(methods, "by_name") == (1, 0, 1, 0)  # merge, pop | push, size
    assert methods_to_write(COUNTER_SKELETON, "Counter") == [("get", True), ("reset", True), ("add", False)]
    assert unittest_ids(COUNTER_TEST) == ["CounterTestGet.test_get", "CounterTestGet.test_reset",
                                          "CounterTestAdd.test_add", "CounterTestAdd.test_add_negative"]
    with pytest.raises(ValueError, match="split must be one of"):
        llm_envs.make("coding/classeval-v0", split="random")


def test_hub_without_copy_fails_with_instructions():
    from llm_envs.data import DatasetUnavailableError

    env = llm_envs.make("coding/classeval-v0")
    with pytest.raises(DatasetUnavailableError, match="(?s)FudanSELab/ClassEval.*save_to_disk.*data_path"):
        env.reset(seed=0)


def test_fixture_splits_oracle_and_env_step(data_path):
    env = llm_envs.make("coding/classeval-v0", data_path=data_path, max_new_tokens=1024)
    task = env.task
    assert len(task.problems("train")) == 66 and len(task.problems("eval")) == 16
    assert task.problems("eval")[0]["task_id"] == "ClassEval_66"
    for index in (0, 1):  # a Counter and a Stack (with a static method)
        env.reset(options={"split": "eval", "task_index": index})
        _, rewards, _, _, infos = env.step(task.solve(env.problem))
        assert rewards == {"coder_1": 6.0, "coder_2": 6.0}
        assert infos["coder_1"]["reward_tests"] == 4.0
    prompt = env.text("coder_1")
    assert "You write these methods of Stack67: pop, size." in prompt and "class Stack67:" in prompt


def test_multi_turn_diagnostics_plain_feedback_and_sequential(data_path):
    env = llm_envs.make("coding/classeval-v0", data_path=data_path, num_turns=2, test_timeout_s=1.0)
    env.reset(options={"split": "eval", "task_index": 0})
    env.step({"coder_1": GET + "def reset(self)\n    pass\n", "coder_2": "def add(self, n):\n    return n\n"})
    prompt = env.text("coder_1")
    assert "Your previous methods:" in prompt and "Diagnostics of the merged class:" in prompt
    assert "- reset: written, but does NOT parse" in prompt and "- Tests: 2/4 passed" in prompt
    assert "CounterTestAdd.test_add: failed: AssertionError: 2 != 3" in env.text("coder_2")
    plain = llm_envs.make("coding/classeval-v0", data_path=data_path, num_turns=2, feedback="plain")
    plain.reset(options={"split": "eval", "task_index": 0})
    plain.step({"coder_1": GET, "coder_2": ""})
    assert "Your previous methods:" in plain.text("coder_1") and "Diagnostics" not in plain.text("coder_1")
    seq = llm_envs.make("coding/classeval-v0", data_path=data_path, protocol="sequential")
    seq.reset(options={"split": "eval", "task_index": 0})
    seq.step(GET)
    assert "Your teammate wrote these methods:" in seq.text("coder_2") and "return self.value" in seq.text("coder_2")


# The issue's class: two methods, three unittest tests.
ACCOUNT_SKELETON = '''class Account:
    """A bank account."""

    def __init__(self, balance=0):
        self.balance = balance

    def deposit(self, amount):
        """Add amount to the balance and return the new balance."""

    def kind(self):
        """The account's kind: "basic"."""
'''
ACCOUNT_TEST = '''import unittest


class AccountTestDeposit(unittest.TestCase):
    def test_deposit(self):
        self.assertEqual(Account(5).deposit(3), 8)

    def test_deposit_twice(self):
        account = Account()
        account.deposit(2)
        self.assertEqual(account.deposit(2), 4)


class AccountTestKind(unittest.TestCase):
    def test_kind(self):
        self.assertEqual(Account().kind(), "basic")
'''
REACH_UNITTEST = (  # no denied name written out: an imported module's attribute, a concatenated key
    "    import os\n"
    "    ut = getattr(getattr(os, 's' + 'ys'), 'mod' + 'ules')['unit' + 'test']\n"
)
ATTACKS = {
    "always-equal object": "    class Same:\n        def __eq__(self, other):\n            return True\n"
                           "        __hash__ = None\n    return Same()\n",
    "patch TestResult, raise": REACH_UNITTEST + "    ut.TestResult.addFailure = lambda *a, **k: None\n"
                               "    ut.TestResult.addError = lambda *a, **k: None\n    raise ValueError('x')\n",
    "patch assertEqual": REACH_UNITTEST + "    ut.TestCase.assertEqual = lambda *a, **k: None\n    return None\n",
    "patch TestCase.run": REACH_UNITTEST + "    ut.TestCase.run = lambda self, result=None: None\n    return None\n",
    "patch builtins": "    import builtins\n    builtins.AssertionError = type('AssertionError', (Exception,), {})\n"
                      "    builtins.isinstance = lambda *a: True\n    return None\n",
    "exit in the method": "    import os\n    os._exit(0)\n",
    "exit while loading": None,  # a default argument that exits when the class is defined
    "fake markers": "    print('passed')\n    print('OK')\n    return 'passed'\n",
    "frames": "    import sys\n    frame = sys._getframe()\n    while frame is not None:\n"
              "        for name, value in list(frame.f_globals.items()):\n"
              "            if callable(value) and name.startswith(('_classeval', '_ce_')):\n"
              "                frame.f_globals[name] = lambda *a, **k: 'passed'\n"
              "        frame = frame.f_back\n    return None\n",
    "reading the tests": "    import gc\n    for found in gc.get_objects():\n"
                         "        if type(found).__name__.startswith('AccountTest'):\n"
                         "            found.assertEqual = lambda *a, **k: None\n"
                         "    return [o for o in gc.get_objects() if isinstance(o, str) and 'assertEqual' in o]\n",
    "timeout": "    while True:\n        pass\n",
    "fork and forge frames": "    import os\n    if os.fork() == 0:\n        frame = b'{\"ok\": \"passed\"}'\n"
                             "        for fd in range(64):\n            try:\n"
                             "                os.write(fd, len(frame).to_bytes(4, 'big') + frame)\n"
                             "            except OSError:\n                pass\n        os._exit(0)\n"
                             "    os.wait()\n    return None\n",
    "control-flow exceptions": "    raise type('SkipTest', (Exception,), {})('skip')\n",
    "returning self": "    return self\n",
    "a class named like the skeleton's": "    class Account:\n        pass\n    return Account()\n",
    "patching the class's harness": "    for name in list(globals()):\n"
                                    "        if name.startswith('__sandbox'):\n"
                                    "            globals()[name] = lambda *a, **k: ('h', 0, 'Account')\n"
                                    "    return None\n",
}


def _account(deposit_body: str | None, kind_body: str | None):
    texts = []
    for signature, body in (("deposit(self, amount)", deposit_body), ("kind(self)", kind_body)):
        if body is None:
            signature = signature[:-1] + ", _=__import__('os')._exit(0))"
            body = "    return None\n"
        texts.append(f"def {signature}:\n{body}")
    return score_class(texts, ACCOUNT_SKELETON, ACCOUNT_TEST, "Account", (0, 1), LIMITS)


def test_the_issues_class_scores_honest_and_empty_answers():
    honest = _account("    self.balance += amount\n    return self.balance\n", "    return 'basic'\n")
    empty = _account("    return None\n", "    return 0\n")
    assert (honest.total, empty.total) == (6.0, 2.0)


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_forged_verdict_earns_no_more_test_credit_than_empty_methods(attack):
    score = _account(ATTACKS[attack], ATTACKS[attack])
    assert score.components == {"valid": 2.0, "tests": 0.0, "overlap": 0.0}, score.execution
    assert score.execution.passed == 0


# A class that uses what crosses between the tests' process and the class's process: files in the shared
# scratch, attributes read, set and mutated in place, arguments mutated by a method, exceptions, class
# attributes and static methods, special methods, standard-library values, the tests' own objects.
SHELF_SKELETON = '''import datetime


class Shelf:
    """Books on a shelf."""
    LIMIT = 3

    def __init__(self, path="shelf.txt"):
        self.path = path
        self.books = []
        self.notes = {"owner": None}

    def add(self, title):
        """Add a title; ValueError beyond LIMIT books."""

    def load(self):
        """Add the titles of the file at path, one a line; return how many."""

    def save(self):
        """Write the titles to path, one a line."""

    def take_all(self, into):
        """Move every title into the list into; return how many."""

    def added_on(self):
        """The date of the shelf: 2024-02-29."""

    def label(self, element):
        """The text of an xml.etree element."""

    @staticmethod
    def clean(title):
        """The title stripped and in title case."""

    def __len__(self):
        """How many titles."""

    def __getitem__(self, index):
        """The title at index."""

    def __iter__(self):
        """The titles."""

    def __eq__(self, other):
        """Shelves are equal when they hold the same titles."""
'''
SHELF_SOLUTION = '''
def add(self, title):
    if len(self.books) >= self.LIMIT:
        raise ValueError("the shelf is full")
    self.books.append(title)

def load(self):
    with open(self.path) as handle:
        titles = [line.strip() for line in handle if line.strip()]
    self.books.extend(titles)
    return len(titles)

def save(self):
    with open(self.path, "w") as handle:
        handle.write("".join(title + "\\n" for title in self.books))

def take_all(self, into):
    into.extend(self.books)
    count = len(self.books)
    self.books.clear()
    return count

def added_on(self):
    return datetime.date(2024, 2, 29)

def label(self, element):
    return element.text

def clean(title):
    return title.strip().title()

def __len__(self):
    return len(self.books)

def __getitem__(self, index):
    return self.books[index]

def __iter__(self):
    return iter(self.books)

def __eq__(self, other):
    return isinstance(other, Shelf) and self.books == other.books
'''
SHELF_TEST = '''import unittest
import xml.etree.ElementTree as ET
from unittest.mock import MagicMock


class ShelfTest(unittest.TestCase):
    def setUp(self):
        self.shelf = Shelf()
        self.shelf.books.append("Dune")

    def test_files(self):
        with open("in.txt", "w") as handle:
            handle.write("Emma\\nUlysses\\n")
        self.shelf.path = "in.txt"
        self.assertEqual(self.shelf.load(), 2)
        self.shelf.path = "out.txt"
        self.shelf.save()
        with open("out.txt") as handle:
            self.assertEqual(handle.read(), "Dune\\nEmma\\nUlysses\\n")

    def test_attributes_mutated_in_place(self):
        books = self.shelf.books
        self.shelf.notes["owner"] = "Ann"
        self.shelf.add("Emma")
        self.assertEqual(books, ["Dune", "Emma"])
        self.assertEqual(self.shelf.notes, {"owner": "Ann"})
        self.assertEqual(len(self.shelf), 2)

    def test_arguments_mutated_by_a_method(self):
        into = ["Ulysses"]
        self.assertEqual(self.shelf.take_all(into), 1)
        self.assertEqual(into, ["Ulysses", "Dune"])
        self.assertEqual(self.shelf.books, [])

    def test_exceptions(self):
        self.shelf.add("Emma")
        self.shelf.add("Ulysses")
        with self.assertRaises(ValueError):
            self.shelf.add("Persuasion")

    def test_class_attributes_static_and_special_methods(self):
        Shelf.LIMIT = 5
        self.assertEqual(Shelf.LIMIT, 5)
        self.assertEqual(Shelf.clean("  dune "), "Dune")
        self.assertEqual(self.shelf[0], "Dune")
        self.assertEqual(list(self.shelf), ["Dune"])
        other = Shelf()
        other.add("Dune")
        self.assertEqual(self.shelf, other)
        self.assertIsInstance(other, Shelf)

    def test_standard_library_values(self):
        self.assertEqual(self.shelf.added_on(), datetime.date(2024, 2, 29))

    def test_the_tests_own_objects(self):
        self.assertEqual(self.shelf.label(ET.fromstring("<b>Dune</b>")), "Dune")

    def test_a_mock_on_an_instance(self):
        self.shelf.load = MagicMock(return_value=7)
        self.assertEqual(self.shelf.load(), 7)
'''


def test_what_crosses_between_the_tests_and_the_class():
    methods = methods_to_write(SHELF_SKELETON, "Shelf")
    owners = assign_methods(methods, "round_robin")
    solution = extract_methods(SHELF_SOLUTION, [m for m, _ in methods])
    texts = ["".join(solution[m] for (m, _), o in zip(methods, owners, strict=True) if o == i) for i in (0, 1)]
    score = score_class(texts, SHELF_SKELETON, SHELF_TEST, "Shelf", owners, LIMITS)
    failed = {i: o.message for i, o in zip(score.test_ids, score.execution.outcomes, strict=True) if not o.passed}
    # The one use of a class here that a proxy cannot carry: a mock object put on an instance (counted in
    # docs/classeval.md); every other test passes.
    assert list(failed) == ["ShelfTest.test_a_mock_on_an_instance"], failed
    assert "not plain data cannot be passed" in failed["ShelfTest.test_a_mock_on_an_instance"]
    empty = score_class(["", ""], SHELF_SKELETON, SHELF_TEST, "Shelf", owners, LIMITS)
    assert empty.execution.passed == 0


BAG_SKELETON = '''class Bag:
    def __init__(self):
        self.items = [[1], [2]]
        self.meta = {"a": {"b": 1}}

    def swap(self):
        """Replace items by {"x": 1}."""

    def total(self):
        """The sum of the first numbers of items."""
'''
BAG_TEST = '''import unittest


class BagTest(unittest.TestCase):
    def test_nested_views(self):
        bag = Bag()
        first = bag.items[0]
        first.append(5)
        bag.meta["a"]["b"] = 7
        self.assertEqual(bag.items, [[1, 5], [2]])
        self.assertEqual(bag.meta, {"a": {"b": 7}})
        self.assertEqual(bag.total(), 3)
        bag.items.sort(key=len)
        self.assertEqual(bag.items, [[2], [1, 5]])

    def test_a_view_of_a_replaced_attribute_keeps_its_contents(self):
        bag = Bag()
        items = bag.items
        bag.swap()
        items.append(3)
        self.assertEqual(items, [[1], [2], 3])
        self.assertEqual(bag.items, {"x": 1})
'''


def test_nested_views_and_replaced_attributes():
    texts = ["def swap(self):\n    self.items = {'x': 1}\n",
             "def total(self):\n    return sum(i[0] for i in self.items)\n"]
    score = score_class(texts, BAG_SKELETON, BAG_TEST, "Bag", (0, 1), LIMITS)
    assert [o.status for o in score.execution.outcomes] == ["passed", "passed"], score.execution.outcomes
