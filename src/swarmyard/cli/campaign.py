"""``swarmyard campaign CAMPAIGN.toml [--resume] [--json] [--sandbox local|process]``: run a matched campaign."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from swarmyard.cli import render
from swarmyard.config import SandboxKind
from swarmyard.money import format_usd

if TYPE_CHECKING:
    from swarmyard.campaign.runner import TrialEvent


class TrialProgress:
    """One line on stderr as each trial starts and ends: trials done of all (cells x seeds), the trial, the time
    since the campaign started and what it spent so far. Plain lines, on a terminal or not, so that a log of a
    long campaign shows where it is; stdout keeps the results alone."""

    def __init__(self, total: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.total = total
        self._clock = clock
        self._started = clock()
        self.spent = 0

    def _say(self, text: str) -> None:
        render.stderr.print(text, highlight=False, markup=False, soft_wrap=True)

    def _where(self, done: int) -> str:
        elapsed = int(self._clock() - self._started)
        return (f"[{done:>{len(str(self.total))}}/{self.total}] {elapsed // 60}:{elapsed % 60:02d} elapsed, "
                f"{format_usd(self.spent)} spent")

    def __call__(self, event: TrialEvent) -> None:
        """Show a trial starting, ending, or kept from before (a resume)."""
        t = event.trial
        what = f"{t.cell.name} seed {t.seed}"
        record = event.record
        if record is None:
            self._say(f"{self._where(event.done)}: running {what}")
            return
        self.spent += record.spend_micro_usd
        if event.skipped:
            self._say(f"{self._where(event.done)}: kept {what} (finished before)")
        elif record.error:
            self._say(f"{self._where(event.done)}: {what} FAILED (counts as score 0): {record.error}")
        else:
            score = "-" if record.score is None else f"{record.score:,}"
            self._say(f"{self._where(event.done)}: {what} scored {score} ({record.calls} calls, "
                      f"{record.tokens_in + record.tokens_out:,} tokens, {record.wall_s:.1f} s)")


def command(
    campaign_file: Annotated[Path, typer.Argument(help="The campaign file (TOML).")],
    resume: Annotated[bool, typer.Option(
        "--resume", help="Continue the campaign in its folder: finished trials are kept, not run again.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as one JSON document.")] = False,
    sandbox: Annotated[SandboxKind | None, typer.Option(
        "--sandbox", help="Machine backend of every trial: local (default) or process (no isolation).")] = None,
) -> None:
    """Run every cell of a campaign on every seed, matched on budget, tokens or calls; print each cell's mean
    score, spread and failures, every pair of cells compared seed by seed (mean difference, interval, wins, exact
    sign and Wilcoxon tests) and the conclusions drawn from them. Progress goes to stderr. The folder keeps the
    record, campaign.md, campaign.html (linking every trial's report), results.json and the plots.

    Exit 0 when every trial has run; 1 for a bad campaign file (before anything runs) or other error.
    """
    from swarmyard.campaign import load_campaign, run_campaign, summarise
    from swarmyard.campaign.files import markdown, write_files
    from swarmyard.campaign.record import hold

    campaign = load_campaign(campaign_file)  # every trial's swarm file is checked here: exit 1 before any run
    if sandbox is SandboxKind.PROCESS:
        render.stderr.print("[yellow]warning[/yellow]: --sandbox process runs agents without isolation",
                            markup=True)
    progress = TrialProgress(len(campaign.trials))

    def announce() -> None:  # once the folder is this process's: a busy or refused folder is one line of error
        render.stderr.print(f"campaign {campaign.name}: {len(campaign.cells)} cells x {len(campaign.seeds)} seeds "
                            f"= {len(campaign.trials)} trials; its record, report and runs go to {campaign.dir}",
                            highlight=False, markup=False, soft_wrap=True)

    records = run_campaign(campaign, resume=resume, sandbox=sandbox, on_event=progress, on_start=announce)
    with hold(campaign.dir):  # the folder's files are this process's to write until they are written
        summary = summarise(campaign, records)
        files = write_files(summary)
    if as_json:
        print(json.dumps(summary.to_dict(), indent=2))
    else:
        plots = [p.name for p in files.plots]
        print(markdown(summary, plots), end="")
        render.stderr.print(f"campaign {campaign.name}: {files.markdown}, {files.html}, {files.json}",
                            highlight=False)
