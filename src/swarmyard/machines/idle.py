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

States (:class:`~swarmyard.machines.protocol.Suspension`): ``running`` -> ``frozen`` -> ``hibernated`` ->
``running``. A machine idle for ``hibernate_s`` (default 600 s; ``None``: never) is hibernated: frozen still, its
memory pushed out of RAM through its memory cgroup (``memory.reclaim`` on cgroup v2, ``memory.force_empty`` on v1):
its file pages dropped or written back, its processes' anonymous pages written to the host's swap. Its processes
are not ended: the next wake is a thaw like any other, and the pages come back as they are touched (from swap, or
the file they were read from). A checkpoint to disk with CRIU, which would end the processes and free their
kernel memory too, is not possible on the hosts this was built on (see :mod:`swarmyard.machines.checkpoint`).

What hibernation needs, and what a machine reports when it is missing (``MachineInfo.hibernate_reason``, where
it stays frozen instead): a memory cgroup of its own (every machine with a memory limit, the default, has one) and
swap on the host with room in it. Without swap a frozen machine's anonymous memory (almost all of an idle
process's) has nowhere to go. swarmyard does not add swap to a host: swap is the whole host's (every process on it
becomes swappable, not only machines), it needs root, and a swap file takes the disk's space for good; it is the
operator's choice (``swapon`` a swap file or a zram device), after which hibernation works with no setting here.

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
from swarmyard.machines.pids import inside
from swarmyard.machines.protocol import Backend, MachineInfo, MachineState, Suspension

log = logging.getLogger(__name__)

#: How long a machine may go without a call or a packet before it is frozen, unless told otherwise.
DEFAULT_IDLE_SUSPEND_S = 60.0
#: How often a frozen machine on a private network has its packet counters read (the most a packet waits).
WAKE_POLL_S = 0.02
#: How long a machine may go idle before its memory is released (it is frozen first), unless told otherwise.
DEFAULT_HIBERNATE_S = 600.0
#: How long the host's swap figures are trusted before they are read again.
_SWAP_CHECK_S = 5.0
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


def host_swap_reason(meminfo: Path = Path("/proc/meminfo")) -> str | None:
    """Why this host cannot take a hibernated machine's memory (``None``: it has swap with room in it)."""
    try:
        fields = {k: v.split() for k, _, v in (line.partition(":") for line in meminfo.read_text().splitlines())}
        total, free = int(fields["SwapTotal"][0]), int(fields["SwapFree"][0])
    except (OSError, KeyError, ValueError, IndexError):
        return "the host's swap figures cannot be read (/proc/meminfo)"
    if total == 0:
        return ("the host has no swap: a frozen machine's anonymous memory has nowhere to go, so it stays frozen in "
                "RAM (swarmyard does not add swap to a host; an operator who accepts swapping can swapon a swap "
                "file or zram device); CRIU checkpoints are not possible here either")
    if free == 0:
        return "the host's swap is full: a frozen machine's memory has nowhere to go, so it stays frozen in RAM"
    return None


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
    #: why it was not hibernated when it was due (``None``: it was, or it is not due yet)
    hibernate_reason: str | None = None

    def move(self, state: Suspension) -> None:
        if state is not self.state and state not in TRANSITIONS[self.state]:
            raise SandboxError(f"a machine cannot go from {self.state} to {state}")
        self.state = state


