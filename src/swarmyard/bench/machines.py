"""``swarmyard bench machines``: create + first exec, exec on a ready machine, fork, and many machines at once.

Baselines run in the same process: plain ``subprocess`` of ``true`` and plain ``bwrap --unshare-all true``.
No sandbox is pre-booted: every create and fork figure is a cold boot of a fresh sandbox. What the backend does
keep ahead of demand are parked launchers (see :mod:`swarmyard.machines.launchers`): processes already inside
fresh cgroups with their machine folders made, so a cgroup move (an RCU grace period) is off a boot's path. The
pool refills in the background during the timed loops, as it would in use. The same figure with no launcher
parked is reported beside it, and so are the Python init (the fallback without a C compiler) and machines
without cgroup limits.

The same operations are then measured the way a user's script makes them, through the ``Boxd`` client against
its embedded plane (already up: its start, the first call of a script, is a row of its own), beside the backend's
own figures taken in the same process and under the same load: create + wait_until_ready + first exec, fork +
ready, delete; and both again with busy processes loading every core, to compare how each holds up. Last, the
wake of a machine frozen for being idle (see :mod:`swarmyard.machines.idle`): an exec that finds it frozen.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from swarmyard.bench.fork_memory import fork_memory_rows
from swarmyard.bench.result import BenchResult, BenchRow
from swarmyard.clock import FakeClock
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
    _client_rows(result, max(n, 15))  # a ratio of two medians: five samples each are too few to compare
    _wake_rows(result, n, exec_ms)
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


@contextmanager
def _load(busy: int) -> Iterator[None]:
    """``busy`` processes spinning on the CPU for as long as the block lasts."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"], env={"PATH": "/usr/bin:/bin"})
                for _ in range(busy)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def _client_rows(result: BenchResult, n: int) -> None:
    """The user's path: the ``Boxd`` client on its embedded plane, beside the backend's own figures."""
    from swarmyard.boxd import Boxd

    counter = iter(range(10**6))
    busy = os.cpu_count() or 2
    with tempfile.TemporaryDirectory(prefix="swarmyard-bench-") as tmp:
        started = time.perf_counter()
        # the default configuration: the embedded plane and broker on the default local model
        boxd = Boxd(root=Path(tmp) / "client", budget_usd="1000000", idle_suspend_s=None)
        assert boxd.goal_id  # the first call that needs the plane starts it
        plane_start_s = time.perf_counter() - started
        client = boxd.machines
        backend = Machines("local", root=Path(tmp) / "backend", idle_suspend_s=None)
        try:
            def client_create() -> None:
                made = client.create(f"c{next(counter)}")
                client.wait_until_ready(made.id)
                client.exec(made.id, ["true"])

            def backend_create() -> None:
                info = backend.create(f"b{next(counter)}")
                backend.wait_until_ready(info.id)
                backend.exec(info.id, ["true"])

            def deleted(remove: Callable[[str], None], ids: list[str]) -> list[float]:
                samples = []
                for machine_id in ids:
                    began = time.perf_counter()
                    remove(machine_id)
                    samples.append(time.perf_counter() - began)
                return samples

            client_create()  # each side's first machine pays for its host probe
            backend_create()
            quiet = {"client": _ms(_timed(client_create, n)), "backend": _ms(_timed(backend_create, n))}
            client_delete = _ms(deleted(client.delete, [m.id for m in client.list()]))
            backend_delete = _ms(deleted(backend.delete, [i.id for i in backend.list()]))
            source = client.create("source")
            client.wait_until_ready(source.id)
            origin = backend.create("origin")
            backend.wait_until_ready(origin.id)

            def client_fork() -> None:
                client.wait_until_ready(client.fork(source.id, f"cf{next(counter)}").id)

            def backend_fork() -> None:
                backend.wait_until_ready(backend.fork(origin.id, f"bf{next(counter)}").id)

            fork = {"client": _ms(_timed(client_fork, n)), "backend": _ms(_timed(backend_fork, n))}
            for machine in client.list():
                client.delete(machine.id)
            for info in backend.list():
                backend.delete(info.id)
            with _load(busy):
                loaded = {"client": _ms(_timed(client_create, n)), "backend": _ms(_timed(backend_create, n))}
        finally:
            backend.close()
            boxd.close()
    create_ratio = quiet["client"] / quiet["backend"]
    client_load, backend_load = loaded["client"] / quiet["client"], loaded["backend"] / quiet["backend"]
    result.add(BenchRow("Boxd() first call: plane start (default model)", plane_start_s, "s", target="<= 5 s"))
    result.add(BenchRow("Boxd create + wait_until_ready + first exec", quiet["client"], "ms", quiet["backend"],
                        "the backend's", "<= 1.5x"))
    result.add(BenchRow("Boxd fork + wait_until_ready", fork["client"], "ms", fork["backend"], "the backend's",
                        "<= 50 ms"))
    result.add(BenchRow("Boxd delete", client_delete, "ms", backend_delete, "the backend's"))
    result.add(BenchRow(f"Boxd create + ready + first exec, {busy} cores busy", loaded["client"], "ms",
                        loaded["backend"], "the backend's, as loaded", f"<= {create_ratio:.2f}x (quiet ratio)"))
    result.summary.update(
        client_plane_start_s=round(plane_start_s, 3),
        client_create_ready_exec_ms_p50=round(quiet["client"], 2),
        backend_create_ready_exec_ms_p50=round(quiet["backend"], 2),
        client_create_ratio=round(create_ratio, 2),
        client_fork_ready_ms_p50=round(fork["client"], 2),
        backend_fork_ready_ms_p50=round(fork["backend"], 2),
        client_fork_ratio=round(fork["client"] / fork["backend"], 2),
        client_delete_ms_p50=round(client_delete, 2),
        backend_delete_ms_p50=round(backend_delete, 2),
        client_delete_ratio=round(client_delete / backend_delete, 2),
        loaded_cores_busy=busy,
        client_create_loaded_ms_p50=round(loaded["client"], 2),
        backend_create_loaded_ms_p50=round(loaded["backend"], 2),
        client_create_loaded_ratio=round(loaded["client"] / loaded["backend"], 2),
        client_load_slowdown=round(client_load, 2),
        backend_load_slowdown=round(backend_load, 2),
    )
    result.notes.append(
        "Boxd rows: the client on its embedded plane (already started; its start is its own row), each figure "
        "beside the backend's own taken in the same process; the loaded rows run with a spinning process per core, "
        "and client_load_slowdown vs backend_load_slowdown says whether the client's path holds up as the backend's"
    )


