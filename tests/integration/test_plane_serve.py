"""``swarmyard serve`` as a real process: worker tools and the mounted model broker on one Unix socket."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from swarmyard.auth.tokens import TokenAuthority, load_or_create_secret
from swarmyard.domain import GoalSpec, ReservationState, TaskSpec
from swarmyard.store import open_store


def _env() -> dict[str, str]:
    # Only what a Python child needs: never the whole environment (it may hold provider keys).
    return {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "PYTHONPATH", "VIRTUAL_ENV") if k in os.environ}


def _serve(tmp_path: Path, *extra: str) -> Iterator[subprocess.Popen[bytes]]:
    sock = tmp_path / "plane.sock"
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    open_store(store_url).close()  # migrated before the server opens it
    proc = subprocess.Popen(
        [sys.executable, "-c", "from swarmyard.cli.main import main; main()", "serve", "--store", store_url,
         "--socket", str(sock), "--secret-file", str(tmp_path / "token-secret"),
         "--operator-token-file", str(tmp_path / "operator-token"), *extra],
        env=_env(), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:  # readiness poll, bounded; the test itself never waits on a race
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "swarmyard serve did not start"
            if sock.exists():
                try:
                    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock))) as c:
                        if c.get("http://plane/healthz").status_code == 200:
                            break
                except httpx.TransportError:
                    pass
            time.sleep(0.05)
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.slow
def test_two_serving_processes_share_the_socket_and_the_store(tmp_path: Path) -> None:
    for proc in _serve(tmp_path, "--workers", "2", "--rate", "1000", "--burst", "1000"):
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        assert len(children) == 2  # two serving processes, forked by the one the user started
        store = open_store(f"sqlite:///{tmp_path / 'store.db'}")
        try:
            goal = store.create_goal(GoalSpec("two", budget_micro_usd=10_000_000, call_cap=100))
            for i in range(24):
                store.create_task(goal.id, TaskSpec(f"t{i}"))
            authority = TokenAuthority(load_or_create_secret(tmp_path / "token-secret"), store)
            tokens = [authority.issue(goal.id, "main", ttl_s=3600)[0] for _ in range(24)]

            def call(token: str, tool: str, body: dict[str, object]) -> httpx.Response:
                # A fresh connection per call: the kernel hands connections to either process.
                with httpx.Client(transport=httpx.HTTPTransport(uds=str(tmp_path / "plane.sock")),
                                  base_url="http://plane", headers={"authorization": f"Bearer {token}"}) as c:
                    return c.post(f"/v1/tools/{tool}", json=body)

            claims = [call(t, "claim_task", {}).json() for t in tokens]
            assert len({c["task"]["id"] for c in claims}) == 24  # no task held twice
            fence = {"task_id": claims[0]["task"]["id"], "fencing_token": claims[0]["fencing_token"]}
            assert all(call(tokens[0], "board_post", {**fence, "body": f"p{i}"}).status_code == 200
                       for i in range(6))
            # Revoked by another process (here: the test's own store handle): every serving process
            # refuses the token on its very next call, since each reads the worker's row on every call.
            authority.revoke(store.get_worker(claims[0]["task"]["worker_id"]).id)
            refused = [call(tokens[0], "board_post", {**fence, "body": "late"}) for _ in range(12)]
            assert {r.status_code for r in refused} == {401}
            assert [p.body for p in store.read_board(goal.id)] == [f"p{i}" for i in range(6)]
        finally:
            store.close()


@pytest.mark.slow
def test_model_call_and_tools_share_the_serve_socket(tmp_path: Path) -> None:
    sock, folder = tmp_path / "plane.sock", tmp_path
    store = open_store(f"sqlite:///{folder / 'store.db'}")
    server = _serve(tmp_path, "--provider", "sim=simulated:sim-1")
    proc = next(server)
    try:
        goal = store.create_goal(GoalSpec("serve", budget_micro_usd=10_000_000, call_cap=100))
        store.create_task(goal.id, TaskSpec("t", budget_micro_usd=5_000_000, call_cap=50))
        tokens = TokenAuthority(load_or_create_secret(folder / "token-secret"), store)
        token, _ = tokens.issue(goal.id, "main", ttl_s=3600)
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://plane",
                          headers={"authorization": f"Bearer {token}"}) as http:
            claimed = http.post("/v1/tools/claim_task", json={})
            assert claimed.status_code == 200 and claimed.json()["task"] is not None
            sdk = openai.OpenAI(base_url="http://plane/v1", api_key=token, max_retries=0, http_client=http)
            reply = sdk.chat.completions.create(model="sim-1", max_tokens=64,
                                                messages=[{"role": "user", "content": "hi"}])
            assert reply.choices[0].message.content
            assert [m.id for m in sdk.models.list()] == ["sim-1"]
        # Settlement is written after the answer went out; a server told to stop writes what is queued
        # before it exits. The call went through the broker's ledger in the same store: reserved, settled.
        proc.terminate()
        assert proc.wait(timeout=30) == 0
        [reservation] = store.list_reservations(goal.id)
        assert reservation.state is ReservationState.SETTLED
    finally:
        server.close()
        store.close()


def test_provider_flags_and_file_make_one_table(tmp_path: Path) -> None:
    from swarmyard.cli.serve import provider_table
    from swarmyard.config import ProviderKind
    from swarmyard.errors import ConfigError

    file = tmp_path / "swarm.toml"
    file.write_text('[providers.sim]\nkind = "simulated"\nmodels = ["a"]\n'
                    '[providers.s2]\nkind = "scripted"\nmodels = ["b"]\n')
    table = provider_table(file, ["sim=scripted:c,d"])
    assert table["sim"].kind is ProviderKind.SCRIPTED and table["sim"].models == ("c", "d")
    assert table["s2"].models == ("b",)
    with pytest.raises(ConfigError, match="NAME=KIND:MODEL"):
        provider_table(None, ["nokind"])
    with pytest.raises(ConfigError) as bad:
        provider_table(None, ["x=martian:m"])
    assert bad.value.field == "providers.x"
