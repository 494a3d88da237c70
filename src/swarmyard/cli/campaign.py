"""``swarmyard campaign CAMPAIGN.toml [--resume] [--json] [--sandbox local|process]``: run a matched campaign."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from swarmyard.cli import render
from swarmyard.config import SandboxKind
from swarmyard.money import format_usd

if TYPE_CHECKING:
    from swarmyard.campaign.runner import TrialEvent
    from swarmyard.campaign.spec import Campaign


class TrialProgress:
    """One line on stderr as each trial starts and ends: trials done of all (cells x seeds), the trial, the time
    since the campaign started and what it spent so far; stdout keeps the results alone.

    Off a terminal (or with ``live=False``) these are plain lines, so that a log of a long campaign shows where it
    is. On one, each trial's ending is a line above a rich progress bar: trials done of all, the trial running now,
    elapsed time and spend; ``close`` takes the bar down. ``quiet``: nothing at all."""

    def __init__(self, total: int, *, clock: Callable[[], float] = time.monotonic, live: bool | None = None,
                 quiet: bool = False) -> None:
        self.total = total
        self._clock = clock
        self._started = clock()
        self.spent = 0
        self.quiet = quiet
        self.bar: Any = None
        self._task: Any = None
        if not quiet and (render.stderr.is_terminal if live is None else live):
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("trials"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                TextColumn("{task.fields[spent]} spent · {task.description}"),
                                console=render.stderr, transient=True)
            self._task = self.bar.add_task("starting", total=total, spent=format_usd(0))
            self.bar.start()

    def close(self) -> None:
        """Take the live bar down (nothing to do for plain lines)."""
        if self.bar is not None:
            self.bar.stop()
            self.bar = None

    def _say(self, text: str) -> None:
        if self.quiet:
            return
        text = render.shown(text)  # a trial's error may carry a worker's or a provider's words
        if self.bar is not None:
            self.bar.console.print(text, highlight=False, markup=False, soft_wrap=True)
            return
        render.stderr.print(text, highlight=False, markup=False, soft_wrap=True)

    def _show(self, done: int, what: str) -> None:
        if self.bar is not None:
            self.bar.update(self._task, completed=done, description=what, spent=format_usd(self.spent))

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
            self._show(event.done, f"running {what}")
            if self.bar is None:
                self._say(f"{self._where(event.done)}: running {what}")
            return
        self.spent += record.spend_micro_usd
        self._show(event.done, f"{what} ended")
        if event.skipped:
            self._say(f"{self._where(event.done)}: kept {what} (finished before)")
        elif record.error:
            self._say(f"{self._where(event.done)}: {what} FAILED (counts as score 0): {record.error}")
        else:
            score = "-" if record.score is None else f"{record.score:,}"
            self._say(f"{self._where(event.done)}: {what} scored {score} ({record.calls} calls, "
                      f"{record.tokens_in + record.tokens_out:,} tokens, {record.wall_s:.1f} s)")
        if event.done >= event.total:
            self.close()  # the last trial has ended: its line stays, the bar goes


def announce(campaign: Campaign) -> None:
    """Say where the campaign's folder is: once the folder is this process's (a busy or refused folder is one
    line of error instead), before the first trial."""
    render.stderr.print(f"campaign {campaign.name}: {len(campaign.cells)} cells x {len(campaign.seeds)} seeds "
                        f"= {len(campaign.trials)} trials; its record, report and runs go to {campaign.dir}",
                        highlight=False, markup=False, soft_wrap=True)


def command(
    campaign_file: Annotated[Path, typer.Argument(help="The campaign file (TOML).")],
    resume: Annotated[bool, typer.Option(
        "--resume", help="Continue the campaign in its folder: finished trials are kept, not run again.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as one JSON document.")] = False,
    sandbox: Annotated[SandboxKind | None, typer.Option(
        "--sandbox", help="Machine backend of every trial: local (default) or process (no isolation).")] = None,
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="No progress on stderr (the folder's line at the start and the results stay).")] = False,
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
    if quiet:  # the local model's assembly, deep in the broker, says nothing either
        import os as _os

        from swarmyard.progress import QUIET_ENV

        _os.environ[QUIET_ENV] = "1"
    if sandbox is SandboxKind.PROCESS:
        render.stderr.print("[yellow]warning[/yellow]: --sandbox process runs agents without isolation",
                            markup=True)
    progress = TrialProgress(len(campaign.trials), quiet=quiet)

    try:
        records = run_campaign(campaign, resume=resume, sandbox=sandbox, on_event=progress,
                               on_start=lambda: announce(campaign))
    finally:
        progress.close()
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
