"""Shared fixtures: the fake clock, stores on both engines, and a throwaway PostgreSQL.

PostgreSQL comes from ``SWARMYARD_TEST_PG_URL`` (``.ci/run`` starts one on a private port and socket
folder); without it, the session starts its own with ``initdb`` + ``pg_ctl`` and stops it at the end.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from swarmyard.clock import FakeClock

SHARED = Path(__file__).resolve().parents[2] / "shared"
VECTORS = SHARED / "vectors"


ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """A PostgreSQL server URL (admin database), started for the session if none was given."""
    given = os.environ.get("SWARMYARD_TEST_PG_URL")
    if given:
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
def clock() -> FakeClock:
    """A clock that moves only when the test says so."""
    return FakeClock()


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store URL on each engine."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'store.db'}"
    return str(request.getfixturevalue("pg_url"))
