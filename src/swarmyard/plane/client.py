"""The control plane's client: where it is (:class:`PlaneAddress`) and its worker tools, typed
(:class:`ToolClient`, blocking, and :class:`AsyncToolClient`), used by every caller of ``/v1/tools/*``.

Worker code reads its connection from the environment it was given (never the host's): ``SWARMYARD_TOKEN``
plus ``SWARMYARD_PLANE_SOCKET`` (a Unix socket path) or ``SWARMYARD_PLANE_URL``: one URL, or several replicas'
URLs separated by commas, reached with failover (``swarmyard.plane.failover``).

The tool clients own the tools' paths, the claim's ``task_id`` and ``fencing_token`` (filled into every call
but ``claim_task``, from the last claim) and the reading of each answer into its type of
:mod:`swarmyard.plane.tool_results`; a refusal comes back as the plane's typed error
(``SwarmyardError.from_dict``). They post over any transport with ``post(path, json=...)``: an ``httpx`` client
(:meth:`PlaneAddress.client`), or the built-in agent's :class:`~swarmyard.plane.lean_client.LeanClient`. This
module imports neither httpx nor pydantic until an httpx client is asked for: the agent, started in every
machine, loads it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from swarmyard.domain import Citation, PostKind
from swarmyard.errors import SwarmyardError, UserError
from swarmyard.plane import tool_results as r

if TYPE_CHECKING:
    import httpx

    from swarmyard.plane.lean_client import HttpClient, HttpResponse

T = TypeVar("T")
R = TypeVar("R")

_BASE = "http://plane"


@dataclass(frozen=True, slots=True)
class PlaneAddress:
    """Where the control plane is: a Unix socket path, or the http(s) URLs of its replicas (one or more)."""

    socket_path: str | None = None
    urls: tuple[str, ...] = ()

    @property
    def url(self) -> str | None:
        """The first replica's URL (None for a socket)."""
        return self.urls[0] if self.urls else None

    @classmethod
    def parse(cls, where: str) -> PlaneAddress:
        """``http://...``/``https://...`` is a URL (a comma-separated list: replicas); anything else is a socket
        path."""
        if where.startswith(("http://", "https://")):
            from swarmyard.plane.failover import parse_urls

            return cls(urls=parse_urls(where))
        return cls(socket_path=where)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> PlaneAddress:
        """The address a worker was given in its environment."""
        if env.get("SWARMYARD_PLANE_SOCKET"):
            return cls(socket_path=env["SWARMYARD_PLANE_SOCKET"])
        if env.get("SWARMYARD_PLANE_URL"):
            return cls.parse(env["SWARMYARD_PLANE_URL"])
        raise UserError("set SWARMYARD_PLANE_SOCKET (a Unix socket path) or SWARMYARD_PLANE_URL")

    def async_client(self, token: str, *, timeout_s: float = 60.0) -> httpx.AsyncClient:
        """An async client that sends ``token`` on every request."""
        import httpx

        from swarmyard.plane.failover import AsyncFailoverTransport

        headers = {"authorization": f"Bearer {token}"}
        if self.socket_path is not None:
            return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=self.socket_path), base_url=_BASE,
                                     headers=headers, timeout=timeout_s)
        if len(self.urls) > 1:
            return httpx.AsyncClient(base_url=self.urls[0], transport=AsyncFailoverTransport(self.urls),
                                     headers=headers, timeout=timeout_s)
        return httpx.AsyncClient(base_url=self.url or _BASE, headers=headers, timeout=timeout_s)

    def client(self, token: str, *, timeout_s: float = 60.0) -> httpx.Client:
        """A blocking client that sends ``token`` on every request."""
        import httpx

        from swarmyard.plane.failover import FailoverTransport

        headers = {"authorization": f"Bearer {token}"}
        if self.socket_path is not None:
            return httpx.Client(transport=httpx.HTTPTransport(uds=self.socket_path), base_url=_BASE,
                                headers=headers, timeout=timeout_s)
        if len(self.urls) > 1:
            return httpx.Client(base_url=self.urls[0], transport=FailoverTransport(self.urls), headers=headers,
                                timeout=timeout_s)
        return httpx.Client(base_url=self.url or _BASE, headers=headers, timeout=timeout_s)


