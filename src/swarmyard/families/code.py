"""The code family: a small repository whose visible tests are the search split and whose hidden ones the holdout.

The seed picks three of the functions below, with constants of its own (a shift, a separator, divisors), and
writes ``solution.py`` with their stubs, a README and ``tests/test_visible.py``. An answer is the whole text of
``solution.py``; the evaluator runs the split's cases (those of its pytest file, as ``cases.json``) against it in
its sandbox, comparing return values outside the artifact's process (``scorers/code.py``).
Score = passed share x 1,000,000. The hidden tests cover the same functions on other inputs and edge cases.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from swarmyard.families.instance import Instance, TaskInput

NAME = "code"
VISIBLE_CASES = 3
HIDDEN_CASES = 8


@dataclass(frozen=True, slots=True)
class Spec:
    """One function to implement: its signature, its docstring, a reference and a case maker."""

    name: str
    signature: str
    doc: str
    reference: str
    cases: Callable[[random.Random], list[tuple[Any, ...]]]


def _words(rng: random.Random, n: int) -> str:
    pool = ["red", "blue", "green", "sky", "sea", "sun", "moon", "star", "tree", "leaf", "rock"]
    return " ".join(rng.choice(pool) for _ in range(n))


def _specs(rng: random.Random) -> list[Spec]:
    shift = rng.randint(1, 25)
    sep = rng.choice(["-", ":", "/", "+"])
    a, b = rng.sample([2, 3, 4, 5, 7], 2)
    wa, wb = rng.sample(["Fizz", "Buzz", "Zap", "Pop", "Bang"], 2)
    k = rng.randint(2, 3)
    return [
        Spec("caesar", "caesar(text: str) -> str",
             f"Shift every ASCII letter {shift} places forward in the alphabet, wrapping around and keeping its "
             "case; leave every other character as it is.",
             f"def caesar(text):\n    out = []\n    for ch in text:\n        if 'a' <= ch <= 'z':\n"
             f"            out.append(chr((ord(ch) - 97 + {shift}) % 26 + 97))\n        elif 'A' <= ch <= 'Z':\n"
             f"            out.append(chr((ord(ch) - 65 + {shift}) % 26 + 65))\n        else:\n"
             f"            out.append(ch)\n    return ''.join(out)\n",
             lambda r: [(rng_text(r),) for _ in range(HIDDEN_CASES + VISIBLE_CASES)]),
        Spec("run_length", "run_length(text: str) -> str",
             f"Encode each run of one repeated character as the character, {sep!r} and the run's length, runs "
             f"joined by ','; the empty string encodes as ''. Example: 'aab' -> 'a{sep}2,b{sep}1'.",
             f"def run_length(text):\n    runs = []\n    for ch in text:\n        if runs and runs[-1][0] == ch:\n"
             f"            runs[-1][1] += 1\n        else:\n            runs.append([ch, 1])\n"
             f"    return ','.join(f'{{c}}{sep}{{n}}' for c, n in runs)\n",
             lambda r: [("".join(r.choice("aab c") for _ in range(r.randint(0, 12))),)
                        for _ in range(HIDDEN_CASES + VISIBLE_CASES)]),
        Spec("fizz", "fizz(n: int) -> str",
             f"Return {wa!r} when n is divisible by {a}, {wb!r} when by {b}, {wa + wb!r} when by both, else str(n).",
             f"def fizz(n):\n    out = ({wa!r} if n % {a} == 0 else '') + ({wb!r} if n % {b} == 0 else '')\n"
             f"    return out or str(n)\n",
             lambda r: [(r.choice([r.randint(-50, 200), a * b * r.randint(1, 9), a * r.randint(1, 9), 0]),)
                        for _ in range(HIDDEN_CASES + VISIBLE_CASES)]),
        Spec("top_words", "top_words(text: str) -> list[str]",
             f"The {k} most frequent words of text (split on whitespace, lower-cased), most frequent first, ties "
             f"in alphabetical order; fewer when text has fewer distinct words.",
             f"def top_words(text):\n    counts = {{}}\n    for word in text.lower().split():\n"
             f"        counts[word] = counts.get(word, 0) + 1\n"
             f"    return sorted(counts, key=lambda w: (-counts[w], w))[:{k}]\n",
             lambda r: [(_words(r, r.randint(0, 14)).title() if r.random() < 0.3 else _words(r, r.randint(0, 14)),)
                        for _ in range(HIDDEN_CASES + VISIBLE_CASES)]),
        Spec("balanced", "balanced(text: str) -> bool",
             "Whether the brackets (), [] and {} in text are balanced and properly nested; other characters "
             "are ignored.",
             "def balanced(text):\n    pairs = {')': '(', ']': '[', '}': '{'}\n    stack = []\n"
             "    for ch in text:\n        if ch in '([{':\n            stack.append(ch)\n"
             "        elif ch in pairs:\n            if not stack or stack.pop() != pairs[ch]:\n"
             "                return False\n    return not stack\n",
             lambda r: [("".join(r.choice("()[]{}x") for _ in range(r.randint(0, 10))),)
                        for _ in range(HIDDEN_CASES + VISIBLE_CASES)]),
    ]


def rng_text(rng: random.Random) -> str:
    """A short mixed-case text with punctuation."""
    return "".join(rng.choice("abcxyzABCXYZ .,!") for _ in range(rng.randint(0, 16)))


def _expected(spec: Spec, args: tuple[Any, ...]) -> Any:
    space: dict[str, Any] = {}
    exec(compile(spec.reference, f"<reference {spec.name}>", "exec"), space)  # our own reference code
    return space[spec.name](*args)


def _test_file(specs: list[Spec], cases: dict[str, list[tuple[Any, ...]]], header: str) -> str:
    lines = [f'"""{header}"""', "", "import json", "", "import pytest", "", "import solution", ""]
    for spec in specs:
        rows = [[list(args), _expected(spec, args)] for args in cases[spec.name]]
        lines += ["", f"@pytest.mark.parametrize(('args', 'expected'), json.loads({json.dumps(rows)!r}))",
                  f"def test_{spec.name}(args, expected):",
                  f"    assert solution.{spec.name}(*args) == expected", ""]
    return "\n".join(lines)


def _cases_file(specs: list[Spec], cases: dict[str, list[tuple[Any, ...]]]) -> str:
    """The cases the scorer runs: function name -> [[args, expected], ...], the test file's cases as data."""
    rows = {spec.name: [[list(args), _expected(spec, args)] for args in cases[spec.name]] for spec in specs}
    return json.dumps(rows, sort_keys=True, indent=1) + "\n"


