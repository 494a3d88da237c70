"""The broker's HTTP endpoints: authenticate the worker, reserve the worst case, call the provider, settle.

Admission (token, claim, price and the durable reservation together, before any byte goes upstream) runs on
the event loop itself when the store can take it without waiting: SQLite with its write lock free, a route
whose input is bounded by bytes. Otherwise it goes to the broker's store threads. Streams are passed on as
each event arrives. A failure before the request leaves releases the hold; a lost answer after it marks the
hold ``unknown`` and answers 502 with ``x-should-retry: false`` so the SDKs do not pay twice.

Settlement runs once the answer's last bytes are out (on the loop's next turn, or on the store threads when
the store is busy), and nobody waits for it: the worker does not pay a store commit on every call. Until it
lands the worst case stays held, which only ever refuses too early. If the broker dies in between, the hold
stays ``held`` (visible in ``swarmyard budget``, and ``swarmyard budget reconcile`` settles or releases it);
``Broker.wait_settled`` waits for the last ones.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, TypeVar, cast

import anyio
import orjson
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route
from starlette.types import Send

from swarmyard.auth.tokens import TokenAuthority, token_hash
from swarmyard.broker import anthropic as messages_format
from swarmyard.broker import ledger
from swarmyard.broker.chat import (
    ChatRequest,
    ChatResponse,
    Finished,
    FinishReason,
    StreamEvent,
    StreamTally,
    Usage,
)
from swarmyard.broker.formats import ANTHROPIC, OPENAI_CHAT, RESPONSES, ApiFormat
from swarmyard.broker.jsonbody import parse_object
from swarmyard.broker.keys import scrubbed
from swarmyard.broker.providers.protocol import CallState, Provider
from swarmyard.broker.settings import BrokerSettings, ModelRoute, Tokenizer
from swarmyard.broker.tokencount import ByteBoundCounter, TokenCounter, cl100k, input_bound
from swarmyard.clock import Clock, SystemClock
from swarmyard.domain import Price, Reservation
from swarmyard.errors import (
    BudgetExceededError,
    ConflictError,
    ContextLengthError,
    DeadlinePassedError,
    InvalidInputError,
    InvalidTokenError,
    NotFoundError,
    PayloadTooLargeError,
    ProviderError,
    StoreBusyError,
    SwarmyardError,
    UpstreamLostError,
    UpstreamUnknownError,
)
from swarmyard.store.protocol import Store
from swarmyard.store.threads import StoreThreads

log = logging.getLogger(__name__)

_T = TypeVar("_T")

# Enough threads for reads to overlap (SQLite writers queue on one lock anyway; a PostgreSQL pool has 16)
_STORE_THREADS = 16
# A price read from the store is reused this long: a price change reaches new reservations within it
_PRICE_TTL_S = 1.0
#: Largest request body admitted on the event loop: bounding its input by bytes takes well under a millisecond.
_INLINE_BODY_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class _Admitted:
    """A request that passed auth and holds a reservation."""

    reservation: Reservation
    price: Price
    counter: TokenCounter
    input_tokens: int
    max_tokens: int


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


class _JsonResponse(Response):
    """A JSON answer rendered by orjson (the same compact UTF-8 JSON as Starlette's, several times faster)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


async def _coalesced(frames: AsyncIterator[bytes]) -> AsyncIterator[tuple[bytes, bool]]:
    """``frames`` as they come, but the frames made in one go (one upstream read) leave as one body chunk;
    each chunk with whether it is the last (known when the producer ended in the same go).

    Why: every chunk goes through the server's send path and costs a few socket writes; an upstream read
    often carries several events. Nothing waits for more: a frame goes out as soon as the producer waits
    for the upstream again. The producer runs as its own task, so a worker that goes away cancels it (and
    ``frames`` does its own cleanup, marking the hold unknown).
    """
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def pump() -> None:
        try:
            async for frame in frames:
                queue.put_nowait(frame)
        finally:
            queue.put_nowait(None)

    producer = asyncio.ensure_future(pump())
    try:
        while (frame := await queue.get()) is not None:
            parts = [frame]
            while not queue.empty() and (frame := queue.get_nowait()) is not None:
                parts.append(frame)
            yield b"".join(parts), frame is None
            if frame is None:
                break
    finally:
        producer.cancel()  # a no-op once it is done
        with anyio.CancelScope(shield=True):
            await asyncio.wait({producer})


class _EventStream(StreamingResponse):
    """Server-sent events from ``_coalesced``: the last chunk carries the end of the body with it.

    Starlette ends a stream with an empty body message of its own, which the server writes apart: one more
    socket write, and one more wake-up of the reader, for every answer.
    """

    def __init__(self, chunks: AsyncIterator[tuple[bytes, bool]]) -> None:
        # Starlette keeps the iterator as body_iterator; only stream_response below reads it
        super().__init__(cast(AsyncIterator[bytes], chunks), media_type="text/event-stream",
                         headers={"cache-control": "no-cache", "x-accel-buffering": "no"})

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        ended = False
        async for chunk, last in cast(AsyncIterator[tuple[bytes, bool]], self.body_iterator):
            await send({"type": "http.response.body", "body": chunk, "more_body": not last})
            ended = last
        if not ended:
            await send({"type": "http.response.body", "body": b"", "more_body": False})


class Broker:
    """Holds the store, the token authority, the providers and the settings; serves the endpoints."""

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
        self.clock = clock or SystemClock()
        # Calls the event loop cannot make without waiting (a busy store, a tokenizer's count) go to these
        # threads: one on SQLite, which has one writer anyway.
        self._threads = StoreThreads(1 if store.single_writer else _STORE_THREADS, name="broker-store")
        self._settling: set[asyncio.Task[None]] = set()  # settlements on their way to the threads
        self._prices: dict[str, tuple[float, Price]] = {}
        # settlements handed to the pool and not yet written; wait_settled waits for zero
        self._unsettled = 0
        self._settled = threading.Condition()

    async def _in_pool(self, call: Callable[..., _T], *args: Any) -> _T:
        """Run a blocking store call on the broker's threads."""
        return await self._threads.run(partial(call, *args))

    # -- errors ---------------------------------------------------------------------------------------------

    @staticmethod
    def _error(exc: SwarmyardError, fmt: ApiFormat | None = None) -> JSONResponse:
        body = _outgoing(exc)
        headers = {"x-should-retry": "true" if exc.retryable else "false"}
        return JSONResponse(fmt.error_body(body) if fmt else body, status_code=exc.status, headers=headers)

    # -- admission (runs in a worker thread) ----------------------------------------------------------------

    def _route(self, model: str) -> ModelRoute:
        route = self.settings.by_name.get(model)
        if route is None:
            raise NotFoundError("model", model)
        return route

    def _counter(self, route: ModelRoute) -> TokenCounter:
        if route.tokenizer is Tokenizer.CL100K:
            return cl100k()
        if route.tokenizer is Tokenizer.PROVIDER:
            own = self.providers[route.provider].counter(route.upstream)
            if own is not None:
                return own
        return ByteBoundCounter()

    def _price(self, route: ModelRoute) -> Price:
        now = time.monotonic()
        cached = self._prices.get(route.name)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            price = self.store.get_price(route.name)
        except NotFoundError:
            price = route.default_price
        self._prices[route.name] = (now + _PRICE_TTL_S, price)
        return price

    def _admit(self, token: str, chat: ChatRequest, route: ModelRoute) -> _Admitted:
        signed = self.tokens.verify_signed(token)  # a forged or expired token costs no token counting
        if chat.max_tokens is not None and chat.max_tokens > route.max_output_tokens:
            # Agent CLIs send their own large defaults (Claude Code asks for 32,000); the model cannot write
            # past the route's limit anyway, so the request is held (and reserved) at that limit.
            chat = replace(chat, max_tokens=route.max_output_tokens)
        price = self._price(route)
        counter = self._counter(route)
        inputs = input_bound(chat, counter)
        room = route.output_room(inputs)
        if room < self.settings.min_output_tokens:
            # refused before anything is held: the model could not even read the whole conversation
            raise ContextLengthError(route.name, inputs, route.context_tokens)
        max_tokens = chat.max_tokens
        if max_tokens is not None:
            max_tokens = min(max_tokens, room)
            # The common case: the worst case is known before the store is asked, so the worker's token, its
            # claim and both envelopes are checked and charged in one transaction (one trip to the store).
            reservation = self.store.reserve_for_worker(
                signed.worker_id, token_hash(token), model=route.name,
                amount=ledger.worst_case(inputs, max_tokens, price), method=counter.method)
            return _Admitted(reservation, price, counter, inputs, max_tokens)
        identity = self.tokens.verify(token)
        claim = self.store.current_claim(identity.worker_id)
        if claim is None:
            raise ConflictError(f"worker {identity.worker_id} holds no live claim; claim a task first")
        task = claim.task
        goal = self.store.get_goal(task.goal_id)
        if goal.deadline is not None and self.clock.now() >= goal.deadline:
            raise DeadlinePassedError(goal.id, goal.deadline)
        # the tighter envelope decides, and is the one a refusal names
        envelopes = [
            (f"task {task.id}", task.envelope.available),
            (f"goal {goal.id}", goal.envelope.available),
        ]
        name, available = min(envelopes, key=lambda pair: pair[1])
        max_tokens = ledger.largest_affordable(available, inputs, price, room)
        if max_tokens < self.settings.min_output_tokens:
            raise BudgetExceededError(
                name, ledger.worst_case(inputs, self.settings.min_output_tokens, price), available
            )
        amount = ledger.worst_case(inputs, max_tokens, price)
        reservation = self.store.reserve(
            task.id, claim.token, model=route.name, amount=amount, method=counter.method
        )
        return _Admitted(reservation, price, counter, inputs, max_tokens)

    async def _admission(self, token: str, chat: ChatRequest, route: ModelRoute, size: int) -> _Admitted:
        """Admit right here on the event loop when that cannot block it; otherwise on the store threads.

        It cannot block when the store answers without waiting (SQLite, whose write lock is free: taken, the
        attempt fails at once having done nothing, and the call queues for the threads) and counting the
        input is a length, not a tokenizer's work (a byte-bounded route, a small body). That saves the two
        thread hand-offs, a good part of what the broker adds to a call.
        """
        if route.tokenizer is Tokenizer.BYTES and size <= _INLINE_BODY_BYTES:
            done, admitted = self._on_loop(self._admit, token, chat, route)
            if done and admitted is not None:
                return admitted
        return await self._in_pool(self._admit, token, chat, route)

    def _on_loop(self, call: Callable[..., _T], *args: Any) -> tuple[bool, _T | None]:
        """``call(*args)`` right here if the store can take it without waiting: (True, its result); else
        (False, None), having done nothing. Its other errors are raised."""
        with self.store.nowait() as nowait:
            if nowait:
                try:
                    return True, call(*args)
                except StoreBusyError:
                    pass
        return False, None

    # -- settlement -----------------------------------------------------------------------------------------

    def _write_settlement(self, admitted: _Admitted, usage: Usage) -> None:
        self.store.settle(
            admitted.reservation.id,
            ledger.actual_cost(usage.input_tokens, usage.output_tokens, admitted.price),
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
        )

    def _settle(self, admitted: _Admitted, usage: Usage) -> None:
        try:
            self._write_settlement(admitted, usage)
        except Exception:
            # the hold stays held (or was reconciled meanwhile): safe, visible, and reconcilable
            log.exception("reservation %s could not be settled", admitted.reservation.id)
        finally:
            self._one_settled()

    def _one_settled(self) -> None:
        with self._settled:
            self._unsettled -= 1
            if not self._unsettled:
                self._settled.notify_all()

    def _settle_soon(self, admitted: _Admitted, usage: Usage) -> None:
        """Settle once the answer is out: on the event loop's next turn (the answer's last bytes are written
        in this one) when the store can take it without waiting, else on the store threads.

        On the loop, the settlement runs while the worker reads its answer, instead of on a thread that
        wakes later and then competes with the next call for the interpreter and the write lock.
        """
        with self._settled:
            self._unsettled += 1
        try:
            asyncio.get_running_loop().call_soon(self._settle_on_loop, admitted, usage)
        except RuntimeError:  # no loop running: this is a thread
            self._settle(admitted, usage)

    def _settle_on_loop(self, admitted: _Admitted, usage: Usage) -> None:
        try:
            done, _ = self._on_loop(self._write_settlement, admitted, usage)
        except Exception:
            # the hold stays held (or was reconciled meanwhile): safe, visible, and reconcilable
            log.exception("reservation %s could not be settled", admitted.reservation.id)
            done = True
        if done:
            self._one_settled()
            return
        task = asyncio.ensure_future(self._settle_in_pool(admitted, usage))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _settle_in_pool(self, admitted: _Admitted, usage: Usage) -> None:
        try:
            await self._in_pool(self._settle, admitted, usage)
        except RuntimeError:
            self._settle(admitted, usage)  # the threads are shut down (the broker is closing): settle here

    def routes(self) -> list[BaseRoute]:
        """The broker's routes, for the control plane to mount beside ``/v1/tools/*``.

        Whoever mounts them owns the broker's end: ``aclose()`` (on the serving loop) or at least
        ``wait_settled()``, so that settlements queued behind the last answers are written.
        """
        return _routes_for(self)

    def wait_settled(self, timeout_s: float | None = None) -> bool:
        """Block until every queued settlement is written (False if ``timeout_s`` ran out first)."""
        with self._settled:
            return self._settled.wait_for(lambda: not self._unsettled, timeout_s)

    async def _lost(self, admitted: _Admitted, exc: BaseException) -> UpstreamUnknownError:
        reservation_id = admitted.reservation.id
        with anyio.CancelScope(shield=True):
            await self._in_pool(self.store.mark_unknown, reservation_id)
        log.warning("reservation %s is unknown: %s", reservation_id, type(exc).__name__)
        return UpstreamUnknownError(
            f"the upstream answer was lost after the request was sent; reservation "
            f"{reservation_id} is held until reconciled",
            reservation_id=reservation_id,
        )

    async def _failed(self, admitted: _Admitted, state: CallState, exc: BaseException) -> SwarmyardError:
        """Release or mark unknown, and say what to answer."""
        # an error status is an answer: the provider refused, nothing was generated, nothing to bill
        answered = isinstance(exc, (ProviderError, ContextLengthError))
        if isinstance(exc, UpstreamLostError) or (state.sent and not answered):
            return await self._lost(admitted, exc)
        with anyio.CancelScope(shield=True):
            await self._in_pool(self.store.release_reservation, admitted.reservation.id)
        if answered:
            return cast(SwarmyardError, exc)
        log.exception("provider failed before sending", exc_info=exc)
        return ProviderError(
            f"provider failed before the request was sent ({type(exc).__name__})", retryable=True
        )

    def _usage(self, admitted: _Admitted, reported: Usage | None, output_text: str) -> Usage:
        if reported is not None:
            return reported
        # no usage record: bound the input as reserved and count what was streamed
        return Usage(admitted.input_tokens, admitted.counter.count(output_text) if output_text else 0)

    # -- endpoints ------------------------------------------------------------------------------------------

    def _signed(self, request: Request) -> str:
        """The request's worker token once its signature and expiry check out: nobody without one gets a
        byte of their body read. (Revocation is checked with the reservation, in the store.)"""
        token = _token(request)
        self.tokens.verify_signed(token)
        return token

    async def generate(self, request: Request, fmt: ApiFormat) -> Response:
        """One generation endpoint (chat completions, responses or messages)."""
        try:
            token = self._signed(request)
            raw = await _read_body(request, self.settings.max_body_bytes)
            chat = fmt.parse(parse_object(raw))
            route = self._route(chat.model)
            admitted = await self._admission(token, chat, route, len(raw))
        except SwarmyardError as exc:
            return self._error(exc, fmt)
        provider = self.providers[route.provider]
        upstream = replace(chat, model=route.upstream, max_tokens=admitted.max_tokens)
        log.info(
            "reservation %s: %s via %s, %d micro-USD held",
            admitted.reservation.id,
            route.name,
            provider.name,
            admitted.reservation.amount,
        )
        if chat.stream:
            return await self._stream(provider, upstream, admitted, fmt, chat.model)
        state = CallState()
        try:
            answer: ChatResponse = await provider.complete(upstream, state)
        except Exception as exc:
            return self._error(await self._failed(admitted, state, exc), fmt)
        usage = self._usage(
            admitted, answer.usage, answer.text + "".join(c.arguments for c in answer.tool_calls)
        )
        response = _JsonResponse(fmt.render(answer, chat.model, usage))
        self._settle_soon(admitted, usage)
        return response

    async def _stream(
        self, provider: Provider, upstream: ChatRequest, admitted: _Admitted, fmt: ApiFormat, model: str
    ) -> Response:
        state = CallState()
        events = provider.stream(upstream, state)
        try:
            # wait for the first event so that a failure before any data still gets a proper status
            first: StreamEvent = await events.__anext__()
        except StopAsyncIteration:
            first = Finished(FinishReason.STOP, None)
        except Exception as exc:
            await events.aclose()
            return self._error(await self._failed(admitted, state, exc), fmt)
        return _EventStream(_coalesced(self._frames(first, events, state, admitted, fmt, model)))

    async def _frames(
        self,
        first: StreamEvent,
        events: AsyncGenerator[StreamEvent, None],
        state: CallState,
        admitted: _Admitted,
        fmt: ApiFormat,
        model: str,
    ) -> AsyncIterator[bytes]:
        writer = fmt.writer(model, admitted.input_tokens)
        tally = StreamTally()
        finished: Finished | None = None
        done = False
        try:
            yield writer.open()
            event = first
            while True:
                if isinstance(event, Finished):
                    finished = event
                    break
                tally.add(event)
                yield writer.event(event)
                try:
                    event = await events.__anext__()
                except StopAsyncIteration:
                    # a stream that ends without its finish record lost its end
                    raise UpstreamLostError("the upstream stream ended early") from None
            usage = self._usage(admitted, finished.usage, tally.output_text())
            done = True
            try:
                yield writer.close(finished.finish, usage)
            finally:
                # after the last frame was handed on, so that it leaves before the settlement runs
                self._settle_soon(admitted, usage)
        except Exception as exc:
            done = True
            # bytes were streamed: whatever failed, the cost is unknown
            state.sent = True
            error = await self._failed(admitted, state, exc)
            yield writer.error(fmt.error_body(_outgoing(error)))
        finally:
            if not done:
                # the worker went away mid-stream; the upstream call may go on costing
                await self._lost(admitted, ConnectionAbortedError("worker disconnected"))
            with anyio.CancelScope(shield=True):
                await events.aclose()

    async def count_tokens(self, request: Request) -> Response:
        """``POST /v1/messages/count_tokens``: the input bound the broker would reserve for."""
        try:
            token = self._signed(request)
            raw = await _read_body(request, self.settings.max_body_bytes)
            chat = messages_format.parse_request(parse_object(raw), counting=True)
            route = self._route(chat.model)

            def count() -> int:
                self.tokens.verify(token)
                return input_bound(chat, self._counter(route))

            total = await self._in_pool(count)
        except SwarmyardError as exc:
            return self._error(exc, ANTHROPIC)
        return JSONResponse({"input_tokens": total})

    async def models(self, request: Request) -> Response:
        """``GET /v1/models`` in a shape both SDKs read."""
        try:
            token = _token(request)
            await self._in_pool(self.tokens.verify, token)
        except SwarmyardError as exc:
            return self._error(exc)
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
        if self._settling:
            await asyncio.gather(*self._settling)
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
