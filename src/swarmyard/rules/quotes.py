"""A source line quoted in a finding or a synthesis: ``"the words" (path:line)``.

Where a run asks for quoted findings (``[workers] finding = "quoted"``), a scout's finding is its verdict and the
lines it cited, and the lead's synthesis (``[lead] synthesis = "quoted"``) is the findings' verdicts and the same
lines: swarmyard writes every quote from a citation the plane checked, in this one shape. A quote is the source's
words, not the finding's: the copy check (``originality``) leaves quotes out on both sides, so a synthesis that
quotes the line a finding quotes does not copy that finding.
"""

from __future__ import annotations

import re

#: A quote and the line it is from: ``"words" (path:line)``.
SPAN = re.compile(r'"(?P<quote>[^\n]*?)" \((?P<ref>[^\s()"]+:[0-9]{1,9})\)')


def span(ref: str, quote: str) -> str:
    """``quote`` (one line, its runs of spaces made one) with the ``path:line`` it is from."""
    return f'"{" ".join(quote.split())}" ({ref})'


def spans(text: str) -> list[tuple[str, str]]:
    """``(ref, quote)`` of every quote in ``text``, in order."""
    return [(m["ref"], m["quote"]) for m in SPAN.finditer(text)]


def without(text: str) -> str:
    """``text`` less its quotes (each replaced by a space)."""
    return SPAN.sub(" ", text)
