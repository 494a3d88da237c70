"""``swarmyard serve``: the control plane on a Unix socket and optionally TCP (mTLS off loopback)."""

from __future__ import annotations

from pathlib import Path

import typer

from swarmyard.cli.options import StoreOption, store_at

_Socket = typer.Option(Path("swarmyard.sock"), "--socket", help="Unix socket to listen on.")
_NoSocket = typer.Option(False, "--no-socket", help="Listen on TCP only.")
_Host = typer.Option(None, "--host", help="Also listen on TCP at this address.")
_Port = typer.Option(8787, "--port", help="TCP port (with --host).")
_Cert = typer.Option(None, "--tls-cert", help="Server certificate (PEM).")
_Key = typer.Option(None, "--tls-key", help="Server key (PEM).")
_Ca = typer.Option(None, "--tls-ca", help="CA that client certificates must chain to (mutual TLS).")
_Secret = typer.Option(Path("token-secret"), "--secret-file",
                       help="The control plane's token secret (created 0600 if absent).")
_OperatorFile = typer.Option(Path("operator-token"), "--operator-token-file",
                             help="Where the operator token is written (0600) if absent.")
_Lease = typer.Option(300.0, "--lease-s", min=1.0, help="Lease length of a claim, in seconds.")
_Rate = typer.Option(50.0, "--rate", min=0.1, help="Tool calls per second per worker.")
_Burst = typer.Option(100, "--burst", min=1, help="Tool calls a worker may make at once.")
_Renew = typer.Option(0.0, "--renew-interval-s", min=0.0,
                      help="Calls within this many seconds of a claim's last renewal skip renewing it.")
_Evaluator = typer.Option(None, "--evaluator-socket", help="Score submitted artifacts with this evaluator.")


def command(
    store: str = StoreOption,
    socket: Path = _Socket,
    no_socket: bool = _NoSocket,
    host: str | None = _Host,
    port: int = _Port,
    tls_cert: Path | None = _Cert,
    tls_key: Path | None = _Key,
    tls_ca: Path | None = _Ca,
    secret_file: Path = _Secret,
    operator_token_file: Path = _OperatorFile,
    lease_s: float = _Lease,
    rate: float = _Rate,
    burst: int = _Burst,
    renew_interval_s: float = _Renew,
    evaluator_socket: Path | None = _Evaluator,
) -> None:
    """Serve the control plane (worker tools, operator API, /metrics) until Ctrl-C."""
    from swarmyard.errors import UserError
    from swarmyard.keys import write_secret_file
    from swarmyard.plane.app import create_app
    from swarmyard.plane.server import Listen, TlsFiles, check_listen, serve
    from swarmyard.plane.settings import PlaneSettings
    from swarmyard.plane.tokens import TokenAuthority, load_or_create_secret

    tls_parts = (tls_cert, tls_key, tls_ca)
    if any(p is not None for p in tls_parts) and not all(p is not None for p in tls_parts):
        raise UserError("mutual TLS needs all of --tls-cert, --tls-key and --tls-ca")
    tls = TlsFiles(tls_cert, tls_key, tls_ca) if tls_cert and tls_key and tls_ca else None
    listen = Listen(socket_path=None if no_socket else socket, tcp_host=host, tcp_port=port, tls=tls)
    check_listen(listen)  # before touching the store: a refused setup changes nothing
    opened = store_at(store)
    tokens = TokenAuthority(load_or_create_secret(secret_file), opened)
    if not operator_token_file.exists():
        write_secret_file(operator_token_file, tokens.issue_operator().encode())
    evaluator = None
    if evaluator_socket is not None:
        from swarmyard.evaluator.client import AsyncEvaluatorClient

        evaluator = AsyncEvaluatorClient(evaluator_socket)
    app = create_app(opened, tokens, PlaneSettings(lease_s=lease_s, rate_per_s=rate, rate_burst=burst,
                                                   renew_min_interval_s=renew_interval_s),
                     evaluator=evaluator)
    where = [f"unix:{socket}"] if listen.socket_path else []
    if host:
        where.append(f"{'https' if tls else 'http'}://{host}:{port}")
    typer.echo(f"control plane on {', '.join(where)}; operator token in {operator_token_file}", err=True)
    try:
        serve(app, listen)
    finally:
        opened.close()
