"""A real ``swarmyard serve`` (the console script) for the security tests, set up through its own API: a goal,
a task, a worker token and that worker's claim."""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

SWARMYARD = Path(sys.executable).with_name("swarmyard")  # the console script pip installed beside python


def child_env() -> dict[str, str]:
    """Only what the server needs: never the test's whole environment."""
    return {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "PYTHONPATH", "VIRTUAL_ENV") if k in os.environ}


@dataclass
class Served:
    """A running ``swarmyard serve`` and what the test set up through its operator API."""

    proc: subprocess.Popen[bytes]
    folder: Path
    operator: str
    worker: str
    goal_id: str
    task_id: str
    fencing_token: int
    worker_id: str

    @property
    def store(self) -> Path:
        return self.folder / "store.db"

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(transport=httpx.HTTPTransport(uds=str(self.folder / "plane.sock")),
                            base_url="http://plane", headers=headers, timeout=60)


def serve(folder: Path, *extra: str, env: dict[str, str] | None = None,
          store: str | None = None) -> subprocess.Popen[bytes]:
    """Start the console script (on ``store``, by default a SQLite file in ``folder``) and wait, bounded, until
    it answers ``/healthz``."""
    assert SWARMYARD.exists(), f"{SWARMYARD} is missing: pip install -e ."
    sock = folder / "plane.sock"
    proc = subprocess.Popen(
        [str(SWARMYARD), "serve", "--store", store or f"sqlite:///{folder / 'store.db'}", "--socket", str(sock),
         "--secret-file", str(folder / "token-secret"), "--operator-token-file", str(folder / "operator-token"),
         "--rate", "10000", "--burst", "10000", *extra],
        env=env or child_env(), cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while True:  # readiness poll, bounded; no test below waits on a race
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        assert time.monotonic() < deadline, "swarmyard serve did not start"
        if sock.exists():
            try:
                with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock))) as c:
                    if c.get("http://plane/healthz").status_code == 200:
                        return proc
            except httpx.TransportError:
                pass
        time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def served_with_claim(*extra: str, env: dict[str, str] | None = None, budget_micro_usd: int = 5_000_000,
                      store: str | None = None) -> Iterator[Served]:
    """``swarmyard serve`` with ``extra`` flags, a goal and a task made through the operator API, and a worker
    holding the task's claim (taken through ``claim_task``)."""
    folder = Path(tempfile.mkdtemp(prefix="sy-sec-"))  # short: a Unix socket path has at most 107 bytes
    proc = serve(folder, *extra, env=env, store=store)
    try:
        operator = (folder / "operator-token").read_text().strip()
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(folder / "plane.sock")), base_url="http://plane",
                          headers={"authorization": f"Bearer {operator}"}, timeout=60) as op:
            goal = op.post("/v1/operator/goals", json={"objective": "o", "budget_micro_usd": budget_micro_usd,
                                                       "call_cap": 1000}).json()["goal"]
            op.post(f"/v1/operator/goals/{goal['id']}/tasks",
                    json={"title": "t", "budget_micro_usd": budget_micro_usd // 5, "call_cap": 500}
                    ).raise_for_status()
            issued = op.post(f"/v1/operator/goals/{goal['id']}/workers", json={}).json()
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(folder / "plane.sock")), base_url="http://plane",
                          headers={"authorization": f"Bearer {issued['token']}"}, timeout=60) as worker:
            claim = worker.post("/v1/tools/claim_task", json={}).json()
        yield Served(proc, folder, operator, issued["token"], goal["id"], claim["task"]["id"],
                     claim["fencing_token"], issued["worker"]["id"])
    finally:
        stop(proc)
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def served_evaluator(bundle: Path, *extra: str) -> Iterator[Path]:
    """``swarmyard evaluator serve`` on a copy of ``bundle`` in a fresh folder (its socket ``eval.sock``, its state
    ``state/``), started through the console script and waited for, bounded, until it prints its ready line."""
    root = Path(tempfile.mkdtemp(prefix="sy-ev-"))
    root.chmod(0o755)  # searchable by the evaluator's own user; the bundle's modes protect the bundle
    shutil.copytree(bundle, root / "bundle")
    proc = subprocess.Popen([str(SWARMYARD), "evaluator", "serve", str(root / "bundle"), "--socket",
                             str(root / "eval.sock"), "--state", str(root / "state"), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"})
    assert proc.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        ready = selector.select(timeout=60)
    line = proc.stdout.readline() if ready else ""
    assert line, f"evaluator serve did not start: {proc.stderr.read() if proc.stderr else ''}"
    try:
        yield root
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        assert proc.returncode is not None
        shutil.rmtree(root, ignore_errors=True)
