"""One assembly of a control plane and its model broker, and the one way they are served.

``swarmyard serve``, a run's in-process plane, the ``Boxd`` client's embedded plane and the benches that stand a
plane up all build it here: the plane's app over a store and a token authority, the broker on the same app (its
routes beside the plane's, its model calls counted in ``/metrics`` and kept with the trajectories when those are
kept, its providers closed once the server has stopped), served with the same :class:`ConnectionLimits` (a
deadline for a request's headers and one for its body, a cap on their bytes and on each listener's connections).
Before, each of them wired its own copy, and the copies drifted (one served without the limits).

This module is part of the plane: it imports the broker and the store, never what sits above them (a run, the
``Boxd`` client), which pass what is theirs (the machines view, the sources, extra routes and watchers) in.
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swarmyard.plane.connections import ConnectionLimits
from swarmyard.plane.server import BackgroundServer, Listen, serve, serve_processes

if TYPE_CHECKING:
    from starlette.applications import Starlette
    from starlette.routing import BaseRoute

    from swarmyard.auth.tokens import TokenAuthority
    from swarmyard.broker.app import Broker
    from swarmyard.broker.providers.configured import LocalSlots
    from swarmyard.config import ProviderConfig
    from swarmyard.plane.dashboard import MachinesView
    from swarmyard.plane.settings import PlaneSettings
    from swarmyard.plane.sources import Sources
    from swarmyard.plane.tools import Evaluator
    from swarmyard.plane.trajectory import TrajectoryFiles
    from swarmyard.store.protocol import Store

#: What every listener of every assembled plane is served with unless its caller says otherwise (``swarmyard
#: serve``'s flags): the defaults of :class:`ConnectionLimits`.
LIMITS = ConnectionLimits()


@dataclass(frozen=True, slots=True)
class Assembled:
    """A plane's app and the broker mounted on it (``None``: a plane with no providers)."""

    app: Starlette
    broker: Broker | None

    @property
    def core(self) -> Any:
        """The plane's handlers (operator API, worker tools), for a caller in this process to call directly."""
        return self.app.state.plane

    def on_close(self, close: Callable[[], Awaitable[None]]) -> None:
        """Have ``close`` awaited once the server has stopped, after what was added before it."""
        self.app.state.on_close.append(close)

    def background(self, listen: Listen, *, also: tuple[Listen, ...] = (),
                   bound: tuple[socket.socket | None, ...] = (), limits: ConnectionLimits = LIMITS,
                   ) -> BackgroundServer:
        """The servers of ``listen`` (and ``also``) on a thread of this process, not started yet: a run's plane,
        a ``Boxd`` client's. ``bound``: Unix sockets already listening (see :class:`BackgroundServer`)."""
        return BackgroundServer(self.app, listen, limits=limits, also=also, bound=bound)


def assemble(store: Store, tokens: TokenAuthority, settings: PlaneSettings, *,
             providers: Mapping[str, ProviderConfig] | None = None, given: Mapping[str, Any] | None = None,
             local_slots: LocalSlots | None = None, cache_dir: Path | None = None,
             evaluator: Evaluator | None = None, trajectories: TrajectoryFiles | None = None,
             machines: MachinesView | None = None, sources: Sources | None = None,
             extra_routes: Sequence[BaseRoute] = ()) -> Assembled:
    """The plane over ``store`` with, when ``providers`` is given, the broker serving that table mounted on it.

    ``given``: provider objects made by the caller (a scripted provider), by table entry; ``local_slots``: how an
    embedded model shares its context (the broker's default when ``None``); ``extra_routes``: mounted after the
    broker's. The other arguments are :func:`swarmyard.plane.app.create_app`'s.
    """
    from swarmyard.plane.app import create_app

    broker = None
    if providers is not None:
        from swarmyard.broker.providers.configured import BUILTIN_SLOTS, configured_broker

        broker = configured_broker(store, tokens, providers, cache_dir=cache_dir, given=given,
                                   local_slots=local_slots or BUILTIN_SLOTS)
    routes = [*(broker.routes() if broker is not None else ()), *extra_routes]
    app = create_app(store, tokens, settings, extra_routes=routes, evaluator=evaluator, trajectories=trajectories,
                     machines=machines, sources=sources)
    # run by the server after it stopped taking requests (uvicorn's lifespan is off): the broker's queued
    # settlements written, its providers closed
    app.state.on_close = []
    if broker is not None:
        # a claim is refused when its task's envelope cannot afford the least call this broker can hold
        app.state.plane.tools.floor_claims(broker.settings.routes, broker.settings.min_output_tokens)
        # /metrics: model-call latency and errors by code; each step's calls and cost with the trajectories
        app.state.plane.metrics.watch_broker(broker)
        if trajectories is not None:
            broker.watchers.append(trajectories.model_call)
        app.state.on_close.append(broker.aclose)
    return Assembled(app, broker)


def serve_assembled(make: Callable[[], Assembled], listen: Listen, *, processes: int = 1,
                    limits: ConnectionLimits = LIMITS,
                    sockets: tuple[socket.socket | None, socket.socket | None] | None = None) -> None:
    """Serve ``make()``'s plane in the foreground until SIGINT/SIGTERM; from ``processes`` forked processes sharing
    the listeners when more than one, ``make`` then running in each after its fork (see
    :func:`swarmyard.plane.server.serve_processes`). ``sockets``: listeners already bound (``bind``)."""
    if processes > 1:
        serve_processes(lambda: make().app, listen, processes, limits=limits, sockets=sockets)
    else:
        serve(make().app, listen, limits=limits, sockets=sockets)
