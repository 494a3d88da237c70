"""A campaign's results: per cell, means with their spread and failures; per pair of cells, the paired difference
over the seeds they share; and the sentences the campaign tests, each held to those figures.

Every trial counts: a trial that failed scores the floor (0, the least an evaluator gives) in its cell, so a cell
that fails often is not scored on its survivors. Cells share seeds (the same seed is the same task instance), so
they are compared seed by seed: the mean of the differences, its bootstrap interval, how many seeds each wins,
and exact sign and Wilcoxon signed-rank tests. A sentence holds only where the test says so at 5% and the
interval agrees; with fewer than ``MIN_TRUSTED_SEEDS`` seeds it is not tested at all.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from swarmyard.campaign.record import TrialRecord
from swarmyard.campaign.spec import Campaign, Cell
from swarmyard.campaign.stats import MIN_TRUSTED_SEEDS, Interval, Paired, bootstrap_ci, mean, paired
from swarmyard.config import HistoryMode

#: The seed's sentence for the 2x2.
SENTENCE = "a single worker beats the cohort under the same cap"
#: The sweep's sentence, for each n.
TEAM_SENTENCE = "team@{n} beats best@{n}"
#: What each cell reports with an interval: the record's field and its name in the output.
METRICS = ("score", "spend_micro_usd", "wall_s", "calls", "tokens")
#: The figures whose spread over a cell's trials the report gives beside the score's.
RANGED = ("calls", "tokens", "spend_micro_usd", "wall_s")
#: The significance level of the tests.
ALPHA = 0.05
#: A failed trial's score: the least an evaluator gives.
FLOOR = 0


def _ci(values: Sequence[float], seed: int) -> Interval | None:
    return bootstrap_ci(values, seed=seed) if values else None


def scored_value(record: TrialRecord, scored: bool) -> float | None:
    """The trial's score as its cell counts it: a failed trial of a scored campaign scores the floor."""
    if record.score is not None:
        return float(record.score)
    return float(FLOOR) if scored and record.error else None


