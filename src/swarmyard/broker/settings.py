"""Broker settings: which model names route to which provider, their prices, limits and token counting."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from swarmyard.domain import Price
from swarmyard.errors import ConfigError


class Tokenizer(StrEnum):
    """How a route's input is bounded: a pinned tokenizer, the provider's own, or UTF-8 bytes."""

    BYTES = "bytes"
    CL100K = "cl100k"
    PROVIDER = "provider"


@dataclass(frozen=True, slots=True)
class ModelRoute:
    """A model name workers may ask for, the provider that serves it and its default price."""

    name: str
    provider: str
    upstream_model: str | None = None
    input_per_mtok: int = 0
    output_per_mtok: int = 0
    max_output_tokens: int = 4096
    tokenizer: Tokenizer = Tokenizer.BYTES
    #: the model's context window (input and answer together), where the broker knows it
    context_tokens: int | None = None

    def __post_init__(self) -> None:
        if not self.name or not self.provider:
            raise ConfigError("a model route needs a name and a provider", field="model")
        if self.context_tokens is not None and self.context_tokens <= 0:
            raise ConfigError(f"model {self.name}: context_tokens must be > 0", field="model")
        if min(self.input_per_mtok, self.output_per_mtok) < 0 or self.max_output_tokens <= 0:
            raise ConfigError(
                f"model {self.name}: prices must be >= 0 and max_output_tokens > 0", field="model"
            )

    @property
    def upstream(self) -> str:
        """The model name sent to the provider."""
        return self.upstream_model or self.name

    def output_room(self, input_tokens: int) -> int:
        """The most tokens an answer to ``input_tokens`` of input may have: the route's limit, or less where
        the context window is known and nearly full."""
        if self.context_tokens is None:
            return self.max_output_tokens
        return min(self.max_output_tokens, self.context_tokens - input_tokens)

    @property
    def default_price(self) -> Price:
        """The price used when the store holds none for this model."""
        return Price(self.name, self.input_per_mtok, self.output_per_mtok)


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    """Everything the broker needs besides the store, the token authority and the providers."""

    routes: tuple[ModelRoute, ...] = ()
    max_body_bytes: int = 4 * 1024 * 1024
    min_output_tokens: int = 16
    by_name: dict[str, ModelRoute] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [route.name for route in self.routes]
        if len(names) != len(set(names)):
            raise ConfigError("model names must be unique", field="models")
        if self.max_body_bytes <= 0 or self.min_output_tokens <= 0:
            raise ConfigError("max_body_bytes and min_output_tokens must be positive", field="broker")
        object.__setattr__(self, "by_name", {route.name: route for route in self.routes})
