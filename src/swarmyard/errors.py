"""Every error swarmyard raises, in one tree.

    SwarmyardError                      root; ``status`` is the HTTP status the control plane answers with
    ├── UserError                       you misused swarmyard (bad config, bad arguments); not retryable
    │   ├── ConfigError                 a swarm file or setting is invalid; names the field
    │   ├── InsecureSecretError         a secret file others can read or that is not the user's (``path``)
    │   ├── InsecureRootError           a machines root another user owns or others may write (``path``)
    │   ├── CampaignRecordError         a campaign folder's record line is malformed or a trial twice (``path``, ``line``)
    │   └── CampaignBusyError           another process runs the campaign in this folder (``folder``)
    ├── InvalidInputError (400)         a request or call argument is malformed
    │   ├── ContextLengthError (400)    the conversation leaves the model no room to answer (``model``, ...)
    │   ├── NestingTooDeepError (400)   a JSON body nested deeper than the fixed limit (``limit``)
    │   ├── UnoriginalFindingError (400) a lead's finding that copies, loops or says back (``task_id``, ``reason``)
    │   └── UnverifiedCitationError (400) a finding quotes a source line that does not hold the quote (``ref``, ...)
    ├── NotFoundError (404)             an id that does not exist (``kind``, ``id``)
    ├── PayloadTooLargeError (413)      a post, artifact or body over its limit (``what``, ``size``, ``limit``)
    │   └── QuotaExceededError (413)    a goal's or task's artifacts or board past their total (``used``, ...)
    ├── AuthError
    │   ├── InvalidTokenError (401)     forged, malformed, expired or revoked capability token
    │   ├── ForbiddenError (403)        a valid token used outside its scope (other goal, other group)
    │   │   ├── DepthExceededError      a delegation past the goal's maximum depth
    │   │   └── CrossSiteError (403)    a dashboard form posted from another site (``origin``)
    │   └── MisdirectedRequestError (421) a dashboard request over TCP naming a host it is not served as (``host``)
    ├── RateLimitedError (429)          too many calls; ``retry_after_s`` says when to retry
    ├── StoreError
    │   ├── StoreBusyError (503)        a no-wait store call found the write lock taken; nothing was done; retryable
    │   ├── StoreLostError (503)        the store's connection was lost mid-call: whether it took effect is unknown
    │   ├── FencingError (409)          a write for a task whose claim is no longer the caller's
    │   │   ├── StaleFencingTokenError  the presented token is older than the task's current one
    │   │   └── LeaseExpiredError       the token is current but the lease ran out (or the claim ended)
    │   ├── IllegalTransitionError (409) a state change the transition table forbids
    │   ├── ConflictError (409)         a uniqueness or ordering conflict
    │   │   ├── DuplicateOfUnknownError  the same body again after its call went ``unknown`` (``reservation_id``)
    │   │   └── NoFindingError          a task asked to complete that has no finding (``task_id``)
    │   └── MigrationError              the schema is newer than this code, or a migration failed
    ├── BudgetError
    │   ├── BudgetExceededError (402)   an envelope cannot afford the worst case (``envelope``, ``needed``, ``available``)
    │   │   └── NoCallsLeftError (402)  a claim refused: its task has no model call left (``envelope``, ``cap``, ``goal_id``)
    │   ├── CallCapExceededError (429)  a task or goal used all its model calls
    │   └── DeadlinePassedError (403)   the goal's deadline has passed
    ├── SandboxError                    a machine could not be made, run or torn down as asked
    │   ├── SandboxUnavailableError     the host lacks what the requested isolation needs (with an install hint)
    │   ├── MachineNotRunningError (409) the machine's init is gone (killed from inside): only delete (``machine_id``)
    │   ├── MachineNotRespondingError (409) the machine's init is stopped or did not answer in time (``machine_id``)
    │   ├── OutOfResourcesError (503)   this process ran out of open files or memory for a machine call; retryable
    │   ├── MachinesBusyError (503)     the machine calls' bodies in memory are at their budget; retryable
    │   └── MachineRefusedError (400)   the machine refused what was asked of it: a file that is no regular file it may
    │                                   read, a command it cannot run (``field``, ``errno``)
    ├── ProviderError (502)             a model provider failed; ``retryable`` says whether a retry may help
    │   ├── UpstreamUnknownError (502)  the request left and the answer was lost: the cost is unknown, never retry
    │   └── UpstreamLostError (502)     the answer was lost after the request left: dropped, timed out, cut, garbled
    ├── EvaluatorError                  the evaluator refused or failed
    │   ├── HoldoutUsedError (409)      ``final_holdout`` was already answered for this goal
    │   ├── BundleError                 an evaluator bundle or its evaluator.toml is malformed; names the field
    │   ├── ScoringError (422)          the scoring code failed or printed no integer (``reason``)
    │   │   └── ScoringLimitError (422) the scoring code was killed by a limit (``limit``: wall_time, cpu_time, ...)
    │   └── EvaluatorUnavailableError (503) the evaluator's socket cannot be reached; retryable
    ├── AuditError                      the audit log, a checkpoint or a cosignature does not verify
    │   ├── InvalidProofError           a Merkle inclusion or consistency proof does not verify (``reason``)
    │   ├── InvalidSignatureError       a signed note, checkpoint or cosignature is malformed or forged
    │   ├── WitnessRefusedError (409)   the witness refused a checkpoint: fork, rewrite, stale size (``origin``)
    │   └── LogMismatchError            a run's log fails verification at ``what`` number ``index``
    ├── ToolError (422)                 a tool call an agent made failed (``tool``, ``reason``); the agent carries on
    │   ├── ToolRefusedError (403)      a tool the worker's profile does not offer (``profile``)
    │   └── WasiTrapError (422)         a WASI tool stopped by a cap (``limit``: fuel, memory, wall_time, output)
    └── MissingExtraError               an optional dependency is not installed; says what to ``pip install``

Every error carries ``code`` (a stable snake_case name), ``status`` and ``retryable`` and renders to JSON with
``to_dict()``; the ids involved are attributes, so callers never parse messages. ``SwarmyardError.from_dict()``
is its mirror on the other side of the wire: the body's ``code`` names the class, and the message, ``retryable``
and every detail come back as they left (each attribute an error carries is one of its details).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any


class SwarmyardError(Exception):
    """Root of every error swarmyard raises on purpose."""

    code: str = "swarmyard_error"
    status: int = 500
    retryable: bool = False  # the class's default; an instance may say otherwise (a 429 may be retried, a drop never)

    def __init__(self, message: str, *, retryable: bool | None = None, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = type(self).retryable if retryable is None else retryable
        self.details: dict[str, Any] = details

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__:
            taken = _BY_CODE.setdefault(cls.code, cls)
            if taken is not cls:
                raise TypeError(f"{cls.__name__} and {taken.__name__} share the error code {cls.code!r}")

    def to_dict(self) -> dict[str, Any]:
        """The error as the JSON body the control plane answers with."""
        return {"error": {"code": self.code, "message": self.message, "retryable": self.retryable, **self.details}}

    @staticmethod
    def from_dict(body: Mapping[str, Any], *, status: int | None = None) -> SwarmyardError:
        """The error a ``to_dict()`` body describes, rebuilt as its own class (chosen by ``code``).

        A code this side does not know (a newer peer, a proxy, the plane's ``internal_error``) comes back as a
        plain ``SwarmyardError`` that keeps the code, the message, ``retryable`` and ``status`` (when given).
        """
        raw = body.get("error")
        error: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        given, message, flag = error.get("code"), error.get("message"), error.get("retryable")
        code = given if isinstance(given, str) and given else "bad_response"  # not an error body at all
        text = message if isinstance(message, str) else f"{code} (no message)"
        retryable = flag if isinstance(flag, bool) else None
        details = {k: v for k, v in error.items() if k not in ("code", "message", "retryable")}
        kind = _BY_CODE.get(code, SwarmyardError)
        # The class's own __init__ formats a message from its fields; the message that crossed the wire is
        # already formatted, so the instance is made without it and given what to_dict() carried.
        made = kind.__new__(kind)
        SwarmyardError.__init__(made, text, retryable=retryable)
        made.details = details  # set, not passed as keywords: a body's keys are the peer's to choose
        for name in _fields(kind):
            setattr(made, name, details.get(name))
        if code not in _BY_CODE:
            made.code = code
            if status is not None:
                made.status = status
        return made


_BY_CODE: dict[str, type[SwarmyardError]] = {SwarmyardError.code: SwarmyardError}


_FIELDS: dict[type[SwarmyardError], tuple[str, ...]] = {}


def _fields(kind: type[SwarmyardError]) -> tuple[str, ...]:
    """The attributes an error class carries: the named parameters of its and its bases' ``__init__``."""
    if kind in _FIELDS:
        return _FIELDS[kind]
    names: list[str] = []
    for klass in kind.__mro__:
        init = klass.__dict__.get("__init__")
        if klass is SwarmyardError or not issubclass(klass, SwarmyardError) or init is None:
            continue
        for parameter in inspect.signature(init).parameters.values():
            if parameter.name not in ("self", "message", "retryable", *names) and parameter.kind not in (
                    inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL):
                names.append(parameter.name)
    _FIELDS[kind] = tuple(names)
    return _FIELDS[kind]


class UserError(SwarmyardError):
    """swarmyard was used in a way it does not support."""

    code = "user_error"
    status = 400


class ConfigError(UserError):
    """A swarm file or setting is invalid."""

    code = "config_error"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message if field is None else f"{field}: {message}", field=field)
        self.field = field