def _wake_rows(result: BenchResult, n: int, exec_ms: float) -> None:
    """An exec that finds its machine frozen for being idle: the wake (a thaw) plus the exec."""
    clock = FakeClock()
    with (
        tempfile.TemporaryDirectory(prefix="swarmyard-bench-") as tmp,
        Machines("local", root=Path(tmp), idle_suspend_s=60.0, clock=clock) as machines,
    ):
        from swarmyard.machines.idle import Suspender

        machines.idle = Suspender(machines.backend, 60.0, clock=clock, sweeping=False)  # every sweep the bench's
        info = machines.create("sleeper")
        # something running in it, as in a real idle machine: a background process it keeps
        machines.exec(info.id, "setsid sleep 3600 </dev/null >/dev/null 2>&1 &")
        samples, thaws = [], []
        for _ in range(n):
            clock.advance(61.0)
            if info.id not in machines.idle.sweep():
                raise RuntimeError("the bench's idle machine was not frozen")
            began = time.perf_counter()
            machines.exec(info.id, ["true"])
            samples.append(time.perf_counter() - began)
            thaws.append((machines.idle.last_wake_us or 0) / 1e6)
    wake_ms, thaw_ms = _ms(samples), _ms(thaws)
    result.add(BenchRow("exec on a machine frozen for being idle (wake + exec)", wake_ms, "ms", exec_ms,
                        "exec on a ready machine", "wake <= 50 ms"))
    result.add(BenchRow("wake from frozen (thaw alone)", thaw_ms, "ms", target="<= 50 ms"))
    result.summary.update(wake_exec_ms_p50=round(wake_ms, 2), wake_thaw_ms_p50=round(thaw_ms, 3))
    _hibernate_rows(result, n)


#: What the hibernated machine's process holds (its pages go to swap and come back when it reads them).
_HIBERNATE_STATE_BYTES = 100 << 20
_HOLDER = f"""
import secrets, socket
state = bytearray(secrets.token_bytes({_HIBERNATE_STATE_BYTES}))
token = secrets.token_hex(16)
server = socket.socket()
server.bind(("127.0.0.1", 7360))
server.listen()
open("/home/boxd/holder.ready", "w").write("up")
while True:
    conn, _ = server.accept()
    conn.sendall(f"{{token}} {{sum(state[::4096])}}".encode())  # reads one byte of every page
    conn.close()
"""
_ASK = ("import socket\n"
        "with socket.create_connection(('127.0.0.1', 7360), timeout=60) as c: print(c.recv(200).decode())")


