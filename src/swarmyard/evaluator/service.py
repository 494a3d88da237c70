"""The evaluator: scores artifacts in the sandbox, signs every score, and answers the holdout once per goal.

The state folder holds the evaluator's Ed25519 key (``evaluator.key``, 0600), the holdout ledger
(``holdout.db``) and a scratch folder for artifacts being scored; all of it belongs to the evaluator alone.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
from pathlib import Path

from swarmyard.clock import Clock, SystemClock
from swarmyard.errors import ForbiddenError, InvalidInputError, PayloadTooLargeError, SwarmyardError
from swarmyard.evaluator.bundle import Bundle, Split
from swarmyard.evaluator.holdout import HoldoutLedger
from swarmyard.evaluator.sandbox import BwrapSandbox, ScoringSandbox
from swarmyard.evaluator.score import SignedScore, sign_score
from swarmyard.secret_files import load_or_create_ed25519, public_bytes

log = logging.getLogger(__name__)

KEY_FILE = "evaluator.key"
LEDGER_FILE = "holdout.db"
_GOAL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")


def check_goal(goal: object) -> str:
    """``goal`` if it is a goal id the evaluator accepts, else ``InvalidInputError``."""
    if not isinstance(goal, str) or not _GOAL.match(goal):
        raise InvalidInputError("goal must be 1-128 characters of letters, digits, '_', '.', ':', '-'",
                                field="goal")
    return goal


class Evaluator:
    """Scores artifacts for one bundle and signs the results."""

    def __init__(self, bundle: Bundle, state_dir: Path, *, clock: Clock | None = None,
                 sandbox: ScoringSandbox | None = None, goal: str | None = None) -> None:
        self.bundle = bundle
        #: the one goal this evaluator answers for (a run's own evaluator), or ``None`` for any goal
        self.goal = None if goal is None else check_goal(goal)
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._clock = clock or SystemClock()
        self._sandbox = sandbox or BwrapSandbox()
        self._key = load_or_create_ed25519(self.state_dir / KEY_FILE)
        self._ledger = HoldoutLedger(self.state_dir / LEDGER_FILE)
        self._scratch = self.state_dir / "scratch"
        self._scratch.mkdir(mode=0o700, exist_ok=True)

    @property
    def public_key(self) -> bytes:
        """The raw 32-byte Ed25519 public key that verifies this evaluator's scores."""
        return public_bytes(self._key)

    def score(self, goal: str, artifact: bytes, split: str = "search") -> SignedScore:
        """Score ``artifact`` on the search split and return the signed score."""
        self._check_served(goal)
        if split != Split.SEARCH.value:
            # the holdout is reachable only through final_holdout, which counts its one use
            raise InvalidInputError(f"split {split!r} cannot be scored here; only 'search' "
                                    "(the holdout is answered once, by final_holdout)", field="split")
        digest = self._check_artifact(artifact)
        value = self._run(Split.SEARCH, artifact)
        return self._sign(goal, digest, Split.SEARCH, value)

    def final_holdout(self, goal: str, artifact: bytes) -> SignedScore:
        """Score ``artifact`` on the holdout split, once per goal ever; then ``HoldoutUsedError``."""
        self._check_served(goal)
        digest = self._check_artifact(artifact)
        # the claim is committed before scoring starts, so no reply can ever precede it
        self._ledger.claim(goal, digest, self._now_ms())
        try:
            value = self._run(Split.HOLDOUT, artifact)
        except SwarmyardError as exc:
            self._ledger.record(goal, exc.code, None)
            raise
        self._ledger.record(goal, "scored", value)
        return self._sign(goal, digest, Split.HOLDOUT, value)

    def holdout_used(self, goal: str) -> bool:
        """Whether ``goal`` has used its final holdout."""
        return self._ledger.is_used(check_goal(goal))

    def close(self) -> None:
        """Release the ledger."""
        self._ledger.close()

    def _check_served(self, goal: str) -> None:
        check_goal(goal)
        if self.goal is not None and goal != self.goal:
            raise ForbiddenError(f"this evaluator answers for goal {self.goal} only, not {goal}", goal_id=goal)

    def _check_artifact(self, artifact: bytes) -> str:
        if not isinstance(artifact, bytes | bytearray):
            raise InvalidInputError("artifact must be bytes", field="artifact")
        limit = self.bundle.limits.max_artifact_bytes
        if len(artifact) > limit:
            raise PayloadTooLargeError("artifact", len(artifact), limit)
        return hashlib.sha256(artifact).hexdigest()

    def _run(self, split: Split, artifact: bytes) -> int:
        fd, name = tempfile.mkstemp(prefix="artifact-", dir=self._scratch)  # created 0600
        path = Path(name)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(artifact)
            return self._sandbox.run(self.bundle, split, path)
        finally:
            path.unlink(missing_ok=True)

    def _sign(self, goal: str, digest: str, split: Split, value: int) -> SignedScore:
        signed = sign_score(self._key, goal=goal, artifact_sha256=digest, split=split.value, score=value,
                            issued_at=self._now_ms())
        log.info("scored goal=%s split=%s sha256=%s score=%d", goal, split.value, digest, value)
        return signed

    def _now_ms(self) -> int:
        return int(self._clock.now() * 1000)
