"""``swarmyard broker serve``: run the model broker alone on a local address."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from starlette.applications import Starlette

from swarmyard.cli.options import StoreOption, store_at

if TYPE_CHECKING:
    from swarmyard.broker.app import Broker

app = typer.Typer(help="The model broker: OpenAI, Responses and Anthropic endpoints in front of providers.",
                  no_args_is_help=True)


_Host = typer.Option("127.0.0.1", "--host", help="Address to listen on.")
_Port = typer.Option(8788, "--port", help="Port to listen on.")
_SecretFile = typer.Option(None, "--secret-file",
                           help="The control plane's token secret: created 0600 if absent, refused if anyone else "
                                "can read it (default: the one swarmyard serve uses, serve/token.secret in "
                                "$SWARMYARD_STATE_DIR, else ~/.local/state/swarmyard).")
_KeyFile = typer.Option(None, "--key-file", help="Provider keys by provider name (JSON, mode 0600).")
_Providers = typer.Option(None, "--providers",
                          help="Serve this file's \\[providers] table (a swarm file works), prices included.")
_Provider = typer.Option(None, "--provider",
                         help="Serve NAME=KIND:MODEL[,MODEL...] (repeatable), e.g. oa=openai:gpt-4o-mini.")
_Local = typer.Option("qwen", "--local",
                      help="Without --providers or --provider: the embedded model served, qwen, smollm2 or none "
                           "(and openai:gpt-4.1-mini, anthropic:claude-sonnet-4-5 where their key is set).")
_CacheDir = typer.Option(Path(".swarmyard-models"), "--cache-dir",
                         help="Where the local model is assembled.")
_ReadTimeout = typer.Option(120.0, "--read-timeout", help="Upstream read timeout in seconds.")

#: ``--local`` -> the embedded model's name.
_EMBEDDED = {"qwen": "qwen2.5-coder-0.5b-instruct", "smollm2": "smollm2-135m-instruct"}


@app.command()
def serve(store: str = StoreOption, host: str = _Host, port: int = _Port, secret_file: Path | None = _SecretFile,
          key_file: Path | None = _KeyFile, providers: Path | None = _Providers,
          provider: list[str] | None = _Provider, local: str = _Local, cache_dir: Path = _CacheDir,
          read_timeout_s: float = _ReadTimeout) -> None:
    """Serve the broker until Ctrl-C."""
    import uvicorn

    from swarmyard.auth.tokens import TokenAuthority, load_or_create_secret
    from swarmyard.broker.keys import ProviderKeys
    from swarmyard.broker.providers.configured import check_table, configured_broker
    from swarmyard.broker.providers.upstream import Timeouts
    from swarmyard.config import provider_table
    from swarmyard.errors import UserError

    keys = ProviderKeys.from_env(os.environ)
    if key_file is not None:
        keys = keys.merged(ProviderKeys.from_file(key_file))
    flags = list(provider or [])
    if providers is None and not flags:
        if local not in (*_EMBEDDED, "none"):
            raise UserError(f"--local must be qwen, smollm2 or none, not {local!r}")
        if local != "none":
            flags.append(f"local=local:{_EMBEDDED[local]}")
        if keys.get("openai") is not None:
            flags.append("openai=openai:gpt-4.1-mini")
        if keys.get("anthropic") is not None:
            flags.append("anthropic=anthropic:claude-sonnet-4-5")
    table = provider_table(providers, flags)  # every model priced, or refused here naming it
    if not table:
        raise UserError("no provider: give --providers or --provider, set OPENAI_API_KEY or ANTHROPIC_API_KEY, "
                        "or use --key-file or --local")
    check_table(table, env=os.environ, keys=keys)
    opened = store_at(store, serving=True)
    from swarmyard.swarm.run_secrets import serve_secret

    tokens = TokenAuthority(load_or_create_secret(secret_file or serve_secret()), opened)
    broker = configured_broker(opened, tokens, table, cache_dir=cache_dir, keys=keys,
                               timeouts=Timeouts(read_s=read_timeout_s))
    broker_app = Starlette(routes=broker.routes(), lifespan=_closing(broker))
    models = sorted({m for cfg in table.values() for m in cfg.models})
    typer.echo(f"broker on http://{host}:{port}/v1 serving {', '.join(models)}", err=True)
    # Server.run, not uvicorn.run: after a clean shutdown it re-raises the signal that stopped it (Ctrl-C exits
    # 130) where uvicorn.run swallows it; and a port it could not bind is our error (exit 1), not its exit 3.
    # the plane's connection guards: deadlines for headers and bodies, a cap on open connections
    from swarmyard.plane.connections import ConnectionLimits, guarded_protocol

    limits = ConnectionLimits()
    server = uvicorn.Server(uvicorn.Config(broker_app, host=host, port=port, log_level="warning", ws="none",
                                           http=guarded_protocol(limits, limits.cap(1), f"{host}:{port}")))
    server.run()
    if not server.started:
        raise UserError(f"the broker could not listen on {host}:{port}")


def _closing(broker: Broker) -> Callable[[Starlette], AbstractAsyncContextManager[None]]:
    """A lifespan that closes the broker's providers (after writing queued settlements) on shutdown."""

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await broker.aclose()

    return lifespan
