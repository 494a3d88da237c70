"""A capability token a worker writes into what it submits is replaced before the store sees it.

Over real HTTP on each store engine: a worker puts its own token, a peer's, the operator's and a look-alike that
no authority signed into every free text of every writing tool (a post, a finding's title, body and citations, a
sub-task's title and prompt, an artifact). What the store keeps, and hands back to peers,
holds ``[capability token]`` where each signed token stood and the look-alike as written; the artifact is scored
and stored as kept, without the token; on SQLite not one byte of the store's files holds a token.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_plane_tools import Plane, _goal, _Scorer, start_plane

from swarmyard.auth.tokens import REDACTED
from swarmyard.clock import FakeClock
from swarmyard.plane.settings import PlaneSettings


@pytest.fixture
def plane(store_url: str, clock: FakeClock) -> Iterator[Plane]:
    yield from start_plane(store_url, clock, PlaneSettings(lease_s=60, max_body_bytes=50_000),
                           evaluator=_Scorer())


def _store_bytes(store_url: str) -> bytes:
    """Every byte of a SQLite store's files (the database, its WAL and journal)."""
    path = Path(store_url.removeprefix("sqlite:///"))
    return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))


def test_every_token_this_plane_signed_is_replaced_in_what_a_worker_submits(plane: Plane, store_url: str) -> None:
    goal_id, tasks = _goal(plane, "main")
    mine, me = plane.tokens.issue(goal_id, "main", ttl_s=3600)
    peer, _ = plane.tokens.issue(goal_id, "main", ttl_s=3600)
    head, payload, mac = peer.split(".")
    lookalike = f"{head}.{payload}.{'A' if mac[0] != 'A' else 'B'}{mac[1:]}"  # the form, with no valid MAC
    signed = (mine, peer, plane.operator)
    text = f"env: SWARMYARD_TOKEN={mine}\npeer {peer}, operator {plane.operator}; glued {mine}xyz; {lookalike}"
    kept = (f"env: SWARMYARD_TOKEN={REDACTED}\npeer {REDACTED}, operator {REDACTED}; glued {REDACTED}xyz; "
            f"{lookalike}")

    claim = plane.ok("claim_task", mine)
    fence = {"task_id": tasks["main"], "fencing_token": claim["fencing_token"]}
    post = plane.ok("board_post", mine, **fence, body=text)["post"]
    assert post["body"] == kept
    plane.ok("delegate", mine, **fence, title=f"child {mine}", prompt=text)
    blob = f"print('{mine}')\n".encode()
    artifact = plane.ok("submit_artifact", mine, **fence, data_base64=base64.b64encode(blob).decode(),
                        media_type="text/x-python")
    stored = f"print('{REDACTED}')\n".encode()
    assert artifact["artifact"]["sha256"] == hashlib.sha256(stored).hexdigest()
    assert artifact["score"]["score"] == len(stored)  # the evaluator scored what is stored
    citation: dict[str, Any] = {"kind": "post", "ref": str(post["seq"]), "quote": f"it said {mine}"}
    finding = plane.ok("submit_finding", mine, **fence, title=f"env {mine}", body=text, citations=[citation])
    assert finding["finding"]["title"] == f"env {REDACTED}" and finding["finding"]["body"] == kept
    assert finding["finding"]["citations"][0]["quote"] == f"it said {REDACTED}"

    # what the store hands back to anyone
    [stored_post] = plane.store.read_board(goal_id)
    [stored_finding] = plane.store.read_findings(goal_id)
    child = next(t for t in plane.store.list_tasks(goal_id) if t.parent_id == tasks["main"])
    [stored_artifact] = plane.store.list_artifacts(goal_id)
    assert stored_post.body == kept and stored_finding.body == kept and child.prompt == kept
    assert child.title == f"child {REDACTED}"
    assert stored_finding.citations[0].quote == f"it said {REDACTED}"
    assert stored_artifact.author == me.worker_id
    assert plane.store.read_artifact(goal_id, stored_artifact.sha256) == stored
    if store_url.startswith("sqlite:"):
        everything = _store_bytes(store_url)
        assert lookalike.encode() in everything  # the store's bytes are readable here: the look-alike is in them
        for token in signed:
            assert token.encode() not in everything
            assert token.split(".")[2].encode() not in everything  # nor its MAC alone


def test_text_without_a_token_is_stored_as_written(plane: Plane) -> None:
    goal_id, tasks = _goal(plane, "main")
    token, _ = plane.tokens.issue(goal_id, "main", ttl_s=3600)
    claim = plane.ok("claim_task", token)
    fence = {"task_id": tasks["main"], "fencing_token": claim["fencing_token"]}
    text = "sy1. is our prefix; sy1.short.mac stays; résumé ✓"
    assert plane.ok("board_post", token, **fence, body=text)["post"]["body"] == text
    assert plane.ok("submit_finding", token, **fence, title="t", body=text)["finding"]["body"] == text