class Suspender:
    """Freezes idle machines of one backend and wakes them on the next call or packet (see the module docstring).

    ``idle_suspend_s=None`` turns it off: nothing is frozen or kept, and calls pay nothing.
    """

    def __init__(self, backend: Backend, idle_suspend_s: float | None = DEFAULT_IDLE_SUSPEND_S, *,
                 clock: Clock | None = None, sweeping: bool = True,
                 hibernate_s: float | None = DEFAULT_HIBERNATE_S) -> None:
        """``sweeping=False``: no thread; the owner calls :meth:`sweep` (a test with a fake clock).
        ``hibernate_s``: idle time after which a frozen machine's memory is released (``None``: never); not less
        than ``idle_suspend_s``."""
        self.backend = backend
        self.idle_suspend_s = check_idle_suspend_s(idle_suspend_s)
        if hibernate_s == DEFAULT_HIBERNATE_S and self.idle_suspend_s is not None:  # the default follows a longer
            hibernate_s = max(hibernate_s, self.idle_suspend_s)                    # idle_suspend_s; a given one not
        self.hibernate_s = check_hibernate_s(hibernate_s, self.idle_suspend_s)
        #: the memory charged to the last machine hibernated, before and after, in bytes (``None``: none yet)
        self.last_hibernate: tuple[int, int] | None = None
        self._swap_checked: tuple[float, str | None] | None = None
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
        """``info`` with its suspension filled in, and why it stays frozen when it was due to hibernate."""
        with self._lock:
            record = self._records.get(info.id)
        state = Suspension.RUNNING if record is None else record.state
        reason = None if record is None else record.hibernate_reason
        if state is info.suspension and reason == info.hibernate_reason:
            return info
        from dataclasses import replace

        return replace(info, suspension=state, hibernate_reason=reason)

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
        if record.state in (Suspension.FROZEN, Suspension.HIBERNATED):
            if moved and record.networked:  # a packet came to it on a private network: woken
                self._wake(machine_id, record)
                record.last_s = now
            elif (record.state is Suspension.FROZEN and self.hibernate_s is not None
                  and now - record.last_s >= self.hibernate_s):
                self._hibernate(machine_id, record, group)
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

    def hibernate_reason(self, machine_id: str) -> str | None:
        """Why the machine cannot be hibernated here (``None``: it can be, or hibernation is off)."""
        if self.idle_suspend_s is None or self.hibernate_s is None:
            return None
        group, _ = _group(self.backend, machine_id)
        return self._reason(group)

    def _reason(self, group: MachineCgroups | None) -> str | None:
        if group is None:
            return "this machine has no cgroup v2 freezer, so it is never suspended"
        if not group.has_memory:
            return "this machine has no memory cgroup (made with no memory limit), so its memory cannot be released"
        now = time.monotonic()
        if self._swap_checked is None or now - self._swap_checked[0] > _SWAP_CHECK_S:
            self._swap_checked = (now, host_swap_reason())
        return self._swap_checked[1]

    def _hibernate(self, machine_id: str, record: _Activity, group: MachineCgroups) -> None:
        """Release a frozen machine's memory (``record.lock`` held); where it cannot be, say why and leave it frozen."""
        reason = self._reason(group)
        record.hibernate_reason = reason
        if reason is not None:
            return
        before = group.memory_bytes()
        group.reclaim()
        after = group.memory_bytes()
        record.move(Suspension.HIBERNATED)
        self.last_hibernate = (before, after)
        log.debug("machine %s hibernated: %d -> %d bytes in RAM", machine_id, before, after)

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
        started = time.perf_counter_ns()
        group, _ = _group(self.backend, machine_id)
        if group is not None:
            group.freeze(False)  # a hibernated machine too: its pages come back as its processes touch them
            group.swap_back()  # (also after a hibernation that failed half way)
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


def check_hibernate_s(value: object, idle_suspend_s: float | None) -> float | None:
    """``value`` as seconds (``None``: never hibernate); not less than ``idle_suspend_s``; else
    ``InvalidInputError``."""
    seconds = check_idle_suspend_s(value, field="hibernate_s")
    if seconds is not None and idle_suspend_s is not None and seconds < idle_suspend_s:
        raise InvalidInputError("hibernate_s must be at least idle_suspend_s: a machine is frozen before its memory "
                                "is released", field="hibernate_s")
    return seconds


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
    from swarmyard.machines.supervised import SupervisedBackend

    if not isinstance(backend, SupervisedBackend):
        return None, False
    machine = backend._get(machine_id)
    networked = bool(machine.spec.networks)
    if machine.proc is None:
        return None, networked
    return inside(machine.proc.pid, "net"), networked


__all__ = ["DEFAULT_HIBERNATE_S", "DEFAULT_IDLE_SUSPEND_S", "TRANSITIONS", "WAKE_POLL_S", "Suspender",
           "check_hibernate_s", "check_idle_suspend_s", "host_swap_reason"]
