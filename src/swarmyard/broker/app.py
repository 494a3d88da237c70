"""The broker's HTTP endpoints: a thin adapter over admission (``broker.admission``) and holds
(``broker.holds``).

A request is read only after its token's signature checks out, parsed in the format of its endpoint,
admitted (its worst case reserved), sent to its provider, and its answer rendered back in that format;
streams are passed on as each event arrives. How its hold ends is the holds module's: settled when the
answer is whole and its usage known, released when nothing can have been billed, ``unknown`` otherwise,
answered 502 with ``x-should-retry: false`` so the SDKs do not pay twice.

A call still in flight at its goal's deadline is cut there: the request to the upstream is cancelled (its
connection closed), its hold ends as any call lost after sending does (``unknown``: held at its worst case until
reconciled, never sent again), and the worker is answered ``deadline_passed``, the refusal a call made after the
deadline gets.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any, cast

import anyio
import orjson
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from swarmyard.auth.tokens import TokenAuthority
from swarmyard.broker import keepalive, ledger
from swarmyard.broker.admission import Admission, Admitted
from swarmyard.broker.calls import CallEnd, CallWatcher, provider_kind, tell
from swarmyard.broker.chat import (
    ChatRequest,
    ChatResponse,
    Finished,
    FinishReason,
    StreamEvent,
    StreamTally,
    ToolCall,
    Usage,
)
from swarmyard.broker.eventstream import EventStream, coalesced
from swarmyard.broker.formats import ANTHROPIC, OPENAI_CHAT, RESPONSES, ApiFormat
from swarmyard.broker.formats import anthropic as messages_format
from swarmyard.broker.holds import Hold, Holds, body_digest
from swarmyard.broker.jsonbody import parse_object
from swarmyard.broker.keepalive import Waiting, first_event
from swarmyard.broker.keys import scrubbed
from swarmyard.broker.providers.protocol import CALLING_AGENT, CallState, Provider, TakesTurns, agent_cli
from swarmyard.broker.settings import BrokerSettings, ModelRoute
from swarmyard.broker.tokencount import input_bound
from swarmyard.clock import Clock, SystemClock
from swarmyard.errors import (
    BudgetError,
    DeadlinePassedError,
    InvalidInputError,
    InvalidTokenError,
    PayloadTooLargeError,
    ProviderError,
    SwarmyardError,
    UpstreamLostError,
)
from swarmyard.store.protocol import Store
from swarmyard.store.threads import StoreThreads

log = logging.getLogger(__name__)

# Enough threads for reads to overlap (SQLite writers queue on one lock anyway; a PostgreSQL pool has 16)
_STORE_THREADS = 16


def _token(request: Request) -> str:
    header = request.headers.get("authorization", "")
    if header[:7].lower() == "bearer " and header[7:].strip():
        return header[7:].strip()
    key = request.headers.get("x-api-key", "").strip()
    if key:
        return key
    raise InvalidTokenError("send the worker token as Authorization: Bearer or x-api-key")


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError("request body", int(declared), limit)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLargeError("request body", size, limit)
            chunks.append(chunk)
    except ClientDisconnect as exc:
        raise InvalidInputError("the client went away while sending the body", field="body") from exc
    return b"".join(chunks)


def _outgoing(exc: SwarmyardError) -> dict[str, Any]:
    """An error's body as a worker may see it: an upstream's error text can echo a provider key (plain,
    JSON-escaped, URL-encoded, base64, hex), so every key the broker holds is scrubbed out of it."""
    return cast(dict[str, Any], scrubbed(exc.to_dict()))


def _error(exc: SwarmyardError, fmt: ApiFormat | None = None) -> JSONResponse:
    body = _outgoing(exc)
    headers = {"x-should-retry": "true" if exc.retryable else "false"}
    return JSONResponse(fmt.error_body(body) if fmt else body, status_code=exc.status, headers=headers)


class _DeadlineCut(Exception):
    """A stream's upstream call was cut at its goal's deadline (``_until``)."""


async def _until(events: AsyncGenerator[StreamEvent, None], when: float) -> AsyncGenerator[StreamEvent, None]:
    """``events`` until the loop's time ``when``: then the upstream call is closed and ``_DeadlineCut`` raised."""
    try:
        while True:
            try:
                async with asyncio.timeout_at(when):
                    event = await events.__anext__()
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise _DeadlineCut from None
            yield event
    finally:
        with anyio.CancelScope(shield=True):
            await events.aclose()


