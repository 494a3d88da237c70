"""``swarmyard audit verify RUN``: recompute a run's audit tree, check every checkpoint and cosignature, and
that the log was not cut back below, or rewritten after, what the witness cosigned: the host's witness home by
default (what ``swarmyard run`` starts), else the witness, its checkpoint or a size given."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from swarmyard.audit.note import Verifier
from swarmyard.cli import render
from swarmyard.errors import AuditError, UserError

if TYPE_CHECKING:
    from swarmyard.audit.verify import VerifyReport
    from swarmyard.audit.witness_home import WitnessHome

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


def _witnessed(witness: str | None, checkpoint_file: Path | None, origin: str,
               witness_key: Verifier | None) -> tuple[list[str], Verifier | None]:
    """The witness's last cosigned checkpoints of ``origin`` to compare the log with, and the witness key to
    check them with (the one the live witness announces, unless one is pinned)."""
    notes: list[str] = []
    if checkpoint_file is not None:
        try:
            notes.append(checkpoint_file.read_text())
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot read the witness checkpoint {checkpoint_file}: {exc}") from exc
    if witness is not None:
        from swarmyard.audit.witness import HttpWitnessClient
        from swarmyard.errors import NotFoundError

        client = HttpWitnessClient.at(witness)
        try:
            witness_key = witness_key or client.verifier()
            notes.append(client.latest(origin))
        except NotFoundError as exc:
            raise AuditError(f"the witness at {witness} has cosigned nothing for {origin}") from exc
        finally:
            client.close()
    return notes, witness_key


def _from_home(given: Path | None, folder: Path, origin: str) -> tuple[WitnessHome | None, str | None]:
    """The witness home that cosigned this log, and the last checkpoint of it it published.

    Looked up under the log's origin and under the origin ``swarmyard run`` gives the run of this folder's name:
    a folder whose log key was replaced by one of another name is still matched with what the witness saw.
    """
    from swarmyard.audit.witness_home import WitnessHome, homes_to_read

    origins = list(dict.fromkeys([origin, f"swarmyard.local/{folder.resolve().name}"]))
    for root in [given] if given is not None else homes_to_read():
        home = WitnessHome(root)
        for name in origins:
            try:
                note = home.published(name)
            except OSError as exc:
                raise AuditError(f"cannot read the witness home {root}: {exc.strerror}") from exc
            if note is not None:
                return home, note
    return None, None


def _describe(pinned: bool, fresh_size: int | None) -> str:
    trust = "keys pinned" if pinned else "self-consistency only: no key pinned"
    fresh = "rollback not checked" if fresh_size is None else f"not rolled back below {fresh_size}"
    return f"{trust}; {fresh}"


@app.command("verify")
def verify(
    run: Annotated[str, typer.Argument(help="A run folder (store.db, audit/) or a run id.")],
    store_url: Annotated[str | None, typer.Option("--store", help="Store URL, if not store.db.")] = None,
    log_key: Annotated[str | None, typer.Option(
        "--log-key", help="Pin the log's verifier key (the report's 'audit key', or a file holding it).")] = None,
    witness_key: Annotated[str | None, typer.Option(
        "--witness-key", help="Pin the witness's verifier key (or a file holding it).")] = None,
    witness: Annotated[str | None, typer.Option(
        "--witness", help="Ask this witness (URL or socket path) for the last size it cosigned: "
                          "a log rolled back below it fails.")] = None,
    witness_checkpoint: Annotated[Path | None, typer.Option(
        "--witness-checkpoint", help="The witness's last cosigned checkpoint of this log, as a file "
                                     "(`swarmyard witness checkpoint`): a log rolled back below it fails.")] = None,
    min_size: Annotated[int, typer.Option(
        "--min-size", min=0, help="The log must hold at least this many events.")] = 0,
    witness_home: Annotated[Path | None, typer.Option(
        "--witness-home", help="The witness home to compare the log with (default: the host's, where `swarmyard "
                               "run` keeps its witness: $SWARMYARD_WITNESS_DIR, /var/lib/swarmyard/witness, "
                               "then this user's state folder). Read unless --witness or --witness-checkpoint "
                               "is given.")] = None,
    no_witness_home: Annotated[bool, typer.Option(
        "--no-witness-home", help="Do not read any witness home: check the folder (and what else is given) only.")
    ] = False,
    in_progress: Annotated[bool, typer.Option(
        "--in-progress", help="The run is still going: events its last checkpoint does not cover yet are counted, "
                              "not failed, and the tables are not checked (unless the log says the run closed).")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Print the tree size and root (exit 0), or the first bad event, checkpoint or key (exit 1).

    A run's witness (the one `swarmyard run` starts by default) publishes its key and the last checkpoint it
    cosigned in its home, which the run cannot write: with no flag the log is checked against both, so a log
    cut back to an earlier checkpoint, re-signed with its own key, or given a fresh key fails. A run made with
    --no-witness has only its folder: pin the log's key to detect a fresh key, and give --min-size to
    detect a rollback; a log re-signed with its own key cannot be told apart.

    A finished run fails on any event no checkpoint covers (unsequenced rows included) and on any goal, task,
    finding or artifact row that differs from what its events say; --in-progress lets a live run's newest
    events through, counted, and skips the rows.
    """
    from swarmyard.audit.log import LOG_VKEY
    from swarmyard.audit.verify import verify_run
    from swarmyard.errors import LogMismatchError
    from swarmyard.store import open_store

    pinned_log, pinned_witness = _verifier(log_key), _verifier(witness_key)
    folder = _run_folder(run)
    audit_dir = folder / "audit"
    blob_dir: Path | None = folder / "blobs"
    if not audit_dir.is_dir() and store_url is not None and (folder / LOG_VKEY).is_file():
        audit_dir, blob_dir = folder, None  # the folder a serve was given as --audit-dir, its store elsewhere
    if not audit_dir.is_dir():
        raise UserError(f"{run}: no audit/ folder; give a run folder (or a serve's --audit-dir with --store)")
    if store_url is None:
        if not (folder / "store.db").exists():
            raise UserError(f"{run}: no store.db; give --store URL")
        store_url = f"sqlite:///{(folder / 'store.db').resolve()}"
    origin = _origin(audit_dir, pinned_log)
    witnessed, witness_verifier = _witnessed(witness, witness_checkpoint, origin, pinned_witness)
    home: WitnessHome | None = None
    if witness is None and witness_checkpoint is None and not no_witness_home:
        home, note = _from_home(witness_home, folder, origin)
        if home is not None and note is not None:
            published = home.published_key()
            if published is None:
                raise AuditError(f"the witness home {home.root} has checkpoints but no witness.vkey")
            witnessed.append(note)
            witness_verifier = witness_verifier or published
    store = open_store(store_url, blob_dir=blob_dir)
    try:
        report = verify_run(store, audit_dir, log_key=pinned_log, witness_key=witness_verifier,
                            witnessed=witnessed, min_size=min_size, tables=store, in_progress=in_progress)
    except LogMismatchError as exc:
        if as_json:
            render.print_json({"ok": False, "what": exc.what, "index": exc.index, "reason": exc.reason})
        else:
            render.stdout.print(f"BAD {exc.what} {exc.index}: {exc.reason}", highlight=False, markup=False)
        raise typer.Exit(1) from None
    finally:
        store.close()
    root = base64.b64encode(report.root_hash).decode()
    pinned = report.pinned
    if as_json:
        render.print_json({"ok": True, "origin": report.origin, "size": report.size, "root": root,
                           "root_hex": report.root_hash.hex(), "checkpoints": report.checkpoints,
                           "cosigned": report.cosigned, "pinned": pinned, "fresh_size": report.fresh_size,
                           "uncovered": report.uncovered, "closed": report.closed,
                           "tables_checked": report.tables_checked,
                           "witness_home": str(home.root) if home is not None else None})
    else:
        render.stdout.print(f"OK {report.origin} size {report.size} root {root} "
                            f"({report.checkpoints} checkpoints, {report.cosigned} cosigned; "
                            f"{_describe(pinned, report.fresh_size)}; {_progress(report)})",
                            highlight=False, markup=False)
    if not pinned:
        render.stderr.print("note: checked self-consistency only: the folder agrees with itself, but a store and "
                            "folder rewritten with a fresh key would too; pin --log-key or --witness-key",
                            highlight=False, markup=False)
    if home is not None:
        owner = home.owner()
        if home.root.stat().st_uid == audit_dir.stat().st_uid:
            render.stderr.print(f"note: the witness home {home.root} belongs to {owner}, as the run does (the run "
                                "was not started as root): whoever holds that user's files can rewrite both",
                                highlight=False, markup=False)
        elif not as_json:
            render.stderr.print(f"witness home {home.root} ({owner}): not rolled back or rewritten since it "
                                f"cosigned size {report.fresh_size}", highlight=False, markup=False)
    elif witness is None and witness_checkpoint is None and not no_witness_home:
        render.stderr.print(f"note: no witness cosigned {origin} (a run made with --no-witness, or with a witness "
                            "of its own: give --witness): a log cut back to an earlier checkpoint, or rewritten "
                            "and re-signed with the run's log key, passes this check undetected",
                            highlight=False, markup=False)
    if report.fresh_size is None:
        render.stderr.print("note: rollback not checked: a log cut back to an earlier checkpoint passes; give "
                            "--witness, --witness-checkpoint or --min-size", highlight=False, markup=False)


def _progress(report: VerifyReport) -> str:
    if report.uncovered:
        return f"in progress: {report.uncovered} newer events not covered yet, tables not checked"
    if not report.tables_checked:
        return "in progress: tables not checked"
    return f"{'closed' if report.closed else 'not closed'}, tables match"


def _origin(audit_dir: Path, pinned: Verifier | None) -> str:
    """The log's origin: its key's name (pinned, else the folder's)."""
    from swarmyard.audit.log import LOG_VKEY

    if pinned is not None:
        return pinned.name
    try:
        return Verifier.parse((audit_dir / LOG_VKEY).read_text().strip()).name
    except OSError as exc:
        raise AuditError(f"no audit log in {audit_dir} ({LOG_VKEY}: {exc.strerror})") from exc