class CampaignRecordError(UserError):
    """A line of a campaign folder's trials record that is malformed or records a trial a second time."""

    code = "campaign_record_error"

    def __init__(self, path: str, line: int, reason: str) -> None:
        super().__init__(f"{path}, line {line}: {reason}", path=path, line=line, reason=reason)
        self.path = path
        self.line = line
        self.reason = reason


class CampaignBusyError(UserError):
    """Another process holds the campaign folder's lock: two would run every trial twice."""

    code = "campaign_busy"

    def __init__(self, folder: str) -> None:
        super().__init__(f"{folder} is in use by another swarmyard campaign process: wait for it, or stop it",
                         folder=folder)
        self.folder = folder


class InsecureSecretError(UserError):
    """A secret file (the control plane's token secret) that another user can read or that is not this user's:
    whoever reads it forges any capability token, so it is refused, never used."""

    code = "insecure_secret"

    def __init__(self, path: str, why: str, fix: str) -> None:
        super().__init__(f"{path}: {why}; refusing to use it as a secret ({fix})", path=path, why=why, fix=fix)
        self.path, self.why, self.fix = path, why, fix


class InsecureRootError(UserError):
    """A machines root (where machines, their disks and the snapshots live) that another user owns or that others
    may write: whoever writes it plants a snapshot, a machine record or a baseline, so it is refused, never used."""

    code = "insecure_root"

    def __init__(self, path: str, why: str, fix: str) -> None:
        super().__init__(f"machines root {path}: {why}; refusing to use it ({fix})", path=path, why=why, fix=fix)
        self.path, self.why, self.fix = path, why, fix


