"""The one way a broker is built: from a ``[providers]`` table (a swarm file's, or ``--provider`` flags').

``swarmyard run``, ``swarmyard serve`` and ``swarmyard broker serve`` all call ``configured_broker``. Every route
takes its price and limits from ``ProviderConfig.terms`` (the maintained table, or the file's own values), so no
assembly can lose them. Keys are read here, from the broker's own environment by the variable the file names
(or from a key file), and never go anywhere near a machine. A Python caller may pass ready provider objects (a
scripted provider in a test, say) that replace the table's entry of the same name; they are priced the same way.
"""

from __future__ import annotations

import hashlib
import importlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swarmyard.broker.keys import ProviderKeys, Secret
from swarmyard.broker.providers import KINDS
from swarmyard.broker.providers.upstream import Timeouts
from swarmyard.broker.settings import ModelRoute, Tokenizer
from swarmyard.config import EMBEDDED_MODELS, ProviderConfig, ProviderKind, ScriptedReply, load_replies
from swarmyard.errors import ConfigError

if TYPE_CHECKING:
    from swarmyard.auth.tokens import TokenAuthority
    from swarmyard.broker.app import Broker
    from swarmyard.broker.providers.scripted import Reply
    from swarmyard.store.protocol import Store

#: Default upstream base URLs of the hosted kinds.
BASE_URLS = {ProviderKind.OPENAI: "https://api.openai.com/v1", ProviderKind.ANTHROPIC: "https://api.anthropic.com"}
#: Default key variables of the hosted kinds.
KEY_VARS = {ProviderKind.OPENAI: "OPENAI_API_KEY", ProviderKind.ANTHROPIC: "ANTHROPIC_API_KEY"}
#: How a hosted kind's input is bounded: OpenAI's models count with cl100k (pinned); others by bytes.
TOKENIZERS = {ProviderKind.OPENAI: Tokenizer.CL100K}
#: The answer limit of a route whose file and table say nothing (the embedded model writes less).
DEFAULT_MAX_OUTPUT = 4096
LOCAL_MAX_OUTPUT = 1024


@dataclass(frozen=True, slots=True)
class LocalSlots:
    """How the embedded model's context is shared: ``count`` parallel slots of ``tokens`` each.

    llama.cpp splits its context evenly between its slots and one request sees only its slot. The built-in
    agent's requests fit in 4,096 tokens, so four of those serve four workers at once; an agent CLI's do not
    (Claude Code's first request is about 19,000 tokens, its system prompt and tool schemas), so it gets fewer
    slots of the 32,768 tokens the default model was trained for. Each slot keeps its prompt cached, so a CLI's
    next call reads only what is new.
    """

    count: int = 4
    tokens: int = 4096

    def __post_init__(self) -> None:
        if self.count < 1 or not 512 <= self.tokens <= MODEL_WINDOW:
            raise ConfigError(f"local slots must be at least one of 512 to {MODEL_WINDOW} tokens",
                              field="local_slots")


#: The window the embedded models were trained for (Qwen2.5-Coder-0.5B: 32,768 tokens).
MODEL_WINDOW = 32_768
#: Slots for the built-in agent, and for an agent CLI (``for_agents``).
BUILTIN_SLOTS = LocalSlots(4, 4096)
CLI_SLOTS = LocalSlots(2, MODEL_WINDOW)


def slots_for(agents: set[str], concurrency: int) -> LocalSlots:
    """The slots for a run whose workers and lead are ``agents``, ``concurrency`` at a time."""
    if agents <= {"builtin"}:
        return BUILTIN_SLOTS
    return LocalSlots(max(1, min(concurrency, CLI_SLOTS.count)), CLI_SLOTS.tokens)


def _class(kind: ProviderKind) -> Any:
    module, _, name = KINDS[kind.value].partition(":")
    return getattr(importlib.import_module(module), name)