def decode(response: httpx.Response | HttpResponse) -> Any:
    """The JSON body of a response (``{"error": ...}`` for errors; non-JSON bodies are wrapped)."""
    try:
        return response.json()
    except (ValueError, RecursionError):  # RecursionError: nested past the parser's stack
        return {"error": {"code": "bad_response", "message": response.text[:500], "retryable": False}}


# -- the worker tools --------------------------------------------------------------------------------------

#: The one tool that names no claim: every other call carries the claim's task and fencing token.
CLAIM = "claim_task"


def tool_path(name: str) -> str:
    """Where the plane serves the worker tool ``name``."""
    return f"/v1/tools/{name}"


@dataclass(frozen=True, slots=True)
class Fence:
    """A claim as every later call names it: the task and the fencing token the claim was issued."""

    task_id: str
    fencing_token: int


class SyncHttpClient(Protocol):
    """What a blocking tool client asks of its transport (an ``httpx.Client`` is one)."""

    def post(self, url: str, *, json: Any = None) -> HttpResponse: ...


class Bearer:
    """A blocking transport over a shared ``httpx.Client`` that sends ``token`` as each request's bearer (an
    operator's client acting for one of its workers)."""

    def __init__(self, http: httpx.Client, token: str) -> None:
        self._http = http
        self._headers = {"authorization": f"Bearer {token}"}

    def post(self, url: str, *, json: Any = None) -> httpx.Response:
        """``POST url`` with ``json`` as this worker."""
        return self._http.post(url, json=json, headers=self._headers)


@dataclass(frozen=True, slots=True)
class ToolCall(Generic[R]):
    """One worker tool call: the tool, its body (without the claim's fields) and the type of its answer."""

    name: str
    body: dict[str, Any]
    result: type[R]


def _call(name: str, result: type[T], **fields: Any) -> ToolCall[T]:
    # a field left out is the server's default (``None`` is never sent: the agent's wire stays as it was)
    return ToolCall(name, {k: v for k, v in fields.items() if v is not None}, result)


def claim_task_call(task_id: str | None = None, *, model: str | None = None,
                    max_tokens: int | None = None) -> ToolCall[r.ClaimResult]:
    """Claim ``task_id``, or any claimable task of the worker's goal and group. ``model`` and ``max_tokens``: what
    the worker's model calls will ask for, so the plane refuses (402) a task that cannot afford one."""
    return _call(CLAIM, r.ClaimResult, task_id=task_id or None, model=model, max_tokens=max_tokens)


def board_read_call(after: int | None = None, limit: int | None = None,
                    kinds: Sequence[PostKind] | None = None) -> ToolCall[r.BoardReadResult]:
    """The group's posts after the cursor ``after``."""
    return _call("board_read", r.BoardReadResult, after=after, limit=limit,
                 kinds=None if kinds is None else [PostKind(k).value for k in kinds])


def board_post_call(body: str, kind: PostKind = PostKind.NOTE) -> ToolCall[r.PostResult]:
    """Append a post to the group's board."""
    return _call("board_post", r.PostResult, kind=PostKind(kind).value, body=body)


def submit_finding_call(title: str, body: str,
                        citations: Sequence[Citation] = ()) -> ToolCall[r.FindingResult]:
    """Record a finding with its citations."""
    return _call("submit_finding", r.FindingResult, title=title, body=body,
                 citations=[c.to_dict() for c in citations])


def read_findings_call(after: str | None = None, limit: int | None = None,
                       broadcast_after: int | None = None) -> ToolCall[r.ReadFindingsResult]:
    """The group's findings after the finding ``after`` and the broadcasts after ``broadcast_after``."""
    return _call("read_findings", r.ReadFindingsResult, after=after, limit=limit, broadcast_after=broadcast_after)


def submit_artifact_call(data: bytes, media_type: str | None = None,
                         split: str | None = None) -> ToolCall[r.ArtifactResult]:
    """Store ``data`` (and have it scored, where the goal has an evaluator)."""
    import base64

    return _call("submit_artifact", r.ArtifactResult, data_base64=base64.b64encode(data).decode("ascii"),
                 media_type=media_type, split=split)


def claim_direction_call(direction: str | None = None) -> ToolCall[r.DirectionResult]:
    """Take ``direction``, or the first free one of the group (``explore``)."""
    return _call("claim_direction", r.DirectionResult, direction=direction)


