"""Findings and a synthesis a small model chooses but does not write (``finding = "quoted"``, ``synthesis =
"quoted"``).

A 0.5B scout asked for a sentence of its own around a true line invented facts ("The budget for the API key has
been exceeded." from the line saying such calls are refused), and a lead asked for a point per finding added more
("The team may need to adjust their budget"). Here the model only chooses the lines its task's question rests on
(an enum of the lines its searches returned), and swarmyard writes the finding, ``"the line" (path:line)``, each
quote from a citation the plane checks before it stores the finding. The lead makes no model call: its synthesis is
the question and, per finding, the lines the plane checked for it, with its id.

No verdict is asked of the model. Asked yes or no on a question and one line, the embedded 0.5B model answered by
the prompt's wording, not the line's: the same answer for the three lines of the demo that say yes and for three
made-up lines that say no, whichever of four phrasings was used (no for two of them, yes for the other two). A
tally of such verdicts would state a conclusion nothing in the run supports; the lines are the evidence a reader
judges. (A lead that writes an answer with its verdicts is ``synthesis = "digest"``, for a model that can.)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from swarmyard.agents.actions import FINISH, ToolSpec
from swarmyard.errors import InvalidInputError
from swarmyard.rules import quotes

_DESCRIPTION = ("Submit your finding and finish: in cite, the line or lines that answer your task's question, as "
                "your search returned them. The finding is those lines; you write no sentence.")
#: ``submit_finding`` as a reply is read (the lines it may cite are narrowed per call by :func:`spec`; a reply
#: without them is asked again by :func:`finding`, since a reply's required arguments are words).
FINISH_SPEC = ToolSpec(FINISH, _DESCRIPTION, {
    "type": "object", "properties": {"cite": {"type": "array", "items": {"type": "string"}}},
    "required": [], "additionalProperties": False})
#: The heading of the synthesis's list of findings.
HEADING = 'Asked "{objective}", the findings cite these lines (the model chose them; it gave no verdict):'
#: A finding's point when the lead's prompt shows no line it cites.
NO_LINE = "(it cites no line)"
_CITED = re.compile(r"^Cited line (?P<ref>\S+:[0-9]{1,9}): (?P<quote>.*)$", re.MULTILINE)


def spec(lines: Sequence[str]) -> ToolSpec:
    """:data:`FINISH_SPEC` whose ``cite`` may only hold ``lines`` (``path:line: text``, as a search returned
    them), one to three of them: constrained decoding makes the model choose."""
    cite: dict[str, Any] = {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3}
    if lines:
        cite["items"] = {"type": "string", "enum": list(dict.fromkeys(lines))}
    return ToolSpec(FINISH, _DESCRIPTION, {"type": "object", "properties": {"cite": cite},
                                           "required": ["cite"], "additionalProperties": False})


def with_quoted(tools: dict[str, ToolSpec]) -> dict[str, ToolSpec]:
    """``tools`` with ``submit_finding`` taking lines, no words."""
    return {name: FINISH_SPEC if name == FINISH else spec_ for name, spec_ in tools.items()}


def finding(cited: Sequence[tuple[str, str]]) -> str:
    """The finding's body from the ``(path:line, quote)`` the model cited: ``"quote" (path:line); ...``.
    ``InvalidInputError`` (the model is asked again) without a line."""
    if not cited:
        raise InvalidInputError("cite the line your task's question rests on, as your search returned it",
                                field="cite")
    return "; ".join(quotes.span(ref, quote) for ref, quote in cited)


def synthesis(objective: str, shown: Sequence[tuple[str, str, str]]) -> str:
    """The synthesis of the findings a lead's prompt shows (``(id, heading, text)``: the body, then the lines the
    plane checked, ``Cited line path:line: quote``): the heading with the objective, then per finding the lines the
    plane checked for it and its id. Nothing in it is a model's, and no finding's own words are repeated."""
    points = []
    for ref, _, text in shown:
        # a line cut to the finding's share of the prompt is quoted as far as it goes, and marked cut
        cited = [quotes.span(m["ref"], m["quote"].removesuffix(" [...]"))
                 + (" [...]" if m["quote"].endswith(" [...]") else "") for m in _CITED.finditer(text)]
        points.append(f"- {'; '.join(cited) or NO_LINE} [{ref}]")
    return HEADING.format(objective=objective) + "\n" + "\n".join(points)
