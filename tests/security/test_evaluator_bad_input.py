"""Bad requests to the real ``swarmyard evaluator serve`` (the console script) on its socket.

The goal a score names is signed into it and written to the holdout ledger, so it is an id, never free text;
the split is a name. Each bad request gets a typed 4xx, the evaluator keeps serving, and its ledger (every
table) is unchanged. A good score afterwards still works.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from serving import served_evaluator

pytestmark = [pytest.mark.bwrap,
              pytest.mark.skipif(os.geteuid() != 0, reason="serve's user switch needs root")]

SWARMYARD = Path(sys.executable).with_name("swarmyard")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "bundles" / "sort-numbers"
GOOD_SORT = b"import sys\nprint(' '.join(map(str, sorted(map(int, sys.stdin.read().split())))))\n"


@pytest.fixture(scope="module")
def evaluator() -> Iterator[Path]:
    with served_evaluator(EXAMPLE) as root:
        yield root


def ledger(root: Path) -> dict[str, list[Any]]:
    found = [p for p in (root / "state").iterdir() if p.suffix in (".db", ".sqlite") or p.name.endswith("ledger")]
    out: dict[str, list[Any]] = {}
    for path in found:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
                out[f"{path.name}:{table}"] = sorted(db.execute(f'SELECT * FROM "{table}"').fetchall(), key=repr)
    return out


def client(root: Path) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(root / "eval.sock")), base_url="http://evaluator",
                        timeout=60)


BAD = 400, "invalid_input"


@pytest.mark.parametrize(("path", "query", "body", "expect"), [
    ("/v1/score", "", GOOD_SORT, BAD),  # no goal
    ("/v1/score", "goal=", GOOD_SORT, BAD),
    ("/v1/score", "goal=a%00b", GOOD_SORT, BAD),  # NUL
    ("/v1/score", "goal=%ED%A0%80", GOOD_SORT, BAD),  # a lone surrogate, UTF-8 encoded
    ("/v1/score", "goal=../../etc/passwd", GOOD_SORT, BAD),
    ("/v1/score", "goal=" + "g" * 201, GOOD_SORT, BAD),
    ("/v1/score", "goal=g1&goal=g2", GOOD_SORT, BAD),
    ("/v1/score", "goal=g1&split=holdout", GOOD_SORT, BAD),  # the holdout is answered by /v1/holdout only
    ("/v1/score", "goal=g1&split=" + "[" * 1000, GOOD_SORT, BAD),
    ("/v1/score", "goal=g1&bogus=1", GOOD_SORT, BAD),
    ("/v1/holdout", "goal=g1&split=search", GOOD_SORT, BAD),
    ("/v1/holdout", "goal=%ff", GOOD_SORT, BAD),
    ("/v1/score", "goal=g1", b"x" * (10 * 1024 * 1024), (413, "payload_too_large")),
    ("/v1/holdout", "goal=g1", b"[" * 1_000_000, (413, "payload_too_large")),
])
def test_a_bad_request_is_a_typed_4xx_and_changes_nothing(evaluator: Path, path: str, query: str, body: bytes,
                                                         expect: tuple[int, str]) -> None:
    before = ledger(evaluator)
    assert before, "the holdout ledger has no tables to compare"
    with client(evaluator) as http:
        answer = http.post(f"{path}?{query}" if query else path, content=body)
        assert (answer.status_code, answer.json()["error"]["code"]) == expect, answer.text
        assert http.get("/v1/health").json()["ok"] is True
    assert ledger(evaluator) == before


def test_good_requests_still_work_afterwards(evaluator: Path) -> None:
    before = ledger(evaluator)
    with client(evaluator) as http:
        answer = http.post("/v1/score?goal=goal_ok", content=GOOD_SORT)
        assert answer.status_code == 200, answer.text
        assert json.loads(answer.text)["score"] == 5
        holdout = http.post("/v1/holdout?goal=goal_ok", content=GOOD_SORT)
        assert holdout.status_code == 200, holdout.text
    assert ledger(evaluator) != before  # the holdout was recorded: the comparison above sees writes
