"""``swarmyard-agent -p PROMPT``: one question to the machine's model, the answer on stdout, like ``claude -p``.

It needs no key: inside a machine made through the Boxd client (or a run) the worker's token and the relay's
address are in its environment (``SWARMYARD_TOKEN``, ``SWARMYARD_PLANE_URL``, ``SWARMYARD_MODEL``), and the
broker charges the call to the machine's task. Exit 0 with the answer; 1 with the broker's refusal on stderr
(``budget_exceeded``, ``context_length``, ...); 2 for a usage error.
"""

from __future__ import annotations

import argparse
import os
import sys

import httpx

from swarmyard.errors import SwarmyardError, UserError
from swarmyard.plane.client import PlaneAddress, decode


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="swarmyard-agent", description=__doc__.split("\n\n")[0])
    parser.add_argument("-p", "--print", dest="prompt", metavar="PROMPT",
                        help="the question; '-' (or none given) reads it from stdin")
    parser.add_argument("--model", default=None, help="the model to ask (default: $SWARMYARD_MODEL)")
    parser.add_argument("--system", default=None, help="a system prompt")
    parser.add_argument("--max-tokens", type=int, default=None, help="the longest answer, in tokens")
    # boxd's scripts pass Claude Code's flag to every agent; there is nothing to skip here
    parser.add_argument("--dangerously-skip-permissions", action="store_true", help=argparse.SUPPRESS)
    return parser


def ask(prompt: str, *, model: str, system: str | None, max_tokens: int | None) -> str:
    """The model's answer to one prompt, through the broker with the machine's token."""
    token = os.environ.get("SWARMYARD_TOKEN")
    if not token:
        raise UserError("SWARMYARD_TOKEN is not set: run this inside a swarmyard machine")
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    body: dict[str, object] = {"model": model, "messages": messages}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    # a CPU model may take minutes for a long answer; the machine's exec timeout bounds the whole command
    with PlaneAddress.from_env(os.environ).client(token, timeout_s=900.0) as http:
        try:
            response = http.post("/v1/chat/completions", json=body)
        except httpx.HTTPError as exc:
            raise UserError(f"cannot reach the model broker: {exc}") from exc
    answer = decode(response)
    if response.status_code >= 400 or not isinstance(answer, dict):
        raise SwarmyardError.from_dict(answer if isinstance(answer, dict) else {}, status=response.status_code)
    return str(answer["choices"][0]["message"].get("content") or "")


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``swarmyard-agent``."""
    args = _parser().parse_args(argv)
    prompt = args.prompt if args.prompt not in (None, "-") else sys.stdin.read()
    model = args.model or os.environ.get("SWARMYARD_MODEL")
    if not prompt.strip():
        sys.stderr.write("swarmyard-agent: the prompt is empty (-p PROMPT, or on stdin)\n")
        return 2
    if not model:
        sys.stderr.write("swarmyard-agent: no model (--model, or SWARMYARD_MODEL)\n")
        return 2
    if args.max_tokens is not None and args.max_tokens <= 0:
        sys.stderr.write("swarmyard-agent: --max-tokens must be positive\n")
        return 2
    try:
        text = ask(prompt, model=model, system=args.system, max_tokens=args.max_tokens)
    except SwarmyardError as exc:
        sys.stderr.write(f"swarmyard-agent: {exc.code}: {exc.message}\n")
        return 1
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
