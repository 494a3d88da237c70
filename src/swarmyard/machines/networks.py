"""Private networks between machines: a bridge per network, a veth pair per member, names as ``<name>.yard``.

A machine is isolated by default (its own network namespace: loopback, and the control plane through its relay).
``networks=["job-1", ...]`` also puts it on those private networks. All of a backend's bridges live in one hub
namespace of their own (``ip netns add``), never in the host's, so the host's interfaces, routes and firewall
are not touched; each network is one bridge there and one /24 of :data:`PRIVATE_RANGE`, which exists only in these
namespaces. A member gets a veth pair: one end on the bridge, the other (``yard0``, ``yard1``, ...) in the
machine with its address. Networks are plain layer 2 with no router: a machine reaches the members of its own
networks and nothing else, and a machine on two networks does not forward between them (its namespace has
forwarding off and it holds no capability to turn it on).

Names: every networked machine's ``/etc/hosts`` is its own file, bound read-only, and lists ``<name>.yard`` (and
the same address as ``<name>.boxd``, boxd's suffix) for itself and each machine it shares a network with; it is
rewritten in place as members come and go.

Needs root on the host (CAP_NET_ADMIN there, to make the hub and move veth ends into machines). A rootless
backend refuses ``networks`` with :class:`~swarmyard.errors.SandboxUnavailableError`: pasta or slirp4netns give a
namespace a way out to the host's network, which is the opposite of what a private network is for, and cannot
join two unprivileged namespaces to one bridge.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from swarmyard.errors import InvalidInputError, SandboxError, SandboxUnavailableError
from swarmyard.ids import new_id

log = logging.getLogger(__name__)

#: Where networks take their /24s from: one per network, .1 to .254 for members.
PRIVATE_RANGE = ipaddress.IPv4Network("10.231.0.0/16")
#: The suffix a member's name resolves under.
DOMAIN = "yard"
#: The same name under boxd's suffix, so commands written for boxd (``curl http://coordinator.boxd:8080``) run
#: unchanged: one hosts line per peer, so both names always give the same address to the same machines.
ALIAS = "boxd"
#: What every machine's /etc/hosts starts with.
LOCALHOST = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
_NETWORK = re.compile(r"[a-z0-9][a-z0-9-]{0,31}\Z")
#: What a networked machine may be called: DNS labels in lowercase, so no two names differ only in case
#: (hosts-file lookups ignore case: "A" would answer for "a.yard"), joined by dots (a coordinator's machine is
#: ``<coordinator>.<name>``, see ``swarmyard.boxd._spawn``); at most 63 characters, as any machine name.
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
MEMBER_NAME = re.compile(rf"(?=.{{1,63}}\Z){_LABEL}(?:\.{_LABEL})*\Z")
#: Networks one machine may join.
MAX_PER_MACHINE = 16
_MAX_NETWORKS = 255
_HOSTS_PER_NETWORK = 254
_ROOT_HINT = ("private networks need root on the host (they make a bridge namespace and move veth ends into "
              "machines); a rootless host has only isolated machines")


def check_names(networks: object) -> tuple[str, ...]:
    """The network names a caller gave, checked: 1-32 lowercase letters, digits and '-', each once."""
    if networks is None:
        return ()
    if isinstance(networks, str) or not isinstance(networks, Sequence | tuple | list):
        raise InvalidInputError("networks must be a list of names", field="networks")
    names = tuple(networks)
    for name in names:
        if not isinstance(name, str) or not _NETWORK.match(name):
            raise InvalidInputError("a network name is 1-32 lowercase letters, digits or '-', starting with a "
                                    "letter or digit", field="networks")
    if len(set(names)) != len(names):
        raise InvalidInputError("a network is named twice", field="networks")
    if len(names) > MAX_PER_MACHINE:
        raise InvalidInputError(f"a machine joins at most {MAX_PER_MACHINE} networks", field="networks")
    return names


def check_member_name(name: str) -> None:
    """A machine on a network is named as DNS labels: lowercase letters, digits and '-', dot-separated."""
    if not MEMBER_NAME.match(name):
        raise InvalidInputError("a machine on a private network is named in lowercase letters, digits and '-' "
                                "(its name is its <name>.yard)", field="name")


def available() -> str | None:
    """Why this host cannot make private networks, or ``None`` when it can."""
    if os.geteuid() != 0:
        return _ROOT_HINT
    missing = [tool for tool in ("ip", "nsenter") if shutil.which(tool) is None]
    if missing:
        return f"private networks need {' and '.join(missing)} (apt-get install iproute2 util-linux)"
    return None


@dataclass
class _Network:
    name: str
    index: int
    subnet: ipaddress.IPv4Network
    members: dict[str, int] = field(default_factory=dict)  # machine id -> host number

    @property
    def bridge(self) -> str:
        return f"yb{self.index}"

    def address(self, machine_id: str) -> str:
        return str(self.subnet.network_address + self.members[machine_id])


@dataclass
class _Member:
    machine_id: str
    name: str
    pid: int
    networks: tuple[str, ...]
    hosts_file: Path


def _run(argv: list[str], stdin: str | None = None) -> None:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SandboxError(f"{argv[0]} failed ({done.returncode}): {done.stderr.strip()[-400:]}")


class Networks:
    """One backend's private networks: made on first use, removed with the backend."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hub: str | None = None
        self._networks: dict[str, _Network] = {}
        self._members: dict[str, _Member] = {}

    def _hub_name(self) -> str:
        if self._hub is None:
            reap_hubs()
            name = f"{_HUB_PREFIX}{os.getpid()}-{new_id('n')[-8:]}"
            _run(["ip", "netns", "add", name])
            try:
                # No IPv6 on the hub's bridges and veth ends: with a link-local address each, the hub's own
                # kernel would answer a machine (the bridges carry no IPv4 address for the same reason).
                _run(["ip", "netns", "exec", name, "sh", "-c",
                      "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6 && "
                      "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6"])
                _run(["ip", "-n", name, "link", "set", "lo", "up"])
            except BaseException:
                with contextlib.suppress(SandboxError):
                    _run(["ip", "netns", "del", name])
                raise
            self._hub = name
        return self._hub

    def _network(self, name: str) -> _Network:
        network = self._networks.get(name)
        if network is None:
            used = {n.index for n in self._networks.values()}
            index = next((i for i in range(1, _MAX_NETWORKS + 1) if i not in used), None)
            if index is None:
                raise SandboxError(f"a backend has at most {_MAX_NETWORKS} networks", retryable=True)
            subnet = list(PRIVATE_RANGE.subnets(new_prefix=24))[index]
            network = _Network(name, index, subnet)
            hub = self._hub_name()
            _run(["ip", "-n", hub, "-batch", "-"],
                 f"link add {network.bridge} type bridge\nlink set {network.bridge} up\n")
            self._networks[name] = network
        return network

    def attach(self, machine_id: str, name: str, pid: int, networks: Iterable[str], hosts_file: Path) -> dict[str, str]:
        """Put the machine whose namespace ``pid`` is in on ``networks``; its address on each, by network."""
        reason = available()
        if reason is not None:
            raise SandboxUnavailableError(reason, machine_id=machine_id)
        wanted = tuple(networks)
        with self._lock:
            hub = self._hub_name()
            hub_cmds: list[str] = []
            inside: list[str] = []
            joined: list[_Network] = []
            try:
                for slot, net_name in enumerate(wanted):
                    network = self._network(net_name)
                    host = next((h for h in range(1, _HOSTS_PER_NETWORK + 1)
                                 if h not in network.members.values()), None)
                    if host is None:
                        raise SandboxError(f"network {net_name} is full ({_HOSTS_PER_NETWORK} machines)",
                                           machine_id=machine_id)
                    network.members[machine_id] = host
                    joined.append(network)
                    outer, inner = f"yv{network.index}h{host}", f"yard{slot}"
                    hub_cmds += [f"link add {outer} type veth peer name {inner} netns {pid}",
                                 f"link set {outer} master {network.bridge} up"]
                    inside += [f"addr add {network.address(machine_id)}/24 dev {inner}", f"link set {inner} up"]
                _run(["ip", "-n", hub, "-batch", "-"], "\n".join(hub_cmds) + "\n")
                _run(["nsenter", "-t", str(pid), "-n", "ip", "-batch", "-"], "\n".join(inside) + "\n")
            except BaseException:
                for network in joined:
                    host = network.members.pop(machine_id, None)
                    if host is not None:
                        with contextlib.suppress(SandboxError):
                            _run(["ip", "-n", hub, "link", "del", f"yv{network.index}h{host}"])
                raise
            self._members[machine_id] = _Member(machine_id, name, pid, wanted, hosts_file)
            self._write_hosts(wanted)
            return {n.name: n.address(machine_id) for n in joined}

    def detach(self, machine_id: str) -> None:
        """Take a machine off its networks (its veth ends go with its namespace; the hub's are removed here)."""
        with self._lock:
            member = self._members.pop(machine_id, None)
            if member is None:
                return
            for net_name in member.networks:
                network = self._networks.get(net_name)
                if network is None:
                    continue
                host = network.members.pop(machine_id, None)
                if host is not None and self._hub is not None:
                    # gone already when the machine's namespace went first
                    with contextlib.suppress(SandboxError):
                        _run(["ip", "-n", self._hub, "link", "del", f"yv{network.index}h{host}"])
            self._write_hosts(member.networks)

    def addresses(self, machine_id: str) -> dict[str, str]:
        """A member's address on each of its networks."""
        with self._lock:
            member = self._members.get(machine_id)
            if member is None:
                return {}
            return {n: self._networks[n].address(machine_id) for n in member.networks}

    def _write_hosts(self, touched: Iterable[str]) -> None:
        """Rewrite, in place (the machines bind these files), the hosts file of every member of ``touched``."""
        affected = {m for n in touched if n in self._networks for m in self._networks[n].members}
        for machine_id in affected:
            member = self._members.get(machine_id)
            if member is None:
                continue
            lines: dict[str, str] = {}
            for net_name in member.networks:
                network = self._networks[net_name]
                for peer_id in network.members:
                    peer = self._members.get(peer_id)
                    if peer is not None and peer.name not in lines:
                        lines[peer.name] = network.address(peer_id)
            write_hosts(member.hosts_file, hosts_text(member.name, lines))

    def close(self) -> None:
        """Remove the hub namespace and with it every bridge and veth end still there."""
        with self._lock:
            self._members.clear()
            self._networks.clear()
            hub, self._hub = self._hub, None
        if hub is not None:
            with contextlib.suppress(SandboxError):
                _run(["ip", "netns", "del", hub])


