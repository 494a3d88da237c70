"""``swarmyard audit verify RUN``: recompute a run's audit tree, check every checkpoint and cosignature, and
that the log was not cut back below, or rewritten after, what the witness cosigned: the host's witness home by
default (what ``swarmyard run`` starts), else the witness, its checkpoint or a size given."""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from swarmyard.audit.note import Verifier
from swarmyard.cli import render
from swarmyard.errors import AuditError, LogMismatchError, UserError

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


def _homes(given: Path | None) -> list[Path]:
    from swarmyard.audit.witness_home import homes_to_read

    return [given] if given is not None else homes_to_read()


def _from_home(given: Path | None, origin: str) -> tuple[WitnessHome | None, str | None]:
    """The witness home that cosigned the log of ``origin``, and the last checkpoint of it it published.

    Only ``origin``, the one the folder's place fixes (``_expected_origin``): the first origin found among
    several would let a folder holding another run's files, or a log re-signed under a name of its own choosing
    and cosigned as a new log, pass as the folder's.
    """
    from swarmyard.audit.witness_home import WitnessHome

    for root in _homes(given):
        home = WitnessHome(root)
        try:
            note = home.published(origin)
        except OSError as exc:
            raise AuditError(f"cannot read the witness home {root}: {exc.strerror}") from exc
        if note is not None:
            return home, note
    return None, None


def _expected_origin(folder: Path, audit_dir: Path, given: str | None) -> str:
    """The origin the log in this folder must have: given, else fixed by the folder (a run's id is the name the
    caller gave its folder by; a serve's log is named after its folder's path), never read from the folder's own
    files, which whoever holds the store can rewrite along with a fresh key."""
    from swarmyard.audit.log import run_origin, serve_origin

    if given is not None:
        return given
    if audit_dir == folder:
        return serve_origin(audit_dir)
    # the name as given (made absolute without following links: "." names the folder one is in), not the
    # resolved one: run A's folder swapped for a symlink to run B's would otherwise be checked as B, and pass
    return run_origin(Path(os.path.abspath(folder)).name)


def _symlinked_elsewhere(folder: Path) -> str | None:
    """Why ``folder`` cannot be verified under its own name: its last component is a symlink to a folder of
    another name (a run's id is its folder's name, so such a link stands one run in for another), else ``None``."""
    given = Path(os.path.abspath(folder))
    if not given.is_symlink():
        return None
    target = given.resolve()
    if target.name == given.name:
        return None  # a run kept elsewhere under its own name (an archive's), linked from where it was
    return f"{folder} is a symlink to a folder named {target.name!r}, not {given.name!r}"


def _describe(log_pinned: bool, witnessed: bool, witness_key: bool, fresh_size: int | None) -> str:
    """What the verdict rests on: where the log's key and the witness's key came from, and the rollback check."""
    if log_pinned:
        log = "log key pinned"
    elif witnessed:
        log = "log key the witness cosigned"  # the witness's checkpoint opened with the folder's key
    else:
        log = "log key from the folder"
    witness = "witness key pinned" if witness_key else "not witnessed"
    fresh = "rollback not checked" if fresh_size is None else f"not rolled back below {fresh_size}"
    return f"{log}; {witness}; {fresh}"


