"""Keep-alive bytes for a stream whose first event is slow to come.

A request with tools on the embedded model is answered whole (a partial tool call is of no use), so its stream has
nothing to send until the answer is ready, which on two cores can take minutes. An SDK that hears nothing for long
gives up and sends the request again (Claude Code did after 300 s of silence): a second hold, and a second answer
computed for nobody. So when the first event has not come within :data:`KEEP_ALIVE_S`, the broker starts the stream
anyway (the format's opening frames) and sends, every :data:`KEEP_ALIVE_S` while it waits, what the format defines
for that: an Anthropic ``ping`` event, or an SSE comment line (``: keep-alive``) for the OpenAI formats, which SSE
readers skip. Nothing of the answer is made up: the events come as they did, after the keep-alives.

A failure after the stream has started is said in the stream (the format's error event) and, as for any stream
that sent bytes, the hold is marked unknown rather than released: never resent, reconciled later.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

import anyio

from swarmyard.broker.chat import Finished, FinishReason, StreamEvent
from swarmyard.broker.formats import ANTHROPIC, ApiFormat

#: Seconds of silence before the stream starts with keep-alives, and between two of them.
KEEP_ALIVE_S = 15.0

ANTHROPIC_PING = b'event: ping\ndata: {"type": "ping"}\n\n'
SSE_COMMENT = b": keep-alive\n\n"


def frame(fmt: ApiFormat) -> bytes:
    """The keep-alive ``fmt``'s streams may carry between events."""
    return ANTHROPIC_PING if fmt.name == ANTHROPIC.name else SSE_COMMENT


class Waiting:
    """A stream's first event, still on its way (see :func:`first_event`)."""

    def __init__(self, pending: asyncio.Future[StreamEvent]) -> None:
        self._pending = pending

    async def next(self, interval_s: float) -> StreamEvent | Waiting:
        """The first event, if it comes within ``interval_s`` (the upstream's error, if it failed), else self."""
        done, _ = await asyncio.wait({self._pending}, timeout=interval_s)
        if not done:
            return self
        return _result(self._pending)

    async def cancel(self) -> None:
        """Stop waiting (the worker went away): the upstream call is cancelled and its generator closed."""
        self._pending.cancel()
        with anyio.CancelScope(shield=True), contextlib.suppress(BaseException):
            await self._pending


def _result(pending: asyncio.Future[StreamEvent]) -> StreamEvent:
    try:
        return pending.result()
    except StopAsyncIteration:
        return Finished(FinishReason.STOP, None)


async def first_event(events: AsyncGenerator[StreamEvent, None], interval_s: float) -> StreamEvent | Waiting:
    """The stream's first event if it comes within ``interval_s`` (its failure raised, as before: the endpoint
    still answers with a proper status), else a :class:`Waiting` that the frames wait on between keep-alives."""

    async def first() -> StreamEvent:
        return await events.__anext__()

    pending = asyncio.ensure_future(first())
    try:
        done, _ = await asyncio.wait({pending}, timeout=interval_s)
    except BaseException:
        await Waiting(pending).cancel()
        raise
    if not done:
        return Waiting(pending)
    return _result(pending)
