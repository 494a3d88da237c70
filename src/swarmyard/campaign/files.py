"""A campaign's files in its folder: ``campaign.md``, ``campaign.html``, ``results.json`` and two plots.

The plots need matplotlib (``pip install 'swarmyard[report]'``); without it the other files are written and say so.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, assert_never

from swarmyard.campaign.spec import Match
from swarmyard.campaign.stats import MIN_TRUSTED_SEEDS, Interval, mean
from swarmyard.campaign.summary import FLOOR, CampaignSummary, CellSummary, claim_text, figure
from swarmyard.config import PolicyKind
from swarmyard.money import format_usd

TOKENS_PLOT = "score-vs-tokens.png"
N_PLOT = "score-vs-n.png"
WALL_PLOT = "score-vs-wall.png"


@dataclass(frozen=True, slots=True)
class CampaignFiles:
    """Where the campaign's results were written (``None``: that plot was not made)."""

    markdown: Path
    html: Path
    json: Path
    tokens_plot: Path | None
    n_plot: Path | None
    #: on a model that is not seeded, where the wall time is a figure of its own: score against it, per trial
    wall_plot: Path | None = None

    @property
    def plots(self) -> list[Path]:
        """The plots made."""
        return [p for p in (self.tokens_plot, self.n_plot, self.wall_plot) if p is not None]


def _ci(i: Interval | None, fmt: str | None = None) -> str:
    if i is None:
        return "-"

    def show(value: float) -> str:
        return figure(value, sign=False) if fmt is None else fmt.format(value)

    return f"{show(i.mean)} [{show(i.low)}, {show(i.high)}]"


def _usd(i: Interval | None) -> str:
    if i is None:
        return "-"
    return f"{format_usd(round(i.mean))} [{format_usd(round(i.low))}, {format_usd(round(i.high))}]"


HEADER = ("cell", "n", "trials", "failed", "score (mean [95% CI])", "sd [min, max]", "spend", "wall s", "calls",
          "tokens", "similarity")


def _spread(c: CellSummary) -> str:
    spread = c.spread
    return "-" if spread is None else f"{figure(spread[0], sign=False)} [{figure(spread[1], sign=False)}, {figure(spread[2], sign=False)}]"


def rows(summary: CampaignSummary) -> list[tuple[str, ...]]:
    """The table's rows, as text. Under a token or call match, the tokens or calls column says what each cell
    used of its allowance."""
    out: list[tuple[str, ...]] = []
    match = summary.campaign.match
    for c in summary.cells:
        i = c.intervals
        failed = len(c.failed)
        rate = f"{failed}/{len(c.trials)}" + (f" ({failed / len(c.trials):.0%})" if c.trials else "")
        tokens, calls = _ci(i["tokens"]), _ci(i["calls"], "{:,.1f}")
        # the allowance is the workers': what they used of it leaves the lead's calls and tokens out
        if c.cell.allowance is not None and match is Match.TOKENS:
            used = c.workers_used("tokens")
            tokens += (f" of {c.cell.allowance:,}" if used is None
                       else f"; workers {used:,.0f} of {c.cell.allowance:,}")
        if c.cell.allowance is not None and match is Match.CALLS:
            used = c.workers_used("calls")
            calls += (f" of {c.cell.allowance:,}" if used is None
                      else f"; workers {used:,.1f} of {c.cell.allowance:,}")
        score = _ci(i["score"])
        if c.scores and len(c.scores) < MIN_TRUSTED_SEEDS:
            # a bootstrap of a handful of seeds is about [min, max]: the values themselves say more
            score = (f"{figure(mean(list(c.scores.values())), sign=False)} (no trustworthy interval from {len(c.scores)} seeds; "
                     "per seed: " + ", ".join(f"{v:,.0f}" for _, v in sorted(c.scores.items())) + ")")
        out.append((c.cell.name, str(c.cell.n), str(len(c.trials)), rate, score, _spread(c),
                    _usd(i["spend_micro_usd"]), _ci(i["wall_s"], "{:,.1f}"), calls, tokens,
                    f"{c.similarity:.2f}" if c.similarity is not None else "-"))
    return out


PAIR_HEADER = ("a", "b", "seeds", "mean a - b", "95% CI (or per seed)", "a wins", "b wins", "ties", "sign p",
               "Wilcoxon p")


