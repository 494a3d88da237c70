"""Properties of the two pure guards behind the bad-input suite: the JSON nesting check and the key scrub.

``check_nesting`` must agree exactly with the depth of any JSON text a JSON library writes (strings full of
brackets, quotes and backslashes included), and refuse every unbalanced text only where a parser would also
refuse it. ``scrub`` must leave no piece of a held key in any encoding an upstream might echo it in, nor may a
stream's ``StreamScrubber``, wherever the key is cut across its deltas.
"""

from __future__ import annotations

import base64
import json
import urllib.parse
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from swarmyard.broker.chat import Finished, FinishReason, TextDelta
from swarmyard.broker.keys import Secret, scrub
from swarmyard.broker.providers.redact import StreamScrubber
from swarmyard.errors import NestingTooDeepError
from swarmyard.jsondepth import check_nesting

_TEXT = st.text(alphabet=st.sampled_from('ab[]{}"\\/:, \n\u00e9\u2028'), max_size=8)
_JSON = st.recursive(st.none() | st.booleans() | st.integers() | _TEXT,
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
                     max_leaves=40)


def depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    return 0


def too_deep(raw: bytes, limit: int) -> bool:
    try:
        check_nesting(raw, limit)
    except NestingTooDeepError as exc:
        assert exc.limit == limit and exc.status == 400 and exc.code == "nesting_too_deep"
        return True
    return False


@settings(max_examples=400)
@given(_JSON, st.integers(min_value=0, max_value=8), st.booleans())
def test_the_check_agrees_with_the_depth_of_any_json(value: Any, limit: int, ascii_only: bool) -> None:
    raw = json.dumps(value, ensure_ascii=ascii_only).encode()
    assert too_deep(raw, limit) == (depth(value) > limit)


@settings(max_examples=400)
@given(st.text(alphabet="[]{}", max_size=60), st.integers(min_value=1, max_value=6))
def test_brackets_alone_are_refused_wherever_a_parser_would_go_deeper(text: str, limit: int) -> None:
    reached = level = 0
    for char in text:  # how deep a parser gets before it stops (at the first closing bracket with none open)
        level += 1 if char in "[{" else -1
        if level < 0:
            break
        reached = max(reached, level)
    if reached > limit:
        assert too_deep(text.encode(), limit)


@pytest.mark.parametrize("levels", [65, 1000, 1_000_000])
def test_the_bodies_that_crash_parsers_are_refused(levels: int) -> None:
    assert too_deep(b"[" * levels + b"]" * levels, 64)
    assert too_deep(b'{"a":' * levels + b"1" + b"}" * levels, 64)
    assert not too_deep(b'"' + b"[" * levels + b'"', 64)  # inside a string brackets are text


_KEY_CHARS = st.sampled_from('abcXYZ0189-_/+="\\ .~%é')


@settings(max_examples=200, deadline=None)  # each new key compiles its pattern once
@given(st.text(alphabet=_KEY_CHARS, min_size=24, max_size=60), st.integers(min_value=0, max_value=2),
       st.text(alphabet="ab ", max_size=5))
def test_no_piece_of_a_held_key_survives_in_any_encoding(value: str, shift: int, tail: str) -> None:
    secret = Secret(value)  # held while this reference lives: scrub sees every live Secret
    data = ("x" * shift + value + tail).encode()
    forms = [value, json.dumps(value)[1:-1], json.dumps(value)[1:-1].replace("/", "\\/"),
             "".join(f"\\u{ord(c):04x}" for c in value), json.dumps(json.dumps(value))[1:-1],
             urllib.parse.quote(value, safe=""), urllib.parse.quote_plus(value), value.encode().hex(),
             value.encode().hex().upper(), base64.b64encode(data).decode(), base64.urlsafe_b64encode(data).decode()]
    for form in forms:
        out = scrub(f"upstream said: {form}!")
        # what is left of an encoded form is at most its edge characters, which mix the key's first or last
        # bytes with what stands beside it: no run of 12 characters of the form survives
        assert "***" in out, (form, out)
        assert not [form[i:i + 12] for i in range(len(form) - 11) if form[i:i + 12] in out], (form, out)
    assert secret.reveal() == value


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=_KEY_CHARS, min_size=24, max_size=60), st.sampled_from(range(5)),
       st.lists(st.integers(min_value=0, max_value=400), max_size=6), st.text(alphabet="ab \\", max_size=40))
def test_a_key_split_across_stream_deltas_never_leaves_the_scrubber(value: str, encoding: int, cuts: list[int],
                                                                    around: str) -> None:
    secret = Secret(value)
    form = [value, json.dumps(value)[1:-1], "".join(f"\\u{ord(c):04x}" for c in value), value.encode().hex(),
            base64.b64encode(value.encode()).decode()][encoding]
    text = f"{around}{form}{around}"
    points = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    scrubber = StreamScrubber()
    out = [e for piece in pieces for e in scrubber.feed(TextDelta(piece))]
    out += scrubber.feed(Finished(FinishReason.STOP))
    streamed = "".join(e.text for e in out if isinstance(e, TextDelta))
    assert "***" in streamed, (pieces, streamed)
    assert not [form[i:i + 12] for i in range(len(form) - 11) if form[i:i + 12] in streamed], (pieces, streamed)
    # a stream cut off mid-key passes on only what cannot begin one
    cut = StreamScrubber()
    head = [e for piece in pieces[:-1] for e in cut.feed(TextDelta(piece))] + cut.cut_off()
    partial = "".join(e.text for e in head if isinstance(e, TextDelta))
    assert not [form[i:i + 12] for i in range(len(form) - 11) if form[i:i + 12] in partial], (pieces, partial)
    assert secret.reveal() == value
