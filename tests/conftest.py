"""Shared fixtures: the fake clock, stores on both engines, a throwaway PostgreSQL, a live control plane, a
worker holding a claim (what the broker serves), and a short temporary folder; the ``bwrap`` mark's skip and the
longer timeout of tests that load a model (the rest of the rig is in ``tests/rigs/``).

PostgreSQL comes from ``SWARMYARD_TEST_PG_URL`` (``.ci/run`` starts one on a private port and socket
folder); without it, the session starts its own with ``initdb`` + ``pg_ctl`` and stops it at the end.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from rigs.folders import short_folder
from swarmyard.audit.witness import HttpWitnessClient, Witness
from swarmyard.auth.tokens import TokenAuthority
from swarmyard.clock import Clock, FakeClock
from swarmyard.domain import GoalSpec, TaskSpec
from swarmyard.plane.tools import Evaluator
from swarmyard.store.protocol import Store

ROOT = Path(__file__).resolve().parents[1]
#: Test vectors from other projects, kept unchanged beside the tests (tests/vectors/NOTICE names each source).
VECTORS = ROOT / "tests" / "vectors"
#: pytest-timeout's limit for a test marked ``model`` (the default, 600 s, is in pyproject.toml): loading and
#: running the embedded model took 92-105 s in CI, and up to three times that on two cores that others share.
MODEL_TIMEOUT_S = 1800


#: Modules whose tests hold a fixed host resource, by the ``xdist_group`` they share: under pytest-xdist
#: (``--dist loadgroup``) the tests of one group run one after another on one worker. Tests marked ``model`` form
#: the group ``model`` of their own accord (see :func:`pytest_collection_modifyitems`).
HOST_GROUPS = {
    "test_run_ray.py": "ray",  # a local Ray cluster whose head listens on the fixed port 56390
    # The host's kernel state, one group: machines on private networks (each backend makes a hub, a network
    # namespace; these tests count the host's namespaces, `ip netns list`, before and after, which another
    # worker's hub would change), and hibernation (whether the host has swap decides what a hibernated machine
    # does; test_machines_hibernate.py adds a swap file for its length where the host has none)
    "test_machine_networks.py": "host",
    "test_machines_cli.py": "host",
    "test_boxd_held_guarantees.py": "host",
    "test_machines_idle.py": "host",
    "test_machines_hibernate.py": "host",
    # the machines bench makes a private network (a hub), and its test and the doctor's read the host's swap, which
    # the hibernation test turns on for its length
    "test_machines_bench.py": "host",
    # not a resource but a build: the two modules that use `wasi_built` on one worker build the tools once
    "test_wasi_tools.py": "wasi-build",
    "test_wasi_bench.py": "wasi-build",
}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the tests marked ``bwrap`` where bubblewrap is missing; give those marked ``model`` a longer timeout;
    put the tests that share a host resource in one ``xdist_group``.

    A ``timeout`` mark of a test's own wins over ``model``'s. The tests that load the embedded model share the
    group ``model``: two models loaded at once on a small host double each one's time (and share the model file
    assembled into the user's cache). A test's own ``xdist_group`` mark wins.
    """
    no_bwrap = pytest.mark.skip(reason="needs bubblewrap (scripts/test installs it)")
    missing = shutil.which("bwrap") is None
    timeouts = config.pluginmanager.hasplugin("timeout")  # pytest-timeout, from the dev extra
    for item in items:
        if missing and item.get_closest_marker("bwrap") is not None:
            item.add_marker(no_bwrap)
        model = item.get_closest_marker("model") is not None
        if timeouts and model and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(MODEL_TIMEOUT_S))
        group = "model" if model else HOST_GROUPS.get(item.path.name)
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(autouse=True, scope="session")
def _private_state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Runs keep their secrets under the user's state folder: in tests, a throwaway one, not the real home's."""
    before = os.environ.get("SWARMYARD_STATE_DIR")
    os.environ["SWARMYARD_STATE_DIR"] = str(tmp_path_factory.mktemp("state") / "swarmyard")
    yield
    if before is None:
        os.environ.pop("SWARMYARD_STATE_DIR", None)
    else:
        os.environ["SWARMYARD_STATE_DIR"] = before


@pytest.fixture(scope="session")
def wasi_built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The WASI tools built from their C source (``python -m swarmyard.wasi.build --out DIR``) once a session, into
    a folder the tests only read: a build took about a minute in CI, most of it SQLite's, and two modules built
    their own."""
    out = tmp_path_factory.mktemp("wasi")
    done = subprocess.run([sys.executable, "-m", "swarmyard.wasi.build", "--out", str(out)], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr
    return out


@dataclass(frozen=True)
class ClaimedWorker:
    """A goal with one task, a worker token for the goal, and the task claimed by that worker."""

    goal_id: str
    task_id: str
    tokens: TokenAuthority
    token: str
    worker_id: str


def claimed_worker(store: Store, clock: Clock, *, secret: bytes, budget: int = 1_000_000, call_cap: int = 100,
                   task_budget: int | None = None, task_call_cap: int | None = None,
                   deadline: float | None = None) -> ClaimedWorker:
    """The broker serves only a worker with a live claim: make one (the task's envelope is the goal's unless
    given)."""
    goal = store.create_goal(GoalSpec("test", budget_micro_usd=budget, call_cap=call_cap, deadline=deadline))
    task = store.create_task(goal.id, TaskSpec("t", budget_micro_usd=budget if task_budget is None else task_budget,
                                               call_cap=call_cap if task_call_cap is None else task_call_cap))
    tokens = TokenAuthority(secret, store, clock)
    token, identity = tokens.issue(goal.id, "main", ttl_s=3600)
    assert store.claim(goal.id, identity.worker_id, 3600) is not None
    return ClaimedWorker(goal.id, task.id, tokens, token, identity.worker_id)


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """A PostgreSQL server URL (admin database), started for the session if none was given.

    Under pytest-xdist with more than one worker, each worker starts a server of its own even when one was given:
    the store sequences only events older than every transaction running on its server, and another worker's
    open transaction held back a test that reads its own events just after writing them."""
    given = os.environ.get("SWARMYARD_TEST_PG_URL")
    if given and int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) < 2:
        yield given
        return
    base = Path(tempfile.mkdtemp(prefix="swarmyard-pg-"))
    script = str(ROOT / "scripts" / "pg-test-server")
    port = str(20000 + secrets.randbelow(20000))
    url = subprocess.run(["bash", script, "start", str(base), port], check=True, capture_output=True,
                         text=True).stdout.strip()
    try:
        yield url
    finally:
        subprocess.run(["bash", script, "stop", str(base)], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server_url: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL schema for one test, as a store URL (``search_path`` set in ``options``)."""
    import psycopg

    schema = f"t_{secrets.token_hex(6)}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in pg_server_url else "?"
    yield f"{pg_server_url}{sep}options=-csearch_path%3D{schema}"
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A fresh folder with a short path (a run's plane socket lives in the run folder), removed after the test."""
    with short_folder() as path:
        yield path


@pytest.fixture
def clock() -> FakeClock:
    """A clock that moves only when the test says so."""
    return FakeClock()


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store URL on each engine."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return str(request.getfixturevalue("pg_url"))


class LivePlane:
    """A real control plane on a SQLite store, served over a Unix socket in a background thread.

    Tests of plane clients (the built-in agent) talk to it over real HTTP; they set up peers' posts and
    findings through the store it serves, and read back what landed there.
    """

    def __init__(self, clock: FakeClock, evaluator: Evaluator | None = None) -> None:
        from swarmyard.auth.tokens import TokenAuthority
        from swarmyard.plane.app import create_app
        from swarmyard.plane.server import BackgroundServer, Listen
        from swarmyard.plane.settings import PlaneSettings
        from swarmyard.store import open_store

        self.folder = Path(tempfile.mkdtemp(prefix="sy-"))  # short: Unix socket paths are limited to 108 bytes
        self.clock = clock
        self.store = open_store(f"sqlite:///{self.folder / 'store.db'}", clock=clock, blob_dir=self.folder / "blobs")
        self.tokens = TokenAuthority(b"k" * 32, self.store, clock)
        app = create_app(self.store, self.tokens, PlaneSettings(lease_s=60), evaluator=evaluator, clock=clock)
        self.socket = self.folder / "plane.sock"
        self._server = BackgroundServer(app, Listen(socket_path=self.socket))
        self._server.__enter__()

    def client(self, token: str) -> httpx.AsyncClient:
        """An async HTTP client over the socket, authenticated as ``token``'s worker."""
        from swarmyard.plane.transport import UnixSocketTransport

        return httpx.AsyncClient(transport=UnixSocketTransport(str(self.socket)), base_url="http://plane",
                                 headers={"authorization": f"Bearer {token}"}, timeout=30)

    def close(self) -> None:
        self._server.__exit__(None, None, None)
        self.store.close()
        shutil.rmtree(self.folder, ignore_errors=True)


@pytest.fixture
def live_plane(clock: FakeClock) -> Iterator[Callable[..., LivePlane]]:
    """Start real planes (optionally with an evaluator); each is stopped at the end of the test."""
    started: list[LivePlane] = []

    def start(evaluator: Evaluator | None = None) -> LivePlane:
        started.append(LivePlane(clock, evaluator))
        return started[-1]

    yield start
    for plane in started:
        plane.close()


@contextmanager
def serving_witness(witness: Witness, sock: Path) -> Iterator[HttpWitnessClient]:
    """Run a witness's real uvicorn server on a Unix socket in a thread until the block ends."""
    from swarmyard.audit.witness import HttpWitnessClient, make_server

    server = make_server(witness, socket=sock)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    ready = threading.Event()
    for _ in range(1000):  # readiness poll with a bound, not a sleep standing in for synchronisation
        if server.started or not thread.is_alive():
            break
        ready.wait(0.01)
    assert server.started, "witness server did not start"
    client = HttpWitnessClient(socket=sock)
    try:
        yield client
    finally:
        client.close()
        server.should_exit = True
        thread.join(10)
