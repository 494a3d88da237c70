"""Swarm files: TOML parsed once at the edge into frozen pydantic models and passed down.

A swarm file has these tables (only ``[goal]`` is required; everything else has a default)::

    [goal]       objective, budget_usd ("0.50" or 1; never a float), call_cap, deadline_s, max_depth
    [tasks]      lenses = [{title, prompt}, ...]  or  plan = N (a planning call splits the objective in N)
    [policy]     kind = independent | team | explore | groups, with that policy's options
                 (``policy = "team"`` is short for ``[policy] kind = "team"``)
    [workers]    agent, count, concurrency, exec_timeout_s, baseline, max_steps, model, lease_s
    [lead]       agent, model, max_steps, prompt
    [providers.NAME]  kind = local | openai | anthropic | openai_compatible | scripted | simulated,
                 base_url, api_key_env, models, model_file
    [run]        store, runs_dir, sandbox

Any problem becomes one ``ConfigError`` whose ``field`` is the dotted path of the first bad field, raised
before anything is started.
"""

from __future__ import annotations

import tomllib
from decimal import Decimal
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from swarmyard.errors import ConfigError, InvalidInputError
from swarmyard.money import MicroUSD, usd_to_micro


class _Frozen(BaseModel):
    """A config table: immutable, and unknown keys are an error (a typo must not be silently ignored)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class PolicyKind(StrEnum):
    """How workers see each other (the policies are described in ``swarmyard.swarm.policies``)."""

    INDEPENDENT = "independent"
    TEAM = "team"
    EXPLORE = "explore"
    GROUPS = "groups"


class AgentKind(StrEnum):
    """Which agent runs in a worker's machine."""

    BUILTIN = "builtin"
    CLAUDE = "claude"
    CODEX = "codex"
    OPENCODE = "opencode"
    AIDER = "aider"
    PI = "pi"


class ProviderKind(StrEnum):
    """Where a provider's models come from."""

    LOCAL = "local"
    OPENAI = "openai"
    ANTHROPIC = "anthropic"
    OPENAI_COMPATIBLE = "openai_compatible"
    SCRIPTED = "scripted"
    SIMULATED = "simulated"


class SandboxKind(StrEnum):
    """Machine backends a run may use."""

    LOCAL = "local"
    PROCESS = "process"
    RAY = "ray"


#: The embedded default model name, served by the ``local`` provider.
DEFAULT_MODEL = "qwen2.5-coder-0.5b-instruct"
#: Embedded model names a ``local`` provider knows without a ``model_file``, and which packaged file each is.
EMBEDDED_MODELS = {DEFAULT_MODEL: "qwen", "smollm2-135m-instruct": "smollm2"}

PositiveInt = Annotated[int, Field(gt=0, strict=True)]
NonNegativeInt = Annotated[int, Field(ge=0, strict=True)]
PositiveSeconds = Annotated[float, Field(gt=0)]


class GoalConfig(_Frozen):
    """The objective of the run and its limits."""

    objective: Annotated[str, Field(min_length=1)]
    budget_usd: str | int
    call_cap: PositiveInt = 200
    deadline_s: PositiveSeconds = 1800.0
    max_depth: NonNegativeInt = 2

    @field_validator("budget_usd", mode="before")
    @classmethod
    def _no_float(cls, value: Any) -> Any:
        if isinstance(value, float):
            raise ValueError(f'write it as a decimal string such as "{value}" (money is never a float)')
        if isinstance(value, bool):
            raise ValueError("must be a decimal string or an integer")
        return value

    @field_validator("budget_usd")
    @classmethod
    def _valid_amount(cls, value: str | int) -> str | int:
        try:
            usd_to_micro(value)
        except InvalidInputError as exc:
            raise ValueError(exc.message.removeprefix("budget_usd ")) from exc
        if Decimal(value) <= 0:
            raise ValueError("must be more than zero")
        return value

    @property
    def budget_micro_usd(self) -> MicroUSD:
        """The budget in micro-USD."""
        return usd_to_micro(self.budget_usd)


class Lens(_Frozen):
    """One explicit task: a title and the instructions the worker gets."""

    title: Annotated[str, Field(min_length=1, max_length=200)]
    prompt: str = ""


class TasksConfig(_Frozen):
    """Either lenses listed in the file or a planning call that splits the objective into ``plan`` tasks."""

    lenses: tuple[Lens, ...] = ()
    plan: PositiveInt | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if self.lenses and self.plan is not None:
            raise ValueError("give either lenses or plan, not both")
        return self


class PolicyConfig(_Frozen):
    """The exploration policy and its options (options of other policies are ignored)."""

    kind: PolicyKind = PolicyKind.TEAM
    #: explore: attempts in a row without improvement before a worker switches direction.
    patience: PositiveInt = 3
    #: explore: a peer's direction is adopted only when its best score beats ours by at least this much.
    adopt_margin: NonNegativeInt = 10
    #: explore: the directions on offer (empty: workers name their own).
    directions: tuple[str, ...] = ()
    #: groups: how many groups explore apart, how many rounds, how many best findings each group broadcasts.
    groups: PositiveInt = 2
    rounds: PositiveInt = 2
    broadcast_top: PositiveInt = 1


