"""``ray``: machines placed on the nodes of a Ray cluster, each in that node's own local sandbox.

Every node gets one host actor (:class:`NodeHost`) that runs a :class:`~swarmyard.machines.local.LocalBackend`
for all the machines placed on it; an actor per machine would cost a Ray worker process (~85 MiB) per agent.
A machine goes to the node with the most room: a node may say how many machines it takes with the custom
resource ``swarmyard_machines`` (``ray start --resources '{"swarmyard_machines": 64}'``); a node that does not
say takes as many as its memory holds at each machine's memory limit.

The cluster: ``address`` (``swarmyard run --ray-address``), else ``RAY_ADDRESS``, else a local cluster started
for this backend and stopped with it. Every node must have the same swarmyard installed (Ray ships calls, not
code). Errors cross the actor boundary as ``to_dict()`` bodies and come back as their own classes.

A machine reaches its control plane through a Unix socket bind-mounted as on the local backend. A node that sees
the plane's own socket (the path exists there with the kernel, device and inode this process sees: the same host,
the same mount) binds it. A node that cannot (another host, or a mount namespace of its own) gets a bridge from its
host actor when the caller gives one (:meth:`RayBackend.bridge_plane`, which ``swarmyard run`` does): a Unix
socket in that node's own folder, each connection forwarded over mutual TLS to the plane's TCP listener (see
:mod:`swarmyard.machines.bridge`). The machine sees only that socket, never the certificate or its key. A node
that reaches the plane neither way is never given a machine; when no node can, ``create`` says so.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import stat
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from swarmyard.errors import NotFoundError, SandboxError, SandboxUnavailableError, SwarmyardError, UserError
from swarmyard.machines.bridge import PlaneBridge, PlaneTls, reap_stale
from swarmyard.machines.protocol import Baseline, ExecEvent, ExecResult, MachineInfo, MachineSpec

log = logging.getLogger(__name__)

INSTALL_HINT = "the ray backend needs Ray: pip install 'swarmyard[ray]'"
#: The custom Ray resource a node uses to say how many machines it takes.
SLOTS_RESOURCE = "swarmyard_machines"
#: How long ``create`` waits for a node to have room before it gives up.
PLACE_TIMEOUT_S = 120.0
#: How many calls one node host serves at once (each exec holds one thread for its whole run).
HOST_CONCURRENCY = 512

T = TypeVar("T")
Outcome = tuple[str, Any]


def socket_identity(path: str) -> list[str | int] | None:
    """The Unix socket at ``path`` as this process sees it: its kernel (the boot id), device and inode; ``None``
    when it sees none. Two processes with the same identity can connect to the same socket (a folder shared
    over the network may show another host's socket file, which no one here can connect to: its kernel differs)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return [boot_id(), info.st_dev, info.st_ino] if stat.S_ISSOCK(info.st_mode) else None


def boot_id() -> str:
    """This host's boot id: two Ray nodes with the same one share a kernel, and so the plane's socket."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def missing() -> str | None:
    """The install hint when Ray is not installed (checked before a run makes anything), else ``None``."""
    import importlib.util

    try:
        found = importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):
        found = False
    return None if found else INSTALL_HINT


def _ray() -> Any:
    try:
        import ray
    except ModuleNotFoundError as exc:
        raise UserError(INSTALL_HINT) from exc
    return ray


def _outcome(call: Callable[[], Any]) -> Outcome:
    """Run ``call`` and return its value or its error as data: a swarmyard error does not pickle across Ray."""
    try:
        return ("ok", call())
    except SwarmyardError as exc:
        return ("error", exc.to_dict())
    except Exception as exc:  # the host's own failure, carried back with its text
        log.exception("node host call failed")
        return ("error", SandboxError(f"node host: {type(exc).__name__}: {exc}").to_dict())


def _value(outcome: Outcome) -> Any:
    kind, value = outcome
    if kind == "ok":
        return value
    raise SwarmyardError.from_dict(value)


class NodeHost:
    """One node's machines: a local backend, driven by the head through Ray actor calls."""

    def __init__(self, root: str | None) -> None:
        from swarmyard.machines.local import LocalBackend

        self.backend = LocalBackend(Path(root) if root else None)
        # what a host killed with its driver left (the backend reaps its machines the same way)
        for name in reap_stale(self.backend.root / "bridges"):
            log.info("removed the stale plane bridge %s", name)
        self._bridges: dict[str, PlaneBridge] = {}
        self._bridges_lock = threading.Lock()

    def describe(self) -> Outcome:
        """What the head needs before it places a machine here."""
        return _outcome(lambda: {"boot_id": boot_id(), "prefix": self.backend.sandbox_prefix(),
                                 "env": self.backend.machine_env("m_probe"), "pid": os.getpid()})

    def sees(self, path: str) -> Outcome:
        """The identity of the socket at ``path`` as this node sees it (``None``: it cannot see it)."""
        return _outcome(lambda: socket_identity(path))

    def bridge(self, name: str, tls: PlaneTls) -> Outcome:
        """Start the bridge ``name`` to the plane ``tls`` names (once); the path of its Unix socket on this node."""
        def start() -> str:
            with self._bridges_lock:
                if name not in self._bridges:
                    path = self.backend.root / "bridges" / name / "plane.sock"
                    self._bridges[name] = PlaneBridge(path, tls).start()
                return str(self._bridges[name].path)

        return _outcome(start)

    def bridged(self) -> Outcome:
        """Connections each of this node's bridges forwarded to its plane, and those it could not."""
        with self._bridges_lock:
            bridges = dict(self._bridges)
        return _outcome(lambda: {name: {"forwarded": b.forwarded, "failed": b.failed}
                                 for name, b in bridges.items()})

    def create(self, spec: MachineSpec) -> Outcome:
        """See :meth:`Backend.create`."""
        return _outcome(lambda: self.backend.create(spec))

    def fork(self, source_id: str, spec: MachineSpec) -> Outcome:
        """See :meth:`Backend.fork`."""
        return _outcome(lambda: self.backend.fork(source_id, spec))

    def wait_until_ready(self, machine_id: str, timeout_s: float) -> Outcome:
        """See :meth:`Backend.wait_until_ready`."""
        return _outcome(lambda: self.backend.wait_until_ready(machine_id, timeout_s))

    def exec(self, machine_id: str, argv: Sequence[str], env: Mapping[str, str], cwd: str | None,
             timeout_s: float | None, stdin: bytes | None) -> Outcome:
        """See :meth:`Backend.exec`."""
        return _outcome(lambda: self.backend.exec(machine_id, argv, env=env, cwd=cwd, timeout_s=timeout_s,
                                                  stdin=stdin))

    def stream_exec(self, machine_id: str, argv: Sequence[str], env: Mapping[str, str], cwd: str | None,
                    timeout_s: float | None, stdin: bytes | None) -> Iterator[Outcome]:
        """See :meth:`Backend.stream_exec`: each event is one object of a Ray streaming generator."""
        try:
            for event in self.backend.stream_exec(machine_id, argv, env=env, cwd=cwd, timeout_s=timeout_s,
                                                  stdin=stdin):
                yield ("ok", event)
        except SwarmyardError as exc:
            yield ("error", exc.to_dict())

    def upload(self, machine_id: str, path: str, data: bytes, mode: int) -> Outcome:
        """See :meth:`Backend.upload`."""
        return _outcome(lambda: self.backend.upload(machine_id, path, data, mode))

    def download(self, machine_id: str, path: str) -> Outcome:
        """See :meth:`Backend.download`."""
        return _outcome(lambda: self.backend.download(machine_id, path))

    def delete(self, machine_id: str) -> Outcome:
        """See :meth:`Backend.delete`."""
        return _outcome(lambda: self.backend.delete(machine_id))

    def list(self) -> Outcome:
        """See :meth:`Backend.list`."""
        return _outcome(self.backend.list)

    def prepare_baseline(self, name: str, source: str) -> Outcome:
        """See :meth:`Backend.prepare_baseline`."""
        return _outcome(lambda: self.backend.prepare_baseline(name, Path(source)))

    def close(self) -> Outcome:
        """Delete this node's machines, then stop its bridges."""
        def close() -> None:
            try:
                self.backend.close()
            finally:
                with self._bridges_lock:
                    for bridge in self._bridges.values():
                        bridge.close()
                    self._bridges.clear()

        return _outcome(close)


@dataclasses.dataclass
class _Node:
    id: str
    host: Any  # the NodeHost actor handle
    capacity: int | None
    boot_id: str
    live: int = 0


class RayBackend:
    """Machines on a Ray cluster's nodes, each in the node's local bubblewrap sandbox."""

    name = "ray"

    def __init__(self, root: Path | None = None, *, address: str | None = None) -> None:
        ray = _ray()
        self._ray = ray
        self._root = root
        target = address or os.environ.get("RAY_ADDRESS") or None
        self._owns_cluster = target is None and not ray.is_initialized()
        if not ray.is_initialized():
            try:
                ray.init(address=target, namespace="swarmyard", log_to_driver=False, include_dashboard=False,
                         configure_logging=False)
            except ConnectionError as exc:
                raise SandboxUnavailableError(f"no Ray cluster at {target}: {exc}") from exc
        self._lock = threading.Condition()
        self._placed: dict[str, _Node] = {}
        self._here = boot_id()  # this host's: the log says which nodes share it
        self._describe: dict[str, Any] = {}
        #: plane socket -> node id -> the control socket a machine there binds (``None``: the node has none)
        self._routes: dict[str, dict[str, str | None]] = {}
        self._nodes = self._start_hosts()

    def _start_hosts(self) -> dict[str, _Node]:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ray = self._ray
        actor = ray.remote(num_cpus=0, max_concurrency=HOST_CONCURRENCY)(NodeHost)
        nodes: dict[str, _Node] = {}
        alive = [n for n in ray.nodes() if n.get("Alive")]
        if not alive:
            raise SandboxUnavailableError("the Ray cluster has no live node")
        for node in alive:
            node_id = node["NodeID"]
            resources = node.get("Resources", {})
            root = None if self._root is None else str(self._root / f"node-{node_id[:12]}")
            host = actor.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                name=f"swarmyard-host-{node_id[:12]}-{os.getpid()}",
            ).remote(root)
            slots = resources.get(SLOTS_RESOURCE)
            nodes[node_id] = _Node(node_id, host, None if slots is None else int(slots), boot_id="")
        for node in nodes.values():
            described = _value(ray.get(node.host.describe.remote()))
            self._describe = self._describe or described  # prefix and env: the same on every node (one install)
            node.boot_id = described["boot_id"]
            if node.capacity is None:
                memory = next(n for n in alive if n["NodeID"] == node.id).get("Resources", {}).get("memory")
                node.capacity = max(1, int(memory // (1 << 30))) if memory else None
            log.info("ray node %s: %s machines, %s host", node.id[:12], node.capacity or "any",
                     "this" if node.boot_id == self._here else "another")
        return nodes

    # -- the way to the plane -----------------------------------------------------------------------------------

    def driver_address(self) -> str:
        """The address Ray knows this process's node by: where nodes of other hosts reach what it serves."""
        node_id = self._ray.get_runtime_context().get_node_id()
        for node in self._ray.nodes():
            if node["NodeID"] == node_id and node.get("NodeManagerAddress"):
                return str(node["NodeManagerAddress"])
        raise SandboxUnavailableError("this process's own Ray node is not among the cluster's live nodes")

    def _routes_of(self, socket: Path) -> dict[str, str | None]:
        """How each node's machines reach the plane at ``socket``: asked of every node the first time."""
        key = str(socket)
        with self._lock:
            known = self._routes.get(key)
        if known is not None:
            return known
        mine = socket_identity(key)
        if mine is None:
            raise SandboxUnavailableError(f"the control plane's socket {key} is not a socket here")
        seen = {node.id: self._call(node.host.sees.remote(key)) for node in self._nodes.values()}
        for node_id, there in seen.items():
            log.info("ray node %s %s the plane's socket", node_id[:12], "sees" if there == mine else "cannot see")
        with self._lock:
            return self._routes.setdefault(key, {n: key if there == mine else None for n, there in seen.items()})

    def nodes_apart(self, socket: Path) -> list[str]:
        """The nodes that cannot see the plane's Unix socket ``socket`` and have no bridge to it yet."""
        return [node for node, route in self._routes_of(socket).items() if route is None]

    def bridge_plane(self, socket: Path, tls: PlaneTls) -> dict[str, str]:
        """Give every node that cannot see ``socket`` a bridge to the same plane over ``tls`` (its TCP listener
        with mutual TLS); how each node's machines reach the plane then: ``"socket"`` or ``"bridge"``."""
        routes = self._routes_of(socket)
        name = hashlib.sha256(f"{socket}\0{os.getpid()}".encode()).hexdigest()[:16]
        for node_id in self.nodes_apart(socket):
            path: str = self._call(self._nodes[node_id].host.bridge.remote(name, tls))
            with self._lock:
                routes[node_id] = path
        return self.plane_routes(socket)

    def plane_routes(self, socket: Path) -> dict[str, str]:
        """How each node's machines reach the plane at ``socket``: ``"socket"``, ``"bridge"`` or ``"none"``."""
        routes = self._routes_of(socket)
        return {node: "none" if route is None else "socket" if route == str(socket) else "bridge"
                for node, route in routes.items()}

    def bridged(self) -> dict[str, dict[str, int]]:
        """Per node with a bridge: the connections it forwarded to the plane over TLS and those it could not."""
        counts: dict[str, dict[str, int]] = {}
        for node in self._nodes.values():
            for count in self._call(node.host.bridged.remote()).values():
                mine = counts.setdefault(node.id, {"forwarded": 0, "failed": 0})
                mine["forwarded"] += count["forwarded"]
                mine["failed"] += count["failed"]
        return counts

    def _for_node(self, spec: MachineSpec, node: _Node) -> MachineSpec:
        """``spec`` as ``node`` runs it: its control socket the one that node's machines reach the plane by."""
        if spec.control_socket is None:
            return spec
        route = self._routes_of(spec.control_socket)[node.id]
        assert route is not None, "placed on a node without a way to the plane"
        return dataclasses.replace(spec, control_socket=Path(route))

    # -- placement ----------------------------------------------------------------------------------------------

    def _place(self, spec: MachineSpec, on: _Node | None = None) -> _Node:
        """Take a place for ``spec`` on ``on`` or on the node with the most room; wait while every node is full."""
        routes = None if spec.control_socket is None else self._routes_of(spec.control_socket)
        usable = [n for n in self._nodes.values() if routes is None or routes[n.id] is not None]
        if not usable:
            raise SandboxUnavailableError(
                "no Ray node can reach the control plane: none sees its Unix socket (they are on other hosts) "
                "and none was given a bridge to its TLS listener (RayBackend.bridge_plane)")
        if on is not None and on not in usable:
            raise SandboxUnavailableError(f"node {on.id[:12]} cannot reach the control plane")

        def room(node: _Node) -> float:
            return float("inf") if node.capacity is None else node.capacity - node.live

        with self._lock:
            if not self._lock.wait_for(lambda: max(room(n) for n in ([on] if on else usable)) > 0,
                                       timeout=PLACE_TIMEOUT_S):
                raise SandboxError(f"no Ray node had room for a machine within {PLACE_TIMEOUT_S:.0f} s",
                                   retryable=True)
            node = on or max(usable, key=lambda n: (room(n), -n.live))
            node.live += 1
            self._placed[spec.id] = node
        return node

    def _unplace(self, machine_id: str) -> None:
        with self._lock:
            node = self._placed.pop(machine_id, None)
            if node is not None:
                node.live -= 1
                self._lock.notify_all()

    def _node(self, machine_id: str) -> _Node:
        with self._lock:
            node = self._placed.get(machine_id)
        if node is None:
            raise NotFoundError("machine", machine_id)
        return node

    def node_of(self, machine_id: str) -> str:
        """The Ray node id a machine runs on."""
        return self._node(machine_id).id

    def _call(self, ref: Any) -> Any:
        try:
            return _value(self._ray.get(ref))
        except self._ray.exceptions.RayError as exc:
            raise SandboxError(f"the Ray node host failed: {type(exc).__name__}") from exc

    def _tag(self, info: MachineInfo, node: _Node) -> MachineInfo:
        return dataclasses.replace(info, backend=self.name, node=node.id)

    # -- the Backend protocol -----------------------------------------------------------------------------------

    def create(self, spec: MachineSpec) -> MachineInfo:
        """Place the machine on the node with the most room and start it booting there."""
        node = self._place(spec)
        try:
            return self._tag(self._call(node.host.create.remote(self._for_node(spec, node))), node)
        except BaseException:
            self._unplace(spec.id)
            raise

    def fork(self, source_id: str, spec: MachineSpec) -> MachineInfo:
        """Fork on the source's node: the copy-on-write disk lives there."""
        node = self._place(spec, on=self._node(source_id))
        try:
            return self._tag(self._call(node.host.fork.remote(source_id, self._for_node(spec, node))), node)
        except BaseException:
            self._unplace(spec.id)
            raise

    def wait_until_ready(self, machine_id: str, timeout_s: float) -> MachineInfo:
        """See :meth:`Backend.wait_until_ready`."""
        node = self._node(machine_id)
        return self._tag(self._call(node.host.wait_until_ready.remote(machine_id, timeout_s)), node)

    def exec(self, machine_id: str, argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None,
             timeout_s: float | None, stdin: bytes | None) -> ExecResult:
        """See :meth:`Backend.exec`."""
        node = self._node(machine_id)
        result: ExecResult = self._call(node.host.exec.remote(machine_id, list(argv), dict(env), cwd,
                                                              timeout_s, stdin))
        return result

    def stream_exec(self, machine_id: str, argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None,
                    timeout_s: float | None, stdin: bytes | None) -> Iterator[ExecEvent]:
        """See :meth:`Backend.stream_exec`: events arrive as the node host yields them."""
        node = self._node(machine_id)
        refs = node.host.stream_exec.options(num_returns="streaming").remote(
            machine_id, list(argv), dict(env), cwd, timeout_s, stdin)
        for ref in refs:
            event: ExecEvent = self._call(ref)
            yield event

    def upload(self, machine_id: str, path: str, data: bytes, mode: int) -> None:
        """See :meth:`Backend.upload`."""
        self._call(self._node(machine_id).host.upload.remote(machine_id, path, data, mode))

    def download(self, machine_id: str, path: str) -> bytes:
        """See :meth:`Backend.download`."""
        data: bytes = self._call(self._node(machine_id).host.download.remote(machine_id, path))
        return data

    def delete(self, machine_id: str) -> None:
        """Delete the machine on its node and give its place back."""
        node = self._node(machine_id)
        try:
            self._call(node.host.delete.remote(machine_id))
        finally:
            self._unplace(machine_id)

    def list(self) -> list[MachineInfo]:
        """Every machine this backend placed, as its node reports it."""
        with self._lock:
            mine = dict(self._placed)
        infos: list[MachineInfo] = []
        for node in self._nodes.values():
            infos.extend(self._tag(i, node) for i in self._call(node.host.list.remote()) if i.id in mine)
        return infos

    def prepare_baseline(self, name: str, source: Path) -> Baseline:
        """Freeze ``source`` as a baseline on every node (a node of another host needs the folder there too)."""
        baselines = [self._call(n.host.prepare_baseline.remote(name, str(source))) for n in self._nodes.values()]
        baseline: Baseline = baselines[0]
        return baseline

    def sandbox_prefix(self) -> str:
        """The machine's home folder as its commands see it (the same on every node)."""
        prefix: str = self._describe["prefix"]
        return prefix

    def machine_env(self, machine_id: str) -> dict[str, str]:
        """The variables every machine starts with (the same on every node: one install)."""
        return dict(self._describe["env"])

    def nodes(self) -> dict[str, int]:
        """Live machines per Ray node id."""
        with self._lock:
            return {n.id: n.live for n in self._nodes.values()}

    def close(self) -> None:
        """Delete every machine on every node, stop the node hosts, and the local cluster if this backend made it."""
        ray = self._ray
        try:
            for node in self._nodes.values():
                try:
                    self._call(node.host.close.remote())
                finally:
                    ray.kill(node.host)
        finally:
            with self._lock:
                self._placed.clear()
            if self._owns_cluster:
                ray.shutdown()