def delegate_call(title: str, prompt: str | None = None, budget_micro_usd: int | None = None,
                  call_cap: int | None = None, priority: int | None = None) -> ToolCall[r.TaskResult]:
    """A sub-task below the claimed one, its budget carved from the claimed task's envelope."""
    return _call("delegate", r.TaskResult, title=title, prompt=prompt, budget_micro_usd=budget_micro_usd,
                 call_cap=call_cap, priority=priority)


HEARTBEAT = _call("heartbeat", r.HeartbeatResult)
READ_DIRECTIONS = _call("read_directions", r.DirectionsResult)


def _json(response: HttpResponse) -> Any:
    """An answer's JSON (``None`` for an empty body; a ``bad_response`` error body for one that is not JSON)."""
    if not response.content:
        return None
    return decode(response)


class _Claimed:
    """What both faces share, no I/O: the claim a client holds, the body each call sends and what it reads."""

    def __init__(self, fence: Fence | None) -> None:
        #: the claim filled into every call but ``claim_task`` (a field the caller gives wins); set by each claim
        #: that claimed a task
        self.fence = fence

    def _body(self, name: str, body: Mapping[str, Any] | None) -> dict[str, Any]:
        payload = dict(body or {})
        if name != CLAIM and self.fence is not None:
            payload.setdefault("task_id", self.fence.task_id)
            payload.setdefault("fencing_token", self.fence.fencing_token)
        return payload

    def _read(self, name: str, status: int, data: Any) -> Any:
        if name == CLAIM and status == 200:
            # a claim that found nothing claimable ends no claim the caller holds: only a new claim replaces it
            claim = r.parse(r.ClaimResult, data)
            if claim.task is not None and claim.fencing_token is not None:
                self.fence = Fence(claim.task.id, claim.fencing_token)
        return data


def checked(status: int, data: Any) -> Any:
    """``data`` of a 200 answer, or the plane's typed error that an error answer carries."""
    if status >= 400:
        # rebuilt by its code: a stale token stays stale, a busy store retryable
        raise SwarmyardError.from_dict(data if isinstance(data, dict) else {}, status=status)
    return data


class AsyncToolClient(_Claimed):
    """The worker tools over an async transport (the agent's lean client, an ``httpx.AsyncClient``)."""

    def __init__(self, http: HttpClient, fence: Fence | None = None) -> None:
        super().__init__(fence)
        self._http = http

    async def send(self, name: str, body: Mapping[str, Any] | None = None) -> tuple[int, Any]:
        """``POST /v1/tools/{name}`` with the claim filled in: the answer's status and JSON, whatever they are."""
        response = await self._http.post(tool_path(name), json=self._body(name, body))
        return response.status_code, self._read(name, response.status_code, _json(response))

    async def call(self, name: str, body: Mapping[str, Any] | None = None) -> Any:
        """The JSON a tool answers (what an agent shows its model); a refusal raises the plane's typed error."""
        return checked(*await self.send(name, body))

    async def run(self, call: ToolCall[T]) -> T:
        """``call``'s answer, read as its type."""
        return r.parse(call.result, await self.call(call.name, call.body))

    async def claim_task(self, task_id: str | None = None, *, model: str | None = None,
                         max_tokens: int | None = None) -> r.ClaimResult:
        """See :func:`claim_task_call`; the claim made is the one later calls name."""
        return await self.run(claim_task_call(task_id, model=model, max_tokens=max_tokens))

    async def heartbeat(self) -> r.HeartbeatResult:
        """Renew the claim's lease now."""
        return await self.run(HEARTBEAT)

    async def board_read(self, after: int | None = None, limit: int | None = None,
                         kinds: Sequence[PostKind] | None = None) -> r.BoardReadResult:
        """See :func:`board_read_call`."""
        return await self.run(board_read_call(after, limit, kinds))

    async def board_post(self, body: str, kind: PostKind = PostKind.NOTE) -> r.PostResult:
        """See :func:`board_post_call`."""
        return await self.run(board_post_call(body, kind))

    async def submit_finding(self, title: str, body: str,
                             citations: Sequence[Citation] = ()) -> r.FindingResult:
        """See :func:`submit_finding_call`."""
        return await self.run(submit_finding_call(title, body, citations))

    async def read_findings(self, after: str | None = None, limit: int | None = None,
                            broadcast_after: int | None = None) -> r.ReadFindingsResult:
        """See :func:`read_findings_call`."""
        return await self.run(read_findings_call(after, limit, broadcast_after))

    async def submit_artifact(self, data: bytes, media_type: str | None = None,
                              split: str | None = None) -> r.ArtifactResult:
        """See :func:`submit_artifact_call`."""
        return await self.run(submit_artifact_call(data, media_type, split))

    async def claim_direction(self, direction: str | None = None) -> r.DirectionResult:
        """See :func:`claim_direction_call`."""
        return await self.run(claim_direction_call(direction))

    async def read_directions(self) -> r.DirectionsResult:
        """The group's directions, their live holders and best scores."""
        return await self.run(READ_DIRECTIONS)

    async def delegate(self, title: str, prompt: str | None = None, budget_micro_usd: int | None = None,
                       call_cap: int | None = None, priority: int | None = None) -> r.TaskResult:
        """See :func:`delegate_call`."""
        return await self.run(delegate_call(title, prompt, budget_micro_usd, call_cap, priority))


