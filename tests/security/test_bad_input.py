"""Bad input against the real ``swarmyard serve``: every tool, operator and broker endpoint, over its socket.

The console script serves a SQLite store with the model broker mounted. Each request below is refused with a
typed 4xx naming its error code; after each, the server still answers and every table of the store holds
exactly what it held before. The bodies: malformed JSON, JSON nested a million deep (the body that made orjson
3.8.3 overflow its stack and take the whole server down with SIGSEGV), wrong types for integers and money, 10 MB,
lone surrogates, NUL and bytes that are not UTF-8.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from serving import Served, served_with_claim

from swarmyard.plane.tools import TOOLS

MILLION_DEEP = b"[" * 1_000_000 + b"]" * 1_000_000  # ~1.9 MiB
TEN_MB = 10 * 1024 * 1024


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with served_with_claim("--provider", "sim=simulated:sim-1") as running:
        yield running


def snapshot(store: Path) -> dict[str, list[Any]]:
    """Every row of every table of the store, read-only (the server keeps it open in WAL mode), and every
    file beside it (artifact blobs)."""
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as db:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        rows: dict[str, list[Any]] = {t: sorted(db.execute(f'SELECT * FROM "{t}"').fetchall(), key=repr)
                                      for t in tables}
    rows["files"] = sorted(str(p.relative_to(store.parent)) for p in store.parent.rglob("*")
                           if p.is_file() and not p.name.startswith(store.name))
    # a serving process renews its own row every few seconds (its seen_at): its liveness, not a request's change
    rows["planes"] = sorted((plane[0], plane[1]) for plane in rows.get("planes", []))
    return rows


def refused(served: Served, method: str, path: str, *, token: str | None, content: bytes | None = None,
            expect: tuple[int, str] | set[tuple[int, str]], params: dict[str, str] | None = None,
            headers: dict[str, str] | None = None) -> None:
    """Send one request; assert its typed refusal, a live server and an unchanged store."""
    before = snapshot(served.store)
    with served.client(token) as client:
        response = client.request(method, path, content=content, params=params,
                                  headers={"content-type": "application/json", **(headers or {})})
        assert served.proc.poll() is None, f"the server died on {method} {path}"
        assert client.get("/healthz").status_code == 200
    got = (response.status_code, response.json()["error"]["code"])
    allowed = expect if isinstance(expect, set) else {expect}
    assert got in allowed, f"{method} {path}: {got} {response.text[:300]}"
    assert snapshot(served.store) == before, f"{method} {path} changed the store"


def fenced(served: Served, **extra: Any) -> dict[str, Any]:
    return {"task_id": served.task_id, "fencing_token": served.fencing_token, **extra}


def body(value: Any) -> bytes:
    return json.dumps(value).encode()  # not orjson: it cannot write the integers past 64 bits sent here


BAD_JSON = 400, "invalid_input"
TOO_DEEP = 400, "nesting_too_deep"
TOO_BIG = 413, "payload_too_large"
BROKER = ("/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/messages/count_tokens")


def deep(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


def test_the_million_bracket_body_is_refused_by_every_endpoint_and_the_server_lives(served: Served) -> None:
    # the body of the crash report, first without any token: refused before a byte of it is read
    refused(served, "POST", "/v1/chat/completions", token=None, content=MILLION_DEEP, expect=(401, "invalid_token"))
    for path in BROKER:
        refused(served, "POST", path, token=served.worker, content=MILLION_DEEP,
                expect=TOO_DEEP)
        refused(served, "POST", path, token=served.worker,
                content=b'{"model": "sim-1", "messages": ' + deep(200_000) + b"}",
                expect=TOO_DEEP)
    for spec in TOOLS:
        refused(served, "POST", f"/v1/tools/{spec.name}", token=served.worker, content=MILLION_DEEP,
                expect={TOO_DEEP, TOO_BIG})  # over 1 MiB: every tool but submit_artifact refuses its size first
        refused(served, "POST", f"/v1/tools/{spec.name}", token=served.worker,
                content=b'{"task_id": ' + deep(100_000) + b"}", expect=TOO_DEEP)
    for path in operator_posts(served):
        refused(served, "POST", path, token=served.operator, content=deep(100_000), expect=TOO_DEEP)


def operator_posts(served: Served) -> list[str]:
    g = f"/v1/operator/goals/{served.goal_id}"
    return ["/v1/operator/goals", f"{g}/tasks", f"{g}/workers", f"{g}/board",
            "/v1/operator/reservations/res_missing/reconcile"]


def test_deep_json_inside_a_chat_request_is_a_typed_400(served: Served) -> None:
    nested = b'{"a":' * 1000 + b"{}" + b"}" * 1000  # no JSON library writes this: it is written by hand

    def holding(value: Any) -> bytes:
        return body(value).replace(b'"NESTED"', nested)

    tools = [{"type": "function", "function": {"name": "f", "parameters": "NESTED"}}]
    refused(served, "POST", "/v1/chat/completions", token=served.worker,
            content=holding({"model": "sim-1", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
                             "tools": tools}), expect=TOO_DEEP)
    tool_use = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": "NESTED"}]}
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        refused(served, "POST", path, token=served.worker,
                content=holding({"model": "sim-1", "max_tokens": 8,
                                 "messages": [{"role": "user", "content": "hi"}, tool_use]}),
                expect=TOO_DEEP)


def test_a_token_whose_payload_is_nested_20000_deep_is_refused_before_it_is_parsed(served: Served) -> None:
    payload = base64.urlsafe_b64encode(deep(20_000)).rstrip(b"=").decode()
    forged_mac = base64.urlsafe_b64encode(hmac.new(b"not the secret", payload.encode(), hashlib.sha256)
                                          .digest()).rstrip(b"=").decode()
    token = f"sy1.{payload}.{forged_mac}"
    for path in ("/v1/tools/claim_task", "/v1/chat/completions"):
        refused(served, "POST", path, token=token, content=b"{}",
                expect=(401, "invalid_token"))
    refused(served, "GET", "/v1/operator/goals", token=token, content=None, expect=(401, "invalid_token"))


@pytest.mark.parametrize("raw", [b'{"task_id": ', b"not json", b"[]", b"null", b'{"task_id": "t",}', b"\xef\xbb\xbf{}"],
                         ids=["truncated", "text", "array", "null", "trailing comma", "bom"])
def test_malformed_json_to_every_tool_and_operator_endpoint(served: Served, raw: bytes) -> None:
    for spec in TOOLS:
        refused(served, "POST", f"/v1/tools/{spec.name}", token=served.worker, content=raw, expect=BAD_JSON)
    for path in operator_posts(served):
        refused(served, "POST", path, token=served.operator, content=raw, expect=BAD_JSON)
    for path in BROKER:
        refused(served, "POST", path, token=served.worker, content=raw,
                expect=BAD_JSON)


def test_ten_megabytes_to_every_endpoint(served: Served) -> None:
    big = b'{"body": "' + b"x" * TEN_MB + b'"}'
    for spec in TOOLS:
        # submit_artifact takes bodies this large (base64 of an artifact): it is refused as the wrong shape
        expect = BAD_JSON if spec.name == "submit_artifact" else TOO_BIG
        refused(served, "POST", f"/v1/tools/{spec.name}", token=served.worker, content=big, expect=expect)
    for path in operator_posts(served):
        refused(served, "POST", path, token=served.operator, content=big, expect=TOO_BIG)
    for path in BROKER:
        refused(served, "POST", path, token=served.worker, content=big,
                expect=TOO_BIG)


def test_strict_integers_for_fencing_tokens_counts_and_money(served: Served) -> None:
    wrong: list[Any] = ["1", True, 1.0, 1.5, None, [1], {"n": 1}]
    for spec in TOOLS:
        if spec.name == "claim_task":
            continue
        for value in wrong:
            refused(served, "POST", f"/v1/tools/{spec.name}", token=served.worker,
                    content=body({**fenced(served, fencing_token=value), "body": "b", "title": "t",
                                  "data_base64": "aGk="}), expect=BAD_JSON)
    money: list[Any] = ["100", 1.5, 100.0, -1, True, 10**20, "1e3"]
    g = f"/v1/operator/goals/{served.goal_id}"
    for value in money:
        refused(served, "POST", "/v1/tools/delegate", token=served.worker,
                content=body(fenced(served, title="sub", budget_micro_usd=value)), expect=BAD_JSON)
        refused(served, "POST", "/v1/operator/goals", token=served.operator,
                content=body({"objective": "o", "budget_micro_usd": value, "call_cap": 1}), expect=BAD_JSON)
        refused(served, "POST", f"{g}/tasks", token=served.operator,
                content=body({"title": "t", "budget_micro_usd": value}), expect=BAD_JSON)
        refused(served, "POST", "/v1/operator/reservations/res_missing/reconcile", token=served.operator,
                content=body({"actual_micro_usd": value}), expect=BAD_JSON)
    for value in ["5", 2.5, -1, True]:
        refused(served, "POST", "/v1/tools/delegate", token=served.worker,
                content=body(fenced(served, title="sub", call_cap=value)), expect=BAD_JSON)
        refused(served, "POST", "/v1/operator/goals", token=served.operator,
                content=body({"objective": "o", "budget_micro_usd": 1, "call_cap": value}), expect=BAD_JSON)
        refused(served, "POST", "/v1/tools/board_read", token=served.worker,
                content=body(fenced(served, limit=value)), expect=BAD_JSON)
    for value in ["64", 1.5, 0, -5, True, 10**7]:
        for path in ("/v1/chat/completions", "/v1/messages"):
            refused(served, "POST", path, token=served.worker,
                    content=body({"model": "sim-1", "max_tokens": value,
                                  "messages": [{"role": "user", "content": "hi"}]}),
                    expect=BAD_JSON)
        refused(served, "POST", "/v1/responses", token=served.worker,
                content=body({"model": "sim-1", "max_output_tokens": value, "input": "hi"}), expect=BAD_JSON)
    for query in ({"after": "-1"}, {"after": "1.5"}, {"limit": "0"}, {"limit": "abc"}, {"bogus": "1"}):
        refused(served, "GET", f"{g}/board", token=served.operator, params=query, expect=BAD_JSON)


def test_operator_query_integers_are_ascii_digits_only(served: Served) -> None:
    g = f"/v1/operator/goals/{served.goal_id}"
    odd = ["1.0", "+1", "1_000", " 1", "1 ", "01", "00", "\u0661", "\u00b2", "1e3", "0x10", "-0", "",
           "9" * 5000, str(2**62 + 1)]
    for value in odd:
        for name in ("after", "limit"):
            refused(served, "GET", f"{g}/board", token=served.operator, params={name: value}, expect=BAD_JSON)
        refused(served, "GET", f"{g}/findings", token=served.operator, params={"limit": value}, expect=BAD_JSON)
    refused(served, "GET", f"{g}/board", token=served.operator, params={"limit": "5.0"}, expect=BAD_JSON)
    with served.client(served.operator) as operator:
        for query in ({"after": "0"}, {"after": str(2**62), "limit": "500"}, {"limit": "1"}):
            assert operator.get(f"{g}/board", params=query).status_code == 200, query
        assert operator.get(f"{g}/findings", params={"limit": "7"}).status_code == 200


def test_odd_unicode_in_every_string(served: Served) -> None:
    bodies = [
        b'{"task_id": "%s", "fencing_token": %d, "body": "\\ud800", "title": "\\udfff"}',  # lone surrogates
        b'{"task_id": "%s", "fencing_token": %d, "body": "a\\u0000b", "title": "a\\u0000"}',  # NUL
        b'{"task_id": "%s", "fencing_token": %d, "body": "\xff\xfe", "title": "\xc0\xaf"}',  # not UTF-8
        b'{"task_id": "%s", "fencing_token": %d, "body": "a\x00b", "title": "t"}',  # a raw control byte
    ]
    for template in bodies:
        raw = template.replace(b"%s", served.task_id.encode()).replace(b"%d", str(served.fencing_token).encode())
        for name in ("board_post", "submit_finding", "delegate"):
            refused(served, "POST", f"/v1/tools/{name}", token=served.worker, content=raw, expect=BAD_JSON)
        objective = raw.replace(b'"body"', b'"objective"').replace(b'"task_id"', b'"x"')
        refused(served, "POST", "/v1/operator/goals", token=served.operator, content=objective, expect=BAD_JSON)
    for text in (b'"\\ud800"', b'"\xff\xfe"', b'"a\x00"'):
        refused(served, "POST", "/v1/chat/completions", token=served.worker,
                content=b'{"model": "sim-1", "messages": [{"role": "user", "content": ' + text + b"}]}",
                expect=BAD_JSON)
    # an id with a NUL or a lone surrogate is refused by its pattern
    refused(served, "POST", "/v1/tools/claim_task", token=served.worker, content=b'{"task_id": "t\\u0000"}',
            expect=BAD_JSON)


def test_a_good_call_still_works_after_all_of_it(served: Served) -> None:
    with served.client(served.worker) as worker:
        posted = worker.post("/v1/tools/board_post", json=fenced(served, body="still here"))
        assert posted.status_code == 200, posted.text
        reply = worker.post("/v1/chat/completions", json={"model": "sim-1", "max_tokens": 8,
                                                          "messages": [{"role": "user", "content": "hi"}]})
        assert reply.status_code == 200, reply.text
    assert served.proc.poll() is None


def pg_snapshot(url: str) -> dict[str, list[Any]]:
    """Every row of every table in the test's PostgreSQL schema."""
    import psycopg

    with psycopg.connect(url) as db:
        tables = [r[0] for r in db.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")]
        return {t: sorted(db.execute(f'SELECT * FROM "{t}"').fetchall(), key=repr) for t in tables}


@pytest.mark.postgres
def test_nul_and_surrogates_are_typed_400s_on_postgresql_too(pg_url: str) -> None:
    # PostgreSQL cannot store a NUL in text: without the plane's own refusal this was the store's error, a 500
    with served_with_claim(store=pg_url) as running:
        before = pg_snapshot(pg_url)
        assert before["tasks"], "the schema the server uses holds the test's task"
        with running.client(running.worker) as worker:
            for raw in (b'"a\\u0000b"', b'"\\ud800"', b'"\xff"'):
                for tool, field in (("board_post", "body"), ("submit_finding", "title")):
                    answer = worker.post(f"/v1/tools/{tool}", content=body(fenced(running, body="b", title="t"))
                                         .replace(b'"' + field.encode() + b'": "' + (b"b" if field == "body" else b"t")
                                                  + b'"', b'"' + field.encode() + b'": ' + raw))
                    assert (answer.status_code, answer.json()["error"]["code"]) == BAD_JSON, answer.text
        with running.client(running.operator) as operator:
            answer = operator.post("/v1/operator/goals", content=b'{"objective": "a\\u0000", "budget_micro_usd": 1, '
                                                                 b'"call_cap": 1}')
            assert (answer.status_code, answer.json()["error"]["code"]) == BAD_JSON, answer.text
        assert running.proc.poll() is None
        assert pg_snapshot(pg_url) == before