def _unrendered(exc: Exception) -> ProviderError:
    log.error("an answer could not be rendered", exc_info=exc)
    return ProviderError(f"the upstream's answer could not be passed on ({type(exc).__name__}); it was billed, "
                         f"do not send it again", retryable=False)


class Broker:
    """Serves the endpoints; admission and holds do the rest."""

    def __init__(
        self,
        store: Store,
        tokens: TokenAuthority,
        providers: Mapping[str, Provider],
        settings: BrokerSettings,
        clock: Clock | None = None,
    ) -> None:
        missing = {route.provider for route in settings.routes} - set(providers)
        if missing:
            raise InvalidInputError(
                f"routes name providers that are not configured: {sorted(missing)}", field="providers"
            )
        self.store = store
        self.tokens = tokens
        self.providers = dict(providers)
        self.settings = settings
        # Calls the event loop cannot make without waiting (a busy store, a tokenizer's count) go to these
        # threads: one on a store that takes one write at a time anyway.
        self._threads = StoreThreads(1 if store.single_writer else _STORE_THREADS, name="broker-store")
        self.admission = Admission(store, tokens, self.providers, settings, clock or SystemClock(), self._threads)
        self.holds = Holds(store, self._threads)
        #: seconds a stream may be silent before its first event: then keep-alives (``swarmyard.broker.keepalive``)
        self.keep_alive_s = keepalive.KEEP_ALIVE_S
        #: told of every call's end (``swarmyard.broker.calls``): the plane's metrics, a run's live trace
        self.watchers: list[CallWatcher] = []
        #: each goal's deadline, read once (it never changes): the calls of that goal still in flight are cut there
        self._deadlines: dict[str, float | None] = {}

    def routes(self) -> list[BaseRoute]:
        """The broker's routes, for the control plane to mount beside ``/v1/tools/*``.

        Whoever mounts them owns the broker's end: ``aclose()`` (on the serving loop) or at least
        ``wait_settled()``, so that settlements queued behind the last answers are written.
        """
        return _routes_for(self)

    def wait_settled(self, timeout_s: float | None = None) -> bool:
        """Block until every queued settlement is written (False if ``timeout_s`` ran out first)."""
        return self.holds.wait_settled(timeout_s)

    # The settlement tests drive admission and settlement on a broker with no server through these two.
    async def _admission(self, token: str, chat: ChatRequest, route: ModelRoute, size: int) -> Admitted:
        return await self.admission.admit(token, chat, route, size)

    def _settle_soon(self, admitted: Admitted, usage: Usage) -> None:
        self.holds.settle_soon(Hold(admitted, b""), usage)

    async def _deadline(self, admitted: Admitted) -> tuple[float, float] | None:
        """The call's goal's deadline, as (the clock's time, the event loop's), or ``None`` for a goal without one."""
        goal_id = admitted.reservation.goal_id
        if goal_id not in self._deadlines:
            goal = await self._threads.run(lambda: self.store.get_goal(goal_id))
            self._deadlines[goal_id] = goal.deadline
        deadline = self._deadlines[goal_id]
        if deadline is None:
            return None
        return deadline, asyncio.get_running_loop().time() + deadline - self.admission.clock.now()

    def _signed(self, request: Request) -> tuple[str, str]:
        """The request's worker token and worker id once its signature and expiry check out: nobody without
        one gets a byte of their body read. (Revocation is checked with the reservation, in the store.)"""
        token = _token(request)
        return token, self.tokens.verify_signed(token).worker_id

    async def generate(self, request: Request, fmt: ApiFormat) -> Response:
        """One generation endpoint (chat completions, responses or messages)."""
        route: ModelRoute | None = None
        started = time.time()
        worker_id = ""
        chat: ChatRequest | None = None
        try:
            token, worker_id = self._signed(request)
            # which agent CLI is calling, if one is: the local model asks a CLI's model differently
            CALLING_AGENT.set(agent_cli(request.headers.get("user-agent", "")))
            raw = await _read_body(request, self.settings.max_body_bytes)
            await self.holds.refuse_resend(worker_id, raw)
            chat = fmt.parse(parse_object(raw))
            route = self.admission.route(chat.model)
            admitted = await self.admission.admit(token, chat, route, len(raw), body_digest(raw))
        except SwarmyardError as exc:
            refused = self.providers.get(route.provider) if route is not None else None
            if isinstance(exc, BudgetError) and isinstance(refused, TakesTurns):
                refused.refused(worker_id)  # a worker out of calls or money calls no more: its turn passes
            if self.watchers:
                tell(self.watchers, CallEnd(
                    model=chat.model if chat is not None else "", outcome="refused", started_s=started,
                    ended_s=time.time(), worker_id=worker_id, provider=route.provider if route else "",
                    provider_kind=provider_kind(refused) if refused is not None else "",
                    stream=bool(chat and chat.stream), error_code=exc.code, error_message=exc.message,
                    messages=chat.messages if chat is not None else ()))
            return _error(exc, fmt)
        hold = Hold(admitted, raw)
        provider = self.providers[route.provider]
        upstream = replace(chat, model=route.upstream, max_tokens=admitted.max_tokens)
        log.info(
            "reservation %s: %s via %s, %d micro-USD held",
            admitted.reservation.id,
            route.name,
            provider.name,
            admitted.reservation.amount,
        )
        state = CallState(caller=worker_id)
        deadline: tuple[float, float] | None = None
        limit: asyncio.Timeout | None = None
        try:
            deadline = await self._deadline(admitted)
            if not chat.stream:  # a stream is cut by its events (``_until``) and ends its hold itself
                if deadline is None:  # no timer to set: a goal without a deadline pays nothing for it
                    answer = await provider.complete(upstream, state)
                else:
                    limit = asyncio.timeout_at(deadline[1])
                    async with limit:
                        answer = await provider.complete(upstream, state)
                usage = admitted.usage(answer.usage, answer.text + "".join(c.arguments for c in answer.tool_calls))
        except BaseException as exc:  # a cancelled call ends its hold too, then goes on being cancelled
            error = await self.holds.fail(hold, state, exc)
            self._ended(hold, chat, provider, started, error=error)
            if not isinstance(exc, Exception):
                raise
            if limit is not None and limit.expired() and deadline is not None:
                # cut at the deadline: its hold ended as a lost call's does; the worker hears why
                error = DeadlinePassedError(admitted.reservation.goal_id, deadline[0])
            return _error(error, fmt)
        if chat.stream:
            return await self._stream(provider, upstream, hold, fmt, chat, state, started, deadline)
        self.holds.settle_soon(hold, usage)  # the usage is known: whatever happens next, this call is billed
        if self.watchers:
            # told on the loop's next turn, as the settlement is written: once the answer's bytes are out, not
            # on their way (the call's record and the metrics' update are tens of microseconds a call)
            asyncio.get_running_loop().call_soon(
                functools.partial(self._ended, hold, chat, provider, started, usage=usage, answer=answer))
        try:
            # rendered here (orjson: the same compact UTF-8 JSON as Starlette's, several times faster), so that
            # a failure to render is this endpoint's to answer, not the server's
            return Response(orjson.dumps(fmt.render(answer, chat.model, usage)), media_type="application/json")
        except Exception as exc:
            return _error(_unrendered(exc), fmt)

    def _ended(self, hold: Hold, chat: ChatRequest, provider: Provider, started: float, *,
               usage: Usage | None = None, answer: ChatResponse | None = None, error: SwarmyardError | None = None,
               finish: FinishReason | None = None, text: str = "", tool_calls: tuple[ToolCall, ...] = ()) -> None:
        """Tell the watchers how an admitted call ended (a whole answer with ``usage``, else ``error``)."""
        if not self.watchers:
            return
        admitted = hold.admitted
        reservation = admitted.reservation
        if answer is not None:
            finish, text, tool_calls = answer.finish, answer.text, answer.tool_calls
        outcome = "settled" if error is None else (
            "unknown" if error.code == "upstream_unknown" else "released")
        tell(self.watchers, CallEnd(
            model=chat.model, outcome=outcome, started_s=started, ended_s=time.time(),
            worker_id=admitted.worker_id, goal_id=reservation.goal_id, task_id=reservation.task_id,
            reservation_id=reservation.id, provider=provider.name, provider_kind=provider_kind(provider),
            upstream_model=self.admission.route(chat.model).upstream,
            response_model=answer.model if answer is not None and answer.model else "",
            response_id=answer.id if answer is not None else "",
            finish_reason=finish.value if finish is not None else "",
            input_tokens=usage.input_tokens if usage else 0, output_tokens=usage.output_tokens if usage else 0,
            cost_micro_usd=ledger.actual_cost(usage.input_tokens, usage.output_tokens, admitted.price) if usage
            else 0,
            hold_micro_usd=reservation.amount, max_tokens=admitted.max_tokens, stream=chat.stream,
            error_code=error.code if error is not None else None,
            error_message=error.message if error is not None else "",
            messages=chat.messages, output_text=text, output_tool_calls=tool_calls))

    async def _stream(
        self, provider: Provider, upstream: ChatRequest, hold: Hold, fmt: ApiFormat, chat: ChatRequest,
        state: CallState, started: float, deadline: tuple[float, float] | None,
    ) -> Response:
        events = provider.stream(upstream, state)
        if deadline is not None:
            events = _until(events, deadline[1])
        cut = DeadlinePassedError(hold.admitted.reservation.goal_id, deadline[0]) if deadline else None
        try:
            # wait for the first event so that a failure before any data still gets a proper status; past
            # keep_alive_s of silence the stream starts with keep-alives instead (an SDK would send it again)
            first: StreamEvent | Waiting = await first_event(events, self.keep_alive_s)
        except StopAsyncIteration:
            first = Finished(FinishReason.STOP, None)
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await events.aclose()
            error = await self.holds.fail(hold, state, exc)
            self._ended(hold, chat, provider, started, error=error)
            if not isinstance(exc, Exception):
                raise
            return _error(cut if cut is not None and isinstance(exc, _DeadlineCut) else error, fmt)

        async def after() -> None:
            if not hold.ended:  # the frames never ran: the worker went away before the stream began
                if isinstance(first, Waiting):
                    await first.cancel()
                await events.aclose()
                lost = await self.holds.lose(hold, ConnectionAbortedError("worker disconnected before the stream "
                                                                          "began"))
                self._ended(hold, chat, provider, started, error=lost)

        return EventStream(coalesced(self._frames(first, events, hold, fmt, chat, provider, started, cut)),
                           after=after)

    async def _frames(
        self, first: StreamEvent | Waiting, events: AsyncGenerator[StreamEvent, None], hold: Hold, fmt: ApiFormat,
        chat: ChatRequest, provider: Provider, started: float, cut: DeadlinePassedError | None = None,
    ) -> AsyncIterator[bytes]:
        model = chat.model
        admitted = hold.admitted
        writer = fmt.writer(model, admitted.input_tokens)
        tally = StreamTally()
        try:
            yield writer.open()
            event = first
            while isinstance(event, Waiting):
                yield keepalive.frame(fmt)  # the answer is still being computed: say so, in the format's way
                event = await event.next(self.keep_alive_s)
            while not isinstance(event, Finished):
                tally.add(event)
                yield writer.event(event)
                try:
                    event = await events.__anext__()
                except StopAsyncIteration:
                    # a stream that ends without its finish record lost its end
                    raise UpstreamLostError("the upstream stream ended early") from None
            usage = admitted.usage(event.usage, tally.output_text())
            last = writer.close(event.finish, usage)
        except Exception as exc:
            # bytes were streamed: whatever failed, the cost is unknown
            error = await self.holds.lose(hold, exc)
            self._ended(hold, chat, provider, started, error=error)
            said = cut if cut is not None and isinstance(exc, _DeadlineCut) else error
            yield writer.error(fmt.error_body(_outgoing(said)))
            return
        except BaseException:
            # the worker went away mid-stream; the upstream call may go on costing
            lost = await self.holds.lose(hold, ConnectionAbortedError("worker disconnected"))
            self._ended(hold, chat, provider, started, error=lost)
            raise
        finally:
            with anyio.CancelScope(shield=True):
                if isinstance(first, Waiting):
                    await first.cancel()  # a no-op once it came
                await events.aclose()
        try:
            yield last
        finally:
            # after the last frame was handed on, so that it leaves before the settlement runs
            self.holds.settle_soon(hold, usage)
            self._ended(hold, chat, provider, started, usage=usage, finish=event.finish, text="".join(tally.text),
                        tool_calls=tuple(ToolCall(*tally.tool_meta.get(i, ("", "")), "".join(parts))
                                         for i, parts in sorted(tally.tool_calls.items())))

    async def count_tokens(self, request: Request) -> Response:
        """``POST /v1/messages/count_tokens``: the input bound the broker would reserve for."""
        try:
            token, _ = self._signed(request)
            raw = await _read_body(request, self.settings.max_body_bytes)
            chat = messages_format.parse_request(parse_object(raw), counting=True)
            route = self.admission.route(chat.model)

            def count() -> int:
                self.tokens.verify(token)
                return input_bound(chat, self.admission.counter(route))

            total = await self._threads.run(count)
        except SwarmyardError as exc:
            return _error(exc, ANTHROPIC)
        return JSONResponse({"input_tokens": total})

    async def models(self, request: Request) -> Response:
        """``GET /v1/models`` in a shape both SDKs read."""
        try:
            token = _token(request)
            await self._threads.run(lambda: self.tokens.verify(token))
        except SwarmyardError as exc:
            return _error(exc)
        data: list[dict[str, Any]] = [
            {
                "id": route.name,
                "object": "model",
                "type": "model",
                "created": 0,
                "created_at": "1970-01-01T00:00:00Z",
                "owned_by": "swarmyard",
                "display_name": route.name,
            }
            for route in self.settings.routes
        ]
        return JSONResponse(
            {
                "object": "list",
                "data": data,
                "has_more": False,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None,
            }
        )

    async def aclose(self) -> None:
        """Close every provider and the store threads (queued settlements are written first)."""
        for provider in self.providers.values():
            await provider.aclose()
        await self.holds.drain()
        await asyncio.get_running_loop().run_in_executor(None, self._threads.shutdown)