@dataclass(frozen=True, slots=True)
class CellSummary:
    """One cell's trials, summarised."""

    cell: Cell
    trials: tuple[TrialRecord, ...]
    intervals: dict[str, Interval | None]
    similarity: float | None
    #: the score of each trial as counted (failed ones at the floor), by seed
    scores: dict[int, float]

    @property
    def score(self) -> Interval | None:
        """The score's mean and interval (``None``: no trial was scored)."""
        return self.intervals["score"]

    @property
    def failed(self) -> list[TrialRecord]:
        """The trials that failed, each with its reason."""
        return [t for t in self.trials if t.error]

    @property
    def spread(self) -> tuple[float, float, float] | None:
        """(standard deviation, min, max) of the scores over the seeds; ``None`` with none."""
        values = list(self.scores.values())
        if not values:
            return None
        return (statistics.stdev(values) if len(values) > 1 else 0.0, min(values), max(values))

    def ranges(self) -> dict[str, tuple[float, float, float]]:
        """(standard deviation, min, max) over the cell's trials of each measured figure: its score as counted,
        and the calls, tokens, spend and wall time of the trials that ran (a failed one measured only its time)."""
        out: dict[str, tuple[float, float, float]] = {}
        for name in ("score", *RANGED):
            values = (list(self.scores.values()) if name == "score"
                      else [v for t in self.trials if (not t.error or name == "wall_s")
                            and (v := _value(t, name, True)) is not None])
            if values:
                out[name] = (statistics.stdev(values) if len(values) > 1 else 0.0, min(values), max(values))
        return out

    def workers_used(self, name: str) -> float | None:
        """The mean over the cell's trials that ran of the workers' own ``calls`` or ``tokens`` (the lead's left
        out: what a call or token match gives every cell the same of); ``None`` where no trial recorded them."""
        values = [v for t in self.trials if not t.error and (v := getattr(t, f"worker_{name}")) is not None]
        return mean(values) if values else None

    def to_dict(self) -> dict[str, Any]:
        """The cell as ``--json`` prints it."""
        score = self.score

        def mean_of(name: str) -> float | None:
            found = self.intervals[name]
            return found.mean if found else None

        spend = mean_of("spend_micro_usd")
        spread = self.spread
        return {
            "name": self.cell.name,
            "family": self.cell.family,
            "n": self.cell.n,
            "policy": self.cell.policy.value,
            "history": self.cell.history.value,
            "allowance": self.cell.allowance,
            "tokens_per_agent": self.cell.tokens_per_agent,
            "seeds": [t.seed for t in self.trials],
            "scored": sum(1 for t in self.trials if t.score is not None),
            "failed": len(self.failed),
            "failure_rate": len(self.failed) / len(self.trials) if self.trials else None,
            "mean": score.mean if score else None,
            "ci_low": score.low if score else None,
            "ci_high": score.high if score else None,
            "sd": spread[0] if spread else None,
            "min": spread[1] if spread else None,
            "max": spread[2] if spread else None,
            "spend_micro_usd": round(spend) if spend is not None else None,
            "calls": mean_of("calls"),
            "tokens": mean_of("tokens"),
            "worker_calls": self.workers_used("calls"),
            "worker_tokens": self.workers_used("tokens"),
            "wall_s": mean_of("wall_s"),
            "similarity": self.similarity,
            "intervals": {name: ({"mean": i.mean, "ci_low": i.low, "ci_high": i.high} if i else None)
                          for name, i in self.intervals.items()},
            "ranges": {name: {"sd": sd, "min": low, "max": high} for name, (sd, low, high) in self.ranges().items()},
            "trials": [{"seed": t.seed, "run_id": t.run_id, "score": t.score,
                        "counted_score": self.scores.get(t.seed), "spend_micro_usd": t.spend_micro_usd,
                        "calls": t.calls, "tokens_in": t.tokens_in, "tokens_out": t.tokens_out,
                        "worker_calls": t.worker_calls, "worker_tokens": t.worker_tokens, "wall_s": t.wall_s,
                        "similarity": t.similarity, "error": t.error or None,
                        "report": f"runs/{t.run_id}/report.html" if t.run_id else None} for t in self.trials],
        }


def _value(record: TrialRecord, name: str, scored: bool) -> float | None:
    if name == "score":
        return scored_value(record, scored)
    if name == "tokens":
        return record.tokens_in + record.tokens_out
    if record.error and name != "wall_s":
        return None  # a run that failed measured nothing but the time it took
    value = getattr(record, name)
    return None if value is None else float(value)


def summarise_cell(cell: Cell, trials: Sequence[TrialRecord], *, scored: bool = True, seed: int = 0) -> CellSummary:
    """A cell's intervals (each a bootstrap of its own metric, seeded), its counted scores and mean similarity."""
    intervals = {name: _ci([v for t in trials if (v := _value(t, name, scored)) is not None], seed)
                 for name in METRICS}
    sims = [t.similarity for t in trials if t.similarity is not None]
    scores = {t.seed: v for t in trials if (v := scored_value(t, scored)) is not None}
    return CellSummary(cell, tuple(trials), intervals, mean(sims) if sims else None, scores)


@dataclass(frozen=True, slots=True)
class Comparison:
    """Cell ``a`` against cell ``b`` on the seeds both have a counted score for (differences are a - b)."""

    a: str
    b: str
    seeds: tuple[int, ...]
    a_scores: tuple[float, ...]
    b_scores: tuple[float, ...]
    test: Paired

    def to_dict(self) -> dict[str, Any]:
        """As ``--json`` prints it."""
        t = self.test
        return {"a": self.a, "b": self.b, "seeds": list(self.seeds), "a_scores": list(self.a_scores),
                "b_scores": list(self.b_scores), "differences": list(t.diffs), "mean_difference": t.mean,
                "ci_low": t.low, "ci_high": t.high, "interval_trusted": t.trusted, "a_wins": t.wins,
                "b_wins": t.losses, "ties": t.ties, "sign_test_p": t.sign_p, "wilcoxon_p": t.wilcoxon_p}


