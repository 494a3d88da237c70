"""A campaign's files in its folder: ``campaign.md``, ``campaign.html``, ``results.json`` and two plots.

The plots need matplotlib (``pip install 'swarmyard[report]'``); without it the other files are written and say so.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path

from swarmyard.campaign.stats import Interval
from swarmyard.campaign.summary import SENTENCE, CampaignSummary
from swarmyard.money import format_usd

TOKENS_PLOT = "score-vs-tokens.png"
N_PLOT = "score-vs-n.png"


@dataclass(frozen=True, slots=True)
class CampaignFiles:
    """Where the campaign's results were written (``None``: that plot was not made)."""

    markdown: Path
    html: Path
    json: Path
    tokens_plot: Path | None
    n_plot: Path | None


def _ci(i: Interval | None, fmt: str = "{:,.0f}") -> str:
    if i is None:
        return "-"
    return f"{fmt.format(i.mean)} [{fmt.format(i.low)}, {fmt.format(i.high)}]"


def _usd(i: Interval | None) -> str:
    if i is None:
        return "-"
    return f"{format_usd(round(i.mean))} [{format_usd(round(i.low))}, {format_usd(round(i.high))}]"


HEADER = ("cell", "n", "trials", "score (mean [95% CI])", "spend", "wall s", "calls", "tokens", "similarity")


def rows(summary: CampaignSummary) -> list[tuple[str, ...]]:
    """The table's rows, as text."""
    out: list[tuple[str, ...]] = []
    for c in summary.cells:
        i = c.intervals
        failed = sum(1 for t in c.trials if t.error)
        trials = f"{len(c.trials)}" + (f" ({failed} failed)" if failed else "")
        out.append((c.cell.name, str(c.cell.n), trials, _ci(i["score"]), _usd(i["spend_micro_usd"]),
                    _ci(i["wall_s"], "{:,.1f}"), _ci(i["calls"], "{:,.1f}"), _ci(i["tokens"]),
                    f"{c.similarity:.2f}" if c.similarity is not None else "-"))
    return out


def sentences(summary: CampaignSummary) -> list[str]:
    """What the 2x2 says about the seed's sentence, one line per history setting."""
    out = []
    for claim in summary.claims:
        what = (f"{claim.single} {claim.single_mean:,.0f} vs {claim.cohort} {claim.cohort_mean:,.0f}")
        if claim.separated:
            out.append(f"With {claim.history.value}: {SENTENCE} ({what}; the 95% intervals do not overlap).")
        elif claim.holds:
            out.append(f"With {claim.history.value}: {SENTENCE} on the mean ({what}), but the 95% intervals "
                       "overlap.")
        else:
            out.append(f"With {claim.history.value}: the sentence does not hold here ({what}).")
    return out


def markdown(summary: CampaignSummary, plots: list[str]) -> str:
    """The campaign as a markdown page."""
    c = summary.campaign
    lines = [f"# Campaign {c.name}", "",
             f"Every cell ran under the same cap: {format_usd(c.budget_micro_usd)}, {c.call_cap} calls, "
             f"{c.deadline_s:g} s; seeds {', '.join(map(str, c.seeds))} (the same seed is the same task instance)."
             + ("" if summary.complete else " The campaign is not finished: some trials are missing."), "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in rows(summary)]
    lines += ["", "Similarity: the mean pairwise similarity (0 to 1) of the submissions within a trial, averaged "
              "over the cell's trials; communication makes attempts alike.", ""]
    lines += sentences(summary)
    lines += [""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def html_page(summary: CampaignSummary, plots: list[str]) -> str:
    """The campaign as one HTML page."""
    e = html.escape
    c = summary.campaign
    head = "".join(f"<th>{e(h)}</th>" for h in HEADER)
    body = "".join("<tr>" + "".join(f"<td>{e(cell)}</td>" for cell in row) + "</tr>" for row in rows(summary))
    said = "".join(f"<p>{e(s)}</p>" for s in sentences(summary))
    images = "".join(f'<p><img src="{e(p)}" alt="{e(p)}"></p>' for p in plots)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>campaign {e(c.name)}</title>"
            "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}</style></head><body>"
            f"<h1>Campaign {e(c.name)}</h1><p>Every cell ran under the same cap: "
            f"{e(format_usd(c.budget_micro_usd))}, {c.call_cap} calls, {c.deadline_s:g} s; seeds "
            f"{e(', '.join(map(str, c.seeds)))}.</p><table><tr>{head}</tr>{body}</table>{said}{images}"
            "</body></html>\n")


def _plots(summary: CampaignSummary, folder: Path) -> tuple[Path | None, Path | None]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None, None
    scored = [c for c in summary.cells if c.score is not None and c.intervals["tokens"] is not None]
    tokens_plot = n_plot = None
    if scored:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for index, c in enumerate(scored):
            colour = f"C{index % 10}"
            points = [(t.tokens_in + t.tokens_out, t.score) for t in c.trials if t.score is not None]
            ax.scatter([p[0] for p in points], [p[1] for p in points], alpha=0.35, s=14, color=colour)
            score, tokens = c.score, c.intervals["tokens"]
            assert score is not None and tokens is not None
            ax.errorbar([tokens.mean], [score.mean], yerr=[[score.mean - score.low], [score.high - score.mean]],
                        fmt="o", color=colour, capsize=3, label=c.cell.name)
        ax.set_xlabel("total tokens per trial")
        ax.set_ylabel("score")
        ax.set_title("score vs total tokens, per cell (mean, 95% CI)")
        ax.legend(fontsize=7)
        fig.tight_layout()
        tokens_plot = folder / TOKENS_PLOT
        fig.savefig(tokens_plot, dpi=110)
        plt.close(fig)
    sweep = [c for c in scored if c.cell.family == "sweep"]
    if sweep:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, prefix in (("best@n (independent)", "best@"), ("team@n (team)", "team@")):
            arm = sorted((c for c in sweep if c.cell.name.startswith(prefix)), key=lambda c: c.cell.n)
            if not arm:
                continue
            means = [c.score.mean for c in arm if c.score]
            low = [c.score.mean - c.score.low for c in arm if c.score]
            high = [c.score.high - c.score.mean for c in arm if c.score]
            ax.errorbar([c.cell.n for c in arm], means, yerr=[low, high], marker="o", capsize=3, label=label)
        ax.set_xlabel("n (workers)")
        ax.set_ylabel("score")
        ax.set_xscale("log", base=2)
        ax.set_title("score vs n (mean, 95% CI)")
        ax.legend()
        fig.tight_layout()
        n_plot = folder / N_PLOT
        fig.savefig(n_plot, dpi=110)
        plt.close(fig)
    return tokens_plot, n_plot


def write_files(summary: CampaignSummary) -> CampaignFiles:
    """Write the campaign's files into its folder (each replaced whole)."""
    folder = summary.campaign.dir
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    tokens_plot, n_plot = _plots(summary, folder)
    plots = [p.name for p in (tokens_plot, n_plot) if p is not None]
    out = {"campaign.md": markdown(summary, plots), "campaign.html": html_page(summary, plots),
           "results.json": json.dumps(summary.to_dict(), indent=2) + "\n"}
    for name, text in out.items():
        tmp = folder / f"{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(folder / name)
    return CampaignFiles(folder / "campaign.md", folder / "campaign.html", folder / "results.json",
                         tokens_plot, n_plot)