def pair_rows(summary: CampaignSummary) -> list[tuple[str, ...]]:
    """Every pair of cells compared seed by seed."""
    out: list[tuple[str, ...]] = []
    for p in summary.comparisons:
        t = p.test
        band = (f"[{figure(t.low)}, {figure(t.high)}]" if t.trusted
                else "untrusted (< 8 seeds): " + ", ".join(figure(d) for d in t.diffs))
        out.append((p.a, p.b, str(len(p.seeds)), figure(t.mean), band, str(t.wins), str(t.losses), str(t.ties),
                    f"{t.sign_p:.3g}", f"{t.wilcoxon_p:.3g}"))
    return out


def sentences(summary: CampaignSummary) -> list[str]:
    """The written conclusions: each sentence tested, with the figures it is drawn from, then the crossings."""
    return [claim_text(claim) for claim in summary.claims] + [x.text for x in summary.crossings]


def matching(summary: CampaignSummary) -> str:
    """What every cell of a seed had the same of."""
    c = summary.campaign
    match c.match:
        case Match.BUDGET:
            return (f"Every cell ran under the same cap: {format_usd(c.budget_micro_usd)}, {c.call_cap} calls, "
                    f"{c.deadline_s:g} s (the coordinator holds one share of each back for the lead, so cells of "
                    "more workers may use more of it: see the calls and tokens columns).")
        case Match.TOKENS:
            return ("Matched on tokens: the workers of every cell of a seed had the same tokens in all (the "
                    "allowance after 'of'; a sweep cell n times its tokens per agent), each worker its share, "
                    "counted at one micro-USD a token by the broker's budget; the lead had one share more, outside "
                    "the match. The tokens column gives the run's tokens, then the workers' own (the lead's left "
                    "out) of their allowance. The spend column is in those token units.")
        case Match.CALLS:
            return ("Matched on calls: the workers of every cell of a seed had the same model calls in all (the "
                    "allowance after 'of'), each worker its share and as many steps; the lead had one share more, "
                    "outside the match. The calls column gives the run's calls, then the workers' own (the lead's "
                    "left out) of their allowance.")
        case _ as unreachable:
            assert_never(unreachable)


def variation(summary: CampaignSummary) -> str:
    """Which figures would move if the campaign ran again."""
    if summary.reproducible:
        return ("Every model here is the simulated provider's, answered in turn: the same file and seeds give the "
                "same scores, calls and tokens every time; only wall time and ids change.")
    if summary.campaign.reproducible and (bound := summary.deadline_bound):
        # the model is seeded, but the deadline is wall time: where it cut a trial depends on the host
        return ("Every model here is the simulated provider's, answered in turn, but these trials ran as long as "
                "their deadline, which may have cut them at a point that depends on the host's speed and load, so "
                "their scores, calls and tokens can differ when run again: "
                + ", ".join(f"{t.cell} seed {t.seed} ({t.wall_s:,.1f} s)" for t in bound)
                + ". The other trials are the same every time.")
    if any(cell.policy not in (PolicyKind.TEAM, PolicyKind.INDEPENDENT) for cell in summary.campaign.cells):
        return ("The model is seeded, but an explore or groups cell's workers meet in an order the scheduler "
                "decides (direction claims, later rounds): its trials may differ when run again.")
    return ("The model is not seeded: a trial run again can score, call and spend differently. The sd and [min, "
            "max] columns give the spread over seeds, which includes that variation; the per-seed differences of a "
            "pair show how much of a difference is the seed and how much the cells.")


def spreads(summary: CampaignSummary) -> list[str]:
    """How much each cell's figures moved over its trials (sd, and [min, max]): what a rerun could move too."""
    names = {"score": "score", "calls": "calls", "tokens": "tokens", "spend_micro_usd": "spend (micro-USD)",
             "wall_s": "wall s"}
    out = []
    for c in summary.cells:
        ranges = c.ranges()
        if ranges:
            out.append(f"{c.cell.name} over {len(c.trials)} trials: " + "; ".join(
                f"{names[k]} sd {sd:,.1f} [{_figure(low, k)}, {_figure(high, k)}]"
                for k, (sd, low, high) in ranges.items()))
    return out


def _figure(value: float, name: str) -> str:
    # wall time in tenths of a second; calls, tokens, spend and scores are whole numbers
    return f"{value:,.1f}" if name == "wall_s" else f"{value:,.0f}"


def failures(summary: CampaignSummary) -> list[str]:
    """Each failed trial with its reason (it counts as score 0 in its cell)."""
    return [f"{c.cell.name} seed {t.seed}: {t.error}" for c in summary.cells for t in c.failed]


