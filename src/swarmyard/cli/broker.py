"""``swarmyard broker serve``: run the model broker alone on a local address."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from swarmyard.cli.options import StoreOption, store_at

app = typer.Typer(help="The model broker: OpenAI, Responses and Anthropic endpoints in front of providers.",
                  no_args_is_help=True)


_Host = typer.Option("127.0.0.1", "--host", help="Address to listen on.")
_Port = typer.Option(8788, "--port", help="Port to listen on.")
_SecretFile = typer.Option(Path("token-secret"), "--secret-file",
                           help="The control plane's token secret (created 0600 if absent).")
_KeyFile = typer.Option(None, "--key-file", help="Provider keys (JSON, mode 0600).")
_Local = typer.Option("qwen", "--local", help="Embedded model served as 'local': qwen, smollm2 or none.")
_CacheDir = typer.Option(Path(".swarmyard-models"), "--cache-dir",
                         help="Where the local model is assembled.")
_ReadTimeout = typer.Option(120.0, "--read-timeout", help="Upstream read timeout in seconds.")


@app.command()
def serve(store: str = StoreOption, host: str = _Host, port: int = _Port, secret_file: Path = _SecretFile,
          key_file: Path | None = _KeyFile, local: str = _Local, cache_dir: Path = _CacheDir,
          read_timeout_s: float = _ReadTimeout) -> None:
    """Serve the broker until Ctrl-C."""
    import uvicorn

    from swarmyard.broker import BrokerSettings, ModelRoute, create_broker_app
    from swarmyard.broker.keys import ProviderKeys
    from swarmyard.broker.providers.http import Timeouts
    from swarmyard.broker.providers.protocol import Provider
    from swarmyard.broker.settings import Tokenizer
    from swarmyard.errors import UserError
    from swarmyard.plane.tokens import TokenAuthority, load_or_create_secret

    keys = ProviderKeys.from_env(os.environ)
    if key_file is not None:
        keys = keys.merged(ProviderKeys.from_file(key_file))
    timeouts = Timeouts(read_s=read_timeout_s)
    providers: dict[str, Provider] = {}
    routes: list[ModelRoute] = []
    openai_key = keys.get("openai")
    if openai_key is not None:
        from swarmyard.broker.providers.openai_compat import OpenAICompatProvider

        providers["openai"] = OpenAICompatProvider("https://api.openai.com/v1", openai_key, timeouts=timeouts)
        routes.append(ModelRoute("gpt-4.1-mini", "openai", input_per_mtok=400_000, output_per_mtok=1_600_000,
                                 max_output_tokens=32_768, tokenizer=Tokenizer.BYTES))
    anthropic_key = keys.get("anthropic")
    if anthropic_key is not None:
        from swarmyard.broker.providers.anthropic import AnthropicProvider

        providers["anthropic"] = AnthropicProvider("https://api.anthropic.com", anthropic_key,
                                                   timeouts=timeouts)
        routes.append(ModelRoute("claude-sonnet-4-5", "anthropic", input_per_mtok=3_000_000,
                                 output_per_mtok=15_000_000, max_output_tokens=64_000))
    if local != "none":
        from swarmyard.broker.providers.local import LocalProvider, assemble_qwen, smollm2

        if local not in ("qwen", "smollm2"):
            raise UserError(f"--local must be qwen, smollm2 or none, not {local!r}")
        model = assemble_qwen(cache_dir) if local == "qwen" else smollm2()
        provider = LocalProvider(model, timeouts=timeouts)
        providers["local"] = provider
        routes.append(ModelRoute("local", "local", tokenizer=Tokenizer.PROVIDER, max_output_tokens=2048,
                                 context_tokens=provider.context_tokens))
    if not routes:
        raise UserError("no provider: set OPENAI_API_KEY or ANTHROPIC_API_KEY, or use --key-file or --local")
    opened = store_at(store, serving=True)
    tokens = TokenAuthority(load_or_create_secret(secret_file), opened)
    broker_app = create_broker_app(opened, tokens, providers, BrokerSettings(routes=tuple(routes)))
    typer.echo(f"broker on http://{host}:{port}/v1 serving {', '.join(r.name for r in routes)}", err=True)
    uvicorn.run(broker_app, host=host, port=port, log_level="warning")
