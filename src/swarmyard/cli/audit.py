"""``swarmyard audit verify RUN``: recompute a run's audit tree and check every checkpoint and cosignature."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Annotated

import typer

from swarmyard.cli import render

app = typer.Typer(help="The tamper-evident audit log of a run.", no_args_is_help=True)


def _run_folder(run: str) -> Path:
    path = Path(run)
    if not path.is_dir() and (Path("runs") / run).is_dir():
        path = Path("runs") / run
    return path


@app.command("verify")
def verify(
    run: Annotated[str, typer.Argument(help="A run folder (store.db, audit/) or a run id.")],
    store_url: Annotated[str | None, typer.Option("--store", help="Store URL, if not store.db.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Print the tree size and root (exit 0), or the first bad event or checkpoint (exit 1)."""
    from swarmyard.audit.verify import verify_run
    from swarmyard.errors import LogMismatchError, UserError
    from swarmyard.store import open_store

    folder = _run_folder(run)
    if not (folder / "audit").is_dir():
        raise UserError(f"{run}: no audit/ folder; give a run folder")
    if store_url is None:
        if not (folder / "store.db").exists():
            raise UserError(f"{run}: no store.db; give --store URL")
        store_url = f"sqlite:///{(folder / 'store.db').resolve()}"
    store = open_store(store_url, blob_dir=folder / "blobs")
    try:
        report = verify_run(store, folder / "audit")
    except LogMismatchError as exc:
        if as_json:
            render.print_json({"ok": False, "what": exc.what, "index": exc.index, "reason": exc.reason})
        else:
            render.stdout.print(f"BAD {exc.what} {exc.index}: {exc.reason}", highlight=False, markup=False)
        raise typer.Exit(1) from None
    finally:
        store.close()
    root = base64.b64encode(report.root_hash).decode()
    if as_json:
        render.print_json({"ok": True, "origin": report.origin, "size": report.size, "root": root,
                           "root_hex": report.root_hash.hex(), "checkpoints": report.checkpoints,
                           "cosigned": report.cosigned})
    else:
        render.stdout.print(f"OK {report.origin} size {report.size} root {root} "
                            f"({report.checkpoints} checkpoints, {report.cosigned} cosigned)",
                            highlight=False, markup=False)