def _hibernate_rows(result: BenchResult, n: int) -> None:
    """A machine whose process holds 100 MB, hibernated (its memory pushed to the host's swap while frozen): the
    memory it gives back, an exec that wakes it, and its process answering from all its pages (which reads them
    back from swap). Where the host has no swap, the row says hibernation is not possible and why."""
    from swarmyard.machines.idle import Suspender, host_swap_reason

    reason = host_swap_reason()
    if reason is not None:
        result.add(BenchRow("wake from hibernated: not possible here (summary: hibernate_reason)", 0.0, "ms", target="<= 500 ms"))
        result.summary.update(hibernate_possible=False, hibernate_reason=reason)
        return
    clock = FakeClock()
    with (
        tempfile.TemporaryDirectory(prefix="swarmyard-bench-") as tmp,
        Machines("local", root=Path(tmp), idle_suspend_s=60.0, hibernate_s=600.0, clock=clock) as machines,
    ):
        # no sweeping thread: each sweep is the bench's own (the thread's could be half way through a hibernation
        # when the bench looks)
        machines.idle = Suspender(machines.backend, 60.0, clock=clock, sweeping=False, hibernate_s=600.0)
        info = machines.create("holder")
        machines.wait_until_ready(info.id)
        machines.files.upload(info.id, "/home/boxd/holder.py", _HOLDER.encode())
        machines.exec(info.id, ["sh", "-c", "setsid python3 /home/boxd/holder.py </dev/null >/dev/null 2>&1 &"])
        machines.exec(info.id, ["sh", "-c", "while [ ! -e /home/boxd/holder.ready ]; do sleep 0.05; done"],
                      timeout=120)
        held = machines.exec(info.id, ["python3", "-c", _ASK]).stdout
        asked_running = _ms(_timed(lambda: machines.exec(info.id, ["python3", "-c", _ASK]), n))
        wakes, answers, released, intact = [], [], [], 0
        for i in range(2 * n):
            # frozen: the holder's answer over loopback in the last round is traffic the next sweep sees (it reads
            # the counters only then), which starts the idle time again, so a second sweep a minute on freezes it
            for _ in range(2):
                clock.advance(61.0)
                machines.idle.sweep()
                if machines.idle.suspension(info.id).value == "frozen":
                    break
            clock.advance(600.0)
            machines.idle.sweep()  # hibernated
            if machines.idle.suspension(info.id).value != "hibernated":
                raise RuntimeError(f"the bench's idle machine was not hibernated: {machines.idle.suspension(info.id)}")
            before, after = machines.idle.last_hibernate or (0, 0)
            released.append(before - after)
            began = time.perf_counter()
            if i % 2 == 0:  # the wake alone: a thaw, and an exec that touches none of the holder's pages
                machines.exec(info.id, ["true"])
                wakes.append(time.perf_counter() - began)
            else:  # the wake and the holder's 100 MB read back from swap
                answer = machines.exec(info.id, ["python3", "-c", _ASK]).stdout
                answers.append(time.perf_counter() - began)
                intact += answer == held
    wake_ms, answer_ms = _ms(wakes), _ms(answers)
    released_mb = statistics.median(released) / (1 << 20)
    result.add(BenchRow("memory released by hibernating a machine holding 100 MB", released_mb, "MB"))
    result.add(BenchRow("exec on a hibernated machine (wake + exec)", wake_ms, "ms", target="wake <= 500 ms"))
    result.add(BenchRow("hibernated machine's process answers from all its 100 MB (wake + page-in + exec)",
                        answer_ms, "ms", asked_running, "the same on a running machine", "<= 500 ms"))
    result.summary.update(hibernate_possible=True, hibernate_released_mb_p50=round(released_mb, 1),
                          hibernate_wake_exec_ms_p50=round(wake_ms, 2),
                          hibernate_answer_ms_p50=round(answer_ms, 2), hibernate_answer_running_ms_p50=round(
                              asked_running, 2), hibernate_state_intact=f"{intact}/{n}")
