"""``swarmyard bench <area>``: run a benchmark area and print its table (or JSON with ``--json``)."""

from __future__ import annotations

from pathlib import Path

import typer

from swarmyard.bench import AREAS, BenchResult, run_area
from swarmyard.cli import render
from swarmyard.errors import UserError

app = typer.Typer(help="Measure performance against same-process baselines.", no_args_is_help=True)
#: the areas whose run takes a worker count (the others would silently ignore one)
TAKES_WORKERS = frozenset({"swarm"})


def show(result: BenchResult, as_json: bool) -> None:
    """Print a benchmark result."""
    if as_json:
        render.print_json({"area": result.area, **result.summary, "notes": result.notes})
        return
    rows = []
    for row in result.rows:
        ratio = row.ratio
        rows.append([row.name, f"{row.value:,.3f}".rstrip("0").rstrip("."), row.unit,
                     "" if row.baseline is None else f"{row.baseline:,.3f}".rstrip("0").rstrip("."),
                     row.baseline_name or "", "" if ratio is None else f"{ratio:.2f}", row.target or ""])
    render.print_table(f"swarmyard bench {result.area}", ["measure", "value", "unit", "baseline", "baseline is",
                                                          "ratio", "target"], rows)
    for note in result.notes:
        render.stderr.print(f"note: {note}")


def _make(area: str) -> None:
    def command(
        as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
        quick: bool = typer.Option(False, "--quick", help="A smaller, faster run."),
        workers: int = typer.Option(0, "--workers", min=0, help="Worker count (areas that take one: swarm)."),
        sandboxed: bool = typer.Option(False, "--sandboxed", help="swarm: real machines with the real agent in "
                                       "each, instead of in-process clients."),
        upstream_latency: float = typer.Option(0.0, "--upstream-latency", min=0.0,
                                               help="swarm: with --compare, the seconds the upstream takes to "
                                               "answer each call."),
        compare: str = typer.Option("", "--compare", help="swarm: real `swarmyard run`s of these worker counts "
                                    "(e.g. 10,200), all at once on the upstream, and the largest's wall time "
                                    "over the smallest's."),
        store: str = typer.Option("", "--store", help="swarm: the store the workers' goal is in (a SQLite path "
                                  "or sqlite:///path, or postgresql://...); measures one --workers size on it."),
        replicas: int = typer.Option(0, "--replicas", min=0, max=64, help="swarm: control-plane + broker "
                                     "processes serving the one store (with --store, default 1)."),
    ) -> None:
        if workers and area not in TAKES_WORKERS:
            raise UserError(f"bench {area} takes no --workers (only {', '.join(sorted(TAKES_WORKERS))} does)")
        if sandboxed and area != "swarm":
            raise UserError(f"bench {area} takes no --sandboxed (only swarm does)")
        if (compare or upstream_latency) and area != "swarm":
            raise UserError(f"bench {area} takes no --compare or --upstream-latency (only swarm does)")
        options: dict[str, object] = {"workers": workers} if workers else {}
        if store or replicas:
            options.update(_at_scale(area, store, replicas, workers=workers, sandboxed=sandboxed,
                                     compare=bool(compare or upstream_latency), quick=quick))
        if compare or upstream_latency:
            if workers or sandboxed or quick:
                raise UserError("bench swarm --compare runs its own sizes: it takes no --workers, --sandboxed or "
                                "--quick")
            if not compare:
                raise UserError("--upstream-latency goes with --compare (the worker counts to run on it)")
            options["compare"] = _sizes(compare)
            options["upstream_latency"] = upstream_latency or 2.0
        if sandboxed:
            options["sandboxed"] = True
        show(run_area(area, quick=quick, **options), as_json)

    command.__doc__ = f"Benchmark the {area} area."
    app.command(name=area)(command)


def _at_scale(area: str, store: str, replicas: int, *, workers: int, sandboxed: bool, compare: bool,
              quick: bool) -> dict[str, object]:
    """``--store`` / ``--replicas``: one size on one store; a usage error (exit 2) for what they cannot go with."""
    flag = "--store" if store else "--replicas"
    if area != "swarm":
        raise typer.BadParameter(f"bench {area} takes no {flag} (only swarm does)", param_hint=f"'{flag}'")
    if sandboxed or compare or quick:
        raise typer.BadParameter("bench swarm --store/--replicas runs in-process workers at one size: it takes no "
                                 "--sandboxed, --compare, --upstream-latency or --quick", param_hint=f"'{flag}'")
    if not workers:
        raise typer.BadParameter("bench swarm --store/--replicas measures one size: give it --workers N",
                                 param_hint=f"'{flag}'")
    return {"store": _store_url(store) if store else "", "replicas": replicas or 1}


def _store_url(text: str) -> str:
    """``--store``: a PostgreSQL URL, ``sqlite:///path``, or a SQLite file's path (its folder must exist)."""
    if text.startswith(("postgresql://", "postgres://")):
        return text
    path = Path(text.removeprefix("sqlite:///")) if text.startswith("sqlite:///") else Path(text)
    if "://" in text and not text.startswith("sqlite:///"):
        raise typer.BadParameter(f"{text!r} is neither a SQLite path nor a postgresql:// URL",
                                 param_hint="'--store'")
    if not path.parent.is_dir():
        raise typer.BadParameter(f"the SQLite file's folder {str(path.parent)!r} does not exist",
                                 param_hint="'--store'")
    return f"sqlite:///{path.resolve()}"


def _sizes(text: str) -> list[int]:
    """``10,200`` as worker counts (at least two, each 1 to 2,000)."""
    try:
        sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise UserError(f"--compare takes worker counts such as 10,200, not {text!r}") from None
    if len(sizes) < 2 or sizes[0] < 1 or sizes[-1] > 2000:
        raise UserError(f"--compare takes two or more worker counts from 1 to 2,000, such as 10,200, not {text!r}")
    return sizes


for _area in AREAS:
    _make(_area)


@app.command(name="campaign")
def campaign(
    campaign_file: Path | None = typer.Argument(None, help="The campaign file (default: "
                                                "examples/campaigns/reconciliation-local-4x5.toml)."),
    as_json: bool = typer.Option(False, "--json", help="Print the results as one JSON document."),
    resume: bool = typer.Option(False, "--resume", help="Continue the campaign in its folder."),
    trials: int | None = typer.Option(None, "--trials", min=1, help="Run at most this many trials now."),
) -> None:
    """Run a campaign on a real model seed by seed and report its cells, pairs, wall time and host load."""
    from swarmyard.bench.campaign import run
    from swarmyard.cli.campaign import TrialProgress, announce

    done = run(campaign_file, resume=resume, trials=trials, progress=TrialProgress, on_start=announce)
    if as_json:
        render.print_json(done.document)
    else:
        print(done.markdown, end="")
        d = done.document
        render.stderr.print(f"campaign {d['campaign']}: {d['trials_done']}/{d['trials_total']} trials, "
                            f"{d['wall_s']:,.1f} s (load {d['host']['load_before']} -> {d['host']['load_after']} "
                            f"on {d['host']['cpus']} CPUs); report {d['files']['markdown']}", highlight=False)
