"""The client the control plane uses to reach the evaluator over its Unix socket, sync and async.

    with EvaluatorClient("/run/swarmyard/eval.sock") as evaluator:
        signed = evaluator.score(goal_id, artifact_bytes)        # SignedScore, verifiable by anyone

Failures arrive as the same typed errors the evaluator raised (``HoldoutUsedError``, ``ScoringLimitError``,
...); a socket that cannot be reached is ``EvaluatorUnavailableError`` (retryable).
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx

from swarmyard.errors import EvaluatorError, EvaluatorUnavailableError, SwarmyardError
from swarmyard.evaluator.score import SignedScore

DEFAULT_TIMEOUT_S = 300.0
_BASE = "http://evaluator"


def _error_from(response: httpx.Response) -> SwarmyardError:
    """Rebuild the typed error the evaluator answered with (``SwarmyardError.from_dict``, by its code)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("error"), dict):
        return EvaluatorError(f"the evaluator answered HTTP {response.status_code} without an error body")
    error = SwarmyardError.from_dict(body, status=response.status_code)
    if type(error) is SwarmyardError:
        # a code this client does not know is still the evaluator's failure
        return EvaluatorError(f"{error.code}: {error.message}", retryable=error.retryable)
    return error


def _signed(response: httpx.Response) -> SignedScore:
    if response.status_code != 200:
        raise _error_from(response)
    try:
        data = response.json()
    except ValueError as exc:
        raise EvaluatorError("the evaluator answered with invalid JSON") from exc
    return SignedScore.from_dict(data)


def _public_key(response: httpx.Response) -> bytes:
    if response.status_code != 200:
        raise _error_from(response)
    try:
        return base64.b64decode(response.json()["public_key"], validate=True)
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise EvaluatorError("the evaluator answered with no valid public key") from exc


class EvaluatorClient:
    """A blocking client for one evaluator socket."""

    def __init__(self, socket_path: str | Path, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self._http = httpx.Client(transport=httpx.HTTPTransport(uds=str(socket_path)), base_url=_BASE,
                                  timeout=httpx.Timeout(timeout_s, connect=5.0))

    def _post(self, url: str, params: dict[str, str], artifact: bytes) -> httpx.Response:
        try:
            return self._http.post(url, params=params, content=artifact,
                                   headers={"content-type": "application/octet-stream"})
        except httpx.TransportError as exc:
            raise EvaluatorUnavailableError(f"the evaluator cannot be reached: {exc}") from exc

    def score(self, goal: str, artifact: bytes, split: str = "search") -> SignedScore:
        """Score ``artifact`` on ``split`` and return the signed score."""
        return _signed(self._post("/v1/score", {"goal": goal, "split": split}, artifact))

    def final_holdout(self, goal: str, artifact: bytes) -> SignedScore:
        """The goal's one final holdout score; ``HoldoutUsedError`` on every later call."""
        return _signed(self._post("/v1/holdout", {"goal": goal}, artifact))

    def public_key(self) -> bytes:
        """The evaluator's raw 32-byte Ed25519 public key."""
        try:
            return _public_key(self._http.get("/v1/public-key"))
        except httpx.TransportError as exc:
            raise EvaluatorUnavailableError(f"the evaluator cannot be reached: {exc}") from exc

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class AsyncEvaluatorClient:
    """The same client for asyncio code."""

    def __init__(self, socket_path: str | Path, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        transport = httpx.AsyncHTTPTransport(uds=str(socket_path))
        self._http = httpx.AsyncClient(transport=transport, base_url=_BASE,
                                       timeout=httpx.Timeout(timeout_s, connect=5.0))

    async def _post(self, url: str, params: dict[str, str], artifact: bytes) -> httpx.Response:
        try:
            return await self._http.post(url, params=params, content=artifact,
                                         headers={"content-type": "application/octet-stream"})
        except httpx.TransportError as exc:
            raise EvaluatorUnavailableError(f"the evaluator cannot be reached: {exc}") from exc

    async def score(self, goal: str, artifact: bytes, split: str = "search") -> SignedScore:
        """Score ``artifact`` on ``split`` and return the signed score."""
        return _signed(await self._post("/v1/score", {"goal": goal, "split": split}, artifact))

    async def final_holdout(self, goal: str, artifact: bytes) -> SignedScore:
        """The goal's one final holdout score; ``HoldoutUsedError`` on every later call."""
        return _signed(await self._post("/v1/holdout", {"goal": goal}, artifact))

    async def public_key(self) -> bytes:
        """The evaluator's raw 32-byte Ed25519 public key."""
        try:
            return _public_key(await self._http.get("/v1/public-key"))
        except httpx.TransportError as exc:
            raise EvaluatorUnavailableError(f"the evaluator cannot be reached: {exc}") from exc

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()
