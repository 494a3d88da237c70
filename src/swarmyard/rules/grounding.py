"""What a synthesis must hold in a grounded run: every claim names the findings it rests on, each a real one.

A scout's finding cites lines of its files and the plane checks each quote (``swarmyard.plane.sources``); the
lead's synthesis is checked the same way one level up. Its claims are its paragraphs and list items; each must
name, as ``[fnd_...]``, at least one finding that reached a result (not a task's no-result placeholder, not a
made-up id). A heading that introduces a list (``From the findings:``), a remark wholly in parentheses and the
note on the tasks that reached nothing (:func:`nothing_found`, checked against the store on its own) are not
claims. The built-in lead (``synthesis = "digest"``) writes its answer and each point with their ids; the plane
refuses, with the reason, a synthesis that does not, as it refuses a quote its file does not hold.

The note is made from the store alone (each task's placeholder says which limit ran out, or the task's failure
reason), so the lead's prompt, its synthesis and the plane's check all hold the same words.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from swarmyard.rules import no_result

if TYPE_CHECKING:  # types only: the agent in every machine imports this module, and the domain's classes cost it
    from swarmyard.domain import Finding, Task

#: A finding's id as a synthesis names it.
FINDING_ID = re.compile(r"\bfnd_[0-9a-z]{6,40}\b")
#: The opening of the note on tasks that reached no result (``N of M tasks reached no result``), as
#: :func:`nothing_found` writes it: the lead's prompt quotes a finding's line that would read as one.
NOTE = re.compile(r"\d+ of \d+ tasks? reached no result\b")
_ITEM = re.compile(r"^\s*(?:[-*+\u2022]|\(?\d+[.)])\s+")


def nothing_found(outcomes: Sequence[tuple[str, str | None]]) -> str:
    """The note on the tasks that reached no result, from ``(title, why)`` of every worker task (``why`` is
    ``None`` for a task that reached a result); ``""`` when every task did."""
    missing = [(title, why) for title, why in outcomes if why is not None]
    if not missing:
        return ""
    listed = "; ".join(f"{title!r}: {why}" for title, why in missing)
    return (f"{len(missing)} of {len(outcomes)} tasks reached no result, so nothing of theirs is in this "
            f"synthesis: {listed}.")


def outcomes(tasks: Iterable[Task], findings: Iterable[Finding],
             side_groups: Collection[str]) -> list[tuple[str, str | None]]:
    """``(title, why)`` of every worker task (those outside ``side_groups``: the lead's, the planner's), in the
    store's order: ``why`` is ``None`` for a task that reached a result, else :func:`why_no_result`."""
    bodies: dict[str, list[str]] = {}
    for finding in findings:
        bodies.setdefault(finding.task_id, []).append(finding.body)
    return [(t.title, why_no_result(t.state.value, t.result, bodies.get(t.id, ())))
            for t in tasks if t.group not in side_groups]


def note_in(text: str) -> str | None:
    """The note on tasks that reached no result, where ``text`` (a lead's prompt, a synthesis) holds one."""
    for block in _blocks(text):
        if NOTE.match(block):
            return block
    return None


def without_note(text: str) -> str:
    """``text`` less its note on tasks that reached no result (the store's words, not the writer's)."""
    note = note_in(text)
    return text if note is None else "\n\n".join(b for b in _blocks(text) if b != note)


def why_no_result(state: str, result: str | None, bodies: Iterable[str]) -> str | None:
    """Why a worker task reached no result, or ``None`` when one of its findings (``bodies``) is a result, or it
    ended done with none (its result is elsewhere: an artifact it submitted): the limit its placeholder names,
    else its failure reason, else its state (a task never finished)."""
    bodies = list(bodies)
    if any(not no_result.is_placeholder(body) for body in bodies):
        return None
    if state == "done" and not bodies:
        return None
    for body in reversed(bodies):
        if (why := no_result.reason(body)) is not None:
            return why
    if state == "failed":
        return f"it failed: {' '.join((result or 'no reason was given').split())[:300]}"
    return f"it ended {state} without a finding"


def problem(body: str, cited: Iterable[str], real: Mapping[str, str], placeholders: Iterable[str],
            note: str | None) -> tuple[str, str] | None:
    """``(ref, why)`` for the first thing in a synthesis no finding bears out, or ``None``.

    ``cited``: the finding ids its citations name; ``real``: the ids of the findings that reached a result (to
    their titles); ``placeholders``: the ids of no-result findings; ``note``: what :func:`nothing_found` says from
    the store (``""``: every task reached a result), or ``None`` where claims need not name findings (a run that
    is not grounded: only the ids it names are checked)."""
    empty = set(placeholders)
    for ref in [*cited, *FINDING_ID.findall(body)]:
        if ref in empty:
            return ref, f"{ref} is a task's no-result placeholder: it found nothing, so nothing can rest on it"
        if ref not in real:
            return ref, f"{ref} is not a finding of this goal (the findings: {_listed(real)})"
    if note is None:
        return None
    said = note_in(body)
    if note and said is None:
        return "(none)", f"the synthesis does not say which tasks reached no result; add this line as it is: {note}"
    if said is not None and said != note:
        truth = note or "every task reached a result"
        return "(none)", f"the line on tasks that reached no result does not match the store: {truth}"
    for claim in claims(body):
        if not FINDING_ID.search(claim):
            return "(none)", (f"the claim {_cut(claim)!r} names no finding: end it with the id of the finding it "
                              f"rests on in brackets, one of {_listed(real)}")
    return None


def claims(body: str) -> list[str]:
    """The claims of a synthesis: its paragraphs and list items, less headings, remarks and the note."""
    out: list[str] = []
    for block in _blocks(body):
        if NOTE.match(block):
            continue
        units: list[str] = []
        for line in block.splitlines():
            if _ITEM.match(line) or not units:
                units.append(line.strip())
            else:
                units[-1] += " " + line.strip()
        for i, unit in enumerate(units):
            text = _ITEM.sub("", unit).strip()
            heading = text.endswith(":") and i + 1 < len(units)
            remark = text.startswith("(") and text.endswith(")")
            if text and not heading and not remark:
                out.append(text)
    return out


def _blocks(text: str) -> list[str]:
    return [b.strip() for b in re.split(r"\n\s*\n", text.strip()) if b.strip()]


def _listed(real: Mapping[str, str]) -> str:
    return ", ".join(f"[{ref}]" for ref in list(real)[:10]) or "none"


def _cut(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