def hosts_text(viewer: str, peers: dict[str, str]) -> str:
    """The hosts file of machine ``viewer`` whose networks hold ``peers`` (name -> address): each peer as
    ``<name>.yard`` and ``<name>.boxd``, and a machine of a coordinator's namespace also by the name the
    coordinator gave it, for the coordinator and its other machines (``lead``'s ``scout`` is ``lead.scout``, and
    ``scout.yard`` to them), unless a machine is called that already (a whole name wins)."""
    names: dict[str, list[str]] = {peer: [peer] for peer in peers}
    spaces = {viewer, viewer.rpartition(".")[0]} - {""}
    for peer in peers:
        for space in spaces:
            short = peer.removeprefix(f"{space}.")
            if short != peer and short not in peers:
                names[peer].append(short)
    return LOCALHOST + "".join(
        f"{peers[peer]}\t" + " ".join(f"{n}.{suffix}" for n in names[peer] for suffix in (DOMAIN, ALIAS)) + "\n"
        for peer in sorted(peers))


_HUB_PREFIX = "swarmyard-"


def reap_hubs() -> list[str]:
    """Remove hub namespaces whose backend's process is gone (a runner killed by a signal leaves its hub)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    reaped: list[str] = []
    for line in listed.splitlines():
        name = line.split(" ", 1)[0]
        parts = name.removeprefix(_HUB_PREFIX).split("-")
        if not name.startswith(_HUB_PREFIX) or len(parts) != 2 or not parts[0].isdigit():
            continue
        if Path(f"/proc/{parts[0]}").exists():
            continue  # alive (or its pid reused: then kept, never a live hub removed)
        with contextlib.suppress(SandboxError):
            _run(["ip", "netns", "del", name])
            reaped.append(name)
    if reaped:
        log.info("removed %d private-network hubs left by processes that are gone", len(reaped))
    return reaped


def write_hosts(path: Path, text: str) -> None:
    """Write ``text`` over ``path`` in place: a bind mount follows the inode, so a rename would not be seen.

    The new text goes over the old, then the file is cut to its length: a reader never finds it empty."""
    data = text.encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)
