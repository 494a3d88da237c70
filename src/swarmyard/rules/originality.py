"""Whether a finding says something of its own: not its prompt restated, not one text looped, not a peer's copied.

A small model under a step cap fails in three ways the demo showed: a scout "finding" that is its prompt said
back, a body that is the same six lines repeated until the token limit, and a lead whose synthesis is one scout's
finding copied whole. Each is measured on word shingles (runs of ``SHINGLE`` words, lowercased, list numbering
dropped), so rewording a sentence counts as one's own and copying it does not:

- ``copied_share(text, source)``: the share of ``text``'s shingles found in ``source``;
- ``repeated_share(text)``: the share of ``text``'s lines that repeat an earlier line, or of its shingles that
  repeat an earlier shingle, whichever is larger.

- ``contained_share(text, source)``: the share of ``source``'s shingles found in ``text`` (a finding pasted whole
  into a synthesis padded with as much filler again is 50% copied, but 100% contained).

Words are read after ``skeleton``: NFKC, format characters (zero-width spaces, soft hyphens) dropped, accents
stripped and Cyrillic and Greek look-alike letters folded to the Latin ones, so a copy with U+200B after every
letter, or with Cyrillic 'а' for 'a', is still a copy.

``problem`` turns these into the reason a submission is refused (and the model asked again), or ``None``. It
reads a text less its quotes of source lines (``quotes.SPAN``, ``"words" (path:line)``): those are the source's
words, so a synthesis that quotes the line a finding quotes does not copy the finding.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping

from swarmyard.rules import grounding, instructions, quotes

#: Words per shingle: long enough that common phrases ("the market is") rarely make a copy on their own.
SHINGLE = 4
#: A body with this share of its shingles in the findings a lead read is not its own.
COPIED = 0.6
#: A body with this share of its shingles in its own task's prompt only says the task back (the demo's scouts
#: wrote "The estimated market size for on-device speech models is unknown": half its phrases the prompt's).
RESTATED = 0.5
#: A body holding this share of one finding's shingles holds that finding, whatever else it adds.
CONTAINED = 0.8
#: A finding shorter than this (in shingles) may be quoted whole: a one-line result is cited, not copied.
_MIN_CONTAINED = 8
#: A body with this share of repeated lines or shingles is a loop.
REPEATED = 0.5
#: Fewer shingles or lines than these are too short to call a loop.
_MIN_SHINGLES = 12
_MIN_LINES = 4

_WORD = re.compile(r"[^\W_]+")
_MARKER = re.compile(r"^\s*(?:[-*+\u2022]|\(?\d+[.)]|\(?[a-z][.)])\s+", re.IGNORECASE)


# Cyrillic and Greek letters drawn like Latin ones (Unicode's confusables for the letters a copier reaches for).
_LOOKALIKE = str.maketrans(
    "\u0430\u0432\u0435\u0455\u0456\u0458\u043a\u043c\u043d\u043e\u0440\u0441\u0442\u0443\u0445\u0501\u04bb"
    "\u0410\u0412\u0415\u0405\u0406\u0408\u041a\u041c\u041d\u041e\u0420\u0421\u0422\u0423\u0425"
    "\u03b1\u03b5\u03b9\u03ba\u03bd\u03bf\u03c1\u03c4\u03c5\u03c7"
    "\u0391\u0392\u0395\u0396\u0397\u0399\u039a\u039c\u039d\u039f\u03a1\u03a4\u03a5\u03a7",
    "abesijkmhopctyxdh"
    "ABESIJKMHOPCTYX"
    "aeikvoptux"
    "ABEZHIKMNOPTYX")


def skeleton(text: str) -> str:
    """``text`` as it reads: NFKC, format characters (Cf: zero-width spaces, soft hyphens, bidi marks) dropped,
    accents stripped, Cyrillic and Greek look-alikes folded to Latin letters."""
    text = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", text))
    text = "".join(c for c in text if unicodedata.category(c) not in ("Cf", "Mn"))
    return unicodedata.normalize("NFC", text).translate(_LOOKALIKE)


def _words(text: str) -> list[str]:
    return [w.lower() for line in skeleton(text).splitlines() for w in _WORD.findall(_MARKER.sub("", line))]


def _shingles(words: list[str], n: int = SHINGLE) -> list[tuple[str, ...]]:
    size = max(1, min(n, len(words)))
    return [tuple(words[i:i + size]) for i in range(len(words) - size + 1)] if words else []


def copied_share(text: str, source: str) -> float:
    """The share of ``text``'s shingles that occur in ``source`` (0 for an empty text)."""
    words = _words(text)
    mine = _shingles(words)
    if not mine:
        return 0.0
    theirs = set(_shingles(_words(source), len(mine[0])))
    return sum(1 for s in mine if s in theirs) / len(mine)