class InvalidInputError(SwarmyardError):
    """A request or argument is malformed."""

    code = "invalid_input"
    status = 400

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message, field=field)
        self.field = field


class NestingTooDeepError(InvalidInputError):
    """A JSON body nested deeper than the fixed limit, refused before any parser reads it."""

    code = "nesting_too_deep"

    def __init__(self, limit: int, *, field: str = "body") -> None:
        super().__init__(f"{field} is JSON nested deeper than {limit} levels", field=field)
        self.details["limit"] = limit
        self.limit = limit


class UnoriginalFindingError(InvalidInputError):
    """A lead's synthesis that is not its own: a finding copied, a loop, its task or instructions said back."""

    code = "unoriginal_finding"

    def __init__(self, task_id: str, reason: str) -> None:
        super().__init__(f"task {task_id}: {reason}", field="body")
        self.details.update(task_id=task_id, reason=reason)
        self.task_id = task_id
        self.reason = reason


class UnverifiedCitationError(InvalidInputError):
    """A finding's source citation that the run's sources do not bear out: no such file or line, or the quoted
    words are not on that line. ``reason`` says which, in words an agent can act on when it is asked again."""

    code = "unverified_citation"

    def __init__(self, task_id: str, ref: str, reason: str) -> None:
        super().__init__(f"task {task_id}: citation {ref}: {reason}", field="citations")
        self.details.update(task_id=task_id, ref=ref, reason=reason)
        self.task_id = task_id
        self.ref = ref
        self.reason = reason


