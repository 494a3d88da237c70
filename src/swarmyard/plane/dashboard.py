"""The live dashboard at ``/ui``: a read-only view of a goal, updated over server-sent events.

Plain HTML, CSS and JavaScript shipped in ``swarmyard/plane/ui`` (nothing fetched at build or run time). Every
page and endpoint with data needs the operator token: as a Bearer header (scripts) or as the HttpOnly,
SameSite=Strict cookie the login form sets. A worker token is refused (403); no token gets the login page and
no data. Nothing here writes to the store.

Over TCP (where a browser reaches it) every ``/ui`` request must name the dashboard's own host: the address the
plane listens on (and ``localhost`` when that is loopback) or a name in ``PlaneSettings.ui_hosts`` (``swarmyard
serve --ui-host NAME``), with its port. Any other Host is answered 421: a page of another site whose own name
resolves to this address (DNS rebinding) reads nothing. The login and logout forms must come from the dashboard's
own page (``Sec-Fetch-Site``, ``Origin`` or ``Referer``; a logout must show one of them), else 403 and nothing
changes: another site cannot log its visitor out, nor in. The Unix socket is no browser's: no Host is checked there.

``GET /ui/events?goal=ID`` streams the goal's state as one ``state`` event whenever it changed: the plane wakes
the stream after every tool call it served, and it looks again every ``POLL_S`` otherwise (the broker's
settlements, another serving process's writes, a worker's usage from its trajectory steps: a step wakes no
stream, or every agent's every step would rebuild the goal's whole state).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import re
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from starlette.types import Scope

from swarmyard.auth.tokens import TokenAuthority
from swarmyard.domain import Goal, Reservation, ReservationState
from swarmyard.errors import (
    CrossSiteError,
    ForbiddenError,
    InvalidInputError,
    InvalidTokenError,
    MisdirectedRequestError,
    NotFoundError,
    PayloadTooLargeError,
    StoreError,
    SwarmyardError,
)
from swarmyard.plane.agent_errors import AgentError, AgentLogs
from swarmyard.plane.limits import read_limited
from swarmyard.plane.trajectory import TrajectoryFiles, read_trajectory
from swarmyard.store.protocol import ExploreStore, LifecycleStore, Store

log = logging.getLogger(__name__)
T = TypeVar("T")
Offload = Callable[[Callable[[], T]], Awaitable[T]]
MachinesView = Callable[[], list[dict[str, Any]]]
UsageView = Callable[[], dict[str, dict[str, int]]]


@dataclass(frozen=True, slots=True)
class RunFacts:
    """What the page says of the run itself: whether it has ended, when, and how (a finished run's dashboard
    is read-only, and its timeline ends with the run)."""

    finished: bool = False
    ended_at: float | None = None
    #: ``synthesis``, ``no synthesis`` or ``stopped`` (interrupted before it closed); None while it runs
    outcome: str | None = None
    run_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """As JSON values."""
        return {"finished": self.finished, "ended_at": self.ended_at, "outcome": self.outcome, "id": self.run_id}


@dataclass(frozen=True, slots=True)
class UiListen:
    """Where ``swarmyard run --ui`` serves the dashboard, and whom to tell its URL and token file."""

    host: str = "127.0.0.1"
    port: int = 0
    announce: Callable[[str, Path], None] | None = None
    #: names beside ``host`` a browser may open it by (``--ui-host``; see ``PlaneSettings.ui_hosts``)
    hosts: tuple[str, ...] = ()


COOKIE = "swarmyard_ui"
#: How often a stream looks at the store when nothing woke it.
POLL_S = 0.5
#: A comment line this often keeps proxies and browsers from closing an idle stream.
KEEPALIVE_S = 15.0
_ID = re.compile(r"[A-Za-z0-9_.:-]{1,200}")
_STATIC = {"app.js": "text/javascript; charset=utf-8", "charts.js": "text/javascript; charset=utf-8",
           "app.css": "text/css; charset=utf-8"}
_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # a form post then names its origin (with no-referrer it says "null")
    "Cache-Control": "no-store",
}
#: Posts and findings a state carries (the newest), and characters of each body.
_POSTS, _FINDINGS, _BODY_CHARS = 200, 100, 4000
#: Steps of a trajectory the page gets (the newest): the file itself holds them all.
_STEPS = 200


def _asset(name: str) -> str:
    return resources.files("swarmyard.plane").joinpath("ui", name).read_text(encoding="utf-8")


def _id(value: str | None, field: str) -> str:
    if value is None or _ID.fullmatch(value) is None:
        raise InvalidInputError(f"{field} must be an id (letters, digits and _.:-, at most 200)", field=field)
    return value


def _cut(text: str, limit: int = _BODY_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + " [...]"


def _page(name: str, status: int = 200, message: str = "") -> Response:
    html = _asset(name).replace("{{message}}", _escape(message))
    return Response(html, status_code=status, media_type="text/html; charset=utf-8", headers=_HEADERS)


def _escape(text: str) -> str:
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
            .replace("'", "&#39;"))


def _error(exc: SwarmyardError) -> Response:
    return JSONResponse(exc.to_dict(), status_code=exc.status, headers=_HEADERS)


Endpoint = Callable[[Request], Awaitable[Response]]


def _split_host(value: str) -> tuple[str, int | None] | None:
    """A Host header as (name, port): ``name``, ``name:port``, ``[v6]`` or ``[v6]:port``; None when malformed."""
    name, port = value, ""
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return None
        name, rest = value[1:end], value[end + 1:]
        if rest and not rest.startswith(":"):
            return None
        port = rest[1:]
    elif value.count(":") == 1:
        name, port = value.split(":")
    elif ":" in value:
        return None  # a bare IPv6 address needs its brackets
    if port and not (port.isdigit() and len(port) <= 5):
        return None
    return name.lower().rstrip("."), int(port) if port else None


def _loopback(name: str) -> bool:
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_refusal(scope: Scope, names: Sequence[str]) -> MisdirectedRequestError | None:
    """Why a request may not reach the dashboard by the host it names (``None``: it may).

    Only over TCP: ``scope["server"]`` is then the address and port the connection reached. ``names`` are the
    extra names allowed (``ui_hosts``), each ``NAME`` or ``NAME:PORT``."""
    server = scope.get("server")
    if not (isinstance(server, tuple | list) and len(server) == 2 and isinstance(server[1], int)):
        return None  # the Unix socket: no browser's
    address, port = str(server[0]).lower(), server[1]
    allowed_names = {address}
    if _loopback(address):
        allowed_names |= {"localhost", "127.0.0.1", "::1"}
    shown = [f"[{a}]:{port}" if ":" in a else f"{a}:{port}" for a in sorted(allowed_names)]
    raw = next((v.decode("latin-1") for k, v in scope.get("headers", []) if k == b"host"), "")
    given = _split_host(raw.strip())
    default = 443 if scope.get("scheme") == "https" else 80
    if given is not None:
        name, asked = given
        if (asked or default) == port and name in allowed_names:
            return None
        for extra in names:
            wanted = _split_host(extra.strip())
            if wanted is not None and wanted[0] == name and (asked or default) == (wanted[1] or port):
                return None
    return MisdirectedRequestError(raw[:200], shown + list(names))


def cross_site(request: Request, *, required: bool) -> str | None:
    """The other site a form came from (``None``: the dashboard's own page sent it).

    ``Sec-Fetch-Site`` says it where the browser sends it; else ``Origin``; else ``Referer``. ``required``: a
    request that shows none of them is refused too (a browser always shows one on a form post)."""
    own = f"{request.url.scheme}://{request.headers.get('host', '')}"
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return None if site in ("same-origin", "none") else f"Sec-Fetch-Site: {site[:50]}"
    origin = request.headers.get("origin")
    if origin is not None:
        return None if origin == own else origin[:200]
    referer = request.headers.get("referer")
    if referer is not None:
        return None if referer == own or referer.startswith(own + "/") else referer[:200]
    return "no Origin, Referer or Sec-Fetch-Site" if required else None


def goal_state(store: Store, goal_id: str, machines: MachinesView | None = None,
               usage: dict[str, dict[str, int]] | None = None, facts: RunFacts | None = None,
               errors: dict[str, AgentError] | None = None) -> dict[str, Any]:
    """Everything the dashboard shows of one goal, as JSON values (read from the store, nothing written).

    ``errors``: each worker's last error (from its agent log); ``facts``: how the run ended, if it has."""
    goal = store.get_goal(goal_id)
    tasks = store.list_tasks(goal_id)
    reservations = store.list_reservations(goal_id)
    posts = _all(lambda after: store.read_board(goal_id, after=after, limit=500), lambda p: p.seq)
    findings = store.read_findings(goal_id, limit=10_000)
    per_worker: dict[str, dict[str, Any]] = {}
    calls: list[dict[str, Any]] = []
    for r in reservations:
        who = r.worker_id or "-"
        row = per_worker.setdefault(who, {"calls": 0, "input_tokens": 0, "output_tokens": 0,
                                          "spent_micro_usd": 0, "held_micro_usd": 0})
        row["calls"] += 1
        row["input_tokens"] += r.input_tokens
        row["output_tokens"] += r.output_tokens
        if r.state is ReservationState.SETTLED:
            row["spent_micro_usd"] += r.actual or 0
        elif r.state in (ReservationState.HELD, ReservationState.UNKNOWN):
            row["held_micro_usd"] += r.amount
        calls.append({"worker": who, "task": r.task_id, "model": r.model, "state": r.state.value,
                      "start": r.created_at, "end": r.updated_at,
                      "tokens": r.input_tokens + r.output_tokens})
    workers = []
    for w in store.list_workers(goal_id):
        spent = per_worker.get(w.id, {})
        claim = next((t for t in tasks if t.worker_id == w.id), None)
        error = (errors or {}).get(w.id)
        workers.append({"id": w.id, "group": w.group, "revoked": w.revoked,
                        "task": claim.title if claim else None,
                        "task_state": claim.state.value if claim else None, **(usage or {}).get(w.id, {}),
                        **spent, "error": error.to_dict() if error is not None else None})
    return {
        "goal": _goal(goal),
        "run": (facts or RunFacts()).to_dict(),
        "holds": _holds(store, goal, reservations, finished=facts is not None and facts.finished),
        "tasks": [{"id": t.id, "title": t.title, "group": t.group, "state": t.state.value, "depth": t.depth,
                   "worker": t.worker_id, "fencing_token": t.fencing_token, "lease_expires_at": t.lease_expires_at,
                   "attempts": t.attempts, "result": _cut(t.result or "", 500),
                   "spent_micro_usd": t.envelope.settled, "budget_micro_usd": t.envelope.limit,
                   "calls": t.envelope.calls} for t in tasks],
        "workers": workers,
        "machines": machines() if machines is not None else [],
        "board": [{"seq": p.seq, "kind": p.kind.value, "group": p.group, "author": p.author, "task": p.task_id,
                   "body": _cut(p.body), "at": p.created_at} for p in posts[-_POSTS:]],
        "board_total": len(posts),
        "findings": [{"id": f.id, "task": f.task_id, "group": f.group, "author": f.author, "title": f.title,
                      "body": _cut(f.body), "status": f.status.value, "score": f.score, "at": f.created_at,
                      "citations": [c.to_dict() for c in f.citations]}
                     for f in findings[-_FINDINGS:]],
        "findings_total": len(findings),
        "scores": [{"finding": f.id, "author": f.author, "score": f.score, "at": f.created_at}
                   for f in findings if f.score is not None],
        "calls": calls[-2000:],
        "series": _series(store, goal, reservations, findings, facts),
    }


def _series(store: ExploreStore, goal: Goal, reservations: Sequence[Reservation], findings: Sequence[Any],
            facts: RunFacts | None) -> dict[str, Any]:
    """The charts' data (``swarmyard.report.series``): the evaluator's search scores, else the findings'."""
    from swarmyard.report.series import run_series

    start = goal.created_at
    scored = store.list_scores(goal.id, split="search")
    source = "evaluator"
    points = [(s.created_at - start, s.score, s.worker_id) for s in scored]
    if not points:
        source = "findings"
        points = [(f.created_at - start, f.score, f.author) for f in findings if f.score is not None]
    end = facts.ended_at - start if facts is not None and facts.finished and facts.ended_at else None
    return run_series(start, goal.budget_micro_usd, reservations, points, end_s=end, score_source=source)


def _holds(store: LifecycleStore, goal: Goal, reservations: Sequence[Reservation], *, finished: bool) -> dict[str, Any]:
    """The holds an operator must settle: ``unknown`` ones always (the answer never came: only the provider's
    bill says what it cost), ``held`` ones once the run has ended (their broker is gone); and the commands."""
    unknown = [r for r in reservations if r.state is ReservationState.UNKNOWN]
    held = [r for r in reservations if r.state is ReservationState.HELD]
    left = unknown + (held if finished else [])
    url = store.url
    return {
        "unknown": len(unknown), "held": len(held), "open": len(left),
        "open_micro_usd": sum(r.amount for r in left),
        "ids": [r.id for r in left[:20]],
        "show": f"swarmyard budget show {goal.id} --store {url}",
        "reconcile": f"swarmyard budget reconcile RESERVATION (--actual MICRO_USD | --release) --store {url}",
    }


def _goal(goal: Goal) -> dict[str, Any]:
    e = goal.envelope
    return {"id": goal.id, "objective": goal.objective, "policy": goal.policy, "deadline": goal.deadline,
            "created_at": goal.created_at, "budget_micro_usd": goal.budget_micro_usd,
            "spent_micro_usd": e.settled, "held_micro_usd": e.reserved, "calls": e.calls,
            "call_cap": goal.call_cap}


def _all(page: Callable[[int], list[Any]], cursor: Callable[[Any], int]) -> list[Any]:
    out: list[Any] = []
    after = 0
    while True:
        got = page(after)
        out += got
        if len(got) < 500:
            return out
        after = cursor(got[-1])


class Dashboard:
    """The ``/ui`` routes over a store; ``notify`` wakes every open stream (call it on the app's loop)."""

    def __init__(self, store: Store, tokens: TokenAuthority, offload: Offload[Any], *,
                 trajectories: TrajectoryFiles | None = None, machines: MachinesView | None = None,
                 hosts: Sequence[str] = (), usage: UsageView | None = None, facts: RunFacts | None = None,
                 agents: Path | None = None) -> None:
        """``hosts``: names beside its listening address the dashboard answers to over TCP (``ui_hosts``).

        ``usage``: each worker's CPU time and memory (default: what ``trajectories`` saw in this process);
        ``agents``: the folder of the runner's agent logs, where each worker's last error is read (default: the
        trajectories' folder, which a run shares with them); ``facts``: a finished run's (its stream sends the
        state again only when the store changes, such as a hold reconciled)."""
        self._hosts = tuple(hosts)
        self._usage_view = usage
        self._facts = facts
        folder = agents if agents is not None else (trajectories.folder if trajectories is not None else None)
        self._logs = AgentLogs(folder) if folder is not None else None
        self._store = store
        self._tokens = tokens
        self._offload = offload
        self._trajectories = trajectories
        self._machines = machines
        self._changed: asyncio.Event | None = None
        self._closing = False  # set from any thread: open streams end within POLL_S
        self._generation = 0  # counts notify(): a cached state older than the last change is built again
        self._built: dict[str, tuple[float, int, str]] = {}  # goal -> (built at, generation, state JSON)
        self._locks: dict[str, asyncio.Lock] = {}

    def close(self) -> None:
        """End every open stream (the server is stopping: a browser left open must not hold it up)."""
        self._closing = True

    async def _shared_state(self, goal_id: str) -> str:
        """The goal's state as JSON, built at most once per ``POLL_S`` (or per change) whatever the number of
        open streams, on a thread of its own: a dashboard never queues behind, nor delays, the workers' tools
        on the store threads."""
        loop = asyncio.get_running_loop()
        lock = self._locks.setdefault(goal_id, asyncio.Lock())
        async with lock:
            cached = self._built.get(goal_id)
            # a finished run's too: its holds are reconciled (or its store resumed) after it ended, and the page
            # must then say what the store says, not what it said when first looked at
            fresh = cached is not None and cached[1] == self._generation and loop.time() - cached[0] < POLL_S / 2
            if cached is not None and fresh:
                return cached[2]
            generation = self._generation
            try:
                state = await asyncio.to_thread(self._state, goal_id)
                text = json.dumps(state, separators=(",", ":"), default=str)
            except SwarmyardError as exc:
                text = json.dumps(exc.to_dict())
            if len(self._built) >= 64:
                self._built.clear()
            self._built[goal_id] = (loop.time(), generation, text)
            return text

    def _usage(self) -> dict[str, dict[str, int]]:
        if self._usage_view is not None:
            return self._usage_view()
        return self._trajectories.usage() if self._trajectories is not None else {}

    def _state(self, goal_id: str) -> dict[str, Any]:
        """``goal_state`` with everything this dashboard knows beside the store (blocking: call on a thread)."""
        errors = self._logs.errors() if self._logs is not None else None
        try:
            return goal_state(self._store, goal_id, self._machines, self._usage(), self._facts, errors)
        except (KeyError, ValueError, TypeError, sqlite3.DatabaseError) as exc:
            # a row this version cannot read (a run folder's store made by hand, or by another version, or a
            # page of it damaged): the page says so with a code, where it got a bare 500 and its stream ended
            # with no event
            raise StoreError(f"the store holds a row the dashboard cannot read ({type(exc).__name__}: "
                             f"{str(exc)[:200]})") from exc

    @property
    def wakes(self) -> int:
        """How many times the plane said something changed (``/metrics``: ``swarmyard_dashboard_wakes_total``)."""
        return self._generation

    def notify(self) -> None:
        """Something may have changed: open streams look now."""
        self._generation += 1
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def _wait_change(self, timeout_s: float) -> None:
        if self._changed is None:
            self._changed = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout_s)

    # -- who is asking ----------------------------------------------------------------------------------
    def _token(self, request: Request) -> str | None:
        scheme, _, bearer = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and bearer.strip():
            return bearer.strip()
        return request.cookies.get(COOKIE) or None

    def _check(self, request: Request) -> None:
        """Raise unless the request carries an operator token (401 none or bad, 403 a worker's)."""
        token = self._token(request)
        if token is None:
            raise InvalidTokenError("the dashboard needs the operator token")
        self._tokens.verify_operator(token)

    # -- pages ------------------------------------------------------------------------------------------
    async def index(self, request: Request) -> Response:
        try:
            self._check(request)
        except ForbiddenError:
            return _page("login.html", 403, "A worker token cannot open the dashboard: give the operator token.")
        except SwarmyardError:
            return _page("login.html", 401)
        return _page("index.html")

    async def login(self, request: Request) -> Response:
        if cross_site(request, required=False) is not None:
            return _page("login.html", 403, "That form came from another site.")
        try:
            raw = await read_limited(request.stream(), request.headers.get("content-length"), 16 * 1024)
            form = parse_qs(raw.decode("utf-8", "replace"), max_num_fields=4)
            token = (form.get("token") or [""])[0].strip()
            if not token:
                raise InvalidTokenError("no token given")
            self._tokens.verify_operator(token)
        except ForbiddenError:
            return _page("login.html", 403, "A worker token cannot open the dashboard: give the operator token.")
        except PayloadTooLargeError:
            return _page("login.html", 413, "That form is too large.")
        except (SwarmyardError, ValueError):
            return _page("login.html", 401, "That is not a valid operator token.")
        response = RedirectResponse("/ui", status_code=303, headers=_HEADERS)
        response.set_cookie(COOKIE, token, max_age=12 * 3600, path="/ui", httponly=True, samesite="strict",
                            secure=request.url.scheme == "https")
        return response

    async def logout(self, request: Request) -> Response:
        other = cross_site(request, required=True)
        if other is not None:
            return _error(CrossSiteError(other))  # and the cookie stays: another site cannot end the session
        response = RedirectResponse("/ui", status_code=303, headers=_HEADERS)
        response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")
        return response

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _STATIC:
            return _error(NotFoundError("asset", name))
        return Response(_asset(name), media_type=_STATIC[name], headers=_HEADERS)

    # -- data -------------------------------------------------------------------------------------------
    async def goals(self, request: Request) -> Response:
        try:
            self._check(request)
            goals = await self._offload(self._store.list_goals)
        except SwarmyardError as exc:
            return _error(exc)
        return JSONResponse({"goals": [_goal(g) for g in goals]}, headers=_HEADERS)

    async def state(self, request: Request) -> Response:
        try:
            self._check(request)
            goal_id = _id(request.query_params.get("goal"), "goal")
            state = await self._offload(lambda: self._state(goal_id))
        except SwarmyardError as exc:
            return _error(exc)
        return JSONResponse(state, headers=_HEADERS)

    async def trajectory(self, request: Request) -> Response:
        try:
            self._check(request)
            worker_id = _id(request.path_params["worker_id"], "worker_id")
            worker = await self._offload(lambda: self._store.get_worker(worker_id))  # 404 for a stranger
            files = self._trajectories
            steps = [] if files is None else await self._offload(lambda: read_trajectory(files.path(worker.id)))
        except SwarmyardError as exc:
            return _error(exc)
        return JSONResponse({"worker": worker.id, "kept": files is not None, "steps_total": len(steps),
                             "steps": steps[-_STEPS:]}, headers=_HEADERS)

    async def events(self, request: Request) -> Response:
        try:
            self._check(request)
            goal_id = _id(request.query_params.get("goal"), "goal")
            await self._offload(lambda: self._store.get_goal(goal_id))  # 404 before the stream opens
        except SwarmyardError as exc:
            return _error(exc)

        async def stream() -> AsyncIterator[str]:
            last = ""
            quiet = 0.0
            while not self._closing:
                text = await self._shared_state(goal_id)
                if text != last:
                    last, quiet = text, 0.0
                    yield f"event: state\ndata: {text}\n\n"
                elif quiet >= KEEPALIVE_S:
                    quiet = 0.0
                    yield ": keepalive\n\n"
                await self._wait_change(POLL_S)
                quiet += POLL_S

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={**_HEADERS, "X-Accel-Buffering": "no"})

    def _own_host(self, endpoint: Endpoint) -> Endpoint:
        """``endpoint``, answered only when the request names the dashboard's own host (see the module)."""

        async def guarded(request: Request) -> Response:
            refused = host_refusal(request.scope, self._hosts)
            if refused is not None:
                return _error(refused)
            return await endpoint(request)

        return guarded

    def routes(self) -> list[BaseRoute]:
        """The ``/ui`` routes."""
        own = self._own_host
        return [
            Route("/ui", own(self.index), methods=["GET"]),
            Route("/ui/login", own(self.login), methods=["POST"]),
            Route("/ui/logout", own(self.logout), methods=["POST"]),
            Route("/ui/static/{name}", own(self.static), methods=["GET"]),
            Route("/ui/api/goals", own(self.goals), methods=["GET"]),
            Route("/ui/api/state", own(self.state), methods=["GET"]),
            Route("/ui/api/trajectory/{worker_id}", own(self.trajectory), methods=["GET"]),
            Route("/ui/events", own(self.events), methods=["GET"]),
        ]
