"""A run's evaluator: started for the run's goal, scoring workers' artifacts, and the one final holdout.

``[evaluator] bundle = "..."`` in a swarm file gives the run a ``RunEvaluator``. The coordinator starts it once
the goal exists (``swarmyard evaluator serve --goal GOAL`` as its own process, see
``swarmyard.evaluator.process``) and stops it after the machines are gone. In between:

- the control plane scores every artifact a worker submits (``submit_artifact``) through ``score``: on the
  search split only, the signature checked against the key the evaluator published at start; the plane stores
  the integer with the artifact (``Store.record_score``), audit-logs the signed score (``score.issued``) and
  returns it in the tool's result, so a worker's policy can act on it;
- when the work is done, the coordinator calls ``fire_holdout`` once: the best search-scored artifact (the
  first to reach the best score) is scored on the holdout split, keyed by the goal's id. The evaluator's ledger
  refuses a second holdout for the goal for good (also after a restart), and the store's record of it means a
  resumed run never asks again. Workers cannot reach the holdout: no tool calls it and the socket is not in any
  machine.

Policies read scores from the store: ``best_scores(goal, by="worker" | "direction" | "group" | "task")`` and
``list_scores(goal, worker_id=..., task_id=...)``; a finding that cites a scored artifact carries its score.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from dataclasses import dataclass
from pathlib import Path

from swarmyard.domain import Goal, ScoreRecord
from swarmyard.errors import EvaluatorError, HoldoutUsedError, SwarmyardError
from swarmyard.evaluator.client import EvaluatorClient
from swarmyard.evaluator.process import EvaluatorProcess
from swarmyard.evaluator.score import SignedScore, verify_score
from swarmyard.report.data import RunScores, ScorePoint
from swarmyard.store.protocol import AuditStore, ExploreStore, Store

log = logging.getLogger(__name__)

SEARCH = "search"
HOLDOUT = "holdout"
#: Audit event kinds of the run's evaluator and its final holdout.
HOLDOUT_SCORED = "holdout.scored"
EVALUATOR_STARTED = "evaluator.started"
HOLDOUT_REFUSED = "holdout.refused"


@dataclass(frozen=True, slots=True)
class HoldoutOutcome:
    """How the run's final holdout went: its score record, or why there is none."""

    record: ScoreRecord | None
    note: str = ""


