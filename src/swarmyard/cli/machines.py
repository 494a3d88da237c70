"""``swarmyard machines new|exec|list|fork|delete|stop|serve|doctor|folders|snapshot``: machines from the command
line, on the host and inside a coordinator machine.

On the host the machines belong to one background service per machines root (see :mod:`swarmyard.boxd._host`),
started by the first ``new``; inside a coordinator machine (made with ``--spawn``) the commands make and reach its
own machines through the client that made it, as its ``Boxd()`` does. Either way the rules are the Boxd client's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from swarmyard.cli import render, snapshots

if TYPE_CHECKING:
    from swarmyard.boxd import Machine
    from swarmyard.boxd._remote import RemoteMachines

app = typer.Typer(help="Sandboxed machines: make, run in, fork and delete them; probe the host; snapshots.",
                  no_args_is_help=True)
app.add_typer(snapshots.app, name="snapshot")
_Root = typer.Option(None, "--root", help="Machines run folder (on the host; its service holds the machines).")
_Json = typer.Option(False, "--json", help="Print JSON.")
_COLUMNS = ["name", "id", "status", "networks", "source"]


def _inside() -> bool:
    """In a coordinator machine: its exec environment names the client that made it and its token."""
    return bool(os.environ.get("SWARMYARD_BOXD_URL"))


def _machines(root: Path | None, *, start: bool) -> RemoteMachines | None:
    """The machines these commands act on: a coordinator's own, or the host service's (started by ``new``)."""
    from swarmyard.boxd._host import client
    from swarmyard.boxd._remote import RemoteMachines
    from swarmyard.errors import UserError

    if _inside():
        token = os.environ.get("SWARMYARD_TOKEN")
        if not token:
            raise UserError("this machine has no spawn capability, so it cannot make machines")
        if root is not None:
            raise UserError("--root is for the host: inside a coordinator machine its machines are its client's")
        return RemoteMachines(os.environ["SWARMYARD_BOXD_URL"], token)
    if os.path.exists("/run/swarmyard/ctl/init.sock") or os.environ.get("SWARMYARD_TOKEN"):
        # a machine without the capability: no service starts in here (as Boxd() refuses)
        raise UserError("this machine has no spawn capability, so it cannot make machines: only a machine made "
                        "with --spawn (or Boxd's spawn=True) can")
    if root is not None and not root.is_dir():
        raise UserError(f"--root {root}: no such folder")
    return client(root, start=start)


def _needed(root: Path | None) -> RemoteMachines:
    from swarmyard.errors import UserError

    machines = _machines(root, start=False)
    if machines is None:
        raise UserError("no machines service runs for this root, so no machine exists: "
                        "`swarmyard machines new NAME` makes one")
    return machines


def _row(machine: Machine) -> dict[str, object]:
    source = machine.source
    return {"name": machine.name, "id": machine.id, "status": machine.status, "networks": dict(machine.addresses),
            "source": None if source is None else f"{source.kind}:{source.name}"}


def _print(machines: list[Machine], as_json: bool) -> None:
    rows = [_row(m) for m in machines]
    if as_json:
        render.print_json(rows)
        return
    render.print_table(None, _COLUMNS, [[m.name, m.id, m.status, " ".join(f"{k}={v}" for k, v in m.addresses.items()),
                                         r["source"] or "-"] for m, r in zip(machines, rows, strict=True)])


@app.command()
def new(
    name: str = typer.Argument(..., help="The machine's name (on a network, <name>.yard and <name>.boxd)."),
    networks: str | None = typer.Option(None, "--networks", help="Private networks to join, comma-separated."),
    isolated: bool = typer.Option(True, "--isolated/--no-isolated",
                                  help="Reach nothing but loopback, the control plane and the networks named "
                                       "(the only kind there is; the flag is accepted as boxd spells it)."),
    spawn: bool = typer.Option(False, "--spawn", help="A coordinator: its commands and Boxd() make machines."),
    from_snapshot: str | None = typer.Option(None, "--from-snapshot", help="Start from NAME[:VERSION]."),
    timeout: float = typer.Option(180.0, "--timeout", help="Seconds to wait until it runs commands."),
    root: Path | None = _Root,
    as_json: bool = _Json,
) -> None:
    """Make a machine and return once it runs commands (on the host, the first one starts the service)."""
    from swarmyard.errors import UserError

    if not isolated:
        raise UserError("every machine is isolated (loopback, the control plane and its networks only)")
    nets = [n.strip() for n in networks.split(",")] if networks is not None else None
    machines = _machines(root, start=True)
    assert machines is not None
    try:
        made = machines.create(name, networks=nets, spawn=spawn, from_snapshot=from_snapshot)
        _print([machines.wait_until_ready(made.id, timeout=timeout)], as_json)
    finally:
        machines.close()


@app.command("exec")
def exec_(
    name: str = typer.Argument(..., help="The machine (name or id)."),
    command: list[str] = typer.Argument(..., help="After --: one argument is a shell line, several an argv."),
    env: list[str] = typer.Option([], "--env", "-e", help="KEY=VALUE for the command (repeatable)."),
    cwd: str | None = typer.Option(None, "--cwd", help="Working folder (default: the machine's home)."),
    timeout: float | None = typer.Option(None, "--timeout", help="Seconds before its process tree is killed."),
    root: Path | None = _Root,
) -> None:
    """Run a command in a machine: its output as it came, and its exit code as this command's (124 on timeout)."""
    from swarmyard.errors import InvalidInputError

    pairs = dict(e.split("=", 1) for e in env if "=" in e)
    if len(pairs) != len(env):
        raise InvalidInputError("--env takes KEY=VALUE", field="env")
    machines = _needed(root)
    try:
        done = machines.exec(name, command[0] if len(command) == 1 else command, env=pairs, cwd=cwd,
                             timeout=timeout)
    finally:
        machines.close()
    sys.stdout.buffer.write(done.stdout_raw)
    sys.stdout.flush()
    sys.stderr.buffer.write(done.stderr_raw)
    sys.stderr.flush()
    raise typer.Exit(124 if done.timed_out else done.exit_code)


