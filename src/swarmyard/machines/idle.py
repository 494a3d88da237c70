"""Suspend on idle: a machine with no call and no network traffic for ``idle_suspend_s`` is frozen, and the next
call to it (an exec, a file transfer, a fork of it) or a packet on one of its private networks wakes it.

Freezing is the cgroup v2 freezer (``cgroup.freeze``): the machine's processes stop being scheduled and keep their
memory, so a woken machine goes on where it stopped, its background processes included. A thaw takes well under a
millisecond; what a call to a frozen machine pays is measured by ``swarmyard bench machines``.

What counts as activity:

- a call through :class:`~swarmyard.machines.api.Machines` (exec and streamed exec for as long as they run, upload,
  download, fork, wait): while one is in flight the machine is never frozen;
- packets: the counters of every interface in the machine's network namespace (its loopback, which carries an
  agent's calls to the control plane through the in-sandbox relay, and its private networks), read at each sweep.

What wakes a frozen machine: any call above, and a packet that reaches it on a private network (its counters are
read every :data:`WAKE_POLL_S` while it is frozen, so the first packet wakes it within that, and the kernel holds
the packet meanwhile: a TCP peer sees a slower answer, not a lost one). An isolated machine (the default) has only
loopback and the control plane, which it reaches itself: nothing outside it can send it a packet. Any packet
counts, an ARP broadcast of a neighbour too: a busy network keeps its members awake.

Idle time is read from an injected clock, so tests advance it instead of sleeping. A thread sweeps every machine
of the backend a few times per ``idle_suspend_s`` (at most every second) and freezes those idle long enough; tests
call :meth:`Suspender.sweep` themselves after moving their clock.

States (:class:`~swarmyard.machines.protocol.Suspension`): ``running`` -> ``frozen`` -> ``running``. A later step
moves a machine frozen for long to ``hibernated`` (its memory written to disk, then its processes ended; restored
by the next wake): that step hooks in at :meth:`Suspender.hibernate`, which is where the checkpoint code is called;
until it is built a frozen machine stays frozen.

Only backends whose machines have a cgroup v2 group (``local`` on a host with cgroup v2 mounted, also in a hybrid
hierarchy) can freeze; with others the suspender records activity and freezes nothing. A machine its owner paused
(:mod:`swarmyard.machines.pausing`) is left alone: its owner resumes it, not a call.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from swarmyard.clock import Clock, SystemClock
from swarmyard.errors import InvalidInputError, NotFoundError, SandboxError
from swarmyard.machines import live
from swarmyard.machines.cgroups import MachineCgroups
from swarmyard.machines.protocol import Backend, MachineInfo, MachineState, Suspension

log = logging.getLogger(__name__)

#: How long a machine may go without a call or a packet before it is frozen, unless told otherwise.
DEFAULT_IDLE_SUSPEND_S = 60.0
#: How often a frozen machine on a private network has its packet counters read (the most a packet waits).
WAKE_POLL_S = 0.02
#: The longest a sweep waits for the next (a machine is frozen at most this late).
_MAX_TICK_S = 1.0

#: Allowed changes of a machine's suspension; anything else is a bug here.
TRANSITIONS: dict[Suspension, frozenset[Suspension]] = {
    Suspension.RUNNING: frozenset({Suspension.FROZEN}),
    Suspension.FROZEN: frozenset({Suspension.RUNNING, Suspension.HIBERNATED}),
    Suspension.HIBERNATED: frozenset({Suspension.RUNNING}),
}


def check_idle_suspend_s(value: object, *, field: str = "idle_suspend_s") -> float | None:
    """``value`` as seconds when it is a positive number (``None``: never suspend); else ``InvalidInputError``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 365 * 86400:
        raise InvalidInputError(f"{field} must be a positive number of seconds (at most a year), or None to never "
                                "suspend", field=field)
    return float(value)


@dataclass(slots=True)
class _Activity:
    """What the suspender knows of one machine."""

    last_s: float
    in_flight: int = 0
    state: Suspension = Suspension.RUNNING
    #: packets counted on its interfaces at the last look (``None``: not looked yet, or no namespace to look in)
    packets: int | None = None
    networked: bool = False
    #: the host pid of a process in the machine's network namespace, found once
    net_pid: int | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def move(self, state: Suspension) -> None:
        if state is not self.state and state not in TRANSITIONS[self.state]:
            raise SandboxError(f"a machine cannot go from {self.state} to {state}")
        self.state = state