def _route(name: str, cfg: ProviderConfig, model: str, *, tokenizer: Tokenizer = Tokenizer.BYTES,
           max_output: int = DEFAULT_MAX_OUTPUT, context_tokens: int | None = None) -> ModelRoute:
    """One model's route with its price; a provider's own window (the local model's) bounds the file's.

    The table's context window is used only where the input is counted with a tokenizer: a byte-bounded
    route's bound is several times the true count (fine for holding money, which it never under-holds), and
    checked against a window it would refuse conversations that fit. The file's own ``context_tokens`` holds
    on any route.
    """
    try:
        terms = cfg.terms(model)
    except ValueError as exc:  # parsed configs were checked already; this is a table built in Python
        raise ConfigError(str(exc), field=f"providers.{name}") from None
    given = cfg.prices.get(model)
    window = terms.context_tokens if tokenizer is not Tokenizer.BYTES else given.context_tokens if given else None
    windows = [w for w in (window, context_tokens) if w is not None]
    return ModelRoute(model, name, input_per_mtok=terms.input_per_mtok, output_per_mtok=terms.output_per_mtok,
                      max_output_tokens=terms.max_output_tokens or max_output, tokenizer=tokenizer,
                      context_tokens=min(windows) if windows else None)


def _local(name: str, cfg: ProviderConfig, cache_dir: Path,
           slots: LocalSlots) -> tuple[Any, list[ModelRoute]]:
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
    elif EMBEDDED_MODELS.get(model) == "qwen":
        file = local.assemble_qwen(cache_dir)
    elif EMBEDDED_MODELS.get(model) == "smollm2":
        file = local.smollm2()
    else:
        raise ConfigError(f"unknown embedded model {model!r}: choose one of {sorted(EMBEDDED_MODELS)} or give "
                          "model_file", field=f"providers.{name}.models")
    # A busy 2-core host makes a few tokens a second per slot, and reads a CLI's first prompt for minutes: wait
    # for it (it is on loopback).
    provider = local.LocalProvider(file, name=name, slot_tokens=slots.tokens, n_parallel=slots.count,
                                   timeouts=Timeouts(read_s=1800.0), prefix_folder=cache_dir / "prefixes")
    return provider, [_route(name, cfg, model, tokenizer=Tokenizer.PROVIDER, max_output=LOCAL_MAX_OUTPUT,
                             context_tokens=provider.context_tokens)]


def scripted_replies(replies: Mapping[str, tuple[ScriptedReply, ...]]) -> dict[str, list[Reply]]:
    """A replies file's entries as the scripted provider's replies."""
    from swarmyard.broker.providers.scripted import CallTools, Fail, FailKind, Say

    def one(reply: ScriptedReply) -> Reply:
        if reply.say is not None:
            return Say(reply.say, output_tokens=reply.output_tokens, input_tokens=reply.input_tokens,
                       report_usage=reply.usage)
        if reply.fail is not None:
            return Fail(FailKind(reply.fail), reply.text)
        return CallTools(tuple((call.name, dict(call.arguments)) for call in reply.tool_calls), reply.text)

    return {model: [one(reply) for reply in script] for model, script in replies.items()}


def _key(name: str, cfg: ProviderConfig, env: Mapping[str, str], keys: ProviderKeys | None) -> Secret | None:
    """A hosted provider's key: the key file's entry of its name, else the variable its entry names."""
    var = cfg.api_key_env or KEY_VARS.get(cfg.kind)
    key = keys.get(name) if keys else None
    if key is None and var and env.get(var):
        key = Secret(env[var])
    if key is None and cfg.kind in KEY_VARS:
        raise ConfigError(f"set {var} in the environment of the run (it stays in the broker)",
                          field=f"providers.{name}.api_key_env")
    return key