class ToolClient(_Claimed):
    """The worker tools over a blocking transport (an ``httpx.Client``, a :class:`Bearer`)."""

    def __init__(self, http: SyncHttpClient, fence: Fence | None = None) -> None:
        super().__init__(fence)
        self._http = http

    def send(self, name: str, body: Mapping[str, Any] | None = None) -> tuple[int, Any]:
        """``POST /v1/tools/{name}`` with the claim filled in: the answer's status and JSON, whatever they are."""
        response = self._http.post(tool_path(name), json=self._body(name, body))
        return response.status_code, self._read(name, response.status_code, _json(response))

    def call(self, name: str, body: Mapping[str, Any] | None = None) -> Any:
        """The JSON a tool answers; a refusal raises the plane's typed error."""
        return checked(*self.send(name, body))

    def run(self, call: ToolCall[T]) -> T:
        """``call``'s answer, read as its type."""
        return r.parse(call.result, self.call(call.name, call.body))

    def claim_task(self, task_id: str | None = None, *, model: str | None = None,
                   max_tokens: int | None = None) -> r.ClaimResult:
        """See :func:`claim_task_call`; the claim made is the one later calls name."""
        return self.run(claim_task_call(task_id, model=model, max_tokens=max_tokens))

    def heartbeat(self) -> r.HeartbeatResult:
        """Renew the claim's lease now."""
        return self.run(HEARTBEAT)

    def board_read(self, after: int | None = None, limit: int | None = None,
                   kinds: Sequence[PostKind] | None = None) -> r.BoardReadResult:
        """See :func:`board_read_call`."""
        return self.run(board_read_call(after, limit, kinds))

    def board_post(self, body: str, kind: PostKind = PostKind.NOTE) -> r.PostResult:
        """See :func:`board_post_call`."""
        return self.run(board_post_call(body, kind))

    def submit_finding(self, title: str, body: str,
                       citations: Sequence[Citation] = ()) -> r.FindingResult:
        """See :func:`submit_finding_call`."""
        return self.run(submit_finding_call(title, body, citations))

    def read_findings(self, after: str | None = None, limit: int | None = None,
                      broadcast_after: int | None = None) -> r.ReadFindingsResult:
        """See :func:`read_findings_call`."""
        return self.run(read_findings_call(after, limit, broadcast_after))

    def submit_artifact(self, data: bytes, media_type: str | None = None,
                        split: str | None = None) -> r.ArtifactResult:
        """See :func:`submit_artifact_call`."""
        return self.run(submit_artifact_call(data, media_type, split))

    def claim_direction(self, direction: str | None = None) -> r.DirectionResult:
        """See :func:`claim_direction_call`."""
        return self.run(claim_direction_call(direction))

    def read_directions(self) -> r.DirectionsResult:
        """The group's directions, their live holders and best scores."""
        return self.run(READ_DIRECTIONS)

    def delegate(self, title: str, prompt: str | None = None, budget_micro_usd: int | None = None,
                 call_cap: int | None = None, priority: int | None = None) -> r.TaskResult:
        """See :func:`delegate_call`."""
        return self.run(delegate_call(title, prompt, budget_micro_usd, call_cap, priority))
