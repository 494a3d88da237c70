"""The control plane's ASGI app: worker tools, operator API, OpenAPI schema, metrics, and mounted extras.

A body is read only once the caller's token checks out, up to a size cap (413), and refused if its JSON nests
past ``MAX_JSON_DEPTH`` before any parser sees it; then it is validated, strictly, with the pydantic models of
``swarmyard.plane.models`` (a failure is a 400 naming the field); every ``SwarmyardError`` becomes its typed JSON
body with its ``status`` (plus ``Retry-After`` on 429); anything else is logged and answered with a 500 that
leaks nothing. Store calls run on worker threads, never on the event loop: one hop per call (a whole tool: token
check, rate limit, lease and the store statements together), handed over in batches
(``swarmyard.store.threads``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import partial
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from swarmyard import __version__
from swarmyard.auth.tokens import TokenAuthority
from swarmyard.clock import Clock, SystemClock
from swarmyard.errors import InvalidInputError, InvalidTokenError, StoreLostError, SwarmyardError
from swarmyard.jsondepth import check_nesting
from swarmyard.plane.dashboard import Dashboard, MachinesView
from swarmyard.plane.limits import read_limited, retry_after_header
from swarmyard.plane.metrics import PlaneMetrics
from swarmyard.plane.openapi import build_openapi
from swarmyard.plane.operator import ENDPOINTS, Call, Endpoint, OperatorApi, check_path_id
from swarmyard.plane.settings import PlaneSettings
from swarmyard.plane.sources import Sources
from swarmyard.plane.tools import TOOLS, Evaluator, ToolSpec, WorkerTools
from swarmyard.plane.trajectory import MAX_STEP_BYTES, StepAccepted, StepRecord, TrajectoryFiles
from swarmyard.store.engine import connection_lost
from swarmyard.store.protocol import Store
from swarmyard.store.threads import StoreThreads

log = logging.getLogger(__name__)
T = TypeVar("T")
_JSON = "application/json"


def error_response(exc: SwarmyardError) -> Response:
    """The typed JSON answer for a swarmyard error."""
    headers = {}
    retry_after = getattr(exc, "retry_after_s", None)
    if exc.status == 429 and isinstance(retry_after, int | float):
        headers["Retry-After"] = retry_after_header(float(retry_after))
    if exc.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(exc.to_dict(), status_code=exc.status, headers=headers)


async def _client_gone(request: Request, exc: Exception) -> Response:
    """A client that went away before its body was read (or that the body deadline closed): no one to answer,
    and nothing to log as a failure."""
    return Response(status_code=400)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404/405 as the same typed JSON as every other error."""
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return JSONResponse({"error": {"code": code, "message": exc.detail, "retryable": False}},
                        status_code=exc.status_code, headers=exc.headers)


def _validation_error(exc: ValidationError) -> InvalidInputError:
    first = exc.errors(include_url=False, include_input=False)[0]
    field = ".".join(str(p) for p in first["loc"]) or None
    message = f"{field}: {first['msg']}" if field else first["msg"]
    return InvalidInputError(message, field=field)


def bearer_token(request: Request) -> str:
    """The bearer token of a request, or ``InvalidTokenError`` (401)."""
    return _bearer(request.headers.get("authorization"))


def _bearer(header: str | None) -> str:
    scheme, _, token = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise InvalidTokenError("missing bearer token (Authorization: Bearer <token>)")
    return token.strip()


class _Plane:
    """Everything the route handlers share."""

    def __init__(self, store: Store, tokens: TokenAuthority, settings: PlaneSettings, clock: Clock,
                 evaluator: Evaluator | None, sources: Sources | None = None) -> None:
        self.settings = settings
        self.tokens = tokens
        self.metrics = PlaneMetrics(store)
        self.tools = WorkerTools(store, tokens, settings, clock, self.metrics, evaluator, sources)
        self.operator = OperatorApi(store, tokens, settings, on_revoke=self.tools.forget_worker)
        threads = settings.store_concurrency or (2 if store.single_writer else 8)
        self.store_threads = StoreThreads(threads)
        self.openapi = build_openapi(__version__)
        #: the live dashboard's streams, woken after every tool call that succeeded
        self.dashboard: Dashboard | None = None

    def changed(self) -> None:
        """A tool call changed something: open dashboard streams look again now."""
        if self.dashboard is not None:
            self.dashboard.notify()

    async def offload(self, fn: Callable[[], T]) -> T:
        """Run a blocking store call on a store thread."""
        return await self.store_threads.run(fn)

    async def body(self, request: Request, model: type[BaseModel]) -> Any:
        """The request's body validated as ``model``: call it only once the caller is authenticated."""
        raw = await read_limited(request.stream(), request.headers.get("content-length"),
                                 self.settings.max_request_bytes)
        return validated(model, raw)


