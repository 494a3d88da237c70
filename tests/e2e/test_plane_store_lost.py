"""A tool call whose PostgreSQL session the server ends mid-transaction (a server stopping or restarting does this to
every session in flight) gets the typed ``store_lost`` error, with no traceback in the server's log, and the server
goes on answering.

It used to be a bare 500 ``internal_error`` marked retryable, with a traceback per call: a restart mid-run filled a
run's stderr with them, and "retryable" told an agent to send again a write that may already have landed.

A real ``swarmyard serve`` on loopback over PostgreSQL; the worker's door over HTTP. Another session holds the task's
row, so the heartbeat's UPDATE waits on it; that waiting session is ended with ``pg_terminate_backend``.
"""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest

from rigs.serve import serve


@pytest.mark.postgres
def test_a_tool_call_whose_store_session_is_ended_gets_store_lost_and_the_server_answers_on(
        tmp_path: Path, pg_url: str) -> None:
    import psycopg

    with serve(tmp_path, pg_url) as served:
        op = served.client()
        made = op.post("/v1/operator/goals", json={"objective": "x", "budget_micro_usd": 1_000_000, "call_cap": 0})
        assert made.status_code == 201, made.text
        goal_id = made.json()["goal"]["id"]
        task = op.post(f"/v1/operator/goals/{goal_id}/tasks", json={"title": "t", "budget_micro_usd": 1_000})
        assert task.status_code == 201, task.text
        task_id = task.json()["task"]["id"]
        issued = op.post(f"/v1/operator/goals/{goal_id}/workers", json={"group": "main"})
        assert issued.status_code == 201, issued.text
        worker = served.client(issued.json()["token"])
        claimed = worker.post("/v1/tools/claim_task", json={"task_id": task_id})
        assert claimed.status_code == 200, claimed.text
        fence = int(claimed.json()["fencing_token"])

        answer: list[httpx.Response] = []
        with psycopg.connect(pg_url) as locker:
            locker.execute("SELECT 1 FROM tasks WHERE id = %s FOR UPDATE", (task_id,))
            beat = threading.Thread(target=lambda: answer.append(
                worker.post("/v1/tools/heartbeat", json={"task_id": task_id, "fencing_token": fence})))
            beat.start()
            with psycopg.connect(pg_url, autocommit=True) as admin:
                waiting: list[int] = []
                while not waiting and beat.is_alive():  # progress: the heartbeat's write waits on the row
                    waiting = [int(row[0]) for row in admin.execute(
                        "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
                    ).fetchall()]
                assert waiting, f"the heartbeat did not wait on the row: {answer[0].text if answer else ''}"
                admin.execute("SELECT pg_terminate_backend(%s)", (waiting[0],))
            locker.rollback()
            beat.join()

        assert answer[0].status_code == 503, answer[0].text
        error = answer[0].json()["error"]
        assert error["code"] == "store_lost" and error["retryable"] is False, error
        assert "heartbeat" in error["message"] and "unknown" in error["message"]
        # the server goes on: a new session for the same call
        again = worker.post("/v1/tools/heartbeat", json={"task_id": task_id, "fencing_token": fence})
        assert again.status_code == 200, again.text
    stderr = served.proc.stderr.read().decode() if served.proc.stderr else ""  # the server has stopped
    assert "the store's connection was lost" in stderr, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