def compare(a: CellSummary, b: CellSummary, seed: int = 0) -> Comparison | None:
    """The paired comparison of two cells (``None``: no seed has both scored)."""
    seeds = tuple(sorted(set(a.scores) & set(b.scores)))
    if not seeds:
        return None
    xs = tuple(a.scores[s] for s in seeds)
    ys = tuple(b.scores[s] for s in seeds)
    return Comparison(a.cell.name, b.cell.name, seeds, xs, ys, paired(xs, ys, seed=seed))


class Verdict:
    """What the figures say about a sentence."""

    HOLDS = "holds"
    REVERSED = "reversed"
    NOT_SHOWN = "not shown"
    UNTESTED = "untested"


def verdict(test: Paired) -> str:
    """``holds`` where a's lead is significant (Wilcoxon, two-sided, at ``ALPHA``) and its interval is above 0;
    ``reversed`` where b's is; ``untested`` with fewer than ``MIN_TRUSTED_SEEDS`` seeds; else ``not shown``."""
    if not test.trusted:
        return Verdict.UNTESTED
    if test.wilcoxon_p < ALPHA and test.low > 0:
        return Verdict.HOLDS
    if test.wilcoxon_p < ALPHA and test.high < 0:
        return Verdict.REVERSED
    return Verdict.NOT_SHOWN


@dataclass(frozen=True, slots=True)
class Claim:
    """A sentence the campaign tests, the comparison it rests on (``a`` is the cell the sentence says wins)."""

    sentence: str
    comparison: Comparison
    verdict: str
    #: the grid's history setting, or the sweep's n and tokens per agent
    history: HistoryMode | None = None
    n: int | None = None
    tokens_per_agent: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """As ``--json`` prints it."""
        return {"sentence": self.sentence, "verdict": self.verdict, "a": self.comparison.a, "b": self.comparison.b,
                "history": self.history.value if self.history else None, "n": self.n,
                "tokens_per_agent": self.tokens_per_agent, "text": claim_text(self),
                **{k: v for k, v in self.comparison.to_dict().items() if k not in ("a", "b")}}


def figure(value: float, *, sign: bool = True) -> str:
    """A score or difference as the report prints it: whole numbers with thousands separators, and a small
    fraction with three significant digits, so that a mean of 0.3 (scores of a few points, as a bundle of five
    cases gives) does not read as 0 beside a sentence that holds on it."""
    plus = "+" if sign else ""
    if value == int(value) or abs(value) >= 100:
        return f"{value:{plus},.0f}"
    return f"{value:{plus}.3g}"


def _num(value: float) -> str:
    return figure(value)


def claim_text(claim: Claim) -> str:
    """The written conclusion: the sentence, the verdict and the figures it was drawn from."""
    c, t = claim.comparison, claim.comparison.test
    n = len(c.seeds)
    figures = (f"{c.a} - {c.b} = {_num(t.mean)} on the mean over {n} seeds; {c.a} wins {t.wins}, {c.b} wins "
               f"{t.losses}, {t.ties} tied; Wilcoxon signed-rank p = {t.wilcoxon_p:.3g}, sign test p = "
               f"{t.sign_p:.3g}")
    if t.trusted:
        figures += f"; 95% interval of the difference [{_num(t.low)}, {_num(t.high)}]"
    else:
        figures += "; per-seed differences " + ", ".join(_num(d) for d in t.diffs)
    said = {
        Verdict.HOLDS: "holds",
        Verdict.REVERSED: "does not hold: the opposite is significant",
        # not shown with Wilcoxon's p below 5% is the interval of the mean difference reaching 0: the ranks and
        # the mean disagree, and saying "not significant" would contradict the p printed beside it
        Verdict.NOT_SHOWN: ("is not shown (the difference is not significant at 5%)" if t.wilcoxon_p >= ALPHA
                            else f"is not shown (Wilcoxon's p is below 5%, but the 95% interval of the mean "
                                 f"difference, [{_num(t.low)}, {_num(t.high)}], includes 0: the seeds' ranks and "
                                 "the mean disagree)"),
        Verdict.UNTESTED: f"is not tested: {n} seeds are fewer than the {MIN_TRUSTED_SEEDS} a trustworthy interval "
                          "needs",
    }[claim.verdict]
    where = (f"With {claim.history.value}: " if claim.history is not None
             else f"At {claim.tokens_per_agent:,} tokens per agent: " if claim.tokens_per_agent is not None else "")
    return f'{where}"{claim.sentence}" {said} ({figures}).'