def generate(seed: int) -> Instance:
    """The instance of ``seed``: the same seed gives the same repository and tests."""
    rng = random.Random(f"{NAME}:{seed}")
    specs = rng.sample(_specs(rng), 3)
    visible: dict[str, list[tuple[Any, ...]]] = {}
    hidden: dict[str, list[tuple[Any, ...]]] = {}
    for spec in specs:
        made = spec.cases(rng)
        visible[spec.name], hidden[spec.name] = made[:VISIBLE_CASES], made[VISIBLE_CASES:]
    stubs = ['"""Implement the functions below; tests/test_visible.py shows what is expected."""', ""]
    for spec in specs:
        stubs += ["", f"def {spec.signature}:", f'    """{spec.doc}"""', "    raise NotImplementedError", ""]
    solution_stub = "\n".join(stubs)
    visible_tests = _test_file(specs, visible, "Visible tests: run them with `python3 -m pytest tests`.")
    hidden_tests = _test_file(specs, hidden, "Hidden tests (the holdout).")
    readme = ("# A small repository\n\nImplement the functions in `solution.py` so that `python3 -m pytest tests` "
              "passes. Hidden tests check the same functions on other inputs.\n")
    prompt = ("A small repository is in your machine under task/: implement every function in task/solution.py "
              "as its docstring says, so that its tests pass (run `cd task && python3 -m pytest -q tests`). "
              "Submit the whole text of solution.py with submit_artifact to see its score, then submit a "
              "finding with the final solution.py in its body.")
    files = {"solution.py": solution_stub, "README.md": readme, "tests/test_visible.py": visible_tests,
             "tests/conftest.py": "import sys\nfrom pathlib import Path\n\nsys.path.insert(0, "
                                  "str(Path(__file__).resolve().parent.parent))\n"}
    total_visible = sum(len(c) for c in visible.values())
    total_hidden = sum(len(c) for c in hidden.values())
    return Instance(
        NAME, seed,
        "Implement the functions of a small repository so that its visible and hidden tests pass.",
        (TaskInput("implement solution.py", prompt, files, "repo"),), "code",
        search={"test_visible.py": visible_tests, "cases.json": _cases_file(specs, visible),
                "expected.txt": f"{total_visible}\n"},
        holdout={"test_hidden.py": hidden_tests, "cases.json": _cases_file(specs, hidden),
                 "expected.txt": f"{total_hidden}\n"},
        lead_prompt="Submit the best solution.py the findings hold, whole, as the synthesis.",
    )


def reference_solution(seed: int) -> str:
    """A solution.py that passes every test of ``seed`` (for tests and oracles)."""
    rng = random.Random(f"{NAME}:{seed}")
    specs = rng.sample(_specs(rng), 3)
    return "\n\n".join(spec.reference for spec in specs)
