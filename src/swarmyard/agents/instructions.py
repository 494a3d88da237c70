"""What the built-in agent tells its model, as data: the system prompts, the last-step nudge and the re-ask.

They live apart from the agent so that the copy check (``originality``), in the agent and in the control plane,
can refuse a finding that only says these back (a lead once submitted the last-step nudge as its synthesis).
"""

from __future__ import annotations

WORKER = (
    "You are one worker in a swarm. Work on your task with the tools, then call submit_finding with a "
    "clear, specific result. Reply with exactly one tool call each turn. Tools: {tools}."
)
LEAD = (
    "You are the lead of a swarm. Read the findings below and call submit_finding with one synthesis "
    "that answers the objective; cite the finding ids you rely on in cite. Tools: {tools}."
)
LAST_STEP = (
    "This is your last step. Call submit_finding now: a short title and a body with everything you have "
    "worked out, citing what you used."
)
REASK = (
    "That reply could not be used ({error}). Reply with exactly one JSON object like "
    '{{"action": {{"tool": "submit_finding", "args": {{"title": "...", "body": "..."}}}}}}.'
)

#: Every instruction, as one text a finding may not restate.
ALL = "\n".join((WORKER, LEAD, LAST_STEP, REASK))
