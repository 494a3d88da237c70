"""``swarmyard certs init``: a CA plus server and client certificates for mutual TLS on TCP."""

from __future__ import annotations

from pathlib import Path

import typer

from swarmyard.cli import render

app = typer.Typer(help="Certificates for mutual TLS.", no_args_is_help=True)
_Dir = typer.Option(Path("certs"), "--dir", help="Folder to write into (must not hold certificates yet).")
_Hosts = typer.Option(..., "--host", help="Server name or IP address (repeat for several).")
_ClientName = typer.Option("swarmyard-client", "--client-name", help="The client certificate's name.")
_Days = typer.Option(365, "--days", min=1, help="Validity in days.")
_Json = typer.Option(False, "--json", help="Print the paths as JSON.")


@app.command()
def init(
    folder: Path = _Dir,
    host: list[str] = _Hosts,
    client_name: str = _ClientName,
    days: int = _Days,
    as_json: bool = _Json,
) -> None:
    """Create ca.pem/ca.key, server.pem/server.key and client.pem/client.key (keys 0600)."""
    from swarmyard.plane.certs import init_certs, vars_of

    paths = init_certs(folder, host, client_name=client_name, days=days)
    if as_json:
        render.print_json({f"{p.stem}_{'key' if p.suffix == '.key' else 'cert'}": str(p)
                           for p in vars_of(paths)})
    else:
        for path in vars_of(paths):
            render.stdout.print(str(path), highlight=False)
