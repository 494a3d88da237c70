"""The finding a task ends with when it reached no result, and the limit that stopped it, said truly.

A built-in agent that runs out of steps, model calls, money or time still submits a finding, so the task ends
``done`` and its spend is reported: ``No result was reached for 'TITLE': WHY.``, one line. ``WHY`` names the
limit that ran out with its figures, taken from the broker's typed refusal (which reads them from the store at
the moment it refuses), never assumed: a task stopped by its call cap at $0.003 of $0.20 says the call cap.

The control plane, the coordinator and the report read these lines back: a placeholder claims nothing, so it
needs no citation, it is never handed to the lead as evidence, and the synthesis says how many tasks reached
nothing and why (``swarmyard.swarm.synthesis``).
"""

from __future__ import annotations

import re

from swarmyard.errors import BudgetError, BudgetExceededError, CallCapExceededError, DeadlinePassedError

_PREFIX = "No result was reached for "
#: A whole placeholder: the fixed opening, the task's title in quotes, and the reason on the same line.
_PLACEHOLDER = re.compile(r"No result was reached for '(?P<title>[^'\n]{1,200})': (?P<why>[^\n]{1,1200})")


def placeholder(title: str, why: str) -> str:
    """``No result was reached for 'TITLE': WHY.`` (the title cut to 200 characters, quotes dropped from it)."""
    clean = " ".join(title.replace("'", "").split())[:200] or "task"
    reason = " ".join(why.split()).rstrip(".")
    return f"{_PREFIX}{clean!r}: {reason}."


def is_placeholder(body: str) -> bool:
    """Whether ``body`` is a placeholder and nothing else (one that adds a line of its own is a finding)."""
    return _PLACEHOLDER.fullmatch(body.strip()) is not None


#: The reasons this module words (``step_cap``, ``stopped_by`` on the three budget refusals, the digest's), whole:
#: figures and the step may vary, nothing else.
_STEP = r"at step \d{1,9}"
_WHOSE = r"(?:the goal's|the task's)"
_USD = r"-?\$\d{1,15}\.\d{6}"
_KNOWN_REASON = re.compile(
    r"the step cap ran out \((?P<a>\d{1,9}) of (?P=a) steps\)"
    r"|no finding could be read into a point of its own|every point copied its finding"
    rf"|(?:cut short: )?(?:{_WHOSE} call cap ran out {_STEP}(?: \(all \d{{1,9}} of its model calls were made\))?"
    rf"|the budget ran out {_STEP}(?: \({_WHOSE} envelope had {_USD} left, the next call could cost up to {_USD}\))?"
    rf"|the goal's deadline passed {_STEP})")


def is_own_placeholder(body: str, title: str) -> bool:
    """Whether ``body`` is a placeholder this module could have written for the task titled ``title``: its own
    title, and a reason ``step_cap``, ``stopped_by`` (on a budget, call cap or deadline refusal) or the digest
    words, with figures only. A placeholder is stored without a citation and its reason is repeated in the
    synthesis, so one with words of the agent's own (another task's title, a made-up reason) is not one."""
    found = _PLACEHOLDER.fullmatch(body.strip())
    if found is None or not body.strip().startswith(placeholder(title, "x")[: -len(" x.")]):
        return False
    return _KNOWN_REASON.fullmatch(found["why"].rstrip(".")) is not None


def reason(body: str) -> str | None:
    """A placeholder's reason (the limit that ran out, or the error), or ``None`` for a finding."""
    found = _PLACEHOLDER.fullmatch(body.strip())
    return found["why"].rstrip(".") if found else None


def step_cap(steps: int) -> str:
    """The reason for a run that used every step it had."""
    return f"the step cap ran out ({steps} of {steps} steps)"


def stopped_by(exc: BudgetError, step: int) -> str:
    """The reason for a run the broker refused a call to, naming the limit its refusal names: the call cap (the
    task's or the goal's), the budget (the envelope that could not afford the call, with the figures) or the
    deadline."""
    at = f"at step {step}"
    # the fields crossed the wire (``SwarmyardError.from_dict``): read them as what they should be, or not at all
    whose = "the goal's" if str(getattr(exc, "envelope", "") or "").startswith("goal ") else "the task's"
    if isinstance(exc, CallCapExceededError):
        cap = _int(exc.cap)
        return f"{whose} call cap ran out {at}" + (f" (all {cap} of its model calls were made)" if cap else "")
    if isinstance(exc, BudgetExceededError):
        from swarmyard.money import format_usd  # decimal, not loaded at every agent's start

        needed, available = _int(exc.needed), _int(exc.available)
        figures = (f" ({whose} envelope had {format_usd(available)} left, the next call "
                   f"could cost up to {format_usd(needed)})" if needed is not None and available is not None
                   else "")
        return f"the budget ran out {at}{figures}"
    if isinstance(exc, DeadlinePassedError):
        return f"the goal's deadline passed {at}"
    return f"the broker refused the call {at} ({exc.code}): {exc.message}"


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
