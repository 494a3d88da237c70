"""Server-sent events out of the broker: frames coalesced per upstream read, the body's end sent with the last."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import cast

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


async def coalesced(frames: AsyncIterator[bytes]) -> AsyncIterator[tuple[bytes, bool]]:
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


async def _disconnect(receive: Receive) -> None:
    """Return once the server says the client is gone (or, as uvicorn also says it, that the answer is complete)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class EventStream(StreamingResponse):
    """Server-sent events from ``coalesced``: the last chunk carries the end of the body with it.

    Starlette ends a stream with an empty body message of its own, which the server writes apart: one more
    socket write, and one more wake-up of the reader, for every answer.
    """

    def __init__(self, chunks: AsyncIterator[tuple[bytes, bool]], *, after: Callable[[], Awaitable[None]]) -> None:
        # Starlette keeps the iterator as body_iterator; only stream_response below reads it
        super().__init__(cast(AsyncIterator[bytes], chunks), media_type="text/event-stream",
                         headers={"cache-control": "no-cache", "x-accel-buffering": "no"})
        self._after = after
        self._sent_all = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the stream until it ends or its worker goes away, then run ``after`` however it ended: a worker
        gone before the first chunk was read leaves the frames unstarted, and only ``after`` can end their hold.

        What Starlette's own ``__call__`` does for a server that announces ASGI 2.3 (uvicorn does), with two
        plain asyncio tasks in place of its anyio task group: the stream in one, a listener for the worker's
        disconnect in the other; a disconnect before the last chunk cancels the stream. The task group and its
        cancel scopes cost about a tenth of a millisecond of CPU on every streamed answer (a profile of
        ``swarmyard bench broker``'s serving process).
        """
        try:
            await self._serve(receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._after()

    async def _serve(self, receive: Receive, send: Send) -> None:
        streaming = asyncio.ensure_future(self.stream_response(send))
        listening = asyncio.ensure_future(_disconnect(receive))
        both = {streaming, listening}
        try:
            await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
        finally:
            listening.cancel()  # a no-op once it returned
            if not self._sent_all:
                # the worker went away mid-stream: the stream is cancelled, and its frames end the hold (unknown).
                # Once the last chunk was sent the server says "disconnect" too: the stream then ends by itself.
                streaming.cancel()
            with anyio.CancelScope(shield=True):
                await asyncio.wait(both)
        if not streaming.cancelled():
            streaming.result()  # the stream's own failure, if it failed

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        ended = False
        async for chunk, last in cast(AsyncIterator[tuple[bytes, bool]], self.body_iterator):
            await send({"type": "http.response.body", "body": chunk, "more_body": not last})
            ended = self._sent_all = last
        if not ended:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            self._sent_all = True
