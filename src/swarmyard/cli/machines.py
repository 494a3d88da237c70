"""``swarmyard machines doctor|list|snapshot``: what sandboxing this host allows, the machines' run folders,
and their snapshots."""

from __future__ import annotations

from pathlib import Path

import typer

from swarmyard.cli import render, snapshots

app = typer.Typer(help="Sandboxed machines: probe the host, list run folders, snapshots.", no_args_is_help=True)
app.add_typer(snapshots.app, name="snapshot")


@app.command()
def doctor(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Try every isolation feature on this host and say which work."""
    from swarmyard.machines.doctor import probe

    report = probe()
    if as_json:
        render.print_json(report)
        return
    render.print_table(
        "machines doctor",
        ["check", "ok", "detail"],
        [(c.name, "yes" if c.ok else "NO", c.detail) for c in report.checks],
    )


@app.command("list")
def list_(
    root: Path | None = typer.Option(None, "--root", help="Machines run folder."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Machine folders under the run folder (machines live as long as the process that made them)."""
    from swarmyard.errors import UserError
    from swarmyard.machines.supervised import default_root

    if root is not None and not root.is_dir():
        raise UserError(f"--root {root}: no such folder")  # a typo would otherwise list nothing, as if all were fine
    base = (root or default_root()) / "m"
    rows = (
        [
            {"id": p.name, "disk": str(p / "disk"), "mounted": (p / "disk").is_mount()}
            for p in sorted(base.iterdir())
        ]
        if base.is_dir()
        else []
    )
    if as_json:
        render.print_json(rows)
        return
    render.print_table(
        "machines", ["id", "disk", "mounted"], [(r["id"], r["disk"], r["mounted"]) for r in rows]
    )