def _routes_for(broker: Broker) -> list[BaseRoute]:
    async def chat(request: Request) -> Response:
        return await broker.generate(request, OPENAI_CHAT)

    async def responses(request: Request) -> Response:
        return await broker.generate(request, RESPONSES)

    async def messages(request: Request) -> Response:
        return await broker.generate(request, ANTHROPIC)

    return [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
        Route("/v1/messages", messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", broker.count_tokens, methods=["POST"]),
        Route("/v1/models", broker.models, methods=["GET"]),
    ]


def broker_routes(
    store: Store,
    tokens: TokenAuthority,
    providers: Mapping[str, Provider],
    settings: BrokerSettings,
    clock: Clock | None = None,
) -> list[BaseRoute]:
    """The routes of a broker nobody closes (benchmarks, tests): a mounting server wants ``Broker.routes``."""
    return Broker(store, tokens, providers, settings, clock).routes()


def create_broker_app(
    store: Store,
    tokens: TokenAuthority,
    providers: Mapping[str, Provider],
    settings: BrokerSettings,
    clock: Clock | None = None,
) -> Starlette:
    """A Starlette app serving only the broker (``swarmyard broker serve``); closes providers on shutdown."""
    broker = Broker(store, tokens, providers, settings, clock)

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await broker.aclose()

    app = Starlette(routes=_routes_for(broker), lifespan=lifespan)
    app.state.broker = broker
    return app

