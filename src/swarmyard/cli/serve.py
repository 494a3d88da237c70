"""``swarmyard serve``: the control plane on a Unix socket and optionally TCP (mTLS off loopback).

With ``--providers FILE`` (a swarm file, or any TOML with a ``[providers]`` table) or ``--provider`` flags,
the model broker is mounted on the same socket (``/v1/chat/completions``, ``/v1/responses``, ``/v1/messages``,
``/v1/models``), so a worker's agent reaches its model and its tools through one address. Provider keys are
read from this process's environment by the variable each entry names; they never leave it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from swarmyard.config import ProviderConfig
    from swarmyard.identity import Identity
    from swarmyard.store.protocol import Store

from swarmyard.cli.options import StoreOption, store_at

_Socket = typer.Option(Path("swarmyard.sock"), "--socket", help="Unix socket to listen on.")
_NoSocket = typer.Option(False, "--no-socket", help="Listen on TCP only.")
_Host = typer.Option(None, "--host", help="Also listen on TCP at this address.")
_Port = typer.Option(8787, "--port", help="TCP port (with --host).")
_Cert = typer.Option(None, "--tls-cert", help="Server certificate (PEM).")
_Key = typer.Option(None, "--tls-key", help="Server key (PEM).")
_Ca = typer.Option(None, "--tls-ca", help="CA that client certificates must chain to (mutual TLS).")
_Secret = typer.Option(None, "--secret-file",
                       help="The control plane's token secret: created 0600 if absent, refused if anyone else "
                            "can read it (default: serve/token.secret in $SWARMYARD_STATE_DIR, else "
                            "~/.local/state/swarmyard).")
_OperatorFile = typer.Option(Path("operator-token"), "--operator-token-file",
                             help="Where the operator token is written (0600) if absent.")
_Lease = typer.Option(300.0, "--lease-s", min=1.0, help="Lease length of a claim, in seconds.")
_Rate = typer.Option(50.0, "--rate", min=0.1, help="Tool calls per second per worker.")
_Burst = typer.Option(100, "--burst", min=1, help="Tool calls a worker may make at once.")
_Renew = typer.Option(5.0, "--renew-interval-s", min=0.0,
                      help="Calls within this many seconds of a claim's last renewal check it but skip renewing "
                           "it (heartbeat always renews); a lease then ends at most this much early. 0: renew "
                           "on every call.")
_Evaluator = typer.Option(None, "--evaluator-socket", help="Score submitted artifacts with this evaluator.")
_Providers = typer.Option(None, "--providers",
                          help="Mount the model broker with this file's \\[providers] table (a swarm file works).")
_Provider = typer.Option(None, "--provider",
                         help="Mount the model broker with NAME=KIND:MODEL[,MODEL...] (repeatable), e.g. "
                              "sim=simulated:sim-1 or oa=openai:gpt-4.1-mini.")
_CacheDir = typer.Option(None, "--cache-dir", help="Where embedded models are assembled.")
_Trajectories = typer.Option(None, "--trajectories",
                             help="Keep the agent steps workers report here, one JSONL file per worker (the "
                                  "dashboard at /ui shows them); without it they are acknowledged, not kept.")
_HeaderTimeout = typer.Option(10.0, "--header-timeout-s", min=0.001,
                              help="Close a connection whose request line and headers take longer than this.")
_BodyTimeout = typer.Option(30.0, "--body-timeout-s", min=0.001,
                            help="Close a connection whose request body takes longer than this after its headers.")
_MaxConnections = typer.Option(None, "--max-connections", min=1,
                               help="Connections each listener (the socket, TCP) holds at once; more are closed "
                                    "as they arrive (default: a share of the open-files limit).")
_Workers = typer.Option(1, "--workers", min=1,
                        help="Serving processes sharing the socket(s); each enforces --rate on the calls it serves "
                             "(over PostgreSQL they share one bucket per worker).")
_User = typer.Option("swarmyard-plane", "--user",
                     help="Started as root: the system user to serve as (made if missing), so that the plane cannot "
                          "read the evaluator's bundle or the witness's key; the folders it writes must be that "
                          "user's. 'root' keeps root.")
_Witness = typer.Option(None, "--witness",
                        help="With --audit-dir: have this witness (socket path or URL, e.g. the swarmyard-witness "
                             "service's) cosign every checkpoint, so that verify catches a rollback or a re-signed "
                             "log.")
_UiHost = typer.Option(None, "--ui-host",
                       help="A name (NAME or NAME:PORT) by which browsers may open the dashboard at /ui over TCP, "
                            "beside the address it listens on (repeatable); any other Host is refused (421).")
_AuditDir = typer.Option(None, "--audit-dir",
                         help="Keep the store's audit log (signed checkpoints) in this folder, for `swarmyard audit "
                              "verify DIR --store URL`. Of several replicas, give it to one, and stop it last.")


def provider_table(providers_file: Path | None, flags: list[str]) -> dict[str, ProviderConfig]:
    """The providers named by ``--providers`` and ``--provider`` (flags override the file's entry)."""
    from swarmyard.config import provider_table as table

    return table(providers_file, flags)


def command(
    store: str = StoreOption,
    socket: Path = _Socket,
    no_socket: bool = _NoSocket,
    host: str | None = _Host,
    port: int = _Port,
    tls_cert: Path | None = _Cert,
    tls_key: Path | None = _Key,
    tls_ca: Path | None = _Ca,
    secret_file: Path | None = _Secret,
    operator_token_file: Path = _OperatorFile,
    lease_s: float = _Lease,
    rate: float = _Rate,
    burst: int = _Burst,
    renew_interval_s: float = _Renew,
    evaluator_socket: Path | None = _Evaluator,
    providers: Path | None = _Providers,
    provider: list[str] | None = _Provider,
    cache_dir: Path | None = _CacheDir,
    workers: int = _Workers,
    trajectories: Path | None = _Trajectories,
    header_timeout_s: float = _HeaderTimeout,
    body_timeout_s: float = _BodyTimeout,
    max_connections: int | None = _MaxConnections,
    audit_dir: Path | None = _AuditDir,
    ui_host: list[str] | None = _UiHost,
    witness: str | None = _Witness,
    user: str = _User,
) -> None:
    """Serve the control plane (worker tools, operator API, /metrics, the dashboard at /ui, and the model broker)
    until Ctrl-C."""
    from swarmyard.auth.tokens import TokenAuthority, load_or_create_secret
    from swarmyard.errors import UserError
    from swarmyard.plane.assembly import Assembled, assemble, serve_assembled
    from swarmyard.plane.connections import ConnectionLimits
    from swarmyard.plane.replicas import ReplicaWatch
    from swarmyard.plane.server import Listen, TlsFiles, check_listen
    from swarmyard.plane.settings import PlaneSettings
    from swarmyard.secret_files import write_secret_file

    tls_parts = (tls_cert, tls_key, tls_ca)
    if any(p is not None for p in tls_parts) and not all(p is not None for p in tls_parts):
        raise UserError("mutual TLS needs all of --tls-cert, --tls-key and --tls-ca")
    tls = TlsFiles(tls_cert, tls_key, tls_ca) if tls_cert and tls_key and tls_ca else None
    if witness is not None and audit_dir is None:
        raise UserError("--witness cosigns the audit log kept with --audit-dir: give both")
    if audit_dir is not None and workers > 1:
        raise UserError("--audit-dir keeps one log from one process: serve it with --workers 1 (another replica "
                        "can serve with more)")
    listen = Listen(socket_path=None if no_socket else socket, tcp_host=host, tcp_port=port, tls=tls)
    check_listen(listen)  # before touching the store: a refused setup changes nothing
    limits = ConnectionLimits(header_timeout_s, body_timeout_s, max_connections)
    table = provider_table(providers, provider or [])
    from swarmyard.broker.providers.configured import check_table

    check_table(table, env=os.environ)  # before the store is touched: a table the broker cannot serve changes nothing
    settings = PlaneSettings(lease_s=lease_s, rate_per_s=rate, rate_burst=burst,
                             renew_min_interval_s=renew_interval_s, ui_hosts=tuple(ui_host or ()))
    from swarmyard.swarm.run_secrets import serve_secret

    cosigner = None
    if witness is not None:
        from swarmyard.audit.witness import HttpWitnessClient
        from swarmyard.errors import SwarmyardError

        # made before the store is touched, and before the switch (its TLS context reads the CA file)
        cosigner = HttpWitnessClient.at(witness)
        try:
            cosigner.verifier()
        except SwarmyardError as exc:
            cosigner.close()
            raise UserError(f"witness {witness}: {exc.message}") from exc
    secret = load_or_create_secret(secret_file or serve_secret())
    opened = store_at(store, serving=True)  # migrates the store once, before any serving process opens it
    if not operator_token_file.exists():
        with contextlib.suppress(FileExistsError):  # a replica starting beside this one wrote it first
            write_secret_file(operator_token_file, TokenAuthority(secret, opened).issue_operator().encode())

    def make_app(opened: Store) -> Assembled:
        evaluator = None
        if evaluator_socket is not None:
            from swarmyard.evaluator.client import AsyncEvaluatorClient

            evaluator = AsyncEvaluatorClient(evaluator_socket)
        from swarmyard.plane.trajectory import TrajectoryFiles

        files = TrajectoryFiles(trajectories) if trajectories is not None else None
        made = assemble(opened, TokenAuthority(secret, opened), settings, providers=table or None,
                        cache_dir=cache_dir, evaluator=evaluator, trajectories=files)
        # this process's row among the store's replicas: its holds are tagged, dead replicas' holds swept
        watch = ReplicaWatch(opened)
        watch.start()
        made.on_close(watch.aclose)  # after the broker's: its queued settlements written, providers closed
        return made

    where = [f"unix:{socket}"] if listen.socket_path else []
    if host:
        where.append(f"{'https' if tls else 'http'}://{host}:{port}")
    models = sorted({m for cfg in table.values() for m in cfg.models})
    broker = f"model broker serving {', '.join(models)}" if models else "no model broker (see --providers)"
    procs = f" from {workers} processes" if workers > 1 else ""
    typer.echo(f"control plane on {', '.join(where)}{procs}; {broker}; operator token in {operator_token_file}",
               err=True)
    runner = _plane_user(user, store, [audit_dir, trajectories, cache_dir])
    if runner is not None:
        from swarmyard.plane.privileges import prepare_switch

        sockets = prepare_switch(runner, store, listen)
    else:
        sockets = None

    def drop(made: Assembled) -> Assembled:
        # after the app is built: what it makes at start (TLS contexts read the CA file from the interpreter's
        # packages, provider clients, the store's connections) is made with the starting user's rights
        if runner is not None:
            from swarmyard.identity import drop_privileges
            from swarmyard.plane.privileges import peer_groups

            drop_privileges(runner, groups=peer_groups())
        return made

    if workers > 1:
        # Every process opens its own store after the fork (connections and pool threads do not survive one);
        # each drops to the plane's user once its app is built; this supervising process stays who it is.
        opened.close()
        serve_assembled(lambda: drop(make_app(store_at(store, serving=True))), listen, processes=workers,
                        limits=limits, sockets=sockets)
        return
    try:
        made = drop(make_app(opened))
        if runner is not None:
            typer.echo(f"serving as {runner.name} (uid {runner.uid})", err=True)
        if audit_dir is not None:
            from swarmyard.audit.keeper import AuditKeeper

            # made by the plane's user: its files are the plane's
            keeper = AuditKeeper(opened, audit_dir, witness=cosigner)
            keeper.start()
            made.on_close(keeper.aclose)  # after the broker's: its last settlements are logged
        serve_assembled(lambda: made, listen, limits=limits, sockets=sockets)
    finally:
        opened.close()
        if cosigner is not None:
            cosigner.close()


def _plane_user(user: str, store: str, folders: list[Path | None]) -> Identity | None:
    """Started as root: the plane's user to switch to (``swarmyard.plane.privileges``), or ``None`` (said on
    stderr when it is because a folder the plane writes in is not that user's)."""
    from swarmyard.plane.privileges import plane_identity

    runner, why = plane_identity(user, store, [f for f in folders if f is not None])
    if runner is None and why is not None:
        typer.echo(f"warning: serving as root, not as {user}: {why}; the plane can then read the evaluator's "
                   f"bundle and the witness's key (give it folders of {user}'s, or --user root)", err=True)
    return runner
