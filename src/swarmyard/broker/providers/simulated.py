"""A provider that imitates a model: for load benchmarks (configurable latency, sizes, speed and failures), or,
with ``simulate = "attempts"``, as a seeded model that improves attempts from their scores (see
``swarmyard.broker.providers.attempts``)."""

from __future__ import annotations

import hashlib
import random
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

import anyio

from swarmyard.broker.chat import (
    ChatRequest,
    ChatResponse,
    Finished,
    FinishReason,
    StreamEvent,
    TextDelta,
    Usage,
)
from swarmyard.broker.providers.attempts import attempt_answer
from swarmyard.broker.providers.protocol import CallState
from swarmyard.broker.providers.turns import Turns, stable_text
from swarmyard.broker.tokencount import FunctionCounter, TokenCounter
from swarmyard.errors import ProviderError, UpstreamLostError
from swarmyard.ids import new_id

#: How the simulated model counts tokens: words, as its usage reports them.
WORDS = "simulated:words"


def _words(text: str) -> int:
    return len(text.split())


@dataclass
class SimulatedProvider:
    """Answers ``output_tokens`` words after ``latency_s``, streaming at ``tokens_per_s`` (0 = no pacing).

    ``failure_rate`` of calls fail: half before the request is sent, half by a drop after it (seeded, so a
    benchmark run is repeatable). ``simulate = "attempts"`` answers the built-in agent's actions instead of
    ``tok`` words: attempts that improve from the scores in the conversation, each drawn from a generator keyed
    by the caller (its first request's text, ids left out) and its call count. ``turns`` > 0 answers that many
    callers one at a time in a fixed order (``swarmyard.broker.providers.turns``), so a team's run is the same
    whatever the scheduling.
    """

    name: str = "simulated"
    latency_s: float = 0.0
    output_tokens: int = 16
    input_tokens: int | None = None
    tokens_per_s: float = 0.0
    failure_rate: float = 0.0
    report_usage: bool = True
    seed: int = 0
    simulate: str = "tokens"
    turns: int = 0
    _random: random.Random = field(init=False, repr=False)
    #: caller -> (its key, calls answered)
    _callers: dict[str, tuple[str, int]] = field(init=False, repr=False)
    _turns: Turns | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)
        self._callers = {}
        self._turns = Turns(self.turns) if self.turns > 0 else None

    def refused(self, caller: str) -> None:
        """The broker refused ``caller``'s call: it calls no more, so it leaves the turns."""
        if self._turns is not None:
            self._turns.leave(caller)

    def counter(self, model: str) -> TokenCounter | None:
        """Under ``attempts``, its own count (words, as its usage reports them); else none."""
        return FunctionCounter(WORDS, _words) if self.simulate == "attempts" else None

    def _maybe_fail(self, state: CallState) -> None:
        if self.failure_rate and self._random.random() < self.failure_rate:
            if self._random.random() < 0.5:
                raise ProviderError("simulated failure before send", retryable=True)
            state.sent = True
            raise UpstreamLostError("simulated drop after send")
        state.sent = True

    def _usage(self, request: ChatRequest, produced: int) -> Usage | None:
        if not self.report_usage:
            return None
        words = sum(len(message.content.split()) for message in request.messages)
        return Usage(self.input_tokens if self.input_tokens is not None else words, produced)

    def _count(self, request: ChatRequest) -> int:
        return min(self.output_tokens, request.max_tokens or self.output_tokens)

    def _key(self, request: ChatRequest, caller: str) -> str | None:
        """The call's key: its caller's and how many calls that caller made before (``None``: no caller)."""
        if not caller:
            return None
        first = "\n".join(m.content for m in request.messages)
        key, calls = self._callers.get(caller) or (hashlib.sha256(stable_text(first).encode()).hexdigest(), 0)
        self._callers[caller] = (key, calls + 1)
        return f"{key}#{calls}"

    async def _text(self, request: ChatRequest, state: CallState) -> str:
        """The answer's text: an action under ``attempts``, else ``tok`` words; in turn where turns are taken."""
        if self._turns is not None and state.caller:
            await self._turns.wait(state.caller, "\n".join(m.content for m in request.messages))
        if self.simulate != "attempts":
            return " ".join(["tok"] * self._count(request))
        text = attempt_answer(request, self.seed, self._key(request, state.caller))
        if self._turns is not None and '"submit_finding"' in text:
            self._turns.leave(state.caller)  # its last answer: it submits and ends
        return text

    async def complete(self, request: ChatRequest, state: CallState) -> ChatResponse:
        """A whole simulated answer."""
        text = await self._text(request, state)
        self._maybe_fail(state)
        produced = len(text.split())
        delay = self.latency_s + (produced / self.tokens_per_s if self.tokens_per_s else 0.0)
        if delay:
            await anyio.sleep(delay)
        return ChatResponse(
            new_id("chatcmpl"),
            request.model,
            text,
            (),
            FinishReason.STOP,
            self._usage(request, produced),
        )

    async def stream(self, request: ChatRequest, state: CallState) -> AsyncGenerator[StreamEvent, None]:
        """A simulated answer, one word per event."""
        text = await self._text(request, state)
        self._maybe_fail(state)
        if self.latency_s:
            await anyio.sleep(self.latency_s)
        words = text.split(" ") if text else []
        produced = len(words)
        for index, word in enumerate(words):
            if self.tokens_per_s:
                await anyio.sleep(1 / self.tokens_per_s)
            yield TextDelta(word if index == 0 else f" {word}")
        yield Finished(FinishReason.STOP, self._usage(request, produced))

    async def aclose(self) -> None:
        """Nothing to release."""
