"""``swarmyard machines snapshot create|list|versions|delete``: versioned disks that machines start from.

The host operator's snapshots by default: every Boxd client and run of the root may start machines from them, no
coordinator machine may. ``--client ID`` acts in a Boxd client's namespace instead (``boxd.snapshots.client``):
the operator, the user who owns the root, may list, make and delete any client's snapshots there.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from swarmyard.cli import render

if TYPE_CHECKING:
    from swarmyard.machines.snapshots import Snapshot, Snapshots

app = typer.Typer(help="Snapshots: named, versioned disks to start machines from.", no_args_is_help=True)
_Root = typer.Option(None, "--root", help="Machines run folder (where the machines of this host live).")
_Json = typer.Option(False, "--json", help="Print JSON.")
_Client = typer.Option(None, "--client", help="A Boxd client's id (boxd.snapshots.client): act on its snapshots "
                                               "instead of the operator's.")
_COLUMNS = ["name", "version", "digest", "size_bytes", "source"]


def _store(root: Path | None, client: str | None = None) -> Snapshots:
    from swarmyard.errors import UserError
    from swarmyard.machines.local import LocalBackend
    from swarmyard.machines.snapshots import Snapshots

    if root is not None and not root.is_dir():
        raise UserError(f"--root {root}: no such folder")
    # the local backend's own baselines (owned as its machines need them); no machine is started
    return Snapshots(LocalBackend(root, parked=0), client)


def _print(snapshots: list[Snapshot], as_json: bool) -> None:
    rows = [asdict(s) for s in snapshots]
    if as_json:
        render.print_json(rows)
        return
    render.print_table(None, _COLUMNS, [[r[c] for c in _COLUMNS] for r in rows])


@app.command()
def create(name: str = typer.Argument(..., help="The snapshot's name; each create adds a version."),
           source: str = typer.Option(..., "--from", help="A folder on this host, or the id or name of a live "
                                                          "machine of yours (made by another process)."),
           root: Path | None = _Root, as_json: bool = _Json, client: str | None = _Client) -> None:
    """Snapshot a folder, or a live machine's disk (frozen while it is copied), as a new version of NAME."""
    from swarmyard.errors import UserError

    folder = Path(source)
    if folder.is_dir():
        store = _store(root, client)
        _print([store.create(name, folder=folder)], as_json)
        return
    if "/" in source:
        raise UserError(f"--from {source}: not a folder on this host")
    store = _store(root, client)
    _print([store.create(name, machine_id=source)], as_json)


@app.command("list")
def list_(root: Path | None = _Root, as_json: bool = _Json, client: str | None = _Client) -> None:
    """The newest version of every snapshot."""
    store = _store(root, client)
    _print(list(store.list()), as_json)


@app.command()
def versions(name: str = typer.Argument(..., help="The snapshot."), root: Path | None = _Root,
             as_json: bool = _Json, client: str | None = _Client) -> None:
    """Every version of NAME, oldest first."""
    store = _store(root, client)
    _print(list(store.versions(name)), as_json)


@app.command()
def delete(ref: str = typer.Argument(..., help="NAME (every version) or NAME:VERSION."), root: Path | None = _Root,
           as_json: bool = _Json, client: str | None = _Client) -> None:
    """Delete a snapshot or one version (refused while a live machine runs on it, whichever process made it)."""
    store = _store(root, client)
    _print(list(store.delete(ref)), as_json)