class WorkersConfig(_Frozen):
    """The workers: which agent, how many, how many at once, and their limits."""

    agent: AgentKind = AgentKind.BUILTIN
    count: PositiveInt = 3
    concurrency: PositiveInt = 4
    exec_timeout_s: PositiveSeconds = 900.0
    baseline: str | None = None
    max_steps: PositiveInt = 8
    model: Annotated[str, Field(min_length=1)] = DEFAULT_MODEL
    lease_s: PositiveSeconds = 120.0


class LeadConfig(_Frozen):
    """The lead: one more worker that reads every finding and writes the synthesis."""

    agent: AgentKind = AgentKind.BUILTIN
    model: Annotated[str, Field(min_length=1)] = DEFAULT_MODEL
    max_steps: PositiveInt = 4
    prompt: str = "Read every finding and write one synthesis that answers the objective. Cite the findings."


class ProviderConfig(_Frozen):
    """One model provider the broker may route to."""

    kind: ProviderKind
    base_url: str | None = None
    api_key_env: str | None = None
    models: tuple[str, ...] = ()
    model_file: str | None = None

    @model_validator(mode="after")
    def _needs(self) -> Self:
        if self.kind is ProviderKind.OPENAI_COMPATIBLE and not self.base_url:
            raise ValueError("an openai_compatible provider needs base_url")
        if self.base_url is not None and not self.base_url.startswith(("http://", "https://")):
            raise ValueError("base_url must start with http:// or https://")
        # checked here, not when the broker starts: by then the run folder and its goal already exist
        if self.kind is ProviderKind.LOCAL and len(self.models) != 1:
            raise ValueError("a local provider serves exactly one model")
        if self.kind is ProviderKind.LOCAL and not self.model_file and self.models[0] not in EMBEDDED_MODELS:
            raise ValueError(f"unknown embedded model {self.models[0]!r}: choose one of "
                             f"{sorted(EMBEDDED_MODELS)} or give model_file")
        return self


class RunConfig(_Frozen):
    """Where the run keeps its state and which machines it uses."""

    store: str | None = None
    runs_dir: str = "runs"
    sandbox: SandboxKind = SandboxKind.LOCAL
    #: a witness that cosigns the audit checkpoints (``swarmyard witness serve``): an http(s) URL or the path
    #: of its Unix socket; none by default (the log is then signed by its own key only)
    witness: Annotated[str, Field(min_length=1)] | None = None


def _default_providers() -> dict[str, ProviderConfig]:
    return {"local": ProviderConfig(kind=ProviderKind.LOCAL, models=(DEFAULT_MODEL,))}


class SwarmConfig(_Frozen):
    """A whole swarm file."""

    goal: GoalConfig
    tasks: TasksConfig = TasksConfig()
    policy: PolicyConfig = PolicyConfig()
    workers: WorkersConfig = WorkersConfig()
    lead: LeadConfig = LeadConfig()
    providers: dict[str, ProviderConfig] = Field(default_factory=_default_providers)
    run: RunConfig = RunConfig()

    @field_validator("policy", mode="before")
    @classmethod
    def _policy_shorthand(cls, value: Any) -> Any:
        return {"kind": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if not self.tasks.lenses and self.tasks.plan is None:
            raise ValueError("tasks: list lenses or set plan = N")
        if not self.providers:
            raise ValueError("providers: at least one provider is needed")
        # a model no provider serves would start the run and fail every agent with a 404
        served = {model for provider in self.providers.values() for model in provider.models}
        for where, model in (("workers.model", self.workers.model), ("lead.model", self.lead.model)):
            if model not in served:
                raise ValueError(f"{where}: no provider serves {model!r} (served: {', '.join(sorted(served))})")
        return self

    @property
    def task_count(self) -> int:
        """How many top-level tasks the run will have."""
        return len(self.tasks.lenses) if self.tasks.lenses else int(self.tasks.plan or 0)


def _field_of(error: dict[str, Any]) -> str:
    parts = [str(p) for p in error.get("loc", ()) if not str(p).startswith(("function-", "constrained-"))]
    # pydantic names union branches after their type ("str", "int"); they are not part of the field's path
    parts = [p for p in parts if p not in {"str", "int", "float", "bool"}]
    return ".".join(parts) or "swarm file"


def parse_config(data: dict[str, Any]) -> SwarmConfig:
    """Validate a parsed swarm file; ``ConfigError`` names the first bad field."""
    try:
        return SwarmConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
        if first.get("type") == "missing":
            message = "is required"
        elif first.get("type") == "extra_forbidden":
            message = "is not a known setting"
        field = _field_of(dict(first))
        if field == "swarm file" and ": " in message:
            # whole-file checks say which table they are about in front of the message
            field, message = message.split(": ", 1)
        raise ConfigError(message, field=field) from exc


def loads_config(text: str) -> SwarmConfig:
    """Parse a swarm file's TOML text."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}", field="swarm file") from exc
    return parse_config(data)


def load_config(path: Path) -> SwarmConfig:
    """Read and parse a swarm file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"no such swarm file: {path}", field="swarm file") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}", field="swarm file") from exc
    return loads_config(text)
