"""``swarmyard bench machines``: create + first exec, exec on a ready machine, fork, and many machines at once.

Baselines run in the same process: plain ``subprocess`` of ``true`` and plain ``bwrap --unshare-all true``.
No sandbox is pre-booted: every create and fork figure is a cold boot of a fresh sandbox. What the backend does
keep ahead of demand are parked launchers (see :mod:`swarmyard.machines.launchers`): processes already inside
fresh cgroups with their machine folders made, so a cgroup move (an RCU grace period) is off a boot's path. The
pool refills in the background during the timed loops, as it would in use. The same figure with no launcher
parked is reported beside it, and so are the Python init (the fallback without a C compiler) and machines
without cgroup limits.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from swarmyard.bench.fork_memory import fork_memory_rows
from swarmyard.bench.result import BenchResult, BenchRow
from swarmyard.machines import networks, pausing
from swarmyard.machines.api import Machines
from swarmyard.machines.local import LocalBackend
from swarmyard.machines.protocol import Limits
from swarmyard.machines.snapshots import Snapshots


def _ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def _p90_ms(samples: list[float]) -> float:
    return statistics.quantiles(samples, n=10)[-1] * 1000


def _timed(action: object, n: int) -> list[float]:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        action()  # type: ignore[operator]
        samples.append(time.perf_counter() - started)
    return samples


def run(quick: bool = False, **options: object) -> BenchResult:
    """Measure the ``local`` backend beside raw subprocess and raw bwrap."""
    n = 5 if quick else 30
    many = 10 if quick else 100
    env = {"PATH": "/usr/bin:/bin"}
    bwrap = shutil.which("bwrap", path=env["PATH"]) or "bwrap"
    raw_sub = _ms(_timed(lambda: subprocess.run(["true"], env=env, check=True), n))
    raw_bwrap = _ms(
        _timed(
            lambda: subprocess.run(
                [
                    bwrap,
                    "--unshare-all",
                    "--ro-bind",
                    "/usr",
                    "/usr",
                    "--symlink",
                    "usr/lib",
                    "/lib",
                    "--symlink",
                    "usr/lib64",
                    "/lib64",
                    "--symlink",
                    "usr/bin",
                    "/bin",
                    "true",
                ],
                env=env,
                check=True,
            ),
            n,
        )
    )
    result = BenchResult(area="machines")
    with (
        tempfile.TemporaryDirectory(prefix="swarmyard-bench-") as tmp,
        Machines("local", root=Path(tmp), max_concurrent=many + 8) as machines,
    ):
        counter = iter(range(10**6))

        def create_exec() -> None:
            info = machines.create(f"c{next(counter)}")
            machines.exec(info.id, ["true"])

        create_exec()  # the first machine pays for the host probe
        create_exec_samples = _timed(create_exec, n)
        create_exec_ms = _ms(create_exec_samples)
        for info in machines.list():
            machines.delete(info.id)
        network_ms: float | None = None
        if networks.available() is None:

            def create_exec_networked() -> None:
                info = machines.create(f"w{next(counter)}", networks=["bench"])
                machines.exec(info.id, ["true"])

            network_ms = _ms(_timed(create_exec_networked, n))
            for info in machines.list():
                machines.delete(info.id)
        ready = machines.create("ready")
        machines.exec(ready.id, ["true"])
        exec_ms = _ms(_timed(lambda: machines.exec(ready.id, ["true"]), n))

        def fork() -> None:
            info = machines.fork(ready.id, f"f{next(counter)}")
            machines.wait_until_ready(info.id)

        fork_ms = _ms(_timed(fork, n))
        for info in machines.list():
            if info.id != ready.id:
                machines.delete(info.id)

        def pause_resume() -> None:
            pausing.pause(machines.backend, ready.id)
            pausing.resume(machines.backend, ready.id)

        pause_resume_ms = _ms(_timed(pause_resume, n))
        golden = Path(tmp) / "golden"
        (golden / "repo").mkdir(parents=True)
        for i in range(50):  # a small checkout: fifty files
            (golden / "repo" / f"f{i}.py").write_text(f"x = {i}\n" * 20)
        snapshot = Snapshots(machines.backend).create("bench", folder=golden)

        def create_from_snapshot() -> None:
            info = machines.create(f"s{next(counter)}", snapshot.baseline)
            machines.exec(info.id, ["true"])

        snapshot_ms = _ms(_timed(create_from_snapshot, n))
        for info in machines.list():
            if info.id != ready.id:
                machines.delete(info.id)

        native = isinstance(machines.backend, LocalBackend) and machines.backend.native_init is not None
        parked = machines.backend.parked if isinstance(machines.backend, LocalBackend) else 0

        def create_exec_unlimited() -> None:
            info = machines.create(f"u{next(counter)}", limits=Limits(memory_bytes=None, pids=None))
            machines.exec(info.id, ["true"])

        unlimited_ms = _ms(_timed(create_exec_unlimited, n))
        for info in machines.list():
            machines.delete(info.id)

        def one(i: int) -> None:
            info = machines.create(f"many{i}")
            machines.exec(info.id, ["true"])

        started = time.perf_counter()
        with ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(one, range(many)))
        many_s = time.perf_counter() - started
    with (
        tempfile.TemporaryDirectory(prefix="swarmyard-bench-") as tmp,
        Machines(LocalBackend(Path(tmp), parked=0), max_concurrent=n + 2) as unparked,
    ):

        def create_exec_unparked() -> None:
            info = unparked.create(f"n{next(counter)}")
            unparked.exec(info.id, ["true"])

        create_exec_unparked()
        unparked_ms = _ms(_timed(create_exec_unparked, n))
    with (
        tempfile.TemporaryDirectory(prefix="swarmyard-bench-") as tmp,
        Machines(LocalBackend(Path(tmp), init="python"), max_concurrent=n) as slow,
    ):

        def create_exec_python() -> None:
            info = slow.create(f"p{next(counter)}")
            slow.exec(info.id, ["true"])

        python_init_ms = _ms(_timed(create_exec_python, max(3, n // 3)))
    result.add(
        BenchRow("create + first exec (true)", create_exec_ms, "ms", raw_bwrap, "raw bwrap", "<= 10 ms")
    )
    if network_ms is not None:
        result.add(BenchRow("create + first exec, on a private network", network_ms, "ms", create_exec_ms,
                            "create + first exec", "<= 2x"))
    result.add(
        BenchRow("create + first exec, no launcher parked", unparked_ms, "ms", raw_bwrap, "raw bwrap")
    )
    result.add(BenchRow("create + first exec, no cgroup limits", unlimited_ms, "ms", raw_bwrap, "raw bwrap"))
    result.add(BenchRow("create + first exec, Python init", python_init_ms, "ms", raw_bwrap, "raw bwrap"))
    result.add(BenchRow("exec on a ready machine", exec_ms, "ms", raw_sub, "raw subprocess"))
    result.add(BenchRow("fork (ready)", fork_ms, "ms", raw_bwrap, "raw bwrap", "<= 20 ms"))
    result.add(BenchRow("pause + resume (cgroup freezer)", pause_resume_ms, "ms", create_exec_ms,
                        "create + first exec", "<= 2x"))
    result.add(BenchRow("create + first exec from a snapshot (50 files)", snapshot_ms, "ms", create_exec_ms,
                        "create + first exec", "<= 2x"))
    result.add(
        BenchRow(
            f"{many} machines at once (create + exec)",
            many_s * 1000,
            "ms",
            raw_bwrap * many,
            f"{many} x raw bwrap",
        )
    )
    fork_memory_rows(result, n)
    result.add(BenchRow("raw bwrap --unshare-all true", raw_bwrap, "ms"))
    result.add(BenchRow("raw subprocess true", raw_sub, "ms"))
    result.summary.update(
        create_exec_ms_p50=round(create_exec_ms, 2),
        create_exec_ms_p90=round(_p90_ms(create_exec_samples), 2),
        create_exec_unparked_ms_p50=round(unparked_ms, 2),
        exec_ms_p50=round(exec_ms, 2),
        fork_ms_p50=round(fork_ms, 2),
        pause_resume_ms_p50=round(pause_resume_ms, 2),
        create_exec_snapshot_ms_p50=round(snapshot_ms, 2),
        create_exec_network_ms_p50=None if network_ms is None else round(network_ms, 2),
        create_exec_no_cgroups_ms_p50=round(unlimited_ms, 2),
        create_exec_python_init_ms_p50=round(python_init_ms, 2),
        init="native" if native else "python",
        pooled=False,
        parked_launchers=parked,
        raw_bwrap_ms_p50=round(raw_bwrap, 2),
        raw_subprocess_ms_p50=round(raw_sub, 2),
        many_machines=many,
        many_machines_s=round(many_s, 3),
    )
    result.notes.append(
        "every figure is a cold boot of a fresh sandbox (none is pre-booted); machines boot the "
        + ("C init (compiled at first use)" if native else "Python init (no C compiler found)")
        + f"; {parked} launchers wait parked in fresh cgroups and are refilled in the background during the"
        " timed loops; the no-launcher-parked row is the same boot joining its cgroups on the way"
        " (a cgroup move waits for an RCU grace period)"
    )
    return result
