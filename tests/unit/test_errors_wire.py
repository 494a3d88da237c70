"""Errors survive the wire: ``SwarmyardError.from_dict(e.to_dict())`` is ``e`` again, for every class in the tree."""

from __future__ import annotations

import inspect
import json
import types
import typing
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import swarmyard.errors as errors
from swarmyard.errors import (
    InvalidInputError,
    LeaseExpiredError,
    SandboxError,
    StaleFencingTokenError,
    StoreBusyError,
    SwarmyardError,
    UpstreamUnknownError,
)


def _tree(root: type[SwarmyardError]) -> list[type[SwarmyardError]]:
    found = [root]
    for sub in root.__subclasses__():
        found += _tree(sub)
    return found


CLASSES = sorted(set(_tree(SwarmyardError)), key=lambda kind: kind.__name__)


def _values(hint: Any) -> st.SearchStrategy[Any]:
    """Values a JSON body can carry for an annotated parameter."""
    if hint is float:
        return st.floats(allow_nan=False, allow_infinity=False)
    if hint is type(None):
        return st.none()
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return st.one_of(*(_values(arg) for arg in typing.get_args(hint)))
    return st.from_type(hint)


def _instances(kind: type[SwarmyardError]) -> st.SearchStrategy[SwarmyardError]:
    hints = typing.get_type_hints(kind.__init__)
    arguments: dict[str, st.SearchStrategy[Any]] = {}
    for parameter in inspect.signature(kind.__init__).parameters.values():
        if parameter.name == "self" or parameter.kind is inspect.Parameter.VAR_KEYWORD:
            continue
        if parameter.name == "retryable":
            arguments["retryable"] = st.booleans()
            continue
        arguments[parameter.name] = _values(hints[parameter.name])
    return st.builds(kind, **arguments)


def test_the_tree_is_whole() -> None:
    # every class the module defines is in the tree the test draws from, and each has a code of its own
    defined = {value for value in vars(errors).values()
               if isinstance(value, type) and issubclass(value, SwarmyardError)}
    assert defined == set(CLASSES)
    assert len({kind.code for kind in CLASSES}) == len(CLASSES)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(CLASSES).flatmap(_instances))
def test_from_dict_mirrors_to_dict(error: SwarmyardError) -> None:
    body = error.to_dict()
    wire = json.loads(json.dumps(body))
    back = SwarmyardError.from_dict(wire)
    assert type(back) is type(error)
    assert (back.code, back.status, back.retryable, str(back)) == (error.code, error.status, error.retryable,
                                                                    str(error))
    # every attribute the error carries (the ids involved) came back, and nothing else was added
    assert vars(back) == vars(error)
    assert back.to_dict() == body


def test_retryable_is_a_keyword_of_every_error() -> None:
    error = SandboxError("no slot", retryable=True)
    assert error.retryable is True and error.to_dict()["error"]["retryable"] is True
    assert SandboxError("no slot").retryable is False
    assert StoreBusyError("busy").retryable is True  # the class's default when the caller says nothing


def test_the_decoders_difference_is_kept() -> None:
    # what guessing from the HTTP status lost: both are 409s, and a busy store is a retryable 503
    stale = SwarmyardError.from_dict(StaleFencingTokenError("tsk_1", 3, 4).to_dict())
    expired = SwarmyardError.from_dict(LeaseExpiredError("tsk_1", 4, 4).to_dict())
    assert isinstance(stale, StaleFencingTokenError) and not isinstance(stale, LeaseExpiredError)
    assert isinstance(expired, LeaseExpiredError) and (expired.presented, expired.current) == (4, 4)
    busy = SwarmyardError.from_dict(StoreBusyError("the store is busy").to_dict())
    assert isinstance(busy, StoreBusyError) and busy.retryable and not isinstance(busy, InvalidInputError)
    lost = SwarmyardError.from_dict(UpstreamUnknownError("lost", reservation_id="rsv_1").to_dict())
    assert isinstance(lost, UpstreamUnknownError) and lost.reservation_id == "rsv_1" and not lost.retryable


def test_a_code_this_side_does_not_know_keeps_what_it_said() -> None:
    error = SwarmyardError.from_dict(
        {"error": {"code": "internal_error", "message": "internal error", "retryable": True}}, status=500)
    assert type(error) is SwarmyardError
    assert (error.code, error.message, error.retryable, error.status) == ("internal_error", "internal error",
                                                                          True, 500)
    assert error.to_dict() == {"error": {"code": "internal_error", "message": "internal error",
                                         "retryable": True}}
    odd = SwarmyardError.from_dict({"detail": "not ours"}, status=502)
    assert (odd.code, odd.retryable, odd.status) == ("bad_response", False, 502)


def test_a_body_cannot_choose_what_it_is_made_of() -> None:
    # keys that are parameter names of the constructors, or attributes of every error, stay details
    body = {"error": {"code": "stale_fencing_token", "message": "m", "self": 1, "details": 2, "__class__": 3,
                      "task_id": "tsk_1", "presented": 1, "current": 2}}
    error = SwarmyardError.from_dict(body)
    assert type(error) is StaleFencingTokenError and error.task_id == "tsk_1"
    assert error.details["self"] == 1 and error.details["details"] == 2 and error.to_dict() == {
        "error": {"code": "stale_fencing_token", "message": "m", "retryable": False, **{
            k: v for k, v in body["error"].items() if k not in ("code", "message")}}}
