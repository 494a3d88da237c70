"""A campaign's results per cell: means with bootstrap intervals, the seed's sentence where it holds, and
how alike the attempts within a cell were."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from swarmyard.campaign.record import TrialRecord
from swarmyard.campaign.spec import Campaign, Cell
from swarmyard.campaign.stats import Interval, bootstrap_ci, mean
from swarmyard.config import HistoryMode

#: The seed's sentence, stated where the record supports it.
SENTENCE = "a single worker beats the cohort under the same cap"
#: What each cell reports with an interval: the record's field and its name in the output.
METRICS = ("score", "spend_micro_usd", "wall_s", "calls", "tokens")


def _ci(values: Sequence[float], seed: int) -> Interval | None:
    return bootstrap_ci(values, seed=seed) if values else None


@dataclass(frozen=True, slots=True)
class CellSummary:
    """One cell's trials, summarised."""

    cell: Cell
    trials: tuple[TrialRecord, ...]
    intervals: dict[str, Interval | None]
    similarity: float | None

    @property
    def score(self) -> Interval | None:
        """The score's mean and interval (``None``: no trial was scored)."""
        return self.intervals["score"]

    def to_dict(self) -> dict[str, Any]:
        """The cell as ``--json`` prints it."""
        score = self.score

        def mean_of(name: str) -> float | None:
            found = self.intervals[name]
            return found.mean if found else None

        spend = mean_of("spend_micro_usd")
        return {
            "name": self.cell.name,
            "family": self.cell.family,
            "n": self.cell.n,
            "policy": self.cell.policy.value,
            "history": self.cell.history.value,
            "seeds": [t.seed for t in self.trials],
            "scored": sum(1 for t in self.trials if t.score is not None),
            "failed": sum(1 for t in self.trials if t.error),
            "mean": score.mean if score else None,
            "ci_low": score.low if score else None,
            "ci_high": score.high if score else None,
            "spend_micro_usd": round(spend) if spend is not None else None,
            "calls": mean_of("calls"),
            "tokens": mean_of("tokens"),
            "wall_s": mean_of("wall_s"),
            "similarity": self.similarity,
            "intervals": {name: ({"mean": i.mean, "ci_low": i.low, "ci_high": i.high} if i else None)
                          for name, i in self.intervals.items()},
            "trials": [{"seed": t.seed, "run_id": t.run_id, "score": t.score, "spend_micro_usd": t.spend_micro_usd,
                        "calls": t.calls, "tokens_in": t.tokens_in, "tokens_out": t.tokens_out, "wall_s": t.wall_s,
                        "similarity": t.similarity, "error": t.error or None} for t in self.trials],
        }


def _value(record: TrialRecord, name: str) -> float | None:
    if name == "tokens":
        return record.tokens_in + record.tokens_out
    if record.error and name != "wall_s":
        return None  # a run that failed measured nothing but the time it took
    value = getattr(record, name)
    return None if value is None else float(value)


def summarise_cell(cell: Cell, trials: Sequence[TrialRecord], seed: int = 0) -> CellSummary:
    """A cell's intervals (each a bootstrap of its own metric, seeded) and its mean similarity."""
    intervals = {name: _ci([v for t in trials if (v := _value(t, name)) is not None], seed) for name in METRICS}
    sims = [t.similarity for t in trials if t.similarity is not None]
    return CellSummary(cell, tuple(trials), intervals, mean(sims) if sims else None)


@dataclass(frozen=True, slots=True)
class Claim:
    """The seed's sentence checked for one history setting: does the single worker beat the cohort?"""

    history: HistoryMode
    single: str
    cohort: str
    single_mean: float
    cohort_mean: float
    #: the single worker's mean is higher
    holds: bool
    #: and the two intervals do not overlap
    separated: bool

    def to_dict(self) -> dict[str, Any]:
        """As ``--json`` prints it."""
        return {"sentence": SENTENCE, "history": self.history.value, "single": self.single, "cohort": self.cohort,
                "single_mean": self.single_mean, "cohort_mean": self.cohort_mean, "holds": self.holds,
                "separated": self.separated}


def claims(cells: Sequence[CellSummary]) -> list[Claim]:
    """For each history setting of the 2x2, whether the single worker's mean score beats the cohort's."""
    grid = [c for c in cells if c.cell.family == "grid"]
    out = []
    for history in HistoryMode:
        single = next((c for c in grid if c.cell.history is history and c.cell.n == 1), None)
        cohort = next((c for c in grid if c.cell.history is history and c.cell.n > 1), None)
        if single is None or cohort is None or single.score is None or cohort.score is None:
            continue
        s, k = single.score, cohort.score
        out.append(Claim(history, single.cell.name, cohort.cell.name, s.mean, k.mean, s.mean > k.mean,
                         s.mean > k.mean and s.low > k.high))
    return out


@dataclass(frozen=True, slots=True)
class CampaignSummary:
    """The whole campaign's results."""

    campaign: Campaign
    cells: tuple[CellSummary, ...]
    claims: tuple[Claim, ...]

    @property
    def complete(self) -> bool:
        """Every trial of every cell is in the record."""
        return sum(len(c.trials) for c in self.cells) == len(self.campaign.trials)

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document."""
        c = self.campaign
        return {
            "campaign": c.name,
            "dir": str(c.dir),
            "seeds": list(c.seeds),
            "cap": {"budget_micro_usd": c.budget_micro_usd, "call_cap": c.call_cap, "deadline_s": c.deadline_s},
            "complete": self.complete,
            "cells": [cell.to_dict() for cell in self.cells],
            "claims": [claim.to_dict() for claim in self.claims],
        }


def summarise(campaign: Campaign, records: Sequence[TrialRecord]) -> CampaignSummary:
    """Group the record by cell (in the campaign's order) and summarise each."""
    by_cell: dict[str, list[TrialRecord]] = {}
    for record in records:
        by_cell.setdefault(record.cell, []).append(record)
    cells = tuple(summarise_cell(cell, sorted(by_cell.get(cell.name, []), key=lambda r: r.seed))
                  for cell in campaign.cells)
    return CampaignSummary(campaign, cells, tuple(claims(cells)))
