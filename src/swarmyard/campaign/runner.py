"""Running a campaign: every trial a real run through ``Swarm`` (the path ``swarmyard run`` takes), one at a time.

Trials run in the campaign's order (cell by cell, seed by seed); each finished trial is appended to the durable
record before the next starts, so a killed campaign resumes with ``resume=True`` and reruns only the trial it
was in (from scratch, in a fresh run folder: a trial is measured whole or not at all).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from swarmyard.campaign.record import TrialLog, TrialRecord, hold
from swarmyard.campaign.spec import Campaign, Trial
from swarmyard.campaign.stats import mean_pairwise_similarity
from swarmyard.config import SandboxKind
from swarmyard.domain import ReservationState, TaskState
from swarmyard.errors import SandboxUnavailableError, SwarmyardError, UserError
from swarmyard.report.data import ReportData
from swarmyard.store import open_store
from swarmyard.swarm.coordinator import SIDE_GROUPS
from swarmyard.swarm.setup import LEAD_GROUP

log = logging.getLogger(__name__)

#: Submissions of one trial compared for similarity, at most (the first ones, in the order they came).
MAX_SUBMISSIONS = 64
#: Bytes of a submission read for the comparison.
_SUBMISSION_BYTES = 8192


@dataclass(frozen=True, slots=True)
class TrialEvent:
    """Progress: a trial starts (``record`` is ``None``) or ends; ``done`` of ``total`` are finished."""

    trial: Trial
    done: int
    total: int
    record: TrialRecord | None = None
    skipped: bool = False


def _scores(url: str, goal_id: str) -> tuple[int | None, list[str]]:
    """The run's score (its holdout score, else its best search score) and its submissions' texts."""
    store = open_store(url)
    try:
        holdout = store.list_scores(goal_id, split="holdout")
        search = store.list_scores(goal_id)
        score = holdout[-1].score if holdout else max((s.score for s in search), default=None)
        # the submissions compared are the same whichever worker's landed first: the first in sorted order
        shas = sorted(a.sha256 for a in store.list_artifacts(goal_id))[:MAX_SUBMISSIONS]
        texts = sorted(store.read_artifact(goal_id, sha)[:_SUBMISSION_BYTES].decode("utf-8", "replace")
                       for sha in shas)
        if not texts:
            # no artifacts: the workers' findings are what they submitted
            texts = [f.body[:_SUBMISSION_BYTES] for f in store.read_findings(goal_id, limit=MAX_SUBMISSIONS)
                     if f.group != LEAD_GROUP]
        return score, texts
    finally:
        store.close()


def _failure(trial: Trial, data: ReportData, score: int | None, now: float) -> str:
    """Why a run that ended is a failed trial (``""``: it is not): its deadline passed before its workers'
    tasks ended, every worker task failed, or it has an evaluator that scored nothing it was given."""
    work = [t for t in data.tasks if t.group not in SIDE_GROUPS]
    done = [t for t in work if t.state is TaskState.DONE]
    ids = {t.id for t in work}
    last = max((s.ended_at for s in data.spans if s.task_id in ids), default=None)
    deadline = data.goal.deadline
    if deadline is not None and now >= deadline and (len(done) < len(work) or last is None or last >= deadline):
        return (f"timeout: the deadline of {trial.config.goal.deadline_s:g} s passed before the workers' tasks "
                f"ended ({len(done)} of {len(work)} done" + (f", best score by then {score:,}" if score else "")
                + ")")
    if work and not done:
        failed = next((t for t in work if t.state is TaskState.FAILED), work[0])
        why = (failed.result or "").strip().splitlines()
        return (f"trial_failed: none of its {len(work)} worker tasks finished (one {failed.state.value}"
                + (f": {why[-1][:300]}" if why else "") + ")")
    if score is None and trial.config.evaluator is not None:
        return ("not_scored: the evaluator scored nothing in this run (no submission, or its scorer failed on "
                "every one)")
    return ""


def _record(trial: Trial, run_id: str, data: ReportData, url: str, wall_s: float) -> TrialRecord:
    score, texts = _scores(url, data.goal.id)
    # a trial that timed out, whose work all failed, or that nothing scored is a failed trial: its cell counts
    # it at the floor and lists it with this reason (its run's figures stay in the record)
    failure = _failure(trial, data, score, time.time())
    work = {t.id for t in data.tasks if t.group not in SIDE_GROUPS}
    mine = [r for r in data.reservations if r.task_id in work and r.state is not ReservationState.RELEASED]
    return TrialRecord(trial.key, trial.cell.name, trial.seed, run_id, None if failure else score,
                       data.spent_micro_usd, data.calls, data.input_tokens, data.output_tokens, round(wall_s, 3),
                       mean_pairwise_similarity(texts), len(texts), data.synthesis is not None, failure,
                       len(mine), sum(r.input_tokens + r.output_tokens for r in mine))


def run_trial(trial: Trial, *, sandbox: SandboxKind | None = None) -> TrialRecord:
    """One trial, a whole run of its swarm config; a run that fails is recorded with its error, unscored.

    A misuse or a host that cannot run machines at all would fail every trial the same way: those are raised.
    """
    from swarmyard.swarm.run import Swarm

    started = time.monotonic()
    try:
        result = Swarm(trial.config, sandbox=sandbox).run()
    except (UserError, SandboxUnavailableError):
        raise
    except SwarmyardError as exc:
        log.warning("trial %s failed: %s", trial.key, exc.message)
        return TrialRecord(trial.key, trial.cell.name, trial.seed, "", None, 0, 0, 0, 0,
                           round(time.monotonic() - started, 3), None, 0, False, f"{exc.code}: {exc.message}")
    run_dir = trial.config.run.runs_dir
    url = f"sqlite:///{run_dir}/{result.run_id}/store.db"
    return _record(trial, result.run_id, result.data, url, time.monotonic() - started)


def run_campaign(campaign: Campaign, *, resume: bool = False, sandbox: SandboxKind | None = None,
                 on_event: Callable[[TrialEvent], None] | None = None,
                 on_start: Callable[[], None] | None = None, limit: int | None = None,
                 by_seed: bool = False) -> list[TrialRecord]:
    """Run every trial not yet in the record; the whole record, in the campaign's order. ``on_start`` is called
    once the folder is this process's and its record is read, before the first trial.

    ``limit``: run at most that many trials now (a long campaign in pieces, each resumed); the record then
    returned holds the trials finished so far. ``by_seed``: run seed by seed (every cell of a seed, then the
    next seed), so a campaign stopped part way has whole seeds to pair.

    What the trials need from this host (a machines backend, bubblewrap, a baseline, provider keys) is checked
    before the campaign's folder is made, as ``swarmyard run`` checks it before a run folder."""
    import os

    from swarmyard.broker.providers.configured import check_table
    from swarmyard.swarm.preflight import check_host
    from swarmyard.swarm.run import Swarm

    # the cells differ in workers, policy and history only: the host's part is the same for every trial
    config = Swarm(campaign.trials[0].config, sandbox=sandbox).config
    check_host(config)
    check_table(config.providers, env=os.environ)
    with hold(campaign.dir):  # one process runs a campaign's trials: two would run each twice
        return _run_trials(campaign, TrialLog(campaign.dir), resume=resume, sandbox=sandbox, on_event=on_event,
                           on_start=on_start, limit=limit, by_seed=by_seed)