def contained_share(text: str, source: str) -> float:
    """The share of ``source``'s shingles that occur in ``text`` (0 for a ``source`` too short to tell)."""
    theirs = _shingles(_words(source))
    if len(theirs) < _MIN_CONTAINED:
        return 0.0
    mine = set(_shingles(_words(text), len(theirs[0])))
    return sum(1 for s in theirs if s in mine) / len(theirs)


def repeated_share(text: str) -> float:
    """The larger of the share of lines repeating an earlier line and of shingles repeating an earlier one."""
    lines = [" ".join(_words(line)) for line in text.splitlines()]
    lines = [line for line in lines if line]
    by_line = 0.0
    if len(lines) >= _MIN_LINES:
        by_line = (len(lines) - len(set(lines))) / len(lines)
    grams = _shingles(_words(text))
    by_gram = (len(grams) - len(set(grams))) / len(grams) if len(grams) >= _MIN_SHINGLES else 0.0
    return max(by_line, by_gram)


_HEADER = re.compile(r"^\[(fnd_[0-9a-z]+)\][^\n]*$", re.MULTILINE)


def findings_in(prompt: str) -> dict[str, str]:
    """The findings a lead's prompt shows (``[fnd_...] title`` then the body, up to the next such line, or the
    line that starts the lead's instructions), by id."""
    return {ref: body for ref, _, body in findings_shown(prompt)}


def findings_shown(prompt: str) -> list[tuple[str, str, str]]:
    """(id, title line, body) of each finding a lead's prompt shows, in order."""
    end = prompt.find(f"\n{instructions.LEAD_INSTRUCTIONS_HEAD}\n")
    shown = prompt if end < 0 else prompt[:end]
    heads = list(_HEADER.finditer(shown))
    return [(m[1], m[0][len(m[1]) + 2:].strip(),
             shown[m.end():heads[i + 1].start() if i + 1 < len(heads) else len(shown)].strip())
            for i, m in enumerate(heads)]


def problem(body: str, *, prompt: str = "", read: Mapping[str, str] | None = None) -> str | None:
    """Why ``body`` is not a finding of its own, or ``None``: it repeats itself, it restates ``prompt`` or the
    agent's own instructions, or (for a lead, ``read`` maps the ids of the findings it read to their bodies) it
    copies what it read. Quotes of source lines are left out on both sides. A synthesis's note on the tasks that
    reached no result is the store's words, not the writer's, and is left out (several tasks stopped by the same
    limit read alike)."""
    body = quotes.without(grounding.without_note(body))
    read = {ref: quotes.without(text) for ref, text in (read or {}).items()}
    looped = repeated_share(body)
    if looped >= REPEATED:
        return (f"the body repeats itself ({looped:.0%} of it is repeated lines or phrases): write each point "
                "once")
    if read:
        held = max(read.items(), key=lambda item: contained_share(body, item[1]))
        if (share := contained_share(body, held[1])) >= CONTAINED:
            return (f"the body holds the finding [{held[0]}] ({share:.0%} of its phrases): write the synthesis in "
                    "your own words and cite the findings by id")
        whole = copied_share(body, "\n".join(read.values()))
        if whole >= COPIED:
            ref = _most_copied(body, read.items())
            return (f"the body copies the findings ({whole:.0%} of its phrases, most from [{ref}]): write the "
                    "synthesis in your own words and cite the findings by id")
    if prompt and copied_share(body, prompt) >= RESTATED:
        return "the body only restates what you were given: say in your own words what you found out"
    if copied_share(body, instructions.ALL) >= RESTATED:
        return "the body only says back the agent's instructions: say in your own words what you found out"
    return None


def _most_copied(body: str, read: Iterable[tuple[str, str]]) -> str:
    return max(read, key=lambda item: copied_share(body, item[1]))[0]
