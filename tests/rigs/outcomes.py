"""How a run ends when its lead is the simulated model: that model's every reply is one word repeated, which the
copy checks refuse as a finding, so the lead stores its no-result placeholder and ``swarmyard run`` exits 1
saying so. Tests whose subject is something else (a restart, a resume, a placement) assert that ending exactly."""

from __future__ import annotations

#: what ``swarmyard run`` prints last when its lead reached no result
LEAD_NO_RESULT = "ended without a synthesis: the lead reached no result"


def assert_simulated_lead_ended(returncode: int | None, stderr: str) -> None:
    """The run went through to its lead and ended as a simulated lead ends it: exit 1, and why."""
    assert returncode == 1 and LEAD_NO_RESULT in stderr, f"exit {returncode}\n{stderr[-3000:]}"
