"""Words from workers and models as a terminal, or a file read in one, may show them."""

from __future__ import annotations

#: Control characters but the line break and the tab: a worker's words printed as they are could move the cursor,
#: clear the screen or recolour what follows (ESC sequences), and make a terminal show what the store does not hold.
_CONTROLS = {c: "\ufffd" for c in (*range(0x00, 0x09), *range(0x0b, 0x20), 0x7f, *range(0x80, 0xa0),
                                   # the bidirectional controls: a line shown reordered is not the line stored
                                   0x061c, 0x200e, 0x200f, *range(0x202a, 0x202f), *range(0x2066, 0x206a))}


def shown(text: str) -> str:
    """``text`` as a terminal may print it: each control character (ESC, CR, ...) but ``\\n`` and ``\\t``, and each
    bidirectional control (U+202E, ...), as U+FFFD."""
    return text.translate(_CONTROLS)


def html_shown(text: str) -> str:
    """``text`` HTML-escaped (quotes too) and then ``shown``: a page is opened in browsers and read as a file in
    terminals."""
    import html  # only the report writes HTML

    return shown(html.escape(text))
