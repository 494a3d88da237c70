"""The agent's side of its trajectory: each step reported to the control plane, which keeps it.

A report that fails (a plane without a trajectory folder, a dropped connection) is logged once and never
stops the agent: the trajectory is a record of the work, not part of it.
"""

from __future__ import annotations

import json
import logging
import resource
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from swarmyard.agents.model import ModelReply
from swarmyard.plane.lean_client import http_errors
from swarmyard.plane.step_text import MAX_TEXT_CHARS, cut

if TYPE_CHECKING:
    from swarmyard.plane.lean_client import HttpClient

log = logging.getLogger(__name__)

PATH = "/v1/trajectory/steps"


def now_ms() -> int:
    """Wall-clock milliseconds (what a step's times are in)."""
    return int(time.time() * 1000)


@dataclass(slots=True)
class StepDraft:
    """What one step gathered so far: its model replies, then its action and the tool's result."""

    step: int
    started_ms: int = field(default_factory=now_ms)
    replies: list[dict[str, Any]] = field(default_factory=list)

    def reply(self, reply: ModelReply, duration_ms: int, malformed: str | None = None) -> None:
        """Add one model reply (``malformed`` says why it could not be used)."""
        self.replies.append({
            "text": cut(reply.text),
            "tool_calls": [{"name": cut(name, 200), "arguments": cut(args)} for name, args in reply.tool_calls[:8]],
            "input_tokens": reply.input_tokens, "output_tokens": reply.output_tokens,
            "duration_ms": max(0, duration_ms),
            **({"malformed": cut(malformed, 1000)} if malformed else {}),
        })


class TrajectoryReporter:
    """Posts finished steps to ``/v1/trajectory/steps`` with the worker's token."""

    def __init__(self, client: HttpClient, role: str) -> None:
        self._client = client
        self._role = role
        self._warned = False

    async def report(self, draft: StepDraft, *, task_id: str | None, fencing_token: int | None,
                     action: tuple[str, dict[str, Any]] | None, result: Any = None, note: str | None = None) -> None:
        """Send one step; a failure is logged once and otherwise ignored."""
        body: dict[str, Any] = {"step": draft.step, "role": self._role, "task_id": task_id,
                                "fencing_token": fencing_token,
                                "started_ms": draft.started_ms, "ended_ms": max(draft.started_ms, now_ms()),
                                "replies": draft.replies[-16:]}
        if action is not None:
            args = action[1]
            if len(json.dumps(args, ensure_ascii=False, default=str)) > MAX_TEXT_CHARS:
                args = {"_cut": cut(json.dumps(args, ensure_ascii=False, default=str))}
            body["action"] = {"tool": cut(action[0], 200), "args": args}
        if result is not None:
            text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)
            body["result"] = cut(text)
        if note:
            body["note"] = cut(note, 1000)
        me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        body["cpu_ms"] = int((me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime) * 1000)
        body["max_rss_kb"] = int(max(me.ru_maxrss, children.ru_maxrss))
        try:
            response = await self._client.post(PATH, json=body)
        except http_errors() as exc:
            self._not_kept(draft.step, exc)
            return
        if response.status_code >= 400:
            self._not_kept(draft.step, response.text[:200])

    def _not_kept(self, step: int, why: object) -> None:
        if not self._warned:
            log.info("the plane did not keep step %d of the trajectory: %s", step, why)
            self._warned = True
