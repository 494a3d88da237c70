"""``swarmyard bench campaign [FILE] --json``: run a campaign whole (by default the real-model one) and time it.

Every trial is a real run, as ``swarmyard campaign`` makes it; the bench runs them seed by seed (every cell of a
seed, then the next seed), so that a campaign stopped part way still pairs whole seeds, and adds to the
campaign's figures what a reader needs to judge them: the wall time of the trials and of this command, and the
host's load (a 1-minute load average above the CPU count means the trials shared the CPUs with other work and
their wall times are long for that reason). ``--trials N`` runs at most N trials now; with ``--resume`` the next
call continues, so a long campaign can be run in pieces; ``trials_wall_s`` then sums every piece's trials.
The campaign's folder gets its report (``campaign.md``, ``campaign.html``, ``results.json``, plots) as
``swarmyard campaign`` writes it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swarmyard.config import SandboxKind
from swarmyard.errors import UserError

if TYPE_CHECKING:
    from swarmyard.campaign.runner import TrialEvent
    from swarmyard.campaign.spec import Campaign

#: The campaign run when none is named: 4 cells x 5 seeds of the reconciliation on the embedded model.
DEFAULT_FILE = Path("examples") / "campaigns" / "reconciliation-local-4x5.toml"


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


@dataclass(frozen=True, slots=True)
class CampaignBench:
    """What one ``bench campaign`` call measured, and where the report went."""

    document: dict[str, Any]
    markdown: str


def run(file: Path | None = None, *, resume: bool = False, trials: int | None = None,
        sandbox: SandboxKind | None = None, cwd: Path | None = None,
        progress: Callable[[int], Callable[[TrialEvent], None]] | None = None,
        on_start: Callable[[Campaign], None] | None = None) -> CampaignBench:
    """Run the campaign of ``file`` (``DEFAULT_FILE`` from ``cwd`` when ``None``) and summarise it;
    ``progress(total)`` makes the callback told of each trial's start and end; ``on_start(campaign)`` is called
    once the campaign's folder is this process's, before the first trial (to say where the folder is)."""
    from swarmyard.campaign import load_campaign, run_campaign, summarise
    from swarmyard.campaign.files import markdown, write_files
    from swarmyard.campaign.record import hold

    here = cwd or Path.cwd()
    if file is None:
        file = here / DEFAULT_FILE
        if not file.is_file():
            raise UserError(f"no campaign file named and no {DEFAULT_FILE} here: run from the repository's root "
                            "or name a campaign file", field="file")
    campaign = load_campaign(file, cwd=here)
    load_before = _load()
    started = time.monotonic()
    on_event = progress(len(campaign.trials)) if progress is not None else None
    records = run_campaign(campaign, resume=resume, sandbox=sandbox, on_event=on_event, limit=trials,
                           by_seed=True, on_start=(lambda: on_start(campaign)) if on_start is not None else None)
    wall_s = time.monotonic() - started
    load_after = _load()
    with hold(campaign.dir):
        summary = summarise(campaign, records)
        files = write_files(summary)
    plots = [p.name for p in files.plots]
    document = {
        "area": "campaign",
        "file": str(file),
        **summary.to_dict(),
        "trials_total": len(campaign.trials),
        "trials_done": len(records),
        "trials_failed": sum(1 for r in records if r.error),
        "trials_wall_s": round(sum(r.wall_s for r in records), 1),
        "wall_s": round(wall_s, 1),
        "host": {"cpus": os.cpu_count(), "load_before": load_before, "load_after": load_after},
        "files": {"markdown": str(files.markdown), "html": str(files.html), "json": str(files.json),
                  "plots": [str(campaign.dir / p) for p in plots]},
    }
    return CampaignBench(document, markdown(summary, plots))
