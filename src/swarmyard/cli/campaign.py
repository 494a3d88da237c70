"""``swarmyard campaign CAMPAIGN.toml [--resume] [--json] [--sandbox local|process]``: run a matched campaign."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from swarmyard.cli import render
from swarmyard.config import SandboxKind


class TrialProgress:
    """A progress bar on stderr while trials run, only on a terminal."""

    def __init__(self, total: int, *, live: bool | None = None) -> None:
        self.bar: Any = None
        self.task: Any = None
        if sys.stderr.isatty() if live is None else live:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn(), console=render.stderr)
            self.task = self.bar.add_task("campaign", total=total)

    def __enter__(self) -> TrialProgress:
        if self.bar is not None:
            self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()

    def __call__(self, event: Any) -> None:
        """Show a trial starting or ending."""
        if self.bar is None:
            return
        if event.record is None:
            self.bar.update(self.task, completed=event.done, description=f"running {event.trial.key}")
        else:
            score = event.record.score
            self.bar.update(self.task, completed=event.done,
                            description=f"{event.trial.key}: {'-' if score is None else f'{score:,}'}")


def command(
    campaign_file: Annotated[Path, typer.Argument(help="The campaign file (TOML).")],
    resume: Annotated[bool, typer.Option(
        "--resume", help="Continue the campaign in its folder: finished trials are kept, not run again.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as one JSON document.")] = False,
    sandbox: Annotated[SandboxKind | None, typer.Option(
        "--sandbox", help="Machine backend of every trial: local (default) or process (no isolation).")] = None,
) -> None:
    """Run every cell of a campaign on every seed under the same cap; print each cell's mean score with its 95%
    bootstrap interval, cost, time, calls, tokens and how alike its attempts were. The folder keeps the record,
    campaign.md, campaign.html, results.json and the plots.

    Exit 0 when every trial has run; 1 for a bad campaign file (before anything runs) or other error.
    """
    from swarmyard.campaign import load_campaign, run_campaign, summarise
    from swarmyard.campaign.files import markdown, write_files
    from swarmyard.campaign.record import hold

    campaign = load_campaign(campaign_file)  # every trial's swarm file is checked here: exit 1 before any run
    if sandbox is SandboxKind.PROCESS:
        render.stderr.print("[yellow]warning[/yellow]: --sandbox process runs agents without isolation",
                            markup=True)
    with TrialProgress(len(campaign.trials)) as progress:
        records = run_campaign(campaign, resume=resume, sandbox=sandbox, on_event=progress)
        with hold(campaign.dir):  # the folder's files are this process's to write until they are written
            summary = summarise(campaign, records)
            files = write_files(summary)
    if as_json:
        print(json.dumps(summary.to_dict(), indent=2))
    else:
        plots = [p.name for p in (files.tokens_plot, files.n_plot) if p is not None]
        print(markdown(summary, plots), end="")
        render.stderr.print(f"campaign {campaign.name}: {files.markdown}, {files.html}, {files.json}",
                            highlight=False)
