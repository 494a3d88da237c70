"""Findings and a synthesis a small model chooses but does not write (``finding = "quoted"``, ``synthesis =
"quoted"``).

A 0.5B scout asked for a sentence of its own around a true line invented facts ("The budget for the API key has
been exceeded." from the line saying such calls are refused), and a lead asked for a point per finding added more
("The team may need to adjust their budget"). Here the model only chooses: a scout its verdict on its task's
question (:data:`CHOICES`, an enum) and the lines it rests on (an enum of the lines its searches
returned), and swarmyard writes the finding, ``Yes: "the line" (path:line)``, each quote from a citation the
plane checks before it stores the finding. The lead makes no model call: its synthesis is the tally of the
findings' own first words (:func:`verdicts.answer_sentence`), then each finding's verdict and the lines the plane
checked for it, with its id.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from swarmyard.agents import verdicts
from swarmyard.agents.actions import FINISH, ToolSpec
from swarmyard.errors import InvalidInputError
from swarmyard.rules import quotes

#: The verdicts a model is offered: yes or no. Offered "unclear" too, the 0.5B model chose it for all three scouts
#: in two runs of the demo, each on a line that answers its question outright. (A reply of "unclear" from a model
#: that ignores the schema is still read; a finding whose first word is none of these counts as unclear.)
CHOICES = (verdicts.YES, verdicts.NO)
_VERDICT = {"type": "string", "enum": list(CHOICES)}
_DESCRIPTION = ("Submit your finding and finish: in cite, the line or lines your answer rests on, as your search "
                "returned them; as the verdict, your answer to your task's question from those lines: yes or no. "
                "The finding is written from them; you write no sentence.")
#: ``submit_finding`` as a reply is read (the lines it may cite are narrowed per call by :func:`spec`).
FINISH_SPEC = ToolSpec(FINISH, _DESCRIPTION, {
    "type": "object", "properties": {"cite": {"type": "array", "items": {"type": "string"}}, "verdict": _VERDICT},
    "required": ["verdict"], "additionalProperties": False})
#: The heading of the synthesis's list of findings.
HEADING = 'Asked "{objective}", the findings answer with the lines they cite:'
#: A finding's point when the lead's prompt shows no line it cites.
NO_LINE = "(it cites no line)"
_CITED = re.compile(r"^Cited line (?P<ref>\S+:[0-9]{1,9}): (?P<quote>.*)$", re.MULTILINE)
_FIRST_WORD = re.compile(r"\s*([^\W\d_]+)")


def spec(lines: Sequence[str]) -> ToolSpec:
    """:data:`FINISH_SPEC` whose ``cite`` may only hold ``lines`` (``path:line: text``, as a search returned
    them), one to three of them, then the verdict, both required: constrained decoding makes the model choose.
    (Offered the lines' ``path:line`` alone, shorter to write, the 0.5B model answered "no" for three lines that
    each say yes; writing the line out before its verdict, it answered two of three right.)"""
    cite: dict[str, Any] = {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3}
    if lines:
        cite["items"] = {"type": "string", "enum": list(dict.fromkeys(lines))}
    return ToolSpec(FINISH, _DESCRIPTION, {"type": "object", "properties": {"cite": cite, "verdict": _VERDICT},
                                           "required": ["cite", "verdict"], "additionalProperties": False})


def with_quoted(tools: dict[str, ToolSpec]) -> dict[str, ToolSpec]:
    """``tools`` with ``submit_finding`` taking a verdict and lines, no words."""
    return {name: FINISH_SPEC if name == FINISH else spec_ for name, spec_ in tools.items()}


def finding(args: dict[str, Any], cited: Sequence[tuple[str, str]]) -> str:
    """The finding's body from the model's verdict and the ``(path:line, quote)`` it cited:
    ``Yes: "quote" (path:line); ...``. ``InvalidInputError`` (the model is asked again) without a verdict or a
    line."""
    verdict = str(args.get("verdict") or "").strip().lower()
    if verdict not in verdicts.VERDICTS:
        raise InvalidInputError(f"verdict must be one of {', '.join(verdicts.VERDICTS)}", field="verdict")
    if not cited:
        raise InvalidInputError("cite the line your verdict rests on, as your search returned it", field="cite")
    return f"{verdict.capitalize()}: " + "; ".join(quotes.span(ref, quote) for ref, quote in cited)


def verdict_of(body: str) -> str:
    """The verdict a finding opens with (its first word: yes, no or unclear, in any case); ``unclear`` when its
    first word is none of them."""
    first = _FIRST_WORD.match(body)
    word = first[1].lower() if first else ""
    return word if word in verdicts.VERDICTS else verdicts.UNCLEAR


def synthesis(objective: str, shown: Sequence[tuple[str, str, str]]) -> str:
    """The synthesis of the findings a lead's prompt shows (``(id, heading, text)``: the body, then the lines the
    plane checked, ``Cited line path:line: quote``): the tally of their first words, then each one's verdict, the
    lines it cites and its id. Nothing in it is a model's."""
    read = [(ref, verdict_of(text), [(m["ref"], m["quote"].removesuffix(" [...]")) for m in _CITED.finditer(text)])
            for ref, _, text in shown]
    answer = verdicts.answer_sentence(verdicts.Tally(tuple((ref, verdict) for ref, verdict, _ in read)))
    points = [verdicts.point_line(ref, verdict, "; ".join(quotes.span(r, q) for r, q in cited) or NO_LINE)
              for ref, verdict, cited in read]
    return f"{answer}\n\n{HEADING.format(objective=objective)}\n" + "\n".join(points)
