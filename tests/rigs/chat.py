"""A scripted chat model for the built-in agent (what ``swarmyard.agents.model.ChatModel`` asks of a model), and an
evaluator stand-in that scores from a table: the model and the evaluator of agent tests on a live plane."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from swarmyard.agents.model import ModelReply


class ScriptedChat:
    """Replies from a list, in turn: a string is a reply's text, an exception is raised. Once they are used up,
    ``then`` (a reply's text), or with none an ``IndexError`` (the test's script was too short). What each call was
    given is kept: its messages as they were then, its ``only`` and its ``specs``."""

    def __init__(self, replies: Sequence[str | ModelReply | BaseException], *, then: str | None = None) -> None:
        self.replies = list(replies)
        self.then = then
        self.seen: list[list[dict[str, Any]]] = []
        self.only: list[frozenset[str] | None] = []
        self.specs: list[dict[str, Any] | None] = []

    async def reply(self, messages: list[dict[str, Any]], *, only: frozenset[str] | None = None,
                    specs: dict[str, Any] | None = None) -> ModelReply:
        """The next scripted reply."""
        self.seen.append([dict(m) for m in messages])
        self.only.append(only)
        self.specs.append(specs)
        item = self.replies.pop(0) if self.replies or self.then is None else self.then
        if isinstance(item, BaseException):
            raise item
        return item if isinstance(item, ModelReply) else ModelReply(item)


class TableScorer:
    """An evaluator stand-in (the real one is its own process with hidden data): scores an artifact by its text."""

    def __init__(self, scores: dict[str, int]) -> None:
        self.scores = scores

    async def score(self, goal: str, data: bytes, split: str) -> dict[str, Any]:
        """A score of the artifact's text, as the evaluator's answer has it."""
        return {"goal": goal, "split": split, "score": self.scores[data.decode()], "signature": "sig"}