def _run_trials(campaign: Campaign, record: TrialLog, *, resume: bool, sandbox: SandboxKind | None,
                on_event: Callable[[TrialEvent], None] | None,
                on_start: Callable[[], None] | None, limit: int | None = None,
                by_seed: bool = False) -> list[TrialRecord]:
    finished = record.begin(campaign.name, campaign.digest, resume=resume)
    if on_start is not None:
        on_start()
    total = len(campaign.trials)
    done = sum(1 for t in campaign.trials if t.key in finished)
    order = list(campaign.trials)
    if by_seed:
        seeds = {seed: index for index, seed in enumerate(campaign.seeds)}
        order.sort(key=lambda t: seeds[t.seed])  # stable: the cells keep their order within a seed
    ran = 0
    for trial in order:
        if trial.key not in finished and limit is not None and ran >= limit:
            break
        if trial.key in finished:
            if on_event is not None:
                on_event(TrialEvent(trial, done, total, finished[trial.key], skipped=True))
            continue
        if on_event is not None:
            on_event(TrialEvent(trial, done, total))
        outcome = run_trial(trial, sandbox=sandbox)
        record.append(outcome)
        finished[trial.key] = outcome
        done += 1
        ran += 1
        if on_event is not None:
            on_event(TrialEvent(trial, done, total, outcome))
    return [finished[t.key] for t in campaign.trials if t.key in finished]