class ContextLengthError(InvalidInputError):
    """A request's input leaves the model no room to answer inside its context window."""

    code = "context_length_exceeded"

    def __init__(self, model: str, input_tokens: int | None, context_tokens: int | None) -> None:
        size = "" if input_tokens is None else f" ({input_tokens} tokens)"
        window = "" if context_tokens is None else f" ({context_tokens} tokens)"
        super().__init__(f"the conversation{size} leaves no room for an answer in {model}'s context "
                         f"window{window}: shorten it", field="messages")
        self.details.update(model=model, input_tokens=input_tokens, context_tokens=context_tokens)
        self.model = model
        self.input_tokens = input_tokens
        self.context_tokens = context_tokens


class NotFoundError(SwarmyardError):
    """An id that does not exist."""

    code = "not_found"
    status = 404

    def __init__(self, kind: str, id: str | int) -> None:
        super().__init__(f"{kind} {id!r} not found", kind=kind, id=id)
        self.kind = kind
        self.id = id


class PayloadTooLargeError(SwarmyardError):
    """A post, artifact or request body over its size limit."""

    code = "payload_too_large"
    status = 413

    def __init__(self, what: str, size: int, limit: int) -> None:
        super().__init__(f"{what} is {size} bytes, over the limit of {limit}", what=what, size=size, limit=limit)
        self.what = what
        self.size = size
        self.limit = limit


class QuotaExceededError(PayloadTooLargeError):
    """A write that would take a goal's or a task's stored total past its quota (artifact bytes, board posts or
    board bytes): refused whole, nothing stored. Not retryable: the total only grows."""

    code = "quota_exceeded"
    status = 413

    def __init__(self, what: str, size: int, used: int, limit: int, *, goal_id: str,
                 task_id: str | None = None) -> None:
        SwarmyardError.__init__(
            self,
            f"{what} would be {used + size} with this write of {size}, over the quota of {limit} (goal {goal_id}"
            + (f", task {task_id})" if task_id else ")"),
            what=what, size=size, used=used, limit=limit, goal_id=goal_id, task_id=task_id,
        )
        self.what, self.size, self.used, self.limit = what, size, used, limit
        self.goal_id, self.task_id = goal_id, task_id


class AuthError(SwarmyardError):
    """Authentication or authorisation failed."""

    code = "auth_error"
    status = 401


class InvalidTokenError(AuthError):
    """A forged, malformed, expired or revoked token."""

    code = "invalid_token"
    status = 401


class ForbiddenError(AuthError):
    """A valid token used outside its scope."""

    code = "forbidden"
    status = 403


class DepthExceededError(ForbiddenError):
    """A delegation past the goal's maximum depth."""

    code = "depth_exceeded"

    def __init__(self, task_id: str, depth: int, max_depth: int) -> None:
        super().__init__(f"task {task_id}: a sub-task at depth {depth} exceeds the goal's max depth {max_depth}",
                         task_id=task_id, depth=depth, max_depth=max_depth)
        self.task_id = task_id
        self.depth = depth
        self.max_depth = max_depth


class CrossSiteError(ForbiddenError):
    """A state-changing dashboard request that another site's page sent (its Origin, Referer or Sec-Fetch-Site)."""

    code = "cross_site"

    def __init__(self, origin: str) -> None:
        super().__init__(f"the dashboard refuses a form posted from another site ({origin}): use its own page",
                         origin=origin)
        self.origin = origin


