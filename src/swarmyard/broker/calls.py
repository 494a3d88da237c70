"""What the broker tells its watchers when a model call ends: one ``CallEnd`` per request it answered.

A watcher (the plane's ``/metrics``, a run's live trace) is called on the event loop right after the call's
outcome is known, so it must not block: it counts, or hands the record to a queue. A watcher that raises is
logged and otherwise ignored; a call never fails because somebody was watching it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from swarmyard.broker.chat import Message, ToolCall

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CallEnd:
    """One model call, from the request read to its outcome.

    ``outcome`` is the hold's: ``settled`` (``cost_micro_usd`` is what the ledger settles, from the usage and
    the route's price), ``released`` (nothing billed), ``unknown`` (the answer was lost after the request left)
    or ``refused`` (never sent: bad request, no budget, no such model). ``error_code`` is the code the worker was
    answered with, ``None`` for a whole answer.
    """

    model: str
    outcome: str
    started_s: float
    ended_s: float
    worker_id: str = ""
    goal_id: str = ""
    task_id: str = ""
    reservation_id: str = ""
    provider: str = ""
    provider_kind: str = ""
    upstream_model: str = ""
    response_model: str = ""
    response_id: str = ""
    finish_reason: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    cost_micro_usd: int = 0
    hold_micro_usd: int = 0
    max_tokens: int = 0
    stream: bool = False
    error_code: str | None = None
    error_message: str = ""
    messages: tuple[Message, ...] = ()
    output_text: str = ""
    output_tool_calls: tuple[ToolCall, ...] = ()

    @property
    def seconds(self) -> float:
        """The call's wall time."""
        return max(0.0, self.ended_s - self.started_s)


CallWatcher = Callable[[CallEnd], None]


def tell(watchers: list[CallWatcher], call: CallEnd) -> None:
    """Hand ``call`` to every watcher; one that raises is logged, the others still hear of it."""
    for watcher in watchers:
        try:
            watcher(call)
        except Exception:
            log.exception("a model-call watcher failed on reservation %s", call.reservation_id or "-")


_KINDS = {"OpenAICompatProvider": "openai_compatible", "AnthropicProvider": "anthropic", "LocalProvider": "local",
          "ScriptedProvider": "scripted", "SimulatedProvider": "simulated"}


def provider_kind(provider: object) -> str:
    """The ``gen_ai.provider.name`` of a provider object: the conventions' well-known value where there is one
    (``openai`` only for OpenAI's own API; ``anthropic``), else ``swarmyard.<kind>`` (``openai_compatible``,
    ``local``, ``scripted``, ``simulated``)."""
    kind = _KINDS.get(type(provider).__name__, type(provider).__name__.lower())
    if kind == "anthropic":
        return "anthropic"
    if kind == "openai_compatible" and getattr(getattr(provider, "_client", None), "_host", "") == "api.openai.com":
        return "openai"
    return f"swarmyard.{kind}"