def validated(model: type[BaseModel], raw: bytes) -> Any:
    """``raw`` as ``model``: too deep a body is refused before the parser reads it, and every refusal is a
    typed 400 naming the field."""
    check_nesting(raw)
    if b"\\u0000" in raw and b"\\u0000" in raw.replace(b"\\\\", b""):  # an escaped backslash is not an escape
        # a NUL in a string is refused here: PostgreSQL cannot store one in text, SQLite would
        raise InvalidInputError("strings may not contain NUL (\\u0000)", field="body")
    try:
        return model.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        raise _validation_error(exc) from exc


async def _body_chunks(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return  # the client went away; what was read is validated and refused as incomplete
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


_INTERNAL = {"error": {"code": "internal_error", "message": "internal error", "retryable": True}}


def _unexpected(exc: Exception, what: str) -> Response:
    """The answer to an exception no typed error covers: a store connection lost mid-call is the typed
    ``StoreLostError`` (one log line, no traceback: a restarting server makes many); anything else a logged 500."""
    if connection_lost(exc):
        log.warning("%s: the store's connection was lost: %s", what, (str(exc).strip().splitlines() or [type(exc).__name__])[0])
        return error_response(StoreLostError(
            f"{what}: the store's connection was lost during the call; whether it took effect is unknown"))
    log.exception("%s failed", what)
    return JSONResponse(_INTERNAL, status_code=500)


class _ToolEndpoint:
    """``POST /v1/tools/<name>`` as a bare ASGI app: the hot path of a swarm (thousands of calls a second).

    It reads the two headers it needs straight from the scope and writes its JSON answer with two ``send``
    calls, where a Starlette ``Request`` and ``Response`` per call cost about a tenth of the server's time
    in profiles. Errors still go out as the same typed ``Response`` objects as everywhere else.
    """

    def __init__(self, plane: _Plane, spec: ToolSpec) -> None:
        self._plane = plane
        self._spec = spec
        self._method = getattr(plane.tools, spec.name)
        self._serializer = spec.response.__pydantic_serializer__
        # only an artifact is big; every other tool's body is small JSON
        self._max_bytes = (plane.settings.max_body_bytes if spec.name == "submit_artifact"
                           else plane.settings.max_request_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        plane, spec = self._plane, self._spec
        started = time.perf_counter()
        auth = declared = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                auth = value.decode("latin-1")
            elif name == b"content-length":
                declared = value.decode("latin-1")
        body: bytes | None = None
        try:
            token = _bearer(auth)
            # Whoever has no valid worker token gets no byte of their body read (revocation is checked
            # with the tool's store call; the signature and the expiry need no store).
            plane.tokens.verify_signed(token)
            raw = await read_limited(_body_chunks(receive), declared, self._max_bytes)
            req: Any = validated(spec.request, raw)
            if spec.name == "submit_artifact":
                result: BaseModel = await plane.tools.submit_artifact(token, req, plane.offload)
            else:
                result = await plane.offload(partial(plane.tools.call, partial(self._method, token, req)))
            body = self._serializer.to_json(result)
            status = 200
            plane.changed()
        except SwarmyardError as exc:
            response = error_response(exc)
        except Exception as exc:
            response = _unexpected(exc, f"tool {spec.name}")
        if body is not None:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
        else:
            status = response.status_code
            await response(scope, receive, send)
        plane.metrics.observe(spec.name, status, time.perf_counter() - started)


def _operator_endpoint(plane: _Plane, ep: Endpoint) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            plane.tokens.verify_operator(bearer_token(request))
            for name, value in request.path_params.items():
                check_path_id(name, value)
            query = None
            if ep.query is not None:
                try:
                    query = ep.query.model_validate(dict(request.query_params))
                except ValidationError as exc:
                    raise _validation_error(exc) from exc
            body = await plane.body(request, ep.body) if ep.body is not None else None
            call = Call(path=dict(request.path_params), query=query, body=body)
            result = await plane.offload(partial(ep.handler, plane.operator, call))
            response = Response(result.model_dump_json(), status_code=ep.status, media_type=_JSON)
        except SwarmyardError as exc:
            response = error_response(exc)
        except Exception as exc:
            response = _unexpected(exc, f"operator {ep.name}")
        plane.metrics.operator_calls.labels(str(response.status_code)).inc()
        return response

    return endpoint


class _DirectRoute:
    """An extra ``POST`` route (the model broker's) called as plain ASGI: a request in, its response out.

    What Starlette's route wrapper adds on top is exception translation, which these endpoints do not need:
    they answer every typed error themselves; anything else becomes the same bare 500 the error middleware
    would send.
    """

    def __init__(self, route: Route) -> None:
        self._endpoint = route.endpoint
        self._name = route.path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            response = await self._endpoint(Request(scope, receive, send))
        except ClientDisconnect:
            return
        except Exception as exc:
            response = _unexpected(exc, self._name)
        await response(scope, receive, send)


class _PlaneApp(Starlette):
    """Starlette, with a direct path for ``POST /v1/tools/<name>`` and the broker's ``POST`` endpoints.

    Tool calls and model calls are the hot path (thousands a second from a swarm): they go straight to their
    endpoint, past the router's route-by-route matching and the error middlewares, which they do not need
    because each of them turns every exception into its typed JSON answer itself. Everything else (other
    methods on those paths, too) goes through Starlette as usual.
    """

    def __init__(self, direct: dict[str, _ToolEndpoint | _DirectRoute], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._direct = direct

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            endpoint = self._direct.get(scope["path"])
            if endpoint is not None:
                scope["app"] = self
                await endpoint(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def _trajectory_endpoint(plane: _Plane, files: TrajectoryFiles | None) -> Callable[[Request], Awaitable[Response]]:
    """``POST /v1/trajectory/steps``: a worker reports one agent step (see ``swarmyard.plane.trajectory``)."""

    async def endpoint(request: Request) -> Response:
        try:
            token = bearer_token(request)
            plane.tokens.verify_signed(token)  # no byte of a stranger's body is read
            raw = await read_limited(request.stream(), request.headers.get("content-length"), MAX_STEP_BYTES)
            record: StepRecord = validated(StepRecord, raw)
            who = await plane.offload(partial(plane.tools.authenticate, token))
            kept = False
            if files is not None:
                kept = await plane.offload(partial(files.append, who.worker_id, record))
            # no plane.changed(): a step changes no goal state but a worker's usage, which the streams' poll
            # shows; waking them for every step of every agent rebuilt the whole state (every board post) each time
            return JSONResponse(StepAccepted(kept=kept).model_dump())
        except SwarmyardError as exc:
            return error_response(exc)
        except Exception:
            log.exception("trajectory step failed")
            return JSONResponse(_INTERNAL, status_code=500)

    return endpoint


def create_app(store: Store, tokens: TokenAuthority, settings: PlaneSettings | None = None,
               extra_routes: Sequence[BaseRoute] = (), evaluator: Evaluator | None = None,
               clock: Clock | None = None, trajectories: TrajectoryFiles | None = None,
               machines: MachinesView | None = None, sources: Sources | None = None) -> Starlette:
    """The control plane app over ``store``; ``extra_routes`` (the model broker's) are mounted beside it.

    ``trajectories`` keeps the agent steps workers report (without it they are acknowledged, not kept);
    ``machines`` lists the run's machines for the dashboard at ``/ui``; ``sources`` holds the files each task's
    worker was given, against which the quotes of its findings' source citations are checked.
    """
    plane = _Plane(store, tokens, settings or PlaneSettings(), clock or SystemClock(), evaluator, sources)
    dashboard = plane.dashboard = Dashboard(store, tokens, plane.offload, trajectories=trajectories,
                                            machines=machines, hosts=plane.settings.ui_hosts)
    plane.metrics.watch_dashboard(lambda: dashboard.wakes)

    async def openapi(request: Request) -> Response:
        return JSONResponse(plane.openapi)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True, "version": __version__})

    async def metrics(request: Request) -> Response:
        try:
            if not plane.settings.metrics_public:
                plane.tokens.verify_operator(bearer_token(request))
            text = await plane.offload(plane.metrics.exposition)
        except SwarmyardError as exc:
            return error_response(exc)
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    routes: list[BaseRoute] = [
        Route("/openapi.json", openapi, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/v1/trajectory/steps", _trajectory_endpoint(plane, trajectories), methods=["POST"]),
    ]
    tools = {f"/v1/tools/{spec.name}": _ToolEndpoint(plane, spec) for spec in TOOLS}
    routes += [Route(path, endpoint, methods=["POST"]) for path, endpoint in tools.items()]
    routes += [Route(ep.path, _operator_endpoint(plane, ep), methods=[ep.method]) for ep in ENDPOINTS]
    routes += plane.dashboard.routes()
    routes += list(extra_routes)
    direct: dict[str, _ToolEndpoint | _DirectRoute] = dict(tools)
    for route in extra_routes:
        if isinstance(route, Route) and route.methods == {"POST"} and not route.param_convertors:
            direct[route.path] = _DirectRoute(route)
    app = _PlaneApp(direct, routes=routes,
                    exception_handlers={HTTPException: _http_error, ClientDisconnect: _client_gone})
    app.state.plane = plane
    # run by the server when it is told to stop, before it waits for open requests: dashboard streams end
    app.state.on_stop = [plane.dashboard.close]
    return app