class MisdirectedRequestError(AuthError):
    """A dashboard request over TCP whose Host header names neither the address the plane listens on nor a name
    it was told to answer to: a page of another site pointing its own name at this address (DNS rebinding)."""

    code = "misdirected_request"
    status = 421

    def __init__(self, host: str, allowed: list[str]) -> None:
        super().__init__(f"the dashboard is not served as host {host!r}: open it as {' or '.join(allowed)} "
                         "(or give `swarmyard serve --ui-host NAME` for a name of your own)", host=host,
                         allowed=allowed)
        self.host = host
        self.allowed = allowed


class RateLimitedError(SwarmyardError):
    """Too many calls; retry after ``retry_after_s``."""

    code = "rate_limited"
    status = 429
    retryable = True

    def __init__(self, message: str, *, retry_after_s: float) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.retry_after_s = retry_after_s


class StoreError(SwarmyardError):
    """The store refused or failed an operation."""

    code = "store_error"


class StoreBusyError(StoreError):
    """A store call asked not to wait found the store busy (its write lock taken); nothing was done."""

    code = "store_busy"
    status = 503
    retryable = True


class StoreLostError(StoreError):
    """The store's connection was lost during the call (its server stopped, restarted or ended the session).

    The call's transaction may have committed or not: the outcome is unknown, so this is not retryable as it
    stands; read the state (the board, the task) before doing it again.
    """

    code = "store_lost"
    status = 503


class FencingError(StoreError):
    """A write for a task whose claim is no longer the caller's."""

    code = "fencing_error"
    status = 409

    def __init__(self, message: str, *, task_id: str, presented: int, current: int | None) -> None:
        super().__init__(message, task_id=task_id, presented=presented, current=current)
        self.task_id = task_id
        self.presented = presented
        self.current = current


class StaleFencingTokenError(FencingError):
    """The presented fencing token is not the task's current one."""

    code = "stale_fencing_token"

    def __init__(self, task_id: str, presented: int, current: int | None) -> None:
        super().__init__(
            f"task {task_id}: fencing token {presented} is stale (current {current})",
            task_id=task_id,
            presented=presented,
            current=current,
        )


class LeaseExpiredError(FencingError):
    """The fencing token is current but the lease has run out or the claim has ended."""

    code = "lease_expired"

    def __init__(self, task_id: str, presented: int, current: int | None) -> None:
        super().__init__(
            f"task {task_id}: the lease for fencing token {presented} has expired or ended",
            task_id=task_id,
            presented=presented,
            current=current,
        )


class IllegalTransitionError(StoreError):
    """A state change that the transition table forbids."""

    code = "illegal_transition"
    status = 409

    def __init__(self, kind: str, id: str, from_state: str, to_state: str) -> None:
        super().__init__(
            f"{kind} {id}: cannot go from {from_state} to {to_state}",
            kind=kind,
            id=id,
            from_state=from_state,
            to_state=to_state,
        )
        self.kind = kind
        self.id = id
        self.from_state = from_state
        self.to_state = to_state


class ConflictError(StoreError):
    """A uniqueness or ordering conflict."""

    code = "conflict"
    status = 409


class DuplicateInFlightError(ConflictError):
    """A worker sent again the very body of a call another replica still holds (its answer not given yet, or
    lost with that replica, which killed leaves its holds ``held`` until they are swept ``unknown``): sent now,
    the call could be paid twice, so it is neither held nor sent. Ask again later: once the first hold ends
    settled or released the body may go again, once it is ``unknown`` it is a ``DuplicateOfUnknownError``."""

    code = "duplicate_in_flight"

    def __init__(self, reservation_id: str) -> None:
        super().__init__(
            f"this request repeats one another control plane replica still holds (reservation "
            f"{reservation_id}), whose outcome is not known yet; it was not sent",
            retryable=True,
        )
        self.reservation_id = reservation_id
        self.details["reservation_id"] = reservation_id


