"""The planner: one model call that splits a run's objective into N lenses (``plan = N`` in a swarm file).

It runs like any worker, in its own machine and through the broker, on a planning task the coordinator made
for it (its own envelope, a call cap of two). The answer is schema-constrained: the model is offered a single
tool, ``submit_plan``, whose ``lenses`` array has exactly N items; the local provider turns that into a JSON
schema the decoder must follow. The planner submits the lenses it could read as a finding (JSON body); the
coordinator reads that finding back and fills whatever is missing or unusable from a fixed list of lenses
(``swarmyard.swarm.planning``), so a bad answer never stops a run.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from swarmyard.agents.actions import ToolSpec, _first_json_object
from swarmyard.agents.model import ChatModel, ModelReply
from swarmyard.agents.tools import PlaneTools
from swarmyard.errors import BudgetError, FencingError, InvalidInputError, ProviderError

log = logging.getLogger(__name__)

PLAN_TOOL = "submit_plan"
#: Longest lens title and prompt kept from a model's answer.
MAX_TITLE = 120
MAX_PROMPT = 1000


@dataclass(frozen=True, slots=True)
class PlannedLens:
    """One lens the planner proposed."""

    title: str
    prompt: str


def plan_tool(count: int) -> ToolSpec:
    """The one tool the planner's model may call: exactly ``count`` lenses, each a title and a prompt."""
    lens = {
        "type": "object",
        "properties": {"title": {"type": "string"}, "prompt": {"type": "string"}},
        "required": ["title", "prompt"],
        "additionalProperties": False,
    }
    return ToolSpec(
        PLAN_TOOL,
        f"Submit the plan: exactly {count} distinct lenses on the objective, each with a short title and "
        "instructions for the worker who takes it.",
        {
            "type": "object",
            "properties": {"lenses": {"type": "array", "items": lens, "minItems": count, "maxItems": count}},
            "required": ["lenses"],
            "additionalProperties": False,
        },
    )


def parse_plan(value: Any, count: int) -> list[PlannedLens]:
    """The usable lenses in a plan (a dict with ``lenses``, a bare list, or JSON text), at most ``count``.

    Items without a title, duplicates (by title, case-insensitive) and non-objects are dropped; an item with a
    title but no prompt gets its title as prompt. Raises ``InvalidInputError`` when nothing usable is left.
    """
    if isinstance(value, str):
        text = value.strip()
        try:
            value = json.loads(text) if text.startswith("[") else _first_json_object(text)
        except json.JSONDecodeError as exc:
            raise InvalidInputError(f"the plan is not JSON: {exc.msg}", field="lenses") from exc
        except RecursionError:  # nested past the parser's stack
            raise InvalidInputError("the plan is nested too deeply", field="lenses") from None
    items = value.get("lenses") if isinstance(value, dict) else value
    if not isinstance(items, list):
        raise InvalidInputError("the plan has no lenses list", field="lenses")
    seen: set[str] = set()
    out: list[PlannedLens] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        title = " ".join(str(item.get("title") or "").split())[:MAX_TITLE]
        if not title or title.lower() in seen:
            continue
        seen.add(title.lower())
        prompt = str(item.get("prompt") or "").strip()[:MAX_PROMPT] or title
        out.append(PlannedLens(title, prompt))
    if not out:
        raise InvalidInputError("the plan has no usable lens", field="lenses")
    return out[:count]


def _read(reply: ModelReply, count: int) -> list[PlannedLens]:
    for name, arguments in reply.tool_calls:
        if name == PLAN_TOOL:
            try:
                return parse_plan(json.loads(arguments or "{}"), count)
            except json.JSONDecodeError as exc:
                raise InvalidInputError(f"arguments are not JSON: {exc.msg}", field="lenses") from exc
            except RecursionError:  # nested past the parser's stack
                raise InvalidInputError("arguments are nested too deeply", field="lenses") from None
    return parse_plan(reply.text, count)


_SYSTEM = (
    "You plan the work of a swarm of researchers. Split the objective into exactly {count} distinct lenses "
    "that together cover it without overlap. Answer by calling submit_plan."
)


class PlannerAgent:
    """Claims the planning task, asks for the plan once (one re-ask on an unusable answer), submits it."""

    def __init__(self, model: ChatModel, plane: PlaneTools, *, count: int, task_id: str | None) -> None:
        self._model = model
        self._plane = plane
        self._count = count
        self._task_id = task_id

    async def run(self) -> dict[str, Any]:
        """The outcome line the launcher reads: ending, task id, finding id, model calls as steps."""
        task = await self._plane.claim(self._task_id)
        if task is None:
            return {"ending": "no_task", "task_id": None, "finding_id": None, "steps": 0, "malformed": 0}
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": _SYSTEM.format(count=self._count)},
            {"role": "user", "content": task.prompt},
        ]
        lenses: list[PlannedLens] = []
        steps = malformed = 0
        ending = "submitted"
        try:
            for _ in range(2):
                steps += 1
                reply = await self._model.reply(messages)
                try:
                    lenses = _read(reply, self._count)
                except (InvalidInputError, ValueError) as exc:
                    malformed += 1
                    messages = [*messages, {"role": "assistant", "content": reply.text or "(no plan)"},
                                {"role": "user", "content": f"That plan could not be used ({exc}). "
                                 f"Call submit_plan with exactly {self._count} lenses."}]
                    continue
                if len(lenses) == self._count:
                    break
        except (BudgetError, ProviderError) as exc:
            # the coordinator falls back to its fixed lenses for whatever is missing
            log.info("planning stopped: %s", exc.message)
            ending = "budget" if isinstance(exc, BudgetError) else "error"
        except FencingError:
            return {"ending": "lost_claim", "task_id": task.task_id, "finding_id": None, "steps": steps,
                    "malformed": malformed}
        body = json.dumps({"lenses": [{"title": lens.title, "prompt": lens.prompt} for lens in lenses]})
        finding = (await self._plane.submit_finding("plan", body)).finding
        return {"ending": ending, "task_id": task.task_id, "finding_id": finding.id, "steps": steps,
                "malformed": malformed}
