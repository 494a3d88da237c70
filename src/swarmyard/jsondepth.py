"""The JSON nesting cap, checked on raw bytes before any parser sees them (the plane and the broker both use it)."""

from __future__ import annotations

import re
from itertools import accumulate
from operator import sub

from swarmyard.errors import NestingTooDeepError

#: How deep a JSON request body may nest (objects and arrays). Real requests stay far below it (a tool schema
#: inside a chat request is about 15 levels); a parser without its own limit overflows its C stack on a body
#: of a million ``[`` (orjson before 3.9.15 crashed the whole server).
MAX_JSON_DEPTH = 64

_STRINGS = re.compile(rb'"[^"]*"')  # once escaped backslashes and quotes are gone
_NOT_BRACKETS = bytes(range(256)).translate(None, b"[]{}")
_BRACES_AS_BRACKETS = bytes.maketrans(b"{}", b"[]")
_RUNS = re.compile(rb"\[+|\]+")


def check_nesting(raw: bytes, limit: int = MAX_JSON_DEPTH, *, field: str = "body") -> None:
    """Refuse (``NestingTooDeepError``, 400) a JSON text whose arrays and objects nest deeper than ``limit``,
    without parsing it: this runs before any parser sees the bytes.

    Only brackets outside strings count. The work is a few passes in C over the body: strings cut out, every
    byte but brackets dropped, and innermost pairs peeled off while that shrinks the rest by an eighth or more
    (each peel lowers the depth by exactly one); what is left is long runs, whose depth is a running sum.
    A malformed body may be refused here as too deep where a parser would call it malformed: a 400 either way.
    """
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return
    unescaped = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    marks = _STRINGS.sub(b"", unescaped).translate(_BRACES_AS_BRACKETS, _NOT_BRACKETS)
    peeled = 0
    while peeled < limit:
        if b"[" * (limit - peeled + 1) in marks:
            raise NestingTooDeepError(limit, field=field)
        shorter = marks.replace(b"[]", b"")
        if not shorter:
            return
        shrunk = len(marks) - len(shorter)
        marks, peeled = shorter, peeled + 1
        if shrunk * 8 < len(marks):
            break
    # Runs alternate (an opening run, a closing run, ...): the depth peaks at the end of each opening run.
    runs = list(map(len, _RUNS.findall(marks.lstrip(b"]"))))
    opened = accumulate(runs[0::2])
    closed = accumulate(runs[1::2], initial=0)
    if max(map(sub, opened, closed), default=0) + peeled > limit:
        raise NestingTooDeepError(limit, field=field)
