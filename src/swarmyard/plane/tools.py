"""The worker tools: what a worker may do, checked against its token and its claim.

Every tool runs as one blocking function on a worker thread (token check, rate limit, ownership, lease
renewal and the store call together), so a call costs one hop off the event loop. Every tool but
``claim_task`` names a task and its fencing token: the task must be the caller's own claim in the caller's
goal and group (403 otherwise), and the claim must be current with a live lease (409 otherwise). A call
renews its claim's lease only once it has succeeded: a refused call changes no lease and writes no event.

Every text a worker submits that can hold a token (a post, a finding's title, body and citations' quotes, a
sub-task's title and prompt, an artifact's bytes; a citation's ref and a media type are shorter than any token)
has each capability token this plane signed replaced by ``[capability token]`` before anything checks or stores
it (``TokenAuthority.redact``): an agent can print its own token from its environment, and what is stored goes
on to the report, the dashboard and the lead's prompt.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import re
import threading
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

from swarmyard.auth.tokens import TokenAuthority, WorkerIdentity
from swarmyard.broker import ledger
from swarmyard.broker.admission import RoutePrices
from swarmyard.broker.settings import ModelRoute
from swarmyard.broker.tokencount import REQUEST_OVERHEAD_TOKENS
from swarmyard.clock import Clock
from swarmyard.domain import (
    LEAD_GROUP,
    PLANNER_GROUP,
    Citation,
    CitationKind,
    Claim,
    Finding,
    PostKind,
    TaskSpec,
)
from swarmyard.errors import (
    FencingError,
    ForbiddenError,
    InvalidInputError,
    PayloadTooLargeError,
    StaleFencingTokenError,
    UnoriginalFindingError,
    UnverifiedCitationError,
)
from swarmyard.plane import models as m
from swarmyard.plane.limits import RateLimiter, SharedRateLimiter
from swarmyard.plane.metrics import PlaneMetrics
from swarmyard.plane.settings import PlaneSettings
from swarmyard.plane.sources import Sources
from swarmyard.plane.sources import check as check_sources
from swarmyard.rules import grounding, no_result, originality
from swarmyard.rules.policies import explore_move, explore_order
from swarmyard.store.protocol import LedgerStore, Store

T = TypeVar("T")

#: What ends a line (``str.splitlines``'s breaks: CR, LF, VT, FF, the file/group/record separators, NEL, U+2028,
#: U+2029), a run of them folded into one space in a finding's title.
_LINE_BREAKS = re.compile(r"[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]+")


def _one_line(title: str) -> str:
    """A finding's title as one line: each run of line breaks becomes a space, nothing else changes.

    Folded, not refused: a title is a heading with no file line to check it against (a quote's line break is
    refused because no line of a file holds one), folding loses no word, and a refusal would cost the worker a
    model call to say again what a space mends. What shows a title (the lead's prompt, report.md) still folds it:
    a finding stored before this, or by another door, is shown as one line too."""
    return _LINE_BREAKS.sub(" ", title)


class Offload(Protocol):
    """Runs a blocking store call off the event loop (the app's store threads)."""

    def __call__(self, fn: Callable[[], T], /) -> Awaitable[T]: ...



class Evaluator(Protocol):
    """Anything that scores an artifact for a goal (the evaluator client, or a test double)."""

    async def score(self, goal: str, data: bytes, split: str, /) -> Any:
        """A signed score for ``data``."""
        ...


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One worker tool: its name, request and response models and what it does."""

    name: str
    request: type[BaseModel]
    response: type[BaseModel]
    summary: str


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec("claim_task", m.ClaimTaskRequest, m.ClaimResult, "Claim a task of your goal and group."),
    ToolSpec("heartbeat", m.HeartbeatRequest, m.HeartbeatResult, "Renew the lease on your claim."),
    ToolSpec("board_read", m.BoardReadRequest, m.BoardReadResult, "Read your group's board after a cursor."),
    ToolSpec("board_post", m.BoardPostRequest, m.PostResult,
             "Post a note, direction, progress, failure or question."),
    ToolSpec("submit_finding", m.SubmitFindingRequest, m.FindingResult, "Record a finding with citations."),
    ToolSpec("read_findings", m.ReadFindingsRequest, m.ReadFindingsResult,
             "Read your group's findings and the consolidations broadcast to all groups."),
    ToolSpec("submit_artifact", m.SubmitArtifactRequest, m.ArtifactResult,
             "Submit an artifact (base64); scored when an evaluator is configured."),
    ToolSpec("claim_direction", m.ClaimDirectionRequest, m.DirectionResult,
             "explore: take a direction no live peer holds (the one named, or the first free one)."),
    ToolSpec("read_directions", m.ReadDirectionsRequest, m.DirectionsResult,
             "explore: the group's directions, who holds each and its best score."),
    ToolSpec("delegate", m.DelegateRequest, m.TaskResult,
             "Create a sub-task below yours, its budget carved from your task's envelope."),
)
TOOL_NAMES = frozenset(spec.name for spec in TOOLS)

_CACHE_CAP = 200_000
_Stored = tuple[WorkerIdentity, bytes, m.ArtifactResult]


def jsonable(value: Any) -> Any:
    """A score (dataclass, pydantic model, dict) as plain JSON values; bytes become base64."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return value


class CallFloor:
    """The least a model call through the broker holds, in micro-USD: what a task's envelope must afford for its
    claim to be worth making (``claim(min_slice_micro_usd=)``). The broker's own worst case (``ledger.worst_case``,
    at the store's price, else the route's default, as admission reads them) of the smallest request it admits:
    ``REQUEST_OVERHEAD_TOKENS`` of input (what every request's input bound counts before any message) and as few
    output tokens as that request can be held at.

    A goal or a task carries no model: the claim's caller names the one it will call, and the ``max_tokens`` it
    will ask for, when it knows them (the built-in agent does). Its calls are then held at least at
    ``min(max_tokens, the route's max_output_tokens)`` output tokens, or at ``min_output_tokens`` where the route
    knows its context window (a full window holds less, down to that floor). Otherwise (no model named, or one the
    broker does not route) the cheapest honest bound: one output token (a request may ask for no more) at the
    cheapest model the broker routes. A slice below the floor can make no call at all; one above it may still be
    refused at its first call, whose input is known only then. 0 with no priced route."""

    def __init__(self, store: LedgerStore, routes: Sequence[ModelRoute], min_output_tokens: int, clock: Clock) -> None:
        self._store = store
        self._routes = {route.name: route for route in routes}
        self._min_output = min_output_tokens
        self._clock = clock
        self._prices = RoutePrices(store, clock.now)

    def __call__(self, model: str | None = None, max_tokens: int | None = None) -> int:
        route = self._routes.get(model) if model is not None else None
        if route is None:
            return min((ledger.worst_case(REQUEST_OVERHEAD_TOKENS, 1, self._prices.of(r)) for r in self._routes.values()),
                       default=0)
        output = min(max_tokens or 1, route.max_output_tokens)
        if route.context_tokens is not None:
            output = min(output, self._min_output)
        return ledger.worst_case(REQUEST_OVERHEAD_TOKENS, output, self._prices.of(route))



def _no_floor(model: str | None = None, max_tokens: int | None = None) -> int:
    del model, max_tokens
    return 0


class WorkerTools:
    """The tool implementations over a store, a token authority and the plane's limits."""

    def __init__(self, store: Store, tokens: TokenAuthority, settings: PlaneSettings, clock: Clock,
                 metrics: PlaneMetrics, evaluator: Evaluator | None = None, sources: Sources | None = None) -> None:
        self._store = store
        #: the files each task's worker was given, against which its source citations are checked
        self._sources = sources
        self._tokens = tokens
        self._settings = settings
        self._clock = clock
        self._metrics = metrics
        self._evaluator = evaluator
        # one shared bucket per worker where replicas share the store (see swarmyard.plane.limits)
        self._limiter: RateLimiter | SharedRateLimiter = (
            RateLimiter(settings.rate_per_s, settings.rate_burst, clock) if store.single_writer
            else SharedRateLimiter(store, settings.rate_per_s, settings.rate_burst, clock))
        # (task_id, fencing token) -> worker id. A fencing token is issued once, to one worker, for one task,
        # so this mapping never changes and may be cached without ever going stale.
        self._owners: dict[tuple[str, int], str] = {}
        self._renewed: dict[tuple[str, int], float] = {}
        self._lock = threading.Lock()
        #: the least one model call holds (a :class:`CallFloor` where a broker is mounted): a claim of a task whose
        #: envelope cannot afford it is refused (402 budget_exceeded) rather than made
        self.call_floor: Callable[[str | None, int | None], int] = _no_floor

    def floor_claims(self, routes: Sequence[ModelRoute], min_output_tokens: int) -> None:
        """Refuse a claim whose task cannot afford the least call through a broker's routes (see
        :class:`CallFloor`)."""
        self.call_floor = CallFloor(self._store, routes, min_output_tokens, self._clock)

    # -- shared checks ------------------------------------------------------------------------------------
    def call(self, tool: Callable[[], T], /) -> T:
        """Run one blocking tool call: with the store's shared buckets, its rate token is taken in its own first
        write transaction (one write per call; see ``SharedRateLimiter``)."""
        if isinstance(self._limiter, SharedRateLimiter):
            with self._limiter.calls():
                return tool()
        return tool()

    def authenticate(self, token: str) -> WorkerIdentity:
        """Verify a worker token and take one rate-limit token for its worker."""
        who = self._tokens.verify(token)
        self._limiter.acquire(who.worker_id)
        return who

    def _own(self, who: WorkerIdentity, task_id: str, token: int) -> None:
        key = (task_id, token)
        owner = self._owners.get(key)
        if owner is None:
            task = self._store.get_task(task_id)
            if task.goal_id != who.goal_id or task.group != who.group:
                raise ForbiddenError(f"task {task_id} is outside worker {who.worker_id}'s goal and group",
                                     task_id=task_id, worker_id=who.worker_id)
            if task.fencing_token != token:
                raise StaleFencingTokenError(task_id, token, task.fencing_token)
            owner = task.worker_id or ""
            self._remember(key, owner)
        if owner != who.worker_id:
            raise ForbiddenError(f"task {task_id} is not claimed by worker {who.worker_id}",
                                 task_id=task_id, worker_id=who.worker_id)

    def _remember(self, key: tuple[str, int], owner: str) -> None:
        with self._lock:
            if len(self._owners) >= _CACHE_CAP:
                self._owners.clear()
                self._renewed.clear()
            self._owners[key] = owner

    def _renew(self, task_id: str, token: int) -> Claim:
        """Renew the lease now (``heartbeat``): a stale or lapsed claim is refused and nothing is written."""
        claim = self._store.renew(task_id, token, self._settings.lease_s)
        self._renewed[(task_id, token)] = self._clock.now()
        return claim

    def _renew_after(self, task_id: str, token: int, *, wrote: bool = False) -> None:
        """The call succeeded: renew its lease, or skip it within ``renew_min_interval_s`` of the last renewal.

        Called last, once the tool's work is done: a call refused anywhere (its body, a quota, a citation, a
        depth, the evaluator's store) renews nothing and writes no ``task.renewed`` event. After a write (which
        checked the claim in its own transaction), a claim that lapsed in between keeps the write: the caller
        gets its result and hears of the lapse on its next call.
        """
        key = (task_id, token)
        now = self._clock.now()
        interval = self._settings.renew_min_interval_s
        last = self._renewed.get(key)
        if interval > 0 and last is not None and now - last < interval:
            return
        try:
            self._store.renew(task_id, token, self._settings.lease_s)
        except FencingError:
            if not wrote:
                raise
            return
        self._renewed[key] = now

    def _fenced(self, token: str, task_id: str, fencing_token: int, *, write: bool = False) -> WorkerIdentity:
        """Authenticate and check that the task is the caller's current claim; renew nothing (``_renew_after``).

        ``write``: the caller is about to make a store write, which checks the fencing token and the lease
        inside its own transaction (and refuses with the same typed errors): a check here would repeat it.
        """
        who = self.authenticate(token)
        self._own(who, task_id, fencing_token)
        if not write:
            self._store.check_fence(task_id, fencing_token)
        return who

    # -- tools (blocking; the app runs them on a worker thread) -------------------------------------------
    def claim_task(self, token: str, req: m.ClaimTaskRequest) -> m.ClaimResult:
        """Claim the named task, or the next claimable one of the worker's goal and group."""
        who = self.authenticate(token)
        if req.task_id is not None:
            task = self._store.get_task(req.task_id)
            if task.goal_id != who.goal_id or task.group != who.group:
                raise ForbiddenError(f"task {req.task_id} is outside worker {who.worker_id}'s goal and group",
                                     task_id=req.task_id, worker_id=who.worker_id)
        claim = self._store.claim(who.goal_id, who.worker_id, self._settings.lease_s, task_id=req.task_id,
                                  group=who.group, min_slice_micro_usd=self.call_floor(req.model, req.max_tokens),
                                  calls=True)  # a worker calls models: a task with no call left is not handed out
        if claim is None:
            return m.ClaimResult.model_construct(task=None, fencing_token=None, lease_expires_at=None)
        self._remember((claim.task.id, claim.token), who.worker_id)
        self._renewed[(claim.task.id, claim.token)] = self._clock.now()
        return m.ClaimResult.model_construct(task=claim.task, fencing_token=claim.token,
                                             lease_expires_at=claim.expires_at)

    def heartbeat(self, token: str, req: m.HeartbeatRequest) -> m.HeartbeatResult:
        """Renew the lease now (never skipped)."""
        who = self.authenticate(token)
        self._own(who, req.task_id, req.fencing_token)
        claim = self._renew(req.task_id, req.fencing_token)
        return m.HeartbeatResult.model_construct(task_id=req.task_id, fencing_token=req.fencing_token,
                                                 lease_expires_at=claim.expires_at)

    def board_read(self, token: str, req: m.BoardReadRequest) -> m.BoardReadResult:
        """The worker's group's posts after ``after``."""
        who = self._fenced(token, req.task_id, req.fencing_token)
        posts = self._store.read_board(who.goal_id, after=req.after, limit=req.limit, group=who.group,
                                       kinds=req.kinds)
        self._renew_after(req.task_id, req.fencing_token)
        return m.BoardReadResult.model_construct(posts=posts, cursor=posts[-1].seq if posts else req.after)

    def board_post(self, token: str, req: m.BoardPostRequest) -> m.PostResult:
        """Append a post to the worker's group's board."""
        if req.kind is PostKind.CONSOLIDATION:
            raise ForbiddenError("consolidation posts come from the coordinator, not from workers")
        size = len(req.body.encode())
        if size > self._settings.max_post_bytes:
            raise PayloadTooLargeError("post", size, self._settings.max_post_bytes)
        who = self._fenced(token, req.task_id, req.fencing_token, write=True)
        post = self._store.post(req.task_id, req.fencing_token, req.kind, self._tokens.redact(req.body),
                                author=who.worker_id, group=who.group)
        self._metrics.board_posts.inc()
        self._renew_after(req.task_id, req.fencing_token, wrote=True)
        return m.PostResult.model_construct(post=post)

    def submit_finding(self, token: str, req: m.SubmitFindingRequest) -> m.FindingResult:
        """Record a finding under the worker's claim; its title is stored as one line (:func:`_one_line`), so the
        lead's prompt, the report and the dashboard all show it as stored."""
        who = self._fenced(token, req.task_id, req.fencing_token, write=True)
        redact = self._tokens.redact
        body = redact(req.body)
        citations = tuple(Citation(c.kind, c.ref, redact(c.quote)) for c in req.citations)
        if who.group == LEAD_GROUP:
            self._check_synthesis(req.task_id, who.goal_id, body, citations)
        if self._sources is not None or any(c.kind is CitationKind.SOURCE for c in citations):
            # checked before it is stored: a quote the task's files do not hold is refused with the reason
            check_sources(self._sources, self._store.get_task(req.task_id), citations, body=body)
        finding = self._store.submit_finding(req.task_id, req.fencing_token, author=who.worker_id,
                                             title=redact(_one_line(req.title)), body=body, citations=citations)
        self._renew_after(req.task_id, req.fencing_token, wrote=True)
        return m.FindingResult.model_construct(finding=finding)

    def _check_synthesis(self, task_id: str, goal_id: str, body: str, citations: tuple[Citation, ...]) -> None:
        """The built-in agent's copy check, held here too: the lead's shell can read the agent's token and call
        the plane itself, so what the lead submits is checked where it is stored. Then its grounding: a finding
        it names must be a real one that reached a result, and in a grounded run (``cite_files``) every claim
        names one and the line on tasks that reached nothing says what the store says (``rules.grounding``)."""
        findings: list[Finding] = []
        after: str | None = None
        while page := self._store.read_findings(goal_id, after=after, limit=500):
            findings += [f for f in page if f.group != LEAD_GROUP]
            after = page[-1].id
        if no_result.is_placeholder(body):
            return  # the agent's own placeholder: it claims nothing, so it copies nothing
        # a task's placeholder claims nothing, so the synthesis cannot copy it (and says which tasks left one)
        read = {f.id: f.body for f in findings if not no_result.is_placeholder(f.body)}
        # Not the task's prompt: a lead's prompt holds every finding, so any synthesis that quotes one would
        # "restate" it; the copy checks against the findings themselves are the ones that hold here.
        why = originality.problem(body, read=read)
        if why is not None:
            raise UnoriginalFindingError(task_id, why)
        note = None
        if self._sources is not None:
            tasks = [t for t in self._store.list_tasks(goal_id) if t.group != PLANNER_GROUP]
            note = grounding.nothing_found(grounding.outcomes(tasks, findings, (LEAD_GROUP,)))
        titles = {f.id: f.title for f in findings if f.id in read}
        bad = grounding.problem(body, [c.ref for c in citations if c.kind is CitationKind.FINDING], titles,
                                [f.id for f in findings if f.id not in read], note)
        if bad is not None:
            raise UnverifiedCitationError(task_id, *bad)

    def read_findings(self, token: str, req: m.ReadFindingsRequest) -> m.ReadFindingsResult:
        """The group's findings plus the consolidations broadcast to every group."""
        who = self._fenced(token, req.task_id, req.fencing_token)
        findings = self._store.read_findings(who.goal_id, group=who.group, after=req.after, limit=req.limit)
        broadcasts = self._store.read_board(who.goal_id, after=req.broadcast_after, limit=req.limit,
                                            kinds=[PostKind.CONSOLIDATION])
        self._renew_after(req.task_id, req.fencing_token)
        return m.ReadFindingsResult.model_construct(
            findings=findings, cursor=findings[-1].id if findings else req.after, broadcasts=broadcasts,
            broadcast_cursor=broadcasts[-1].seq if broadcasts else req.broadcast_after)

    def _artifact_bytes(self, req: m.SubmitArtifactRequest) -> bytes:
        """The artifact's bytes, or ``InvalidInputError`` before anything is checked or stored."""
        try:
            data = base64.b64decode(req.data_base64, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidInputError("data_base64 is not valid base64", field="data_base64") from exc
        data = self._tokens.redact_bytes(data)  # scored as stored: the artifact without the token
        if req.split != "search":  # the holdout is the coordinator's, answered once per goal
            raise InvalidInputError(f"split {req.split!r} cannot be scored by a worker; only 'search' (the "
                                    "holdout is answered once per goal, to the run)", field="split")
        return data

    def put_artifact(self, token: str, req: m.SubmitArtifactRequest) -> _Stored:
        """Store the artifact (no evaluator: the whole call)."""
        data = self._artifact_bytes(req)
        who = self._fenced(token, req.task_id, req.fencing_token, write=True)
        artifact = self._store.put_artifact(req.task_id, req.fencing_token, data, author=who.worker_id,
                                            media_type=req.media_type)
        self._renew_after(req.task_id, req.fencing_token, wrote=True)
        return who, data, m.ArtifactResult.model_construct(artifact=artifact, score=None)

    async def submit_artifact(self, token: str, req: m.SubmitArtifactRequest,
                              offload: Offload) -> m.ArtifactResult:
        """Store the artifact and, with an evaluator, return its signed score.

        With an evaluator the score comes first: the claim is checked (no write), the evaluator is asked, and
        only a scored artifact is stored, with its score and the lease's renewal. An artifact the evaluator
        refuses (another goal's evaluator, a bundle that cannot score it) leaves no row, no event and no lease
        moved; a claim lost while it was scored refuses the store's write as any other stale write."""
        evaluator = self._evaluator
        if evaluator is None:
            return (await offload(lambda: self.put_artifact(token, req)))[2]

        def checked() -> tuple[WorkerIdentity, bytes]:
            data = self._artifact_bytes(req)
            return self._fenced(token, req.task_id, req.fencing_token), data

        who, data = await offload(checked)
        score = jsonable(await evaluator.score(who.goal_id, data, req.split))

        def record() -> tuple[m.ArtifactResult, m.DirectionMove | None]:
            artifact = self._store.put_artifact(req.task_id, req.fencing_token, data, author=who.worker_id,
                                                media_type=req.media_type)
            self._renew_after(req.task_id, req.fencing_token, wrote=True)
            # A signed score is a state change of the run: it goes into the audit log like every other.
            self._store.record_event("score.issued", {"goal": who.goal_id, "task": req.task_id,
                                                      "worker": who.worker_id, "score": score})
            stored = m.ArtifactResult.model_construct(artifact=artifact, score=score)
            value = score.get("score") if isinstance(score, dict) else None
            if isinstance(value, bool) or not isinstance(value, int):
                return stored, None
            self._store.record_score(who.goal_id, artifact.sha256, value, split=req.split,
                                     task_id=req.task_id, worker_id=who.worker_id)
            return stored, self._explore_move(who, req.task_id, req.fencing_token)

        stored, move = await offload(record)
        return m.ArtifactResult.model_construct(artifact=stored.artifact, score=score, direction=move)

    def _explore_move(self, who: WorkerIdentity, task_id: str, fencing_token: int) -> m.DirectionMove | None:
        """Under ``explore``: stay, switch or adopt after a scored attempt, taking the new direction for the
        worker in the store (it stays where it is if a peer took that one first)."""
        settings = self._store.explore_settings(who.goal_id, who.group)
        if settings is None:
            return None
        directions = self._store.list_directions(who.goal_id, who.group)
        held = next((d for d in directions if d.holder == who.worker_id and d.task_id == task_id), None)
        if held is None:
            return None
        scores = [s for s in self._store.list_scores(who.goal_id) if s.group == who.group]
        mine = [s for s in scores if s.worker_id == who.worker_id]
        peer_best: dict[str, int] = {}
        for s in scores:
            if s.worker_id != who.worker_id and s.direction is not None:
                peer_best[s.direction] = max(s.score, peer_best.get(s.direction, s.score))
        attempts = [s.score for s in mine if s.task_id == task_id and s.direction == held.name
                    and held.taken_at is not None and s.created_at >= held.taken_at]
        tried = list(dict.fromkeys(s.direction for s in mine if s.direction is not None))
        move = explore_move(held.name, attempts, directions, who.worker_id, tried, peer_best, settings.patience,
                            settings.adopt_margin)
        target, reason = move.direction, move.reason
        if target != held.name:
            # a switch falls back on the next free direction in order when a peer took the first meanwhile
            taken = self._store.claim_direction(task_id, fencing_token, [target, *move.fallbacks],
                                                author=who.worker_id)
            target, reason = (taken.name, reason) if taken is not None else (held.name, "stay")
        return m.DirectionMove.model_construct(direction=target, previous=held.name, reason=reason, best=move.best,
                                               stale=move.stale, patience=move.patience)

    def claim_direction(self, token: str, req: m.ClaimDirectionRequest) -> m.DirectionResult:
        """Take the named direction, or the first free one of the group (those the worker has not scored on
        first); ``direction: null`` when none is free."""
        # checked first: with no free direction it writes nothing, and nothing else would check the claim
        who = self._fenced(token, req.task_id, req.fencing_token)
        directions = self._store.list_directions(who.goal_id, who.group)
        if req.direction is not None:
            names = [req.direction]
        else:
            tried = [s.direction for s in self._store.list_scores(who.goal_id, worker_id=who.worker_id)
                     if s.direction is not None]
            names = explore_order(directions, who.worker_id, tried)
        taken = (self._store.claim_direction(req.task_id, req.fencing_token, names, author=who.worker_id)
                 if names else None)
        self._renew_after(req.task_id, req.fencing_token, wrote=taken is not None)
        return m.DirectionResult.model_construct(direction=taken,
                                                 directions=self._store.list_directions(who.goal_id, who.group))

    def read_directions(self, token: str, req: m.ReadDirectionsRequest) -> m.DirectionsResult:
        """The group's directions, their live holders and best scores."""
        who = self._fenced(token, req.task_id, req.fencing_token)
        directions = self._store.list_directions(who.goal_id, who.group)
        self._renew_after(req.task_id, req.fencing_token)
        return m.DirectionsResult.model_construct(directions=directions)

    def delegate(self, token: str, req: m.DelegateRequest) -> m.TaskResult:
        """A sub-task one level below the caller's, in the caller's group."""
        who = self._fenced(token, req.task_id, req.fencing_token, write=True)
        redact = self._tokens.redact
        spec = TaskSpec(title=redact(req.title), prompt=redact(req.prompt), group=who.group,
                        budget_micro_usd=req.budget_micro_usd, call_cap=req.call_cap, parent_id=req.task_id,
                        priority=req.priority)
        task = self._store.delegate(req.task_id, req.fencing_token, spec)
        self._renew_after(req.task_id, req.fencing_token, wrote=True)
        return m.TaskResult.model_construct(task=task)

    def forget_worker(self, worker_id: str) -> None:
        """Drop cached ownership of a revoked worker (its token is refused anyway; this frees memory)."""
        with self._lock:
            for key in [k for k, v in self._owners.items() if v == worker_id]:
                del self._owners[key]
                self._renewed.pop(key, None)