def claims(cells: Sequence[CellSummary], seed: int = 0) -> list[Claim]:
    """The 2x2's sentence for each history setting (single - cohort) and the sweep's for each n (team - best)."""
    out = []
    grid = [c for c in cells if c.cell.family == "grid"]
    for history in HistoryMode:
        single = next((c for c in grid if c.cell.history is history and c.cell.n == 1), None)
        cohort = next((c for c in grid if c.cell.history is history and c.cell.n > 1), None)
        if single is None or cohort is None or (found := compare(single, cohort, seed)) is None:
            continue
        out.append(Claim(SENTENCE, found, verdict(found.test), history=history))
    sweep = [c for c in cells if c.cell.family == "sweep"]
    for best in (c for c in sweep if c.cell.name.startswith("best@")):
        team = next((c for c in sweep if c.cell.name == best.cell.name.replace("best@", "team@", 1)), None)
        if team is None or (found := compare(team, best, seed)) is None:
            continue
        out.append(Claim(TEAM_SENTENCE.format(n=best.cell.n), found, verdict(found.test), n=best.cell.n,
                         tokens_per_agent=best.cell.tokens_per_agent))
    return out


def own_claims(cells: Sequence[CellSummary], stated: Sequence[tuple[str, str, str]], seed: int = 0) -> list[Claim]:
    """The campaign file's ``[[claims]]``: each (sentence, a, b) tested as a - b on the seeds both scored."""
    by_name = {c.cell.name: c for c in cells}
    out = []
    for sentence, a, b in stated:
        if a in by_name and b in by_name and (found := compare(by_name[a], by_name[b], seed)) is not None:
            out.append(Claim(sentence, found, verdict(found.test)))
    return out


@dataclass(frozen=True, slots=True)
class Crossing:
    """Where team@n stops losing to best@n as tokens per agent grow, for one n."""

    n: int
    #: (tokens per agent, mean of team - best) in increasing tokens
    points: tuple[tuple[int, float], ...]
    #: the verdict of "team@n beats best@n" at each point, in the same order
    verdicts: tuple[str, ...]

    def _side(self, points: Sequence[tuple[int, float, str]], negative: bool) -> str:
        """How team@n stands against best@n on one side of the crossing: "loses to" or "beats" only where the
        difference is significant that way at every point of the side, else what the means say, and where not."""
        want = Verdict.REVERSED if negative else Verdict.HOLDS
        weak = [t for t, _, v in points if v != want]
        if not weak:
            return "loses to" if negative else "beats"
        return (f"{'trails' if negative else 'leads'}, on the mean only (not significant at "
                f"{', '.join(str(t) for t in weak)}),")

    @property
    def text(self) -> str:
        """The crossing, stated from the means and said as a win or a loss only where the claims are significant."""
        marked = [(t, d, v) for (t, d), v in zip(self.points, self.verdicts, strict=True)]
        listed = ", ".join(f"{t}: {_num(d)} ({v})" for t, d, v in marked)
        signed = [(t, d) for t, d in self.points if d != 0]
        changes = [(t0, t1, d1) for (t0, d0), (t1, d1) in itertools.pairwise(signed) if (d0 < 0) != (d1 < 0)]
        if not signed:
            return f"n = {self.n}: team@n and best@n tie on the mean at every tokens per agent tried ({listed})."
        if not changes:
            how = "loses to" if signed[0][1] < 0 else "beats"
            return (f"n = {self.n}: team@n {how} best@n on the mean at every tokens per agent tried, no crossing "
                    f"({listed}).")
        if len(changes) > 1:
            return (f"n = {self.n}: the sign of team@n - best@n changes {len(changes)} times ({listed}): no single "
                    "crossing.")
        t0, t1, after = changes[0]
        below = self._side([p for p in marked if p[0] < t1], after > 0)
        above = self._side([p for p in marked if p[0] >= t1], after < 0)
        return (f"n = {self.n}: team@n {below} best@n below about {t1} tokens per agent and {above} it from there "
                f"on (the mean difference crosses 0 between {t0} and {t1}; {listed}).")

    def to_dict(self) -> dict[str, Any]:
        """As ``--json`` prints it."""
        return {"n": self.n, "points": [{"tokens_per_agent": t, "mean_difference": d, "verdict": v}
                                        for (t, d), v in zip(self.points, self.verdicts, strict=True)],
                "text": self.text}


