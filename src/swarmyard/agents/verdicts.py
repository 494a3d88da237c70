"""A digest lead's answer to a yes/no objective, derived from the findings rather than written by the model.

A 0.5B lead asked for its decision in its own words often got the polarity wrong (the demo's lead answered "We
should not keep a small team's paid API key ... safe" when every scout's finding said the key stays out of the
agents' reach). So the decision is not the model's to write: for each finding the model gives a verdict on the
objective's question, chosen from :data:`VERDICTS` by constrained decoding (the answer's schema is an enum, so it
cannot be anything else), the answer's opening sentence is composed from the tally of those verdicts
(:func:`answer_sentence`) and names the findings it rests on, and the model may only add a reason, which is
refused when it says the opposite of the tally (:func:`contradicts`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from swarmyard.agents.actions import FINISH, ToolSpec

YES, NO, UNCLEAR = "yes", "no", "unclear"
#: What a finding may say to the objective's question.
VERDICTS = (YES, NO, UNCLEAR)
#: The overall answers: the three verdicts and ``mixed`` (some findings say yes, some no).
MIXED = "mixed"


def spec() -> ToolSpec:
    """``submit_finding`` whose only argument is the verdict, one of :data:`VERDICTS` (an enum: constrained
    decoding makes any other answer impossible on a model that follows the schema)."""
    return ToolSpec(
        FINISH,
        'Give your verdict on the question, as far as this finding answers it: "yes", "no" or "unclear".',
        {"type": "object", "properties": {"verdict": {"type": "string", "enum": list(VERDICTS)}},
         "required": ["verdict"], "additionalProperties": False},
    )


def read(text: str, tool_calls: Sequence[tuple[str, str]]) -> str | None:
    """The verdict in a reply (a tool call's ``verdict`` argument, or the same as JSON text, or a reply that is
    only the word); ``None`` when the reply holds none of :data:`VERDICTS`."""
    candidates: list[Any] = [arguments for _, arguments in tool_calls[:1]] + [text]
    for raw in candidates:
        try:
            data = json.loads(raw) if isinstance(raw, str) and raw.strip().startswith("{") else raw
        except (ValueError, RecursionError):
            continue
        if isinstance(data, dict):
            action = data.get("action")
            if isinstance(action, dict) and isinstance(action.get("args"), dict):
                data = action["args"]
            value = data.get("verdict")
            if isinstance(value, str) and value.strip().lower() in VERDICTS:
                return value.strip().lower()
    word = text.strip().strip(".!\"'").lower()
    return word if word in VERDICTS else None


@dataclass(frozen=True, slots=True)
class Tally:
    """Which findings said what, in the order they were read: ``(finding id, verdict)`` each."""

    verdicts: tuple[tuple[str, str], ...]

    def refs(self, verdict: str) -> list[str]:
        """The findings that gave ``verdict``."""
        return [ref for ref, said in self.verdicts if said == verdict]

    @property
    def overall(self) -> str:
        """``mixed`` when some findings say yes and some no; else ``yes`` (or ``no``) when more findings say it
        than are unclear; else ``unclear`` (one finding of three saying yes, two unclear, is not a yes)."""
        yes, no, unclear = len(self.refs(YES)), len(self.refs(NO)), len(self.refs(UNCLEAR))
        if yes and no:
            return MIXED
        if yes > unclear:
            return YES
        if no > unclear:
            return NO
        return UNCLEAR

    @property
    def rests_on(self) -> list[str]:
        """The findings the answer rests on: those that said it (every finding for mixed or unclear)."""
        overall = self.overall
        return self.refs(overall) if overall in (YES, NO) else [ref for ref, _ in self.verdicts]


def _ids(refs: Sequence[str]) -> str:
    return " ".join(f"[{ref}]" for ref in refs)


def _count(refs: Sequence[str], total: int, verdict: str) -> str:
    who = ("the one finding" if total == 1 else f"all {total} findings" if len(refs) == total
           else f"{len(refs)} of {total} findings")
    one = len(refs) == 1
    said = (("is" if one else "are") + " unclear") if verdict == UNCLEAR else ("says " if one else "say ") + verdict
    return f"{who} {said} {_ids(refs)}"


def answer_sentence(tally: Tally) -> str:
    """The answer's opening sentence, from the tally alone: the decision word, then which findings said what,
    each named by its id (so the sentence rests on findings the plane can check)."""
    total = len(tally.verdicts)
    yes, no, unclear = tally.refs(YES), tally.refs(NO), tally.refs(UNCLEAR)
    overall = tally.overall
    parts = [_count(refs, total, verdict) for refs, verdict in ((yes, YES), (no, NO), (unclear, UNCLEAR)) if refs]
    opening = {YES: "Yes", NO: "No", MIXED: "Mixed", UNCLEAR: "Unclear"}[overall]
    return f"{opening}: {'; '.join(parts)}."


_NEGATIVE_START = re.compile(r"^\W*(?:no\b|not\b|never\b|nope\b|we (?:should|must|can) ?not\b|we (?:shouldn't|"
                             r"mustn't|can't|cannot)\b|(?:do|does|are|is) not\b|(?:don't|doesn't|aren't|isn't)\b|"
                             r"no-go\b|unsafe\b)", re.IGNORECASE)
_POSITIVE_START = re.compile(r"^\W*(?:yes\b|go\b(?!-)|we (?:should|must|can)\b(?! ?not)|(?:it|they) (?:is|are) "
                             r"(?:kept )?safe\b)", re.IGNORECASE)
_NEGATIVE_ANYWHERE = re.compile(r"\b(?:no-go|we should not|we shouldn't|the answer is no)\b", re.IGNORECASE)
_POSITIVE_ANYWHERE = re.compile(r"\bthe answer is yes\b", re.IGNORECASE)


def polarity(text: str) -> str | None:
    """``yes`` or ``no`` where the text opens with (or plainly states) a decision, else ``None``."""
    negative = bool(_NEGATIVE_START.match(text) or _NEGATIVE_ANYWHERE.search(text))
    positive = bool(_POSITIVE_START.match(text) or _POSITIVE_ANYWHERE.search(text))
    if negative == positive:
        return None
    return NO if negative else YES


def contradicts(text: str, overall: str) -> bool:
    """Whether a reason the model wrote states a decision other than the tally's: a ``yes`` against a ``no``
    and the other way round, and either one where the findings are mixed or unclear."""
    said = polarity(text)
    if said is None:
        return False
    return said != overall


#: A point of the synthesis as :func:`point_line` writes it: ``- Verdict: the lead's sentence [fnd_...]``.
_POINT = re.compile(r"^- (Yes|No|Unclear): .*\[(fnd_[0-9a-z]+)\]$", re.MULTILINE)


def point_line(ref: str, verdict: str, point: str) -> str:
    """One point of the synthesis: the finding's verdict, the lead's sentence on it, the finding's id."""
    return f"- {verdict.capitalize()}: {point} [{ref}]"


def check(body: str) -> str | None:
    """Why a digest synthesis's opening sentence is not the one its points' verdicts make (``None`` when it
    is): the check a reader (or a test) can run on the synthesis as the store holds it, with nothing else."""
    found = tuple((ref, verdict.lower()) for verdict, ref in _POINT.findall(body))
    if not found:
        return "the synthesis lists no point with its verdict"
    expected = answer_sentence(Tally(found))
    if not body.startswith(expected):
        return f"its answer should open with {expected!r}, from its points' verdicts"
    return None