def _bad(exc: LogMismatchError, as_json: bool) -> typer.Exit:
    """Print a failed verdict; the exit to raise."""
    if as_json:
        render.print_json({"ok": False, "what": exc.what, "index": exc.index, "reason": exc.reason})
    else:
        render.stdout.print(f"BAD {exc.what} {exc.index}: {exc.reason}", highlight=False, markup=False)
    return typer.Exit(1)


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
        "--no-witness", "--no-witness-home",
        help="The log has no witness (a run made with --no-witness): read no witness home, check the folder (and "
             "what else is given) only; the verdict then says 'not witnessed'.")] = False,
    origin_given: Annotated[str | None, typer.Option(
        "--origin", help="The origin the log must have (default: swarmyard.local/<the run folder's name>, or for a "
                         "serve's --audit-dir the origin named after its path): for a folder moved or copied, or a "
                         "serve log begun under an origin of its own.")] = None,
    in_progress: Annotated[bool, typer.Option(
        "--in-progress", help="The run is still going: events its last checkpoint does not cover yet are counted, "
                              "not failed, and the tables are not checked (unless the log says the run closed).")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Print the tree size and root (exit 0), or the first bad event, checkpoint or key (exit 1).

    The log must have the origin its folder fixes (swarmyard.local/<run id> for a run folder), whatever its
    files say, and a witness must have cosigned that origin: a run's witness (the one `swarmyard run` starts by
    default) publishes its key and the last checkpoint it cosigned in its home, which the run cannot write; with
    no flag the log is checked against both, so a log cut back to an earlier checkpoint, re-signed with its own
    key, given a fresh key or another run's files fails, and so does a log no witness home knows. A run made
    with --no-witness has only its folder: verify it with --no-witness (pin the log's key to detect a fresh key,
    and give --min-size to detect a rollback); a log re-signed with its own key cannot be told apart.

    A finished run fails on any event no checkpoint covers (unsequenced rows included) and on any goal, task,
    finding, artifact or score row that differs from what its events say, or that they describe and is gone (other
    tables are not checked); --in-progress lets a live run's newest events through, counted, and skips the rows.
    """
    from swarmyard.audit.log import LOG_VKEY
    from swarmyard.audit.verify import verify_run
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
    origin = _expected_origin(folder, audit_dir, origin_given)
    swapped = _symlinked_elsewhere(folder) if origin_given is None and audit_dir != folder else None
    if swapped is not None:
        raise _bad(LogMismatchError("origin", 0, f"{swapped}: the run folder's name fixes the log it must hold "
                                                 f"({origin}); give the folder itself, or --origin"), as_json)
    named = _origin(audit_dir, pinned_log)
    if named != origin:
        raise _bad(LogMismatchError("origin", 0, f"the log is {named!r}, not {origin!r}, which this folder must "
                                                 "hold: another log's files, or a log re-signed under a name of "
                                                 "its own (a folder moved or copied: give --origin)"), as_json)
    witnessed, witness_verifier = _witnessed(witness, witness_checkpoint, origin, pinned_witness)
    home: WitnessHome | None = None
    if witness is None and witness_checkpoint is None and not no_witness_home:
        home, note = _from_home(witness_home, origin)
        if home is None or note is None:
            # the honest verdict: a log no witness saw proves only that its files agree with each other, which
            # anyone who can write them can arrange; that is said only when asked for (--no-witness)
            looked = ", ".join(str(h) for h in _homes(witness_home))
            raise _bad(LogMismatchError("witness", 0, f"no witness home has cosigned {origin} (looked in {looked}): "
                                                      "a log made with --no-witness is verified with --no-witness; "
                                                      "one cosigned by another witness with --witness"), as_json)
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
        raise _bad(exc, as_json) from None
    finally:
        store.close()
    root = base64.b64encode(report.root_hash).decode()
    pinned = report.pinned
    if as_json:
        render.print_json({"ok": True, "origin": report.origin, "size": report.size, "root": root,
                           "root_hex": report.root_hash.hex(), "checkpoints": report.checkpoints,
                           "cosigned": report.cosigned, "pinned": pinned, "log_key_pinned": pinned_log is not None,
                           "witnessed": witness_verifier is not None, "fresh_size": report.fresh_size,
                           "uncovered": report.uncovered, "closed": report.closed,
                           "tables_checked": report.tables_checked,
                           "witness_home": str(home.root) if home is not None else None})
    else:
        trust = _describe(pinned_log is not None, bool(witnessed), witness_verifier is not None, report.fresh_size)
        render.stdout.print(f"OK {report.origin} size {report.size} root {root} "
                            f"({report.checkpoints} checkpoints, {report.cosigned} cosigned; "
                            f"{trust}; {_progress(report)})", highlight=False, markup=False)
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
    elif witness_verifier is None:
        render.stderr.print(f"note: not witnessed: no witness cosigned {origin} as far as this check knows (a run "
                            "made with --no-witness, or with a witness of its own: give --witness): a log cut back "
                            "to an earlier checkpoint, or rewritten and re-signed with the run's log key, passes "
                            "this check undetected", highlight=False, markup=False)
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