class DuplicateOfUnknownError(ConflictError):
    """A worker sent again the very body of a call whose hold is ``unknown``: the first may have been billed,
    so the broker neither holds nor sends this one. Never retry it; reconcile the reservation named."""

    code = "duplicate_of_unknown"

    def __init__(self, reservation_id: str) -> None:
        super().__init__(
            f"this request repeats one whose answer was lost after it was sent (reservation {reservation_id}, "
            f"unknown until reconciled); it was not sent again",
            retryable=False,
        )
        self.reservation_id = reservation_id
        self.details["reservation_id"] = reservation_id


class NoFindingError(ConflictError):
    """A task was asked to complete but no finding of its has landed: its work is not done, so it stays as it
    is. Retrying helps only once its worker has submitted a finding."""

    code = "no_finding"

    def __init__(self, task_id: str) -> None:
        super().__init__(
            f"task {task_id}: no finding has landed; it can be completed once its worker submits one",
            task_id=task_id,
        )
        self.task_id = task_id


class MigrationError(StoreError):
    """The schema is newer than this code, or a migration failed."""

    code = "migration_error"


class BudgetError(SwarmyardError):
    """A budget rule refused a call."""

    code = "budget_error"
    status = 402


class BudgetExceededError(BudgetError):
    """An envelope cannot afford the worst case of a call."""

    code = "budget_exceeded"
    status = 402

    def __init__(self, envelope: str, needed: int, available: int) -> None:
        super().__init__(
            f"{envelope} envelope cannot afford {needed} micro-USD (available {available})",
            envelope=envelope,
            needed=needed,
            available=available,
        )
        self.envelope = envelope
        self.needed = needed
        self.available = available


class NoCallsLeftError(BudgetExceededError):
    """A claim refused: its task has no model call left, all of its own cap made (``goal_id`` None) or, for a task
    with no cap of its own, all of its goal's (``goal_id``) made or allocated to other tasks.

    A kind of ``BudgetExceededError`` because it is one to its caller: the task's envelope cannot afford one call
    (here its calls, not its money), so whatever handles a claim refused for its slice (an agent ends
    ``claim_refused``, the run fails the tasks no call fits in) handles this one the same way. ``needed`` and
    ``available`` are still micro-USD: the least call, and what the task's money would afford."""

    code = "no_calls_left"
    status = 402

    def __init__(self, envelope: str, cap: int, *, goal_id: str | None = None, needed: int = 0,
                 available: int = 0) -> None:
        whose = (f"all {cap} of its own model calls were made" if goal_id is None else
                 f"goal {goal_id}'s cap of {cap} model calls is all made or allocated to other tasks")
        SwarmyardError.__init__(self, f"{envelope} has no model call left: {whose}", envelope=envelope, cap=cap,
                                goal_id=goal_id, needed=needed, available=available)
        self.envelope = envelope
        self.cap = cap
        self.goal_id = goal_id
        self.needed = needed
        self.available = available


class CallCapExceededError(BudgetError):
    """A task or goal has used all its model calls, or cannot allocate the calls a new task asks for (``asked``)."""

    code = "call_cap_exceeded"
    status = 429

    def __init__(self, envelope: str, cap: int, *, asked: int | None = None) -> None:
        said = (f"{envelope} has used all {cap} of its model calls" if asked is None else
                f"{envelope} cannot give {asked} of its cap of {cap} model calls")
        details: dict[str, Any] = {"envelope": envelope, "cap": cap}
        if asked is not None:
            details["asked"] = asked
        super().__init__(said, **details)
        self.envelope = envelope
        self.cap = cap
        #: the calls a new task or sub-task asked to be allocated (``None``: a call refused, its cap used)
        self.asked = asked


class DeadlinePassedError(BudgetError):
    """The goal's deadline has passed."""

    code = "deadline_passed"
    status = 403

    def __init__(self, goal_id: str, deadline: float) -> None:
        super().__init__(f"goal {goal_id}: deadline has passed", goal_id=goal_id, deadline=deadline)
        self.goal_id = goal_id
        self.deadline = deadline