def crossings(found: Sequence[Claim]) -> list[Crossing]:
    """For each n of a token sweep with two or more tokens per agent, where team@n - best@n changes sign."""
    by_n: dict[int, list[tuple[int, float, str]]] = {}
    for claim in found:
        if claim.n is not None and claim.tokens_per_agent is not None:
            by_n.setdefault(claim.n, []).append((claim.tokens_per_agent, claim.comparison.test.mean, claim.verdict))
    out = []
    for n, points in sorted(by_n.items()):
        if len(points) > 1:
            ordered = sorted(points)
            out.append(Crossing(n, tuple((t, d) for t, d, _ in ordered), tuple(v for _, _, v in ordered)))
    return out


@dataclass(frozen=True, slots=True)
class CampaignSummary:
    """The whole campaign's results."""

    campaign: Campaign
    cells: tuple[CellSummary, ...]
    comparisons: tuple[Comparison, ...]
    claims: tuple[Claim, ...]
    crossings: tuple[Crossing, ...]

    @property
    def complete(self) -> bool:
        """Every trial of every cell is in the record."""
        return sum(len(c.trials) for c in self.cells) == len(self.campaign.trials)

    @property
    def deadline_bound(self) -> list[TrialRecord]:
        """The trials that ran as long as their deadline: the goal's deadline may have cut them (it is wall time,
        so where it falls in a trial depends on the host's speed and load). A trial shorter than its deadline
        never reached it (the goal is made after the trial's clock starts)."""
        limits = {t.key: t.config.goal.deadline_s for t in self.campaign.trials}
        return [t for c in self.cells for t in c.trials
                if t.run_id and t.wall_s >= limits.get(t.key, self.campaign.deadline_s)]

    @property
    def reproducible(self) -> bool:
        """Every model is seeded and answered in turn, and no trial ran into its deadline."""
        return self.campaign.reproducible and not self.deadline_bound

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document."""
        c = self.campaign
        return {
            "campaign": c.name,
            "dir": str(c.dir),
            "seeds": list(c.seeds),
            "match": c.match.value,
            "reproducible": self.reproducible,
            "cap": {"budget_micro_usd": c.budget_micro_usd, "call_cap": c.call_cap, "deadline_s": c.deadline_s},
            "complete": self.complete,
            "cells": [cell.to_dict() for cell in self.cells],
            "comparisons": [p.to_dict() for p in self.comparisons],
            "claims": [claim.to_dict() for claim in self.claims],
            "crossings": [x.to_dict() for x in self.crossings],
        }


def summarise(campaign: Campaign, records: Sequence[TrialRecord]) -> CampaignSummary:
    """Group the record by cell (in the campaign's order), summarise each, and compare every pair."""
    by_cell: dict[str, list[TrialRecord]] = {}
    for record in records:
        by_cell.setdefault(record.cell, []).append(record)
    # a campaign is scored where its runs have an evaluator (or its record holds scores)
    scored = (any(t.config.evaluator is not None for t in campaign.trials)
              or any(r.score is not None for r in records))
    cells = tuple(summarise_cell(cell, sorted(by_cell.get(cell.name, []), key=lambda r: r.seed), scored=scored)
                  for cell in campaign.cells)
    pairs = tuple(p for a, b in itertools.combinations(cells, 2) if (p := compare(a, b)) is not None)
    tested = claims(cells) + own_claims(cells, campaign.claims)
    return CampaignSummary(campaign, cells, pairs, tuple(tested), tuple(crossings(tested)))

