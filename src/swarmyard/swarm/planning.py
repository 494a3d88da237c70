"""``plan = N``: the planning task the planner worker claims, and turning its answer into N lenses.

The fallback, when the planner's answer is missing or unusable (a worker that timed out, a model that wrote
prose, fewer lenses than asked): keep every usable lens it gave and fill the rest, in order, from a fixed list
of general lenses that any objective can be looked at through (evidence, risks, alternatives, ...). A fixed
list keeps the run going and is easy to spot in the report: every fallback lens says so in its prompt.
"""

from __future__ import annotations

import logging

from swarmyard.agents.planner import PlannedLens, parse_plan
from swarmyard.domain import PLANNER_GROUP, Goal, Task, TaskSpec
from swarmyard.errors import InvalidInputError
from swarmyard.store.protocol import TasksStore

log = logging.getLogger(__name__)

#: General lenses used when the planner's answer does not give enough usable ones.
FALLBACK_LENSES: tuple[tuple[str, str], ...] = (
    ("evidence", "Gather the strongest facts and figures that bear on the objective, with their sources."),
    ("risks", "List the risks and failure modes that would make the objective fail, most serious first."),
    ("alternatives", "Compare the main alternatives and competitors, and what each does better or worse."),
    ("costs", "Estimate the costs, effort and time involved, and what drives them."),
    ("opportunities", "Find the openings and advantages that make the objective worth pursuing."),
    ("open questions", "Name what is still unknown and how each question could be answered quickly."),
)

_PLAN_PROMPT = (
    "Objective: {objective}\n\nSplit this objective into exactly {count} distinct lenses (angles of work) that "
    "together cover it. Each lens needs a short title and instructions for the worker who takes it."
)


def create_planning_task(store: TasksStore, goal: Goal, count: int) -> Task:
    """The planner's task: a small slice of the budget (one share in ``count + 2``) and two calls (one when the goal
    has only one)."""
    return store.create_task(
        goal.id,
        TaskSpec(
            "plan",
            _PLAN_PROMPT.format(objective=goal.objective, count=count),
            group=PLANNER_GROUP,
            budget_micro_usd=goal.budget_micro_usd // (count + 2),
            call_cap=min(2, goal.call_cap) or 2,  # allocated from a capped goal's calls, the first task made
            priority=20,
        ),
    )


def fallback_lenses(count: int, start: int = 0) -> list[tuple[str, str]]:
    """``count`` lenses from the fixed list, from ``start`` on; past its end, numbered repeats."""
    out = []
    for i in range(start, start + count):
        title, prompt = FALLBACK_LENSES[i % len(FALLBACK_LENSES)]
        if i >= len(FALLBACK_LENSES):
            title = f"{title} {i // len(FALLBACK_LENSES) + 1}"
        out.append((title, f"{prompt} (a fallback lens: the planning call gave no usable lens here)"))
    return out


def lenses_from_plan(body: str | None, count: int) -> list[tuple[str, str]]:
    """Exactly ``count`` (title, prompt) pairs: the planner's usable lenses, then fallback lenses."""
    planned: list[PlannedLens] = []
    if body:
        try:
            planned = parse_plan(body, count)
        except (InvalidInputError, ValueError) as exc:
            log.warning("the plan could not be used (%s); falling back to the fixed lenses", exc)
    taken = {lens.title.lower() for lens in planned}
    spare = [item for item in fallback_lenses(count + len(FALLBACK_LENSES)) if item[0].lower() not in taken]
    if len(planned) < count:
        log.warning("the plan gave %d usable lens(es) of %d; the rest are fallback lenses", len(planned), count)
    return [(lens.title, lens.prompt) for lens in planned] + spare[: count - len(planned)]
