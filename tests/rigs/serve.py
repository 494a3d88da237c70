"""A ``swarmyard serve`` on loopback, started as a user starts one: ``python -m swarmyard.cli serve`` in a
subprocess from the test's folder, with a providers file, a secret file and an operator-token file there.

The readiness wait is bounded by the process (it must stay alive) and by a minute of wall clock as a last resort,
not by a guess of how long a start takes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from rigs.network import free_port

#: one simulated model with a price, so the broker holds and settles real amounts
PRICED_SIMULATED = ('[providers.sim]\nkind = "simulated"\nmodels = ["sim-1"]\n'
                    '[providers.sim.prices.sim-1]\ninput_usd_per_mtok = "1"\noutput_usd_per_mtok = "2"\n')


@dataclass(frozen=True)
class Served:
    """The running server: its base URL, the operator token it wrote, and its process."""

    base: str
    operator_token: str
    proc: subprocess.Popen[bytes]

    @property
    def operator_headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.operator_token}"}

    def client(self, token: str | None = None, *, timeout: float = 60) -> httpx.Client:
        """An HTTP client of the server with ``token`` (the operator's when None) as its bearer."""
        return httpx.Client(base_url=self.base, headers={"authorization": f"Bearer {token or self.operator_token}"},
                            timeout=timeout)


@contextmanager
def serve(folder: Path, store_url: str, providers: str = PRICED_SIMULATED) -> Iterator[Served]:
    """Serve ``store_url`` with ``providers`` (a providers file's text) from ``folder``; the secret file is
    ``folder/secret`` (made by the server unless a test made it first, to issue tokens itself). On leaving, the
    server must still be running (a test that killed it says so) and is then stopped."""
    (folder / "providers.toml").write_text(providers)
    port = free_port()
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "PYTHONPATH", "VIRTUAL_ENV") if k in os.environ}
    proc = subprocess.Popen(
        [sys.executable, "-m", "swarmyard.cli", "serve", "--store", store_url, "--no-socket", "--host", "127.0.0.1",
         "--port", str(port), "--secret-file", str(folder / "secret"), "--providers", str(folder / "providers.toml"),
         "--operator-token-file", str(folder / "operator-token")],
        cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "serve did not start"
            try:
                httpx.get(f"{base}/metrics")
                if (folder / "operator-token").exists():
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        yield Served(base, (folder / "operator-token").read_text().strip(), proc)
        assert proc.poll() is None, "serve died"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
