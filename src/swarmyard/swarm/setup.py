"""Step 1 of a run: the goal and its tasks, laid out in the store by the policy."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection

from swarmyard.agents.builtin import findings_block
from swarmyard.clock import Clock
from swarmyard.config import PolicyKind, SwarmConfig
from swarmyard.domain import LEAD_GROUP as LEAD_GROUP  # where the lead's group was first defined
from swarmyard.domain import CitationKind, Finding, Goal, GoalSpec, Task, TaskSpec
from swarmyard.rules import grounding, instructions
from swarmyard.rules.policies import Explore, Policy, group_prompt
from swarmyard.store.protocol import Store, TasksStore


def create_goal(store: Store, config: SwarmConfig, clock: Clock) -> Goal:
    """The run's goal with its budget, call cap, deadline and depth."""
    g = config.goal
    spec = GoalSpec(
        g.objective,
        g.budget_micro_usd,
        g.call_cap,
        deadline=clock.now() + g.deadline_s,
        max_depth=g.max_depth,
        policy=config.policy.kind.value,
        # the bundle that scores this goal: a resume must name the same one (the holdout is this goal's once)
        evaluator=str(config.evaluator.bundle_path) if config.evaluator else None,
        quotas=g.quotas,
    )
    goal = store.create_goal(spec)
    p = config.policy
    if p.kind is PolicyKind.EXPLORE:
        # the plane moves workers between directions by these settings, from the store, for every agent alike
        store.offer_directions(goal.id, Explore().group, p.directions, patience=p.patience,
                               adopt_margin=p.adopt_margin)
    return goal


def lenses(config: SwarmConfig, planned: list[tuple[str, str]] | None = None) -> list[tuple[str, str]]:
    """(title, prompt) of every top-level task: from the file, or from a planning call's answer."""
    if config.tasks.lenses:
        return [(lens.title, lens.prompt or lens.title) for lens in config.tasks.lenses]
    return list(planned or [])


def create_round_tasks(
    store: TasksStore,
    goal: Goal,
    config: SwarmConfig,
    policy: Policy,
    round_index: int,
    planned: list[tuple[str, str]] | None = None,
    *,
    made: Collection[tuple[str, str]] = (),
) -> list[Task]:
    """One round's tasks, each copied into the groups the policy names; budgets split evenly. ``made`` holds the
    (title, group) of tasks already in the store (a setup cut short by a store failure, resumed): those are not
    made again, and the rest get the budgets they would have had."""
    items = lenses(config, planned)
    layout = [
        (title, prompt, group, copy, copies)
        for i, (title, prompt) in enumerate(items)
        for group, copies in Counter(policy.task_groups(i, config.workers.count, len(items))).items()
        for copy in range(1, copies + 1)
    ]
    # hold back a share for the lead and for later rounds, so the synthesis is never starved
    shares = len(layout) * (policy.rounds - round_index) + 1
    budget = goal.budget_micro_usd // (shares * policy.rounds) if shares else 0
    # each task's calls are allocated to it from the goal's (a claim escrows them with its slice): a share each,
    # while the unallocated calls last; a task given none (a cap smaller than the tasks) takes each call from
    # the goal's unallocated ones, first come, first served
    share = goal.call_cap // ((len(layout) + 1) * policy.rounds)
    free = unallocated_calls(store, goal)
    made_now = []
    for title, prompt, group, copy, copies in layout:
        if (f"{title}{_suffix(policy.rounds, round_index, copy, copies)}", group) in made:
            continue
        calls = min(share, free)
        free -= calls
        made_now.append(store.create_task(
            goal.id,
            TaskSpec(
                f"{title}{_suffix(policy.rounds, round_index, copy, copies)}",
                "\n\n".join(part for part in (f"Objective: {goal.objective}", prompt,
                                                 _formulation(group_prompt(policy, group))) if part),
                group=group,
                budget_micro_usd=budget,
                call_cap=calls,
            ),
        ))
    return made_now


