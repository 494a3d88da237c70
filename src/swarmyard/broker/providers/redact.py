"""Keys out of what an upstream answers, at the provider boundary: whole answers and streams.

An upstream holds the key it was sent and may echo it (a compromised or hostile server, a proxy that reflects
headers). Every string of a whole answer goes through ``keys.scrubbed`` before a format parser sees it. A
stream cannot be scrubbed event by event: a key split across two deltas is whole in neither. ``StreamScrubber``
keeps, per string the worker reassembles (the text, each tool call's arguments), the last characters a form's
beginning could lie in, and passes them on once the next delta showed they are not part of a key, or at the end.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import assert_never

from swarmyard.broker.chat import Finished, StreamEvent, TextDelta, ToolCallDelta, ToolCallStart
from swarmyard.broker.keys import KeyForms, held_forms


class StreamScrubber:
    """Scrubs one stream's events of every held key, holding back the tail the next delta could still extend.

    One string is held at a time, the tail of the text or of one tool call's arguments: any other event first
    releases it, so the events keep their order (a format writer puts a delta in the block last opened).
    """

    __slots__ = ("_forms", "_held", "_owner")

    def __init__(self, forms: KeyForms | None = None) -> None:
        self._forms = forms or held_forms()
        self._held = ""
        self._owner: int | None = None  # the tool call whose arguments are held; None: the text

    def _hold(self, text: str) -> int:
        """How many final characters of (scrubbed) ``text`` a form of a key could begin in: a form's first part
        is shorter than the form, and written out literally unless an escape stands where it could lie."""
        forms = self._forms
        if not forms.longest_match:
            return 0
        if forms.escaped(text[-forms.longest_match:]):
            return forms.longest_match - 1
        return forms.longest_literal - 1

    def _push(self, owner: int | None, piece: str) -> list[StreamEvent]:
        out = self._release() if owner != self._owner else []
        text = self._forms.scrub(self._held + piece)
        cut = max(0, len(text) - self._hold(text))
        self._held, self._owner = text[cut:], owner
        if cut:
            out.append(TextDelta(text[:cut]) if owner is None else ToolCallDelta(owner, text[:cut]))
        return out

    def feed(self, event: StreamEvent) -> list[StreamEvent]:
        """The events that may reach the worker now; ``Finished`` first releases everything held."""
        match event:
            case TextDelta(text=text):
                return self._push(None, text)
            case ToolCallDelta(index=index, arguments=arguments):
                return self._push(index, arguments)
            case ToolCallStart(index=index, id=call_id, name=name):
                return [*self._release(), ToolCallStart(index, self._forms.scrub(call_id), self._forms.scrub(name))]
            case Finished():
                return [*self._release(), event]
            case _:
                assert_never(event)

    def _release(self) -> list[StreamEvent]:
        held, owner = self._held, self._owner
        self._held, self._owner = "", None
        if not held:
            return []
        return [TextDelta(held) if owner is None else ToolCallDelta(owner, held)]

    def cut_off(self) -> list[StreamEvent]:
        """For a stream that broke off: what was held, up to where the beginning of a key could stand (the
        rest is dropped, since what would have followed it is not known)."""
        self._held = self._held[:self._forms.first_possible_start(self._held)]
        return self._release()


async def scrubbed_stream(events: AsyncIterator[StreamEvent], end: Callable[[], Finished]
                          ) -> AsyncGenerator[StreamEvent, None]:
    """``events``, then ``end()`` (which raises for a stream that did not end as it must), through one
    ``StreamScrubber``; when either fails, the held text that cannot begin a key goes out before the error."""
    forms = held_forms()
    if not forms.longest_match:  # no key held (a local or key-less upstream): nothing to hold back
        async for event in events:
            yield event
        yield end()
        return
    scrubber = StreamScrubber(forms)
    try:
        async for event in events:
            for out in scrubber.feed(event):
                yield out
        last = end()
    except Exception:
        for out in scrubber.cut_off():
            yield out
        raise
    for out in scrubber.feed(last):
        yield out