def _trial_links(summary: CampaignSummary) -> list[tuple[str, list[tuple[int, str | None]]]]:
    return [(c.cell.name, [(t.seed, f"runs/{t.run_id}/report.html" if t.run_id else None) for t in c.trials])
            for c in summary.cells]


def markdown(summary: CampaignSummary, plots: list[str]) -> str:
    """The campaign as a markdown page."""
    c = summary.campaign
    lines = [f"# Campaign {c.name}", "",
             f"{matching(summary)} Seeds {', '.join(map(str, c.seeds))} (the same seed is the same task instance "
             "in every cell)." + ("" if summary.complete else " The campaign is not finished: some trials are "
                                  "missing."), "", variation(summary), "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in rows(summary)]
    lines += ["", f"A failed trial scores {FLOOR} in its cell (never dropped). Similarity: the mean pairwise "
              "similarity (0 to 1) of the submissions within a trial, averaged over the cell's trials; "
              "communication makes attempts alike. The trials took "
              f"{sum(t.wall_s for cell in summary.cells for t in cell.trials):,.1f} s in all.", ""]
    if not summary.reproducible:
        lines += ["## What can vary, and by how much", "",
                  "A rerun of these trials can move every figure below but the cap; over each cell's seeds "
                  "they moved this much (sd [min, max]), which bounds what the pair tests can tell apart:", ""]
        lines += [f"- {s}" for s in spreads(summary)] + [""]
    lines += ["## Conclusions", ""]
    lines += [f"- {s}" for s in sentences(summary)] or ["(no sentence to test: no pair of cells scored)"]
    lines += ["", "## Every pair of cells, seed by seed", "",
              f"Differences are a - b on the seeds both ran; the interval is a percentile bootstrap over seeds of "
              f"the differences (2,000 resamples), shown only from {MIN_TRUSTED_SEEDS} seeds; p-values are exact "
              "and two-sided.", "", "| " + " | ".join(PAIR_HEADER) + " |", "|" + "---|" * len(PAIR_HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in pair_rows(summary)]
    failed = failures(summary)
    lines += ["", "## Failed trials", ""] + ([f"- {f}" for f in failed] or ["None."])
    lines += ["", "## Every trial's report", ""]
    for name, links in _trial_links(summary):
        lines.append(f"- {name}: " + ", ".join(f"[seed {seed}]({link})" if link else f"seed {seed} (no run)"
                                                for seed, link in links))
    lines += [""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def _table(header: tuple[str, ...], body: list[tuple[str, ...]]) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in header)
    rows_ = "".join("<tr>" + "".join(f"<td>{e(cell)}</td>" for cell in row) + "</tr>" for row in body)
    return f"<table><tr>{head}</tr>{rows_}</table>"


def html_page(summary: CampaignSummary, plots: list[str]) -> str:
    """The campaign as one HTML page."""
    e = html.escape
    c = summary.campaign
    said = "".join(f"<li>{e(s)}</li>" for s in sentences(summary)) or "<li>no sentence to test</li>"
    failed = "".join(f"<li>{e(f)}</li>" for f in failures(summary)) or "<li>None.</li>"
    links = "".join(f"<li>{e(name)}: " + ", ".join(f'<a href="{e(link)}">seed {seed}</a>' if link
                                                    else f"seed {seed} (no run)" for seed, link in trial_links)
                    + "</li>" for name, trial_links in _trial_links(summary))
    images = "".join(f'<p><img src="{e(p)}" alt="{e(p)}"></p>' for p in plots)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>campaign {e(c.name)}</title>"
            "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}</style></head><body>"
            f"<h1>Campaign {e(c.name)}</h1><p>{e(matching(summary))} Seeds {e(', '.join(map(str, c.seeds)))}.</p>"
            f"<p>{e(variation(summary))}</p>{_table(HEADER, rows(summary))}"
            f"<p>A failed trial scores {FLOOR} in its cell.</p><h2>Conclusions</h2><ul>{said}</ul>"
            f"<h2>Every pair of cells, seed by seed</h2>{_table(PAIR_HEADER, pair_rows(summary))}"
            f"<h2>Failed trials</h2><ul>{failed}</ul><h2>Every trial's report</h2><ul>{links}</ul>{images}"
            "</body></html>\n")


def _save_figure(path: Path, draw: Callable[[Any], None], *, xlabel: str, ylabel: str, title: str,
                 legend_size: int | None = None) -> Path:
    """Draw one 7 x 4.5 in figure with `draw(ax)`, label it, give it a legend and save it to `path`."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    draw(ax)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _wall_plot(summary: CampaignSummary, folder: Path) -> Path | None:
    """Each trial's score against its wall time, a colour per cell, with each cell's means."""
    cells = [c for c in summary.cells if c.trials]
    if summary.reproducible or not cells:
        return None

    def draw(ax: Any) -> None:
        for index, c in enumerate(cells):
            colour = f"C{index % 10}"
            points = [(t.wall_s, c.scores[t.seed]) for t in c.trials if t.seed in c.scores]
            ax.scatter([p[0] for p in points], [p[1] for p in points], alpha=0.45, s=18, color=colour)
            ax.scatter([mean([p[0] for p in points])], [mean([p[1] for p in points])], marker="D", s=60,
                       color=colour, label=c.cell.name)

    return _save_figure(folder / WALL_PLOT, draw, xlabel="wall time per trial (s)",
                        ylabel="score (failed trials at 0)",
                        title="score vs wall time, per trial (diamond: the cell's mean)", legend_size=7)


def _plots(summary: CampaignSummary, folder: Path) -> tuple[Path | None, Path | None, Path | None]:
    try:
        import matplotlib

        matplotlib.use("Agg")
    except ImportError:
        return None, None, None
    scored = [c for c in summary.cells if c.score is not None and c.intervals["tokens"] is not None]
    tokens_plot = n_plot = None
    if scored:
        def draw_tokens(ax: Any) -> None:
            for index, c in enumerate(scored):
                colour = f"C{index % 10}"
                points = [(t.tokens_in + t.tokens_out, t.score) for t in c.trials if t.score is not None]
                ax.scatter([p[0] for p in points], [p[1] for p in points], alpha=0.35, s=14, color=colour)
                score, tokens = c.score, c.intervals["tokens"]
                assert score is not None and tokens is not None
                ax.errorbar([tokens.mean], [score.mean], yerr=[[score.mean - score.low], [score.high - score.mean]],
                            fmt="o", color=colour, capsize=3, label=c.cell.name)

        tokens_plot = _save_figure(folder / TOKENS_PLOT, draw_tokens, xlabel="total tokens per trial",
                                   ylabel="score", title="score vs total tokens, per cell (mean, 95% CI)",
                                   legend_size=7)
    sweep = [c for c in scored if c.cell.family == "sweep"]
    if sweep:
        by_tokens = any(c.cell.tokens_per_agent is not None for c in sweep)

        def draw_sweep(ax: Any) -> None:
            # a token sweep: one line per arm and n, over tokens per agent; else one line per arm, over n
            lines = sorted({(c.cell.name.split("@")[0], c.cell.n if by_tokens else 0) for c in sweep})
            for arm_name, n in lines:
                arm = sorted((c for c in sweep if c.cell.name.startswith(f"{arm_name}@") and (not by_tokens
                                                                                              or c.cell.n == n)),
                             key=lambda c: (c.cell.tokens_per_agent or 0) if by_tokens else c.cell.n)
                means = [c.score.mean for c in arm if c.score]
                low = [c.score.mean - c.score.low for c in arm if c.score]
                high = [c.score.high - c.score.mean for c in arm if c.score]
                xs = [(c.cell.tokens_per_agent or 0) if by_tokens else c.cell.n for c in arm if c.score]
                label = f"{arm_name}@{n}" if by_tokens else f"{arm_name}@n"
                ax.errorbar(xs, means, yerr=[low, high], marker="o", capsize=3, label=label)
            ax.set_xscale("log", base=2)

        axis = "tokens per agent" if by_tokens else "n"
        n_plot = _save_figure(folder / N_PLOT, draw_sweep, xlabel="tokens per agent" if by_tokens else "n (workers)",
                              ylabel="score", title=f"score vs {axis} (mean, 95% CI)")
    return tokens_plot, n_plot, _wall_plot(summary, folder)


def write_files(summary: CampaignSummary) -> CampaignFiles:
    """Write the campaign's files into its folder (each replaced whole)."""
    folder = summary.campaign.dir
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    tokens_plot, n_plot, wall_plot = _plots(summary, folder)
    plots = [p.name for p in (tokens_plot, n_plot, wall_plot) if p is not None]
    out = {"campaign.md": markdown(summary, plots), "campaign.html": html_page(summary, plots),
           "results.json": json.dumps(summary.to_dict(), indent=2) + "\n"}
    for name, text in out.items():
        tmp = folder / f"{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(folder / name)
    return CampaignFiles(folder / "campaign.md", folder / "campaign.html", folder / "results.json",
                         tokens_plot, n_plot, wall_plot)
