"""A step's action in report.md's trajectories: one code span, whatever backticks and line breaks the model wrote."""

from __future__ import annotations

from swarmyard.report.steps import _code


def test_a_models_backtick_or_line_break_does_not_end_the_code_span() -> None:
    # the search pattern x`<img src=x onerror=alert(1)>` closed the span and left raw HTML in report.md
    span = _code('textsearch {"pattern": "x`<img src=x onerror=alert(1)>`"}\r\n# forged')
    assert span.startswith("`") and span.endswith("`") and span.count("`") == 2
    assert "\n" not in span and "\r" not in span