def check_table(config: Mapping[str, ProviderConfig], given: Mapping[str, Any] | None = None, *,
                env: Mapping[str, str] | None = None, keys: ProviderKeys | None = None) -> None:
    """Refuse, before anything is started, a table the broker could not serve: a scripted provider with no
    replies file (it would answer nothing, and the run end with no synthesis), or, when ``env`` is given, a
    hosted provider whose key is in neither ``env`` nor ``keys``."""
    for name, cfg in config.items():
        if given and name in given:
            continue
        if cfg.kind is ProviderKind.SCRIPTED and cfg.replies is None:
            raise ConfigError("a scripted provider needs replies = FILE (its replies, in order, per model)",
                              field=f"providers.{name}.replies")
        if env is not None and cfg.kind in KEY_VARS:
            _key(name, cfg, env, keys)


def build(config: Mapping[str, ProviderConfig], *, cache_dir: Path, env: Mapping[str, str],
          given: Mapping[str, Any] | None = None, keys: ProviderKeys | None = None,
          timeouts: Timeouts | None = None,
          local_slots: LocalSlots = BUILTIN_SLOTS) -> tuple[dict[str, Any], list[ModelRoute]]:
    """Instantiate every provider of the table (or take the given object) and route its models to it.

    A hosted provider's key is ``keys``' entry of its name if there is one, else the variable ``api_key_env``
    (or its kind's usual one) names in ``env``; ``timeouts`` apply to hosted upstreams.
    """
    check_table(config, given)
    providers: dict[str, Any] = {}
    routes: list[ModelRoute] = []
    for name, cfg in config.items():
        if given and name in given:
            providers[name] = given[name]
            routes += [_route(name, cfg, model) for model in cfg.models]
            continue
        match cfg.kind:
            case ProviderKind.LOCAL:
                providers[name], more = _local(name, cfg, cache_dir, local_slots)
                routes += more
                continue
            case ProviderKind.OPENAI | ProviderKind.OPENAI_COMPATIBLE | ProviderKind.ANTHROPIC:
                key = _key(name, cfg, env, keys)
                providers[name] = _class(cfg.kind)(cfg.base_url or BASE_URLS[cfg.kind], key, name=name,
                                                   timeouts=timeouts)
                tokenizer = TOKENIZERS.get(cfg.kind, Tokenizer.BYTES)
                routes += [_route(name, cfg, model, tokenizer=tokenizer) for model in cfg.models]
                continue
            case ProviderKind.SCRIPTED:
                assert cfg.replies is not None  # check_table
                try:
                    script = load_replies(Path(cfg.replies))
                except ValueError as exc:  # changed since the file was parsed
                    raise ConfigError(str(exc), field=f"providers.{name}.replies") from None
                providers[name] = _class(cfg.kind)(scripted_replies(script), name=name)
            case ProviderKind.SIMULATED:
                providers[name] = _class(cfg.kind)(name=name, simulate=cfg.simulate or "tokens",
                                                   latency_s=cfg.latency_s or 0.0, turns=cfg.turns or 0)
                if cfg.simulate == "attempts":
                    # it reports words as tokens: held at its own count, a call's worst case is what it is
                    routes += [_route(name, cfg, model, tokenizer=Tokenizer.PROVIDER) for model in cfg.models]
                    continue
        routes += [_route(name, cfg, model) for model in cfg.models]
    return providers, routes


def configured_broker(store: Store, tokens: TokenAuthority, config: Mapping[str, ProviderConfig], *,
                      cache_dir: Path | None = None, given: Mapping[str, Any] | None = None,
                      keys: ProviderKeys | None = None, timeouts: Timeouts | None = None,
                      local_slots: LocalSlots = BUILTIN_SLOTS) -> Broker:
    """The broker serving the table's providers (see ``build``); model files come from ``cache_dir`` (by
    default the user cache's ``swarmyard/models``); a local model shares its context as ``local_slots`` say."""
    from swarmyard.broker.app import Broker
    from swarmyard.broker.settings import BrokerSettings

    cache = cache_dir or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "swarmyard" / "models"
    providers, routes = build(config, cache_dir=cache, env=os.environ, given=given, keys=keys, timeouts=timeouts,
                              local_slots=local_slots)
    return Broker(store, tokens, providers, BrokerSettings(routes=tuple(routes)))