class RunEvaluator:
    """The evaluator of one run: not running until ``start(goal)``; then ``score`` for the plane and
    ``fire_holdout`` for the coordinator, until ``close``."""

    def __init__(self, bundle: Path, run_id: str, store: AuditStore | None = None) -> None:
        self.bundle = bundle
        self.run_id = run_id
        #: where ``start`` records the evaluator it started (``evaluator.started``, with its public key)
        self.store = store
        self._process: EvaluatorProcess | None = None
        self._client: EvaluatorClient | None = None

    @property
    def process(self) -> EvaluatorProcess:
        """The running evaluator (``EvaluatorError`` before ``start``)."""
        if self._process is None:
            raise EvaluatorError("the run's evaluator has not been started")
        return self._process

    def start(self, goal_id: str) -> EvaluatorProcess:
        """Start the evaluator for ``goal_id`` (blocking: it may create its user and copy the bundle)."""
        if self._process is None:
            self._process = EvaluatorProcess.start(self.bundle, run_id=self.run_id, goal=goal_id)
            self._client = EvaluatorClient(self._process.socket)
            if self.store is not None:
                # the key every score.issued and holdout.scored event of this goal verifies with
                self.store.record_event(EVALUATOR_STARTED, {
                    "goal": goal_id, "bundle": self._process.name, "user": self._process.user,
                    "own_user": self._process.own_user, "public_key": self.public_key_b64})
            log.info("evaluator %s for goal %s (pid %d)", self._process.describe(), goal_id, self._process.pid)
            if not self._process.own_user:
                log.warning("the evaluator runs as this run's user, not one of its own (start as root for "
                            "that): only file modes protect its bundle")
        return self._process

    @property
    def public_key_b64(self) -> str:
        """The evaluator's Ed25519 public key, base64 (``swarmyard evaluator verify --public-key``); empty
        before ``start``."""
        return base64.b64encode(self._process.public_key).decode("ascii") if self._process is not None else ""

    def describe(self) -> str:
        """Which evaluator, and as which user."""
        return self.process.describe() if self._process is not None else f"{self.bundle.name} (not started)"

    def _verified(self, signed: SignedScore, goal: str, split: str) -> SignedScore:
        # the socket is private, but a score is only worth what its signature proves
        if signed.goal != goal or signed.split != split or not verify_score(signed, self.process.public_key):
            raise EvaluatorError("the evaluator's answer is not a score it signed for this goal and split",
                                 goal_id=goal)
        return signed

    def score_sync(self, goal: str, data: bytes, split: str = SEARCH) -> SignedScore:
        """Score ``data`` on the search split (the evaluator refuses any other) and check the signature."""
        if self._client is None:
            raise EvaluatorError("the run's evaluator has not been started")
        return self._verified(self._client.score(goal, data, split), goal, split)

    async def score(self, goal: str, data: bytes, split: str, /) -> SignedScore:
        """``score_sync`` off the event loop: what the control plane's ``submit_artifact`` awaits."""
        return await asyncio.to_thread(self.score_sync, goal, data, split)

    def fire_holdout(self, store: Store, goal: Goal) -> HoldoutOutcome:
        """Score the goal's best search-scored artifact on the holdout split, once; store and audit-log it."""
        done = store.list_scores(goal.id, split=HOLDOUT)
        if done:
            return HoldoutOutcome(done[0])  # fired before this process (a resumed run): never asked twice
        best = best_record(store.list_scores(goal.id, split=SEARCH))
        if best is None:
            return HoldoutOutcome(None, "no artifact was scored on the search split")
        if self._client is None:
            raise EvaluatorError("the run's evaluator has not been started")
        data = store.read_artifact(goal.id, best.sha256)
        try:
            signed = self._verified(self._client.final_holdout(goal.id, data), goal.id, HOLDOUT)
        except HoldoutUsedError as exc:
            store.record_event(HOLDOUT_REFUSED, {"goal": goal.id, "sha256": best.sha256, "error": exc.to_dict()})
            return HoldoutOutcome(None, "the evaluator had already answered this goal's holdout")
        except SwarmyardError as exc:
            # the evaluator counts a failed scoring as the goal's one shot too: say so, and go on to the report
            store.record_event(HOLDOUT_REFUSED, {"goal": goal.id, "sha256": best.sha256, "error": exc.to_dict()})
            return HoldoutOutcome(None, f"the holdout failed: {exc.message}")
        record = store.record_score(goal.id, best.sha256, signed.score, split=HOLDOUT)
        store.record_event(HOLDOUT_SCORED, {"goal": goal.id, "task": record.task_id, "worker": record.worker_id,
                                            "score": signed.to_dict()})
        return HoldoutOutcome(record)

    def close(self) -> None:
        """Stop the evaluator; its state (key, holdout ledger) stays for a resume."""
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._process is not None:
            self._process.close()


def best_record(records: list[ScoreRecord]) -> ScoreRecord | None:
    """The first record to reach the best score (``records`` oldest first)."""
    return max(records, key=lambda r: r.score, default=None)


def run_scores(store: ExploreStore, goal: Goal, evaluator: str, rows: dict[str, str],
               holdout: HoldoutOutcome | None, public_key: str = "") -> RunScores:
    """The report's view of the scores: times from the goal's start, workers by their timeline rows."""

    def point(r: ScoreRecord) -> ScorePoint:
        return ScorePoint(max(0.0, r.created_at - goal.created_at), r.score, rows.get(r.worker_id, r.worker_id),
                          r.sha256)

    search = tuple(point(r) for r in store.list_scores(goal.id, split=SEARCH))
    if holdout is None:
        return RunScores(evaluator, search, None, "the run did not reach its end", public_key)
    # the holdout's time is when its artifact was submitted: the search score of the same artifact
    first = {p.sha256: p for p in reversed(search)}
    held = None
    if holdout.record is not None:
        base = first.get(holdout.record.sha256)
        held = point(holdout.record) if base is None else ScorePoint(base.at_s, holdout.record.score, base.worker,
                                                                      base.sha256)
    return RunScores(evaluator, search, held, holdout.note, public_key)