class SandboxError(SwarmyardError):
    """A machine could not be made, run or torn down as asked."""

    code = "sandbox_error"


class SandboxUnavailableError(SandboxError):
    """The host lacks what the requested isolation needs."""

    code = "sandbox_unavailable"


class MachineNotRunningError(SandboxError):
    """A machine whose init is gone (a process inside killed it): it runs nothing more, and every call on it but a
    delete is refused. Its state says ``failed``."""

    code = "machine_not_running"
    status = 409

    def __init__(self, message: str, *, machine_id: str) -> None:
        super().__init__(message, machine_id=machine_id)
        self.machine_id = machine_id


class MachineNotRespondingError(SandboxError):
    """A machine whose init does not answer: a process inside stopped it (``kill -STOP``), or it did not answer a
    call within the call's bound. Nothing was done; a delete still works. Not retryable: a stopped init stays
    stopped until something continues it."""

    code = "machine_not_responding"
    status = 409

    def __init__(self, message: str, *, machine_id: str) -> None:
        super().__init__(message, machine_id=machine_id)
        self.machine_id = machine_id


class MachinesBusyError(SandboxError):
    """The request bodies the machines routes hold in memory at once are at their budget: this one was refused
    unread. Retryable once the others are answered."""

    code = "machines_busy"
    status = 503
    retryable = True

    def __init__(self, message: str, *, budget_bytes: int) -> None:
        super().__init__(message, budget_bytes=budget_bytes)
        self.budget_bytes = budget_bytes


class OutOfResourcesError(SandboxError):
    """This process ran out of a resource a machine call needs (open files, memory): nothing the caller asked was
    wrong, and a retry once some are freed may work."""

    code = "out_of_resources"
    status = 503
    retryable = True

    def __init__(self, message: str, *, errno: int) -> None:
        super().__init__(message, errno=errno)
        self.errno = errno


class MachineRefusedError(SandboxError):
    """A machine refused a request as the caller made it (a folder, a device or a file it may not read asked for
    as a file, a program it cannot run): the caller's doing, not the host's, so a 400 naming ``field``."""

    code = "machine_refused"
    status = 400

    def __init__(self, message: str, *, field: str, errno: int | None, machine_id: str) -> None:
        super().__init__(message, field=field, errno=errno, machine_id=machine_id)
        self.field, self.errno, self.machine_id = field, errno, machine_id


class ProviderError(SwarmyardError):
    """A model provider failed."""

    code = "provider_error"
    status = 502

    def __init__(self, message: str, *, retryable: bool = False, upstream_status: int | None = None) -> None:
        super().__init__(message, retryable=retryable, upstream_status=upstream_status)
        self.upstream_status = upstream_status


class UpstreamUnknownError(ProviderError):
    """The request left and its answer was lost: the cost is unknown and a retry could pay twice."""

    code = "upstream_unknown"

    def __init__(self, message: str, *, reservation_id: str) -> None:
        super().__init__(message, retryable=False)
        self.reservation_id = reservation_id
        self.details["reservation_id"] = reservation_id


class UpstreamLostError(ProviderError):
    """After the request left, no whole answer came back (the connection dropped or timed out, the body was cut
    or is not a well-formed answer); the broker records the call as unknown."""

    code = "upstream_lost"

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


class EvaluatorError(SwarmyardError):
    """The evaluator refused or failed."""

    code = "evaluator_error"


class HoldoutUsedError(EvaluatorError):
    """``final_holdout`` already answered for this goal."""

    code = "holdout_used"
    status = 409

    def __init__(self, goal_id: str) -> None:
        super().__init__(f"goal {goal_id}: the final holdout was already used", goal_id=goal_id)
        self.goal_id = goal_id


class BundleError(EvaluatorError):
    """An evaluator bundle or its ``evaluator.toml`` is malformed; ``field`` names what is wrong."""

    code = "bundle_error"

    def __init__(self, message: str, *, field: str, path: str) -> None:
        super().__init__(f"{path}: {field}: {message}", field=field, path=path)
        self.field = field
        self.path = path


