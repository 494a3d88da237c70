"""Providers and model routes built from a swarm file's ``[providers]`` table.

Keys are read here, from the broker's own environment, by the variable the file names; they never go anywhere
near a machine. A Python caller may pass ready provider objects (a scripted provider in a test, say) that
replace the table's entry of the same name.
"""

from __future__ import annotations

import hashlib
import importlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swarmyard.broker.keys import Secret
from swarmyard.broker.providers.http import Timeouts
from swarmyard.broker.settings import ModelRoute, Tokenizer
from swarmyard.config import EMBEDDED_MODELS, ProviderConfig, ProviderKind
from swarmyard.errors import ConfigError

if TYPE_CHECKING:
    from swarmyard.broker.app import Broker
    from swarmyard.plane.tokens import TokenAuthority
    from swarmyard.store.protocol import Store

#: Default upstream base URLs of the hosted kinds.
BASE_URLS = {ProviderKind.OPENAI: "https://api.openai.com/v1", ProviderKind.ANTHROPIC: "https://api.anthropic.com"}
#: Default key variables of the hosted kinds.
KEY_VARS = {ProviderKind.OPENAI: "OPENAI_API_KEY", ProviderKind.ANTHROPIC: "ANTHROPIC_API_KEY"}
#: Embedded model names the ``local`` kind knows, and how each is found.
LOCAL_MODELS = EMBEDDED_MODELS


def _local(name: str, cfg: ProviderConfig, cache_dir: Path) -> tuple[Any, list[ModelRoute]]:
    from swarmyard.broker.providers import local

    if len(cfg.models) != 1:
        raise ConfigError("a local provider serves exactly one model", field=f"providers.{name}.models")
    model = cfg.models[0]
    if cfg.model_file:
        path = Path(cfg.model_file)
        if not path.is_file():
            raise ConfigError(f"model file {path} not found", field=f"providers.{name}.model_file")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()  # the user's own file: pin what is there now
        file = local.ModelFile(model, path, digest)
    elif LOCAL_MODELS.get(model) == "qwen":
        file = local.assemble_qwen(cache_dir)
    elif LOCAL_MODELS.get(model) == "smollm2":
        file = local.smollm2()
    else:
        raise ConfigError(f"unknown embedded model {model!r}: choose one of {sorted(LOCAL_MODELS)} or give "
                          "model_file", field=f"providers.{name}.models")
    # 4 slots of 4,096 tokens each. A busy 2-core host makes a few tokens a second per slot, so a whole answer
    # can take minutes: wait for it (it is on loopback).
    provider = local.LocalProvider(file, name=name, slot_tokens=4096, n_parallel=4,
                                   timeouts=Timeouts(read_s=900.0))
    return provider, [ModelRoute(model, name, tokenizer=Tokenizer.PROVIDER, max_output_tokens=1024,
                                 context_tokens=provider.context_tokens)]


def build(config: Mapping[str, ProviderConfig], *, cache_dir: Path, env: Mapping[str, str],
          given: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], list[ModelRoute]]:
    """Instantiate every provider of the table (or take the given object) and route its models to it."""
    providers: dict[str, Any] = {}
    routes: list[ModelRoute] = []
    for name, cfg in config.items():
        if given and name in given:
            providers[name] = given[name]
            routes += [ModelRoute(model, name) for model in cfg.models]
            continue
        if cfg.kind is ProviderKind.LOCAL:
            providers[name], more = _local(name, cfg, cache_dir)
            routes += more
            continue
        if cfg.kind in (ProviderKind.OPENAI, ProviderKind.OPENAI_COMPATIBLE, ProviderKind.ANTHROPIC):
            var = cfg.api_key_env or KEY_VARS.get(cfg.kind)
            key = env.get(var) if var else None
            if cfg.kind is not ProviderKind.OPENAI_COMPATIBLE and not key:
                raise ConfigError(f"set {var} in the environment of the run (it stays in the broker)",
                                  field=f"providers.{name}.api_key_env")
            base = cfg.base_url or BASE_URLS[cfg.kind]
            module, cls = (("swarmyard.broker.providers.anthropic", "AnthropicProvider")
                           if cfg.kind is ProviderKind.ANTHROPIC
                           else ("swarmyard.broker.providers.openai_compat", "OpenAICompatProvider"))
            providers[name] = getattr(importlib.import_module(module), cls)(
                base, Secret(key) if key else None, name=name)
            tokenizer = Tokenizer.CL100K if cfg.kind is ProviderKind.OPENAI else Tokenizer.BYTES
            routes += [ModelRoute(model, name, tokenizer=tokenizer) for model in cfg.models]
            continue
        if cfg.kind is ProviderKind.SCRIPTED:
            from swarmyard.broker.providers.scripted import ScriptedProvider

            providers[name] = ScriptedProvider(name=name)
        else:
            from swarmyard.broker.providers.simulated import SimulatedProvider

            providers[name] = SimulatedProvider(name=name)
        routes += [ModelRoute(model, name) for model in cfg.models]
    return providers, routes


def configured_broker(store: Store, tokens: TokenAuthority, config: Mapping[str, ProviderConfig], *,
                      cache_dir: Path | None = None, given: Mapping[str, Any] | None = None) -> Broker:
    """A broker serving the table's providers; keys come from this process's own environment (the broker holds
    them), model files from ``cache_dir`` (by default the user cache's ``swarmyard/models``)."""
    from swarmyard.broker.app import Broker
    from swarmyard.broker.settings import BrokerSettings

    cache = cache_dir or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "swarmyard" / "models"
    providers, routes = build(config, cache_dir=cache, env=os.environ, given=given)
    return Broker(store, tokens, providers, BrokerSettings(routes=tuple(routes)))