class Suspender:
    """Freezes idle machines of one backend and wakes them on the next call or packet (see the module docstring).

    ``idle_suspend_s=None`` turns it off: nothing is frozen or kept, and calls pay nothing.
    """

    def __init__(self, backend: Backend, idle_suspend_s: float | None = DEFAULT_IDLE_SUSPEND_S, *,
                 clock: Clock | None = None, sweeping: bool = True) -> None:
        """``sweeping=False``: no thread; the owner calls :meth:`sweep` (a test with a fake clock)."""
        self.backend = backend
        self.idle_suspend_s = check_idle_suspend_s(idle_suspend_s)
        self.clock: Clock = clock or SystemClock()
        self._records: dict[str, _Activity] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sweeping = sweeping and self.idle_suspend_s is not None and _can_freeze_backend(backend)
        #: how long the last wake's thaw took, in microseconds (``None``: none yet)
        self.last_wake_us: int | None = None

    # -- what Machines calls -----------------------------------------------------------------------------------

    def started(self, machine_id: str) -> None:
        """A machine was made: its idle time starts now, and the sweeping thread if it is not running yet."""
        if self.idle_suspend_s is None:
            return
        self._record(machine_id)
        if self._sweeping and self._thread is None:
            with self._lock:
                if self._thread is None and not self._stop.is_set():
                    self._thread = threading.Thread(target=self._loop, name="machines-idle", daemon=True)
                    self._thread.start()

    @contextlib.contextmanager
    def active(self, machine_id: str) -> Iterator[None]:
        """Around a call to the machine: wakes it first if it is suspended, and keeps it from being frozen until
        the call ends; its idle time starts again then."""
        if self.idle_suspend_s is None:  # off: nothing is ever frozen, nothing to keep
            yield
            return
        record = self._record(machine_id)
        with record.lock:
            self._wake(machine_id, record)
            record.in_flight += 1
        try:
            yield
        finally:
            with record.lock:
                record.in_flight -= 1
                record.last_s = self.clock.now()

    def wake(self, machine_id: str) -> bool:
        """Wake the machine if it is suspended (its idle time starts again); whether it was."""
        if self.idle_suspend_s is None:
            return False
        record = self._record(machine_id)
        with record.lock:
            woken = self._wake(machine_id, record)
            record.last_s = self.clock.now()
        return woken

    def forget(self, machine_id: str) -> None:
        """The machine is about to be deleted: woken if frozen (a frozen sandbox would not hear the stop it is
        sent first), then no longer watched."""
        with self._lock:
            record = self._records.pop(machine_id, None)
        if record is not None:
            with record.lock, contextlib.suppress(NotFoundError, SandboxError):
                self._wake(machine_id, record)

    def suspension(self, machine_id: str) -> Suspension:
        """The machine's suspension now (``running`` for a machine not watched)."""
        with self._lock:
            record = self._records.get(machine_id)
        return Suspension.RUNNING if record is None else record.state

    def describe(self, info: MachineInfo) -> MachineInfo:
        """``info`` with its suspension filled in."""
        state = self.suspension(info.id)
        if state is info.suspension:
            return info
        from dataclasses import replace

        return replace(info, suspension=state)

    # -- sweeping ----------------------------------------------------------------------------------------------

    def sweep(self) -> list[str]:
        """Freeze every ready machine idle for ``idle_suspend_s`` by the clock, and wake a frozen one that a packet
        reached; returns the ids of the machines frozen by this sweep."""
        if self.idle_suspend_s is None:
            return []
        frozen: list[str] = []
        live_ids = set()
        for info in self.backend.list():
            live_ids.add(info.id)
            if info.state is not MachineState.READY:
                continue
            record = self._record(info.id)
            if not record.lock.acquire(blocking=False):
                continue  # a call is waking it right now: it is not idle
            try:
                if self._sweep_one(info.id, record):
                    frozen.append(info.id)
            except (NotFoundError, SandboxError) as exc:  # deleted meanwhile, or its init ended
                log.debug("machine %s: not swept: %s", info.id, exc)
            finally:
                record.lock.release()
        with self._lock:
            for gone in set(self._records) - live_ids:
                del self._records[gone]
        return frozen

    def _sweep_one(self, machine_id: str, record: _Activity) -> bool:
        group, folder = _group(self.backend, machine_id)
        if group is None:
            return False  # no freezer for this machine: nothing to watch it for
        now = self.clock.now()
        packets = self._packets(machine_id, record)
        moved = packets is not None and record.packets is not None and packets != record.packets
        if packets is not None:
            record.packets = packets
        if record.state is Suspension.FROZEN:
            if moved and record.networked:  # a packet came to it on a private network: woken
                self._wake(machine_id, record)
                record.last_s = now
            return False
        if record.state is not Suspension.RUNNING:
            return False
        if moved:
            record.last_s = now
            return False
        assert self.idle_suspend_s is not None
        if record.in_flight or now - record.last_s < self.idle_suspend_s:
            return False
        if (folder / live.PAUSED).exists():
            return False  # its owner paused it: its owner resumes it
        group.freeze(True)
        record.move(Suspension.FROZEN)
        # the counters as they stand frozen: a packet from now on is one that came to the frozen machine
        record.packets = self._packets(machine_id, record)
        log.debug("machine %s frozen after %.1f s idle", machine_id, now - record.last_s)
        return True

    def hibernate(self, machine_id: str) -> None:
        """The hook of hibernation (a frozen machine's memory to disk, then its processes ended): not built on this
        backend yet, so a frozen machine stays frozen. Says so with a typed error rather than doing nothing."""
        from swarmyard.errors import SandboxUnavailableError

        raise SandboxUnavailableError("hibernating a machine to disk is not available on this backend yet: an idle "
                                      "machine stays frozen", machine_id=machine_id)

    def close(self) -> None:
        """Stop the sweeping thread (the machines stay as they are: ``forget`` wakes each before its delete)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    # -- internals ---------------------------------------------------------------------------------------------

    def _record(self, machine_id: str) -> _Activity:
        with self._lock:
            record = self._records.get(machine_id)
            if record is None:
                record = self._records[machine_id] = _Activity(self.clock.now())
            return record

    def _wake(self, machine_id: str, record: _Activity) -> bool:
        """Thaw a frozen machine (``record.lock`` held); whether it was frozen."""
        if record.state is Suspension.RUNNING:
            return False
        if record.state is Suspension.HIBERNATED:
            raise SandboxError(f"machine {machine_id} is hibernated and this backend cannot restore it",
                               machine_id=machine_id)
        started = time.perf_counter_ns()
        group, _ = _group(self.backend, machine_id)
        if group is not None:
            group.freeze(False)
        record.move(Suspension.RUNNING)
        self.last_wake_us = (time.perf_counter_ns() - started) // 1000
        return True

    def _packets(self, machine_id: str, record: _Activity) -> int | None:
        """Packets in and out of every interface of the machine's network namespace so far (``None``: it has
        no namespace of its own this process can read)."""
        if record.net_pid is None:
            record.net_pid, record.networked = _net_pid(self.backend, machine_id)
            if record.net_pid is None:
                return None
        try:
            text = Path(f"/proc/{record.net_pid}/net/dev").read_text()
        except OSError:
            record.net_pid = None  # ended: found again next time, if the machine still lives
            return None
        total = 0
        for line in text.splitlines()[2:]:
            _, _, numbers = line.partition(":")
            fields = numbers.split()
            if len(fields) >= 10:
                total += int(fields[1]) + int(fields[9])  # receive packets, transmit packets
        return total

    def _loop(self) -> None:
        while not self._stop.wait(self._tick_s()):
            try:
                self.sweep()
            except Exception:  # the sweeper must outlive one bad sweep: the next one tries again
                log.exception("the idle sweep failed")

    def _tick_s(self) -> float:
        with self._lock:
            records = list(self._records.values())
        if any(r.state is Suspension.FROZEN and r.networked for r in records):
            return WAKE_POLL_S
        assert self.idle_suspend_s is not None
        return min(max(self.idle_suspend_s / 4, WAKE_POLL_S), _MAX_TICK_S)


def _can_freeze_backend(backend: Backend) -> bool:
    from swarmyard.machines.supervised import SupervisedBackend

    return isinstance(backend, SupervisedBackend)


def _group(backend: Backend, machine_id: str) -> tuple[MachineCgroups | None, Path]:
    """The machine's cgroups when they can freeze it, and its folder (where a pause leaves its mark)."""
    from swarmyard.machines.supervised import SupervisedBackend

    if not isinstance(backend, SupervisedBackend):
        return None, Path()
    machine = backend._get(machine_id)
    group = machine.cgroups if machine.cgroups is not None and machine.cgroups.can_freeze else None
    return group, machine.root


def _net_pid(backend: Backend, machine_id: str) -> tuple[int | None, bool]:
    """A host pid in the machine's own network namespace (``None``: it shares this process's), and whether the
    machine is on a private network."""
    from swarmyard.machines.supervised import SupervisedBackend, _inside

    if not isinstance(backend, SupervisedBackend):
        return None, False
    machine = backend._get(machine_id)
    networked = bool(machine.spec.networks)
    if machine.proc is None:
        return None, networked
    return _inside(machine.proc.pid, "net"), networked


__all__ = ["DEFAULT_IDLE_SUSPEND_S", "TRANSITIONS", "WAKE_POLL_S", "Suspender", "check_idle_suspend_s"]
