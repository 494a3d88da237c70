"""The client rebuilds the evaluator's typed errors from its JSON error bodies."""

from __future__ import annotations

import httpx
import pytest

from swarmyard.errors import (
    EvaluatorError,
    HoldoutUsedError,
    PayloadTooLargeError,
    ScoringError,
    ScoringLimitError,
    SwarmyardError,
)
from swarmyard.evaluator.client import _error_from


@pytest.mark.parametrize("error", [
    HoldoutUsedError("goal_a"),
    ScoringLimitError("cpu_time", 3),
    ScoringError("the scoring code exited with status 2", reason="exit_status"),
    PayloadTooLargeError("artifact", 20, 10),
])
def test_known_errors_come_back_as_their_own_type(error: SwarmyardError) -> None:
    rebuilt = _error_from(httpx.Response(error.status, json=error.to_dict()))
    assert type(rebuilt) is type(error)
    assert rebuilt.to_dict() == error.to_dict()


def test_an_unknown_or_broken_body_is_an_evaluator_error() -> None:
    odd = _error_from(httpx.Response(500, json={"error": {"code": "something_new", "message": "boom"}}))
    assert type(odd) is EvaluatorError
    assert "something_new" in odd.message
    broken = _error_from(httpx.Response(502, text="<html>bad gateway</html>"))
    assert type(broken) is EvaluatorError
    assert "502" in broken.message