@app.command("list")
def list_(root: Path | None = _Root, as_json: bool = _Json) -> None:
    """Your machines (on the host: the service's; none when no service runs)."""
    machines = _machines(root, start=False)
    if machines is None:
        _print([], as_json)
        return
    try:
        _print(machines.list(), as_json)
    finally:
        machines.close()


@app.command()
def fork(source: str = typer.Argument(..., help="The machine to copy."),
         name: str = typer.Argument(..., help="The new machine's name."),
         root: Path | None = _Root, as_json: bool = _Json) -> None:
    """A new machine whose disk starts as a copy of SOURCE's."""
    machines = _needed(root)
    try:
        made = machines.fork(source, name)
        _print([machines.wait_until_ready(made.id)], as_json)
    finally:
        machines.close()


@app.command()
def delete(name: str = typer.Argument(..., help="The machine (name or id)."), root: Path | None = _Root) -> None:
    """Kill everything in a machine and remove it (a coordinator's machines go with it)."""
    machines = _needed(root)
    try:
        machines.delete(name)
    finally:
        machines.close()


@app.command()
def stop(root: Path | None = _Root) -> None:
    """Delete every machine of the host's service and stop it."""
    from swarmyard.boxd._host import stop as stop_service
    from swarmyard.errors import UserError

    if _inside():
        raise UserError("stop is for the host's service; inside a machine delete machines one by one")
    stop_service(root)


@app.command()
def serve(
    root: Path | None = _Root,
    providers: Path | None = typer.Option(None, "--providers", help="A file with a \\[providers] table for the "
                                          "machines' agents (default: the embedded local model)."),
    model: str | None = typer.Option(None, "--model", help="The model the machines' agents use."),
    idle_s: float = typer.Option(600.0, "--idle-s", help="Stop after this many seconds without a machine."),
    max_machines: int = typer.Option(128, "--max-machines", help="Machines alive at once."),
    spawn_cap: int = typer.Option(8, "--spawn-cap", help="Machines a coordinator may have alive at once."),
    ready_fd: int | None = typer.Option(None, "--ready-fd", hidden=True),
) -> None:
    """Hold this root's machines for the commands (what the first `new` starts in the background)."""
    from swarmyard.boxd._host import serve as run_service
    from swarmyard.errors import UserError

    if _inside():
        raise UserError("the machines service runs on the host")
    run_service(root, ready_fd=ready_fd, idle_s=idle_s, providers=providers, model=model,
                max_machines=max_machines, spawn_cap=spawn_cap)


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


@app.command()
def folders(
    root: Path | None = typer.Option(None, "--root", help="Machines run folder."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Machine folders under the run folder, whichever process made them (each lives as long as it)."""
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
