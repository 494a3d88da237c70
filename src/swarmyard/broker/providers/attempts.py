"""The simulated provider's ``attempts`` behaviour: a seeded stand-in for a model that improves from scores.

It answers the built-in agent's action format. Offered ``submit_artifact``, it proposes an attempt at a hidden
code (the ``hidden-code`` bundle's task: ``instance I code DIGITS``, as many digits as the prompt's
``N-digit`` says): with no scored attempt in its context, random digits; with one (a single draft), that
draft with one or two digits changed; with several (a scored history), a per-digit mix of them weighted by score,
then one digit changed. Offered only ``submit_finding`` (the last step, or the lead), it submits the best scored
attempt its context shows, in words of its own. Every choice is drawn from a ``random.Random`` seeded by the provider's seed and the call's key
(which caller, by its first request's text, and its how-manyth call this is), never by the order calls arrive in.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Sequence

from swarmyard.broker.chat import ChatRequest

_SCORED = re.compile(r"\[score (-?\d+)\] instance \d+ code (\d+)")
#: A scored attempt as this model's own finding reports it (below): a lead that reads only findings sees these.
_REPORTED = re.compile(r"the highest reached (-?\d+) points; that answer for instance \d+ is the code (\d+)")
_INSTANCE = re.compile(r"\binstance (\d+)\b")
_LENGTH = re.compile(r"\b(\d{1,3})-digit\b")
DEFAULT_LENGTH = 16


def _rng(request: ChatRequest, seed: int, key: str | None) -> random.Random:
    digest = hashlib.sha256(f"{seed}\0{request.model}\0".encode())
    if key is not None:
        digest.update(key.encode())
        return random.Random(digest.digest())
    for message in request.messages:
        digest.update(message.role.value.encode() + b"\0" + message.content.encode() + b"\0")
    return random.Random(digest.digest())


def _mutate(code: str, rng: random.Random, changes: int) -> str:
    digits = list(code)
    for position in rng.sample(range(len(digits)), min(changes, len(digits))):
        digits[position] = rng.choice([d for d in "0123456789" if d != digits[position]])
    return "".join(digits)


def propose(scored: Sequence[tuple[int, str]], length: int, rng: random.Random) -> str:
    """The next attempt's digits, from the scored attempts seen (best first or in any order)."""
    usable = [(score, code) for score, code in scored if len(code) == length]
    if not usable:
        return "".join(rng.choice("0123456789") for _ in range(length))
    ranked = sorted(usable, key=lambda sc: -sc[0])
    if len({code for _, code in ranked}) == 1:
        return _mutate(ranked[0][1], rng, rng.choice((1, 2)))
    weights = [max(score, 0) + 1 for score, _ in ranked]
    mixed = "".join(rng.choices([code[i] for _, code in ranked], weights=weights)[0] for i in range(length))
    return _mutate(mixed, rng, 1)


def attempt_answer(request: ChatRequest, seed: int = 0, key: str | None = None) -> str:
    """The action the simulated model answers ``request`` with, as the agent's JSON text. Its random choices are
    drawn from ``seed`` and ``key`` (the caller and how many calls it made: see the simulated provider), or,
    without a key, from the request's text."""
    text = "\n".join(message.content for message in request.messages)
    rng = _rng(request, seed, key)
    scored = [(int(score), code) for pattern in (_SCORED, _REPORTED) for score, code in pattern.findall(text)]
    instance = (_INSTANCE.findall(text) or ["0"])[0]
    offered = {tool.name for tool in request.tools}
    if "submit_artifact" in offered:
        length_found = _LENGTH.findall(text)
        length = int(length_found[0]) if length_found else DEFAULT_LENGTH
        code = propose(scored, max(1, length), rng)
        return json.dumps({"action": {"tool": "submit_artifact",
                                      "args": {"content": f"instance {instance} code {code}"}}})
    if scored:
        score, code = max(scored, key=lambda sc: sc[0])
        # in words of its own: a lead may not hand in a finding's text as its synthesis
        body = (f"Of all the scored attempts reported, the highest reached {score} points; that answer for "
                f"instance {instance} is the code {code}, so it is the one to keep.")
    else:
        body = "No attempt was scored, so there is no best attempt to report."
    return json.dumps({"action": {"tool": "submit_finding", "args": {"title": "best attempt", "body": body}}})