class ScoringError(EvaluatorError):
    """The scoring code failed or printed no integer; ``reason`` says how (its output stays private)."""

    code = "scoring_error"
    status = 422

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message, reason=reason)
        self.reason = reason


class ScoringLimitError(ScoringError):
    """The scoring code was killed by a limit (``wall_time``, ``cpu_time``, ``memory``, ``output``)."""

    code = "scoring_limit"

    def __init__(self, limit: str, value: int) -> None:
        super().__init__(f"the scoring code hit its {limit} limit ({value})", reason=limit)
        self.limit = limit
        self.value = value
        self.details.update(limit=limit, value=value)


class EvaluatorUnavailableError(EvaluatorError):
    """The evaluator's socket cannot be reached."""

    code = "evaluator_unavailable"
    status = 503
    retryable = True


class AuditError(SwarmyardError):
    """The audit log, a checkpoint or a cosignature does not verify."""

    code = "audit_error"


class InvalidProofError(AuditError):
    """A Merkle inclusion or consistency proof does not verify."""

    code = "invalid_proof"

    def __init__(self, reason: str) -> None:
        super().__init__(reason, reason=reason)
        self.reason = reason


class InvalidSignatureError(AuditError):
    """A signed note, checkpoint or cosignature is malformed or its signature does not verify."""

    code = "invalid_signature"

    def __init__(self, reason: str, *, key_name: str | None = None) -> None:
        super().__init__(reason, reason=reason, key_name=key_name)
        self.reason = reason
        self.key_name = key_name


class WitnessRefusedError(AuditError):
    """The witness refused a checkpoint: a fork, a rewrite, a bad proof or a stale old size."""

    code = "witness_refused"
    status = 409

    def __init__(self, origin: str, reason: str, *, witness_size: int | None = None) -> None:
        super().__init__(f"witness refused {origin}: {reason}", origin=origin, reason=reason,
                         witness_size=witness_size)
        self.origin = origin
        self.reason = reason
        self.witness_size = witness_size


class LogMismatchError(AuditError):
    """A run's audit log fails verification; ``what`` (event, checkpoint, cosignature) and ``index`` say where."""

    code = "log_mismatch"

    def __init__(self, what: str, index: int, reason: str) -> None:
        super().__init__(f"{what} {index}: {reason}", what=what, index=index, reason=reason)
        self.what = what
        self.index = index
        self.reason = reason


class ToolError(SwarmyardError):
    """A tool call an agent made failed: bad arguments, a path outside the tool's folder, the tool's own error.

    It is information for the model, not the end of the run: the agent shows it and goes on.
    """

    code = "tool_error"
    status = 422

    def __init__(self, message: str, *, tool: str, reason: str) -> None:
        super().__init__(message, tool=tool, reason=reason)
        self.tool = tool
        self.reason = reason


class ToolRefusedError(ToolError):
    """A tool the worker's profile does not offer (a governed worker asking for ``shell``)."""

    code = "tool_refused"
    status = 403

    def __init__(self, tool: str, profile: str) -> None:
        super().__init__(f"{tool!r} is not a tool of the {profile!r} profile", tool=tool, reason="not_offered")
        self.profile = profile
        self.details.update(profile=profile)


class WasiTrapError(ToolError):
    """A WASI tool stopped by one of its caps (``limit``: ``fuel``, ``memory``, ``wall_time``, ``output``)."""

    code = "wasi_trap"

    def __init__(self, tool: str, limit: str, value: int) -> None:
        super().__init__(f"the tool {tool!r} hit its {limit} cap ({value})", tool=tool, reason=limit)
        self.limit = limit
        self.value = value
        self.details.update(limit=limit, value=value)


class MissingExtraError(UserError):
    """An optional dependency is not installed."""

    code = "missing_extra"

    def __init__(self, feature: str, extra: str, package: str) -> None:
        super().__init__(
            f"{feature} needs the {package!r} package: pip install 'swarmyard[{extra}]'",
            feature=feature,
            extra=extra,
            package=package,
        )
        self.feature = feature
        self.extra = extra
        self.package = package