def unallocated_calls(store: TasksStore, goal: Goal) -> int:
    """The goal's calls not allocated to a task: its cap less its tasks' own caps (an ended task's is the calls it
    made) and the calls made by its tasks with no cap of their own; 0 when the goal has no cap."""
    if not goal.call_cap:
        return 0
    taken = sum(t.envelope.call_cap or t.envelope.calls for t in store.list_tasks(goal.id))
    return max(0, goal.call_cap - taken)


def _suffix(rounds: int, round_index: int, copy: int, copies: int) -> str:
    """`` (round 2)``, and for one of several copies of a task in a group `` (round 2, attempt 1 of 2)``: a
    task's title still starts with its lens's and `` (round ``, as a lens's files are found by."""
    if copies > 1:
        return f" (round {round_index + 1}, attempt {copy} of {copies})"
    return f" (round {round_index + 1})" if rounds > 1 else ""


def _formulation(text: str) -> str:
    return f"Your group's formulation: {text}" if text.strip() else ""


def lead_prompt(goal: Goal, prompt: str, findings: list[Finding], note: str = "") -> str:
    """The lead's task: the objective, every finding with its id, the note on the tasks that reached no result
    (``grounding.nothing_found``: their placeholders are not findings to read), then its instructions (a small
    model copies what it read last, so the instructions end the prompt, with the shape of the answer)."""
    # a title is one line of the finding's heading: a worker's line breaks in it would start lines of the prompt
    block = findings_block([(f.id, f"{' '.join(f.title.split())} (by {f.author}, group {f.group})", _with_sources(f))
                            for f in findings])
    return "\n\n".join([p for p in (
        f"Objective: {goal.objective}",
        note,  # before the findings: what follows a finding's heading is read as its body
        "Findings:\n" + block if block else "No finding was submitted.",
        f"{instructions.LEAD_INSTRUCTIONS_HEAD}\n{prompt}",
        "Write the synthesis in your own words: your answer to the objective first, then the reasons, each "
        "with the id of the finding it rests on in brackets.",
    ) if p])


#: A line of a finding's body that would read as the lead prompt's own: a verified source line, a finding's
#: heading, the head of the lead's instructions, the note on tasks that reached no result.
_PROMPT_LINE = re.compile(r"\s*(?:Cited line |\[fnd_|" + re.escape(instructions.LEAD_INSTRUCTIONS_HEAD)
                          + "|" + grounding.NOTE.pattern + ")")


def _with_sources(finding: Finding) -> str:
    """The source lines a finding cites as the plane verified them, then its body: the lead reads the evidence,
    not only a scout's sentence about it. The verified lines come first, so that a body cut to the finding's share
    of the prompt keeps them; a body line that would read as the prompt's own (a worker writes its body) is shown
    quoted (``> ``), so that no finding forges a verified line, another finding, the end of the findings or the
    note on tasks that reached no result."""
    quoted = [f"{c.ref}: {' '.join(c.quote.split())}" for c in finding.citations
              if c.kind is CitationKind.SOURCE and c.quote]
    # every line break a reader may break at (CR, VT, FF, NEL, U+2028, ...: what str.splitlines breaks at), not
    # only LF: a forged line after a CR starts a line of the prompt as surely as one after an LF
    body = "\n".join(f"> {line}" if _PROMPT_LINE.match(line) else line for line in finding.body.splitlines())
    return "\n".join([*(f"Cited line {line}" for line in quoted), body])


def create_lead_task(store: TasksStore, goal: Goal, config: SwarmConfig, findings: list[Finding], note: str = "") -> Task:
    """The synthesis task, with what is left of the budget: ``findings`` are those it reads, ``note`` says
    which tasks reached no result and why."""
    # what ended tasks did not spend (or call) was handed back, so it is the lead's too
    unallocated = goal.budget_micro_usd - sum(t.envelope.limit for t in store.list_tasks(goal.id))
    calls = unallocated_calls(store, goal)
    return store.create_task(
        goal.id,
        TaskSpec(
            "synthesis",
            lead_prompt(goal, config.lead.prompt, findings, note),
            group=LEAD_GROUP,
            budget_micro_usd=max(0, unallocated),
            call_cap=calls,
            priority=10,
        ),
    )
