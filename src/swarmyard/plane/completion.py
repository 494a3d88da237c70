"""Completing a task whose finding has landed: the coordinator's step after each agent it ran, and the
operator API's ``POST /v1/operator/tasks/{task_id}/complete`` (``swarmyard task complete``) for a plane that
``swarmyard serve`` runs, where no coordinator does it.

A task is done once a finding of its has landed. It is closed under the claim it has; when that claim's lease
ran out after the finding landed, the completer takes the task back (a claim in its own name) and closes it,
so it is never redone. Both writes go through the store, which logs each as an audit event.
"""

from __future__ import annotations

from enum import StrEnum

from swarmyard.domain import Finding, Task, TaskState
from swarmyard.errors import ConflictError, FencingError, IllegalTransitionError, NoFindingError
from swarmyard.store.protocol import FindingsStore, Store, TasksStore

#: Who an operator's completion (the API's or ``swarmyard task complete --store``'s) takes a task back as: the
#: worker its take-back claim names in the audit log.
OPERATOR = "operator"
#: The result a completed task is closed with.
RESULT = "finding submitted"
#: The lease of a take-back claim: it is closed in the next statement, so any short lease does.
TAKE_BACK_LEASE_S = 60.0
#: Tries of an operator's completion while others claim or close the task between its read and its write.
_TRIES = 5
_PAGE = 10_000


class Completion(StrEnum):
    """What one completion did."""

    COMPLETED = "completed"  # closed under the claim it had
    TAKEN_BACK = "taken_back"  # its lease had run out (or it was given back): claimed back and closed
    ALREADY_DONE = "already_done"  # it was done already: nothing changed
    HELD = "held"  # another worker claimed it in between: nothing changed, that claim goes on


def findings_of(store: FindingsStore, goal_id: str, task_id: str) -> list[Finding]:
    """The findings of one task, in submission order."""
    found: list[Finding] = []
    after: str | None = None
    while True:
        page = store.read_findings(goal_id, after=after, limit=_PAGE)
        found += [f for f in page if f.task_id == task_id]
        if len(page) < _PAGE:
            return found
        after = page[-1].id


def close_found(store: TasksStore, task: Task, by: str) -> Completion:
    """Close ``task``, which has a finding, under the claim it was read with; if that claim is no longer live,
    take the task back as ``by`` and close it. ``HELD`` when another worker claimed it in between."""
    token = task.fencing_token
    try:
        if token is None:
            raise FencingError("no claim", task_id=task.id, presented=0, current=None)
        store.complete(task.id, token, RESULT)
        return Completion.COMPLETED
    except FencingError:
        # the lease ran out after the finding landed: take the task back and close it, never redo it
        claim = store.claim(task.goal_id, by, TAKE_BACK_LEASE_S, task_id=task.id)
        if claim is None:
            return Completion.HELD
        store.complete(task.id, claim.token, RESULT)
        return Completion.TAKEN_BACK


def complete_task(store: Store, task_id: str, by: str) -> tuple[Completion, Task]:
    """Complete a task that has a finding, once: a done task is ``ALREADY_DONE`` and nothing changes.

    Safe to call at once from several places (replicas, retries): one of them closes the task, the others
    answer ``ALREADY_DONE``. Raises ``NotFoundError`` for an unknown task, ``IllegalTransitionError`` for one
    that failed or was cancelled, ``NoFindingError`` for one without a finding, and a retryable
    ``ConflictError`` when others claimed it again each time between its read and its completion.
    """
    for _ in range(_TRIES):
        task = store.get_task(task_id)
        if task.state is TaskState.DONE:
            return Completion.ALREADY_DONE, task
        if task.state not in (TaskState.CLAIMED, TaskState.PENDING):
            raise IllegalTransitionError("task", task_id, task.state.value, TaskState.DONE.value)
        if not findings_of(store, task.goal_id, task_id):
            raise NoFindingError(task_id)
        try:
            outcome = close_found(store, task, by)
        except FencingError:
            # another completion (another replica's, say) closed it under our take-back claim first: look again
            continue
        if outcome is not Completion.HELD:
            return outcome, store.get_task(task_id)
    raise ConflictError(f"task {task_id} was claimed again by a worker each time it was to be completed; "
                        f"try again", retryable=True, task_id=task_id)
