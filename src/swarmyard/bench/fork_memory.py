"""The ``bench machines`` row for a fork with memory: a machine whose process holds 200 MB of loaded state, forked.

Each fork is timed from the call to the fork being ready, then the fork's copy of the process is asked for the
token its source holds in memory only: the row says whether the process came with its state (a checkpoint and
restore of the sandbox's processes, see :mod:`swarmyard.machines.checkpoint`) or the fork kept the disk only, and
why. A fork of the disk only is timed all the same, so the figure is never taken for a restore that did not happen.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from swarmyard.bench.result import BenchResult, BenchRow
from swarmyard.machines.api import Machines

#: The state the source's process loads before it is forked (boxd's figure).
STATE_BYTES = 200 << 20
#: The source's background process: its state and a token held in memory only, answered on a loopback port.
_HOLDER = f'''
import secrets, socket
state = bytearray(b"swarmyard" * ({STATE_BYTES} // 9))
token = secrets.token_hex(16)
server = socket.socket()
server.bind(("127.0.0.1", 7358))
server.listen()
open("/home/boxd/holder.ready", "w").write("up")
while True:
    conn, _ = server.accept()
    conn.sendall(f"{{token}} {{len(state)}}".encode())
    conn.close()
'''
_ASK = '''
import socket
try:
    with socket.create_connection(("127.0.0.1", 7358), timeout=5) as conn:
        print(conn.recv(200).decode())
except OSError:
    print("none")
'''


def fork_memory_rows(result: BenchResult, n: int) -> None:
    """Add the fork-with-memory row and its summary keys to ``result``: ``n`` forks of one loaded machine."""
    with (
        tempfile.TemporaryDirectory(prefix="swarmyard-bench-fm-") as tmp,
        Machines("local", root=Path(tmp), max_concurrent=n + 2) as machines,
    ):
        source = machines.create("loaded")
        machines.wait_until_ready(source.id)
        machines.files.upload(source.id, "/home/boxd/holder.py", _HOLDER.encode())
        machines.files.upload(source.id, "/home/boxd/ask.py", _ASK.encode())
        machines.exec(source.id, ["sh", "-c", "setsid python3 /home/boxd/holder.py </dev/null >/dev/null 2>&1 &"])
        up = machines.exec(source.id, ["sh", "-c", "while [ ! -e /home/boxd/holder.ready ]; do sleep 0.05; done"],
                           timeout=120)
        held = machines.exec(source.id, ["python3", "/home/boxd/ask.py"]).stdout.decode().strip()
        if not up.ok or held == "none":
            raise RuntimeError(f"the loaded machine's process did not start: {up.stderr[-300:]!r}")
        samples: list[float] = []
        intact = 0
        kept: bool | None = None
        reason: str | None = None
        for i in range(n):
            started = time.perf_counter()
            fork = machines.fork(source.id, f"fm{i}")
            machines.wait_until_ready(fork.id)
            samples.append(time.perf_counter() - started)
            kept, reason = fork.fork_memory, fork.fork_memory_reason
            asked = machines.exec(fork.id, ["python3", "/home/boxd/ask.py"]).stdout.decode().strip()
            intact += asked == held
            machines.delete(fork.id)
    fork_ms = statistics.median(samples) * 1000
    what = "process and memory kept" if kept else "disk only"
    result.add(BenchRow(f"fork + ready of a machine holding {STATE_BYTES >> 20} MB ({what})", fork_ms, "ms",
                        target="<= 200 ms with the process running and its state intact"))
    result.summary.update(fork_memory_ms_p50=round(fork_ms, 2), fork_memory_kept=bool(kept),
                          fork_memory_state_intact=f"{intact}/{n}", fork_memory_reason=reason)
    if not kept:
        result.notes.append(f"fork with memory: every fork kept the disk only ({reason}); the figure is that fork's")
