"""``swarmyard audit verify RUN``: recompute a run's audit tree and check every checkpoint and cosignature."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Annotated

import typer

from swarmyard.audit.note import Verifier
from swarmyard.cli import render
from swarmyard.errors import AuditError, UserError

app = typer.Typer(help="The tamper-evident audit log of a run.", no_args_is_help=True)


def _run_folder(run: str) -> Path:
    path = Path(run)
    if not path.is_dir() and (Path("runs") / run).is_dir():
        path = Path("runs") / run
    return path


def _verifier(given: str | None) -> Verifier | None:
    """A verifier key given inline (``name+keyid+key``) or as a file holding one."""
    if given is None:
        return None
    text = given
    if "+" not in given:
        path = Path(given)
        if not path.is_file():
            raise UserError(f"{given}: neither a verifier key (name+id+key) nor a file")
        text = path.read_text()
    try:
        return Verifier.parse(text.strip())
    except AuditError as exc:
        raise UserError(f"{given}: not a verifier key ({exc.message})") from exc


@app.command("verify")
def verify(
    run: Annotated[str, typer.Argument(help="A run folder (store.db, audit/) or a run id.")],
    store_url: Annotated[str | None, typer.Option("--store", help="Store URL, if not store.db.")] = None,
    log_key: Annotated[str | None, typer.Option(
        "--log-key", help="Pin the log's verifier key (the report's 'audit key', or a file holding it).")] = None,
    witness_key: Annotated[str | None, typer.Option(
        "--witness-key", help="Pin the witness's verifier key (or a file holding it).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Print the tree size and root (exit 0), or the first bad event, checkpoint or key (exit 1).

    Without pinned keys the folder is only checked against itself: pin the log's key (or the witness's)
    to detect a folder rewritten with a fresh key.
    """
    from swarmyard.audit.verify import verify_run
    from swarmyard.errors import LogMismatchError
    from swarmyard.store import open_store

    pinned_log, pinned_witness = _verifier(log_key), _verifier(witness_key)
    folder = _run_folder(run)
    if not (folder / "audit").is_dir():
        raise UserError(f"{run}: no audit/ folder; give a run folder")
    if store_url is None:
        if not (folder / "store.db").exists():
            raise UserError(f"{run}: no store.db; give --store URL")
        store_url = f"sqlite:///{(folder / 'store.db').resolve()}"
    store = open_store(store_url, blob_dir=folder / "blobs")
    try:
        report = verify_run(store, folder / "audit", log_key=pinned_log, witness_key=pinned_witness)
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
