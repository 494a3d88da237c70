"""A worker cannot fill the host's disk through ``submit_artifact``: the real ``swarmyard serve`` refuses the
artifact that would take its task past its share of the goal's quota (64 MiB of the goal's 256 MiB by default)
with a typed 413 ``quota_exceeded``, stores nothing for it, and still answers a duplicate of a stored one."""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterator

import pytest
from serving import Served, served_with_claim

from swarmyard.domain import Quotas

TWELVE_MIB = 12 * 1024 * 1024


@pytest.fixture
def served() -> Iterator[Served]:
    with served_with_claim() as running:
        yield running


def _blobs(served: Served) -> set[str]:
    root = served.folder / "blobs"
    return {p.parent.name + p.name for p in root.glob("*/*")} if root.exists() else set()


def test_artifacts_past_the_task_share_are_refused_413_and_not_stored(served: Served) -> None:
    share = Quotas().task_artifact_bytes
    fits = share // TWELVE_MIB
    bodies = [os.urandom(TWELVE_MIB) for _ in range(fits + 1)]
    claim = {"task_id": served.task_id, "fencing_token": served.fencing_token}
    with served.client(served.worker) as worker:
        for body in bodies[:fits]:
            done = worker.post("/v1/tools/submit_artifact",
                               json={**claim, "data_base64": base64.b64encode(body).decode()})
            assert done.status_code == 200, done.text
        over = worker.post("/v1/tools/submit_artifact",
                           json={**claim, "data_base64": base64.b64encode(bodies[-1]).decode()})
        assert over.status_code == 413, over.text
        error = over.json()["error"]
        assert (error["code"], error["what"], error["used"], error["size"], error["limit"], error["task_id"]) == (
            "quota_exceeded", "the task's artifact bytes", fits * TWELVE_MIB, TWELVE_MIB, share, served.task_id)
        assert error["retryable"] is False
        # A duplicate of a stored artifact is the stored one: counted once, still answered.
        again = worker.post("/v1/tools/submit_artifact",
                            json={**claim, "data_base64": base64.b64encode(bodies[0]).decode()})
        assert again.status_code == 200, again.text
        assert again.json()["artifact"]["sha256"] == hashlib.sha256(bodies[0]).hexdigest()
    assert _blobs(served) == {hashlib.sha256(b).hexdigest() for b in bodies[:fits]}
    assert served.proc.poll() is None
