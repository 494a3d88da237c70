"""Swarm files: TOML parsed once at the edge into frozen pydantic models and passed down.

A swarm file has these tables (only ``[goal]`` is required; everything else has a default)::

    [goal]       objective, budget_usd ("0.50" or 1; never a float), call_cap, deadline_s, max_depth
    [tasks]      lenses = [{title, prompt, files}, ...], from_family = "FOLDER" (a generated instance's
                 lenses) or plan = N (a planning call splits the objective in N)
    [policy]     kind = independent | team | explore | groups, with that policy's options
                 (``policy = "team"`` is short for ``[policy] kind = "team"``)
    [workers]    agent, count, concurrency, exec_timeout_s, baseline, max_steps, model, lease_s,
                 max_failures, retry_backoff_s, history (none | scored_history | single_draft_refinement),
                 history_top_k, machine (per_task | per_slot), max_machines
                 profile (full | governed), tools = [{name, wasm, folder, writer, fuel, memory_mb,
                 timeout_s, description, params, required, args, offer}, ...] (WASI tools of the built-in
                 agent; args: arguments fixed for every call; offer: those the model is shown), flow (the tool of each step), attach_result,
                 finding (free | quoted)
    [lead]       agent, model, max_steps, prompt, profile, synthesis (free | digest | quoted), tools, flow,
                 attach_result, artifact
    [providers.NAME]  kind = local | openai | anthropic | openai_compatible | scripted | simulated,
                 base_url, api_key_env, models, model_file, replies (scripted: a file of replies, relative
                 to the swarm file), simulate (simulated: tokens | attempts), latency_s (simulated:
                 seconds each answer takes)
    [providers.NAME.prices.MODEL]  input_usd_per_mtok, output_usd_per_mtok ("0.15": decimal strings),
                 max_output_tokens, context_tokens: set or override what the price table knows of MODEL
    [run]        store, runs_dir, sandbox
    [reference]  label, score, wall_s, calls, tokens, spend_usd: a reference run's figures (the seed's), printed
                 beside this run's at its end
    [evaluator]  bundle (an evaluator bundle folder, relative to the swarm file): artifacts are scored on
                 its search split and the best one on its holdout once, when the run ends

Any problem becomes one ``ConfigError`` whose ``field`` is the dotted path of the first bad field, raised
before anything is started. That includes a hosted or ``openai_compatible`` model with no price: known models
take theirs from the maintained table (``swarmyard.prices``), any other needs one in the file.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from swarmyard.domain import Quotas
from swarmyard.errors import ConfigError, InvalidInputError, UserError
from swarmyard.money import MicroUSD, usd_to_micro
from swarmyard.prices import known_model, usd_per_mtok_to_micro

if TYPE_CHECKING:
    from swarmyard.wasi.catalog import WasiToolSpec


class _Frozen(BaseModel):
    """A config table: immutable, and unknown keys are an error (a typo must not be silently ignored)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class PolicyKind(StrEnum):
    """How workers see each other (the policies are described in ``swarmyard.rules.policies``)."""

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


class HistoryMode(StrEnum):
    """How a worker's context is built from its prior scored attempts (``swarmyard.agents.history``)."""

    NONE = "none"  # the conversation as it went, nothing packed in
    SCORED_HISTORY = "scored_history"  # the top-K scored attempts so far, with their scores
    SINGLE_DRAFT_REFINEMENT = "single_draft_refinement"  # only the best draft so far, to refine


class Synthesis(StrEnum):
    """How the built-in lead writes the synthesis (``swarmyard.agents.builtin``)."""

    FREE = "free"  # one submission, drafted in the lead's conversation with the findings in its brief
    DIGEST = "digest"  # in parts a small model can write: one sentence per finding, then the answer, composed
    QUOTED = "quoted"  # no model call: the objective, then the lines each finding cites, quoted, with its id


class FindingMode(StrEnum):
    """How the built-in worker writes its finding (``swarmyard.agents.quoted``)."""

    FREE = "free"  # the model writes it
    QUOTED = "quoted"  # the model chooses the lines its question rests on; the finding is written from them


class MachineLifetime(StrEnum):
    """How long a worker's machine lives: for one agent run (its task), or for its slot's every run."""

    PER_TASK = "per_task"  # fresh (or from the baseline) for each task, deleted when it ends: the seed's
    PER_SLOT = "per_slot"  # kept by its slot: the slot's next task finds the disk as the last one left it


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


_QUOTAS = Quotas()


class GoalConfig(_Frozen):
    """The objective of the run and its limits."""

    objective: Annotated[str, Field(min_length=1)]
    budget_usd: str | int
    call_cap: PositiveInt = 200
    deadline_s: PositiveSeconds = 1800.0
    max_depth: NonNegativeInt = 2
    #: what the goal's workers may store in total (see :class:`~swarmyard.domain.Quotas`): artifact bytes, each
    #: task's share of them, board posts and board bytes; a write past one is refused with ``quota_exceeded``
    artifact_quota_bytes: PositiveInt = _QUOTAS.artifact_bytes
    task_artifact_quota_bytes: PositiveInt = _QUOTAS.task_artifact_bytes
    board_quota_posts: PositiveInt = _QUOTAS.board_posts
    board_quota_bytes: PositiveInt = _QUOTAS.board_bytes

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

    @property
    def quotas(self) -> Quotas:
        """What the goal may store, as the store keeps it."""
        return Quotas(self.artifact_quota_bytes, self.task_artifact_quota_bytes, self.board_quota_posts,
                      self.board_quota_bytes)


class Lens(_Frozen):
    """One explicit task: a title, the instructions the worker gets, and the files its machine gets in ``task/``
    (files or folders, relative to the swarm file; see ``swarmyard.families.tasks``)."""

    title: Annotated[str, Field(min_length=1, max_length=200)]
    prompt: str = ""
    files: tuple[str, ...] = ()

    @field_validator("files")
    @classmethod
    def _usable_files(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        from swarmyard.families.tasks import resolve, task_files

        base = (info.context or {}).get("base_dir") if isinstance(info.context, dict) else None
        paths = tuple(str(resolve(v, Path(base or "."))) for v in value)
        task_files(paths)  # missing, symbolic or too large: refused here, before any run folder exists
        return paths


class TasksConfig(_Frozen):
    """Lenses listed in the file, the lenses of a generated instance (``from_family = "FOLDER"``, a folder
    ``swarmyard families generate`` wrote, relative to the swarm file), or a planning call that splits the
    objective into ``plan`` tasks."""

    lenses: tuple[Lens, ...] = ()
    plan: PositiveInt | None = None
    from_family: Annotated[str, Field(min_length=1)] | None = None
    #: every worker finding cites its task's files (``path:line`` and words copied from that line), and the plane
    #: refuses one whose quote is not on the cited line (``swarmyard.plane.sources``)
    cite_files: Annotated[bool, Field(strict=True)] = False

    @model_validator(mode="before")
    @classmethod
    def _family_lenses(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("from_family"), str):
            return data
        from swarmyard.families.tasks import family_lenses, resolve

        if data.get("lenses"):
            raise ValueError("give either lenses or from_family, not both")
        base = (info.context or {}).get("base_dir") if isinstance(info.context, dict) else None
        folder = resolve(data["from_family"], Path(base or "."))
        return {**data, "from_family": str(folder), "lenses": family_lenses(folder)}

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        if self.lenses and self.plan is not None:
            raise ValueError("give either lenses or plan, not both")
        titles = [lens.title for lens in self.lenses]
        if any(lens.files for lens in self.lenses) and len(set(titles)) != len(titles):
            # a task finds its files by its lens's title
            raise ValueError("lenses with files need titles of their own (two lenses share one)")
        if self.cite_files and not any(lens.files for lens in self.lenses):
            raise ValueError("cite_files needs lenses with files to cite")
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
    #: groups: how many groups explore apart (a count, or one ``[[policy.groups]]`` table per group with its own
    #: formulation of the tasks), how many rounds at most (they stop early at the deadline or when the budget is
    #: spent), how many best findings (by score) each group broadcasts.
    groups: PositiveInt | tuple[GroupConfig, ...] = 2
    rounds: PositiveInt = 2
    broadcast_top: PositiveInt = 1

    @field_validator("groups")
    @classmethod
    def _some_groups(cls, value: int | tuple[GroupConfig, ...]) -> int | tuple[GroupConfig, ...]:
        if isinstance(value, tuple) and not value:
            raise ValueError("list at least one [[policy.groups]] table, or give a count")
        return value

    @property
    def group_prompts(self) -> tuple[str, ...]:
        """Each group's own formulation, in order (``""`` where a group has none, and for a bare count)."""
        return tuple(g.prompt for g in self.groups) if isinstance(self.groups, tuple) else ("",) * self.groups


class GroupConfig(_Frozen):
    """``[[policy.groups]]``: one group of the ``groups`` policy; ``prompt`` is added to every task it works."""

    prompt: Annotated[str, Field(max_length=10_000)] = ""


class Profile(StrEnum):
    """What an agent's machine lets it do: ``full`` (a shell and files: coding work) or ``governed`` (no shell,
    no program but the agent itself: only the governed tools and the file's WASI tools)."""

    FULL = "full"
    GOVERNED = "governed"


#: Tools of the built-in agent that a WASI tool's name may not take.
RESERVED_TOOL_NAMES = frozenset({"claim_task", "heartbeat", "delegate", "board_read", "board_post", "read_findings",
                                 "submit_finding", "submit_artifact", "shell", "read_file", "write_file"})


#: How a fixed argument's type is named in an error.
_KIND_NAMES = {"string": "a string", "path": "a path (a string)", "boolean": "true or false",
               "integer": "an integer"}


class WasiToolConfig(_Frozen):
    """``[[workers.tools]]``: one WASI tool. ``wasm`` is a shipped tool's name (``jsonquery``, ``csvdiff``,
    ``textsearch``) or a ``.wasm`` file (relative to the swarm file), which then says its ``params``
    (name -> string | integer | boolean | path) and ``description``. ``folder`` (relative to the worker's
    working folder; its task's input files are in ``task``) is preopened read-only unless ``writer``."""

    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,39}$")]
    wasm: Annotated[str, Field(min_length=1)]
    folder: str = "."
    # strict: "yes" or "5" in a swarm file is a mistake to report, not a value to guess at
    writer: Annotated[bool, Field(strict=True)] = False
    fuel: Annotated[int, Field(gt=0, le=10**13, strict=True)] = 1_000_000_000
    memory_mb: Annotated[int, Field(gt=0, le=4096, strict=True)] = 64
    timeout_s: Annotated[float, Field(gt=0, le=600, strict=True)] = 10.0
    description: str | None = None
    params: dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,39}$")],
                 Literal["string", "integer", "boolean", "path"]] | None = None
    required: tuple[str, ...] = ()
    #: arguments fixed here, which the model is neither shown nor may give (``args = {left = "ledger.csv"}``)
    args: dict[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,39}$")],
               Annotated[str, Field(strict=True)] | Annotated[bool, Field(strict=True)]
               | Annotated[int, Field(strict=True)]] = Field(default_factory=dict)
    #: the arguments the model is shown (default: every one ``args`` does not fix); the rest keep their defaults
    offer: tuple[str, ...] | None = None

    @field_validator("name")
    @classmethod
    def _not_reserved(cls, value: str) -> str:
        if value in RESERVED_TOOL_NAMES:
            raise ValueError(f"{value!r} is a built-in tool's name")
        return value

    @field_validator("folder")
    @classmethod
    def _inside(cls, value: str) -> str:
        if value.startswith(("/", "~")) or ".." in Path(value).parts:
            # no '~' either: nothing expands it, and a folder named '~' is not what the file meant
            raise ValueError("must be relative to the worker's working folder, without '..' or '~'")
        return value

    @field_validator("wasm")
    @classmethod
    def _from_swarm_file(cls, value: str, info: ValidationInfo) -> str:
        if "/" not in value and not value.endswith(".wasm"):
            return value  # a shipped tool's name, checked with the rest below
        base = (info.context or {}).get("base_dir") if isinstance(info.context, dict) else None
        path = Path(value) if Path(value).is_absolute() else Path(base or ".") / value
        return str(path.resolve())

    @model_validator(mode="after")
    def _known(self) -> Self:
        import importlib.util

        from swarmyard.wasi.catalog import SHIPPED, shipped_wasm

        if importlib.util.find_spec("wasmtime") is None:  # here, not in the first worker's machine
            raise ValueError("WASI tools need the 'wasmtime' package: pip install 'swarmyard[wasi]'")
        if not self.wasm.startswith("/"):
            if self.wasm not in SHIPPED:  # the benchmark's modules (echo, spin) are built beside them, not tools
                raise ValueError(f"no shipped WASI tool is named {self.wasm!r}; shipped: {', '.join(sorted(SHIPPED))} "
                                 "(or a .wasm file of the swarm file's own)")
            if self.params is not None or self.description is not None or self.required:
                raise ValueError(f"{self.wasm!r} is a shipped tool: its params and description are its own")
            try:
                shipped_wasm(self.wasm)
            except UserError as exc:
                raise ValueError(exc.message) from None
            self._check_args({n: t.value for n, t in SHIPPED[self.wasm].params.items()})
            return self
        try:
            with open(self.wasm, "rb") as f:
                magic = f.read(4)
        except OSError as exc:
            raise ValueError(f"cannot read {self.wasm}: {exc.strerror}") from None
        if magic != b"\0asm":
            raise ValueError(f"{self.wasm} is not a WebAssembly module")
        if self.params is None:
            raise ValueError("a tool from a .wasm file says its params (name -> string | integer | boolean | path)")
        unknown = [r for r in self.required if r not in self.params]
        if unknown:
            raise ValueError(f"required names {unknown[0]!r}, which is not one of its params")
        self._check_args(dict(self.params))
        return self

    def _check_args(self, params: dict[str, str]) -> None:
        """Each fixed argument is one of the tool's params, of its type (a path or string is a string)."""
        kinds: dict[str, type] = {"string": str, "path": str, "boolean": bool, "integer": int}
        for name in self.offer or ():
            if name not in params or name in self.args:
                raise ValueError(f"offer names {name!r}, which is not one of its params left unfixed")
        for name, value in self.args.items():
            if name not in params:
                raise ValueError(f"args names {name!r}, which is not one of its params ({', '.join(params)})")
            if type(value) is not kinds[params[name]]:
                raise ValueError(f"args.{name} must be {_KIND_NAMES[params[name]]}")

    def spec(self, wasm: Path, workdir: Path) -> WasiToolSpec:
        """The tool as the agent runs it: its module at ``wasm``, its folder under ``workdir``."""
        from swarmyard.wasi.catalog import SHIPPED, ParamType, WasiCaps, WasiToolSpec

        shipped = SHIPPED.get(self.wasm)
        params = shipped.params if shipped else {n: ParamType(t) for n, t in (self.params or {}).items()}
        return WasiToolSpec(
            self.name, shipped.description if shipped else (self.description or f"The WASI tool {self.name}."),
            wasm, workdir / self.folder, params, shipped.required if shipped else self.required, self.writer,
            WasiCaps(fuel=self.fuel, memory_bytes=self.memory_mb << 20, wall_s=self.timeout_s), dict(self.args),
            self.offer)


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
    #: a task whose agent fails the same way (same ending, same exit code) this many times in a row is failed
    max_failures: PositiveInt = 3
    #: a worker slot whose agent failed waits this long before its next launch, doubled after each failure in
    #: a row, at most ``MAX_RETRY_BACKOFF_S``
    retry_backoff_s: Annotated[float, Field(ge=0)] = 1.0
    #: how each attempt's context is built from the prior scored attempts of the worker's group (submitted
    #: with submit_artifact and scored by the run's evaluator); ``history_top_k``: attempts a scored history holds
    history: HistoryMode = HistoryMode.NONE
    history_top_k: PositiveInt = 3
    #: ``governed``: no shell and no program but the agent (see :class:`Profile`)
    profile: Profile = Profile.FULL
    #: WASI tools the built-in agent offers (in either profile), run in the worker's machine
    tools: tuple[WasiToolConfig, ...] = ()
    #: ``per_task``: each agent run gets a machine of its own, deleted when its task ends; ``per_slot``: a
    #: worker slot keeps its machine for the tasks it takes (at the cap, the longest-idle one is deleted)
    machine: MachineLifetime = MachineLifetime.PER_TASK
    #: the most machines a run keeps at once; agent runs past it wait for a machine to end
    max_machines: PositiveInt = 128
    #: the built-in agent's tool at each step, in order (each step is offered that tool alone); past the list, any
    flow: tuple[Annotated[str, Field(min_length=1)], ...] = ()
    #: the built-in agent's finding is the result of its last tool call, attached as it is (the model writes its
    #: title): what a tool computed reaches the finding without a model retyping it
    attach_result: Annotated[bool, Field(strict=True)] = False
    #: ``quoted``: the built-in agent's model chooses among the lines its searches returned, and the finding is
    #: written from them (``"the line" (path:line)``): no sentence of the model's reaches it
    finding: FindingMode = FindingMode.FREE

    @model_validator(mode="after")
    def _quoted_builtin(self) -> WorkersConfig:
        if self.finding is FindingMode.QUOTED and (self.agent is not AgentKind.BUILTIN or self.attach_result):
            raise ValueError("finding = 'quoted' is the built-in agent's, without attach_result")
        return self


class LeadConfig(_Frozen):
    """The lead: one more worker that reads every finding and writes the synthesis."""

    agent: AgentKind = AgentKind.BUILTIN
    model: Annotated[str, Field(min_length=1)] = DEFAULT_MODEL
    max_steps: PositiveInt = 4
    prompt: str = "Read every finding and write one synthesis that answers the objective. Cite the findings."
    #: ``governed`` as for the workers; a governed lead has the workers' WASI tools
    profile: Profile = Profile.FULL
    #: ``digest``: a point per finding (up to ``max_steps - 1`` of them), then the answer, each one model call
    synthesis: Synthesis = Synthesis.FREE
    #: WASI tools of a governed built-in lead, instead of the workers' (``None``: the workers')
    tools: tuple[WasiToolConfig, ...] | None = None
    #: as ``[workers]``: the tool at each step, and the synthesis as the last tool's result
    flow: tuple[Annotated[str, Field(min_length=1)], ...] = ()
    attach_result: Annotated[bool, Field(strict=True)] = False
    #: the synthesis is also submitted as an artifact (scored by the run's evaluator), which it cites
    artifact: Annotated[bool, Field(strict=True)] = False

    @model_validator(mode="after")
    def _digest_steps(self) -> LeadConfig:
        if self.synthesis is Synthesis.DIGEST and self.max_steps < 2:
            raise ValueError("synthesis = 'digest' needs max_steps >= 2 (a point of a finding, then the answer)")
        if self.synthesis is not Synthesis.FREE and self.agent is not AgentKind.BUILTIN:
            raise ValueError(f"synthesis = '{self.synthesis.value}' is the built-in lead's; an agent CLI writes its own "
                             "synthesis")
        return self


#: The longest wait between two launches of a slot whose agent keeps failing.
MAX_RETRY_BACKOFF_S = 30.0
#: Kinds whose calls cost nothing unless the file says otherwise (they run here, or are not real models).
FREE_KINDS = frozenset({ProviderKind.LOCAL, ProviderKind.SIMULATED, ProviderKind.SCRIPTED})


class ModelPrice(_Frozen):
    """``[providers.NAME.prices.MODEL]``: a model's price and limits, set here or overriding the table's."""

    input_usd_per_mtok: str | None = None
    output_usd_per_mtok: str | None = None
    max_output_tokens: PositiveInt | None = None
    context_tokens: PositiveInt | None = None

    @field_validator("input_usd_per_mtok", "output_usd_per_mtok", mode="before")
    @classmethod
    def _exact(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, str):
            raise ValueError(f'write it as a decimal string such as "{value}" (money is never a float)')
        usd_per_mtok_to_micro(value, field=str(info.field_name))
        return value


@dataclass(frozen=True, slots=True)
class RouteTerms:
    """What the broker charges for a model and how far it may go: integer micro-USD per million tokens in and
    out, the answer's limit and the context window (``None``: the route's default, or unknown)."""

    input_per_mtok: int
    output_per_mtok: int
    max_output_tokens: int | None = None
    context_tokens: int | None = None


class ScriptedToolCall(_Frozen):
    """A tool call of a scripted reply: the tool's name and its arguments."""

    name: Annotated[str, Field(min_length=1)]
    arguments: dict[str, Any] = Field(default_factory=dict)


class ScriptedReply(_Frozen):
    """One reply of a scripted provider's replies file: ``say`` text, ``tool_calls``, or ``fail`` a way."""

    say: str | None = None
    tool_calls: tuple[ScriptedToolCall, ...] = ()
    fail: Literal["before_send", "after_send", "mid_stream", "status_500", "status_429"] | None = None
    #: with ``tool_calls``: text said beside them; with ``fail = "mid_stream"``: text sent before the drop
    text: str = ""
    input_tokens: NonNegativeInt | None = None
    output_tokens: NonNegativeInt | None = None
    #: with ``say``: whether the answer reports its usage (``false``: a full answer without it; the broker counts)
    usage: bool = True

    @model_validator(mode="after")
    def _one_kind(self) -> Self:
        given = [name for name, on in (("say", self.say is not None), ("tool_calls", bool(self.tool_calls)),
                                       ("fail", self.fail is not None)) if on]
        if len(given) != 1:
            raise ValueError("a reply has exactly one of say, tool_calls or fail")
        if not self.usage and self.say is None:
            raise ValueError("usage = false goes with say: only a said answer can leave its usage out")
        return self


class _ReplyFile(BaseModel):
    """A replies file: model name (or ``"*"`` for any other) -> its replies, used in order."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    replies: dict[str, tuple[ScriptedReply, ...]]


def load_replies(path: Path) -> dict[str, tuple[ScriptedReply, ...]]:
    """A scripted provider's replies, from JSON (``.json``) or TOML (anything else); ``ValueError`` says why not."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"replies file {path} not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read replies file {path}: {exc}") from None
    try:
        data: Any = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"replies file {path} is not valid {'JSON' if path.suffix == '.json' else 'TOML'}: "
                         f"{exc}") from None
    try:
        return _ReplyFile.model_validate({"replies": data}).replies
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())[1:] if not str(p).startswith("function-"))
        message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
        raise ValueError(f"replies file {path}: {where or 'top level'}: {message}") from None


class ProviderConfig(_Frozen):
    """One model provider the broker may route to."""

    kind: ProviderKind
    base_url: str | None = None
    api_key_env: str | None = None
    models: tuple[str, ...] = ()
    model_file: str | None = None
    #: scripted: the file its replies come from; relative paths are taken from the swarm file's folder
    replies: str | None = None
    #: simulated: ``tokens`` (words, for load benchmarks) or ``attempts`` (a seeded model that improves
    #: attempts from their scores, see ``swarmyard.broker.providers.attempts``)
    simulate: Literal["tokens", "attempts"] | None = None
    #: simulated: seconds each answer takes, as a real model's would (load benchmarks, calls in flight in tests)
    latency_s: Annotated[float, Field(ge=0, le=600)] | None = None
    #: simulated: answer this many workers one at a time in a fixed order, so that a run of workers sharing a
    #: board is the same whatever the scheduling (``swarmyard.broker.providers.turns``); a campaign sets it
    turns: Annotated[int, Field(ge=1, le=1024, strict=True)] | None = None
    prices: dict[str, ModelPrice] = Field(default_factory=dict)

    @field_validator("replies")
    @classmethod
    def _from_swarm_file(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        base = (info.context or {}).get("base_dir") if isinstance(info.context, dict) else None
        path = Path(value)
        if not path.is_absolute():
            path = Path(base or ".") / path
        return str(path.resolve())

    def terms(self, model: str) -> RouteTerms:
        """The price and limits of one of this provider's models: the file's values over the table's.

        ``ValueError`` names the model when a hosted or ``openai_compatible`` one has no price at all.
        """
        given = self.prices.get(model) or ModelPrice()
        known = None if self.kind in FREE_KINDS else known_model(self.kind.value, model, self.base_url)

        def price(value: str | None, field: str, table: int | None) -> int:
            if value is not None:
                return usd_per_mtok_to_micro(value, field=field)
            if table is not None:
                return table
            if self.kind in FREE_KINDS:
                return 0
            raise ValueError(f"no {field.split('_')[0]} price is known for model {model!r} (it is not in the "
                             f'price table): set {field} in this provider\'s [prices."{model}"] table')

        return RouteTerms(
            price(given.input_usd_per_mtok, "input_usd_per_mtok", known.input_per_mtok if known else None),
            price(given.output_usd_per_mtok, "output_usd_per_mtok", known.output_per_mtok if known else None),
            given.max_output_tokens,
            given.context_tokens or (known.context_tokens if known else None),
        )

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
        if self.replies is not None and self.kind is not ProviderKind.SCRIPTED:
            raise ValueError("replies is for a scripted provider")
        if self.simulate is not None and self.kind is not ProviderKind.SIMULATED:
            raise ValueError("simulate is for a simulated provider")
        if self.latency_s is not None and self.kind is not ProviderKind.SIMULATED:
            raise ValueError("latency_s is for a simulated provider")
        if self.turns is not None and self.kind is not ProviderKind.SIMULATED:
            raise ValueError("turns is for a simulated provider")
        if self.replies is not None:
            load_replies(Path(self.replies))
        for model in self.prices:
            if model not in self.models:
                raise ValueError(f"prices names {model!r}, which is not one of this provider's models")
        for model in self.models:
            self.terms(model)  # a hosted model with no price is refused here, before any run folder exists
        return self


class RunConfig(_Frozen):
    """Where the run keeps its state and which machines it uses."""

    store: str | None = None
    runs_dir: str = "runs"
    sandbox: SandboxKind = SandboxKind.LOCAL
    #: the Ray cluster of ``sandbox = "ray"`` (``HOST:PORT``); unset: ``RAY_ADDRESS``, else a local cluster
    ray_address: Annotated[str, Field(min_length=1)] | None = None
    #: a witness that cosigns the audit checkpoints (``swarmyard witness serve``): an http(s) URL or the path
    #: of its Unix socket; none by default (the log is then signed by its own key only)
    witness: Annotated[str, Field(min_length=1)] | None = None

    @field_validator("sandbox")
    @classmethod
    def _backend_installed(cls, value: SandboxKind) -> SandboxKind:
        if value is SandboxKind.RAY:
            from swarmyard.machines.ray import missing

            if (hint := missing()) is not None:
                raise ValueError(hint)
        return value


class ReferenceConfig(_Frozen):
    """``[reference]``: a reference run of the same benchmark (the seed's own), printed beside this run's figures
    in the table every run ends with. Each figure is optional; ``tokens`` is input and output together."""

    label: Annotated[str, Field(min_length=1, max_length=60)] = "reference"
    score: Annotated[int, Field(ge=0, strict=True)] | None = None
    wall_s: Annotated[float, Field(ge=0)] | None = None
    calls: Annotated[int, Field(ge=0, strict=True)] | None = None
    tokens: Annotated[int, Field(ge=0, strict=True)] | None = None
    spend_usd: str | None = None

    @field_validator("spend_usd")
    @classmethod
    def _amount(cls, value: str | None) -> str | None:
        if value is not None:
            usd_to_micro(value)  # "0.017438": a decimal string, never a float
        return value


class EvaluatorConfig(_Frozen):
    """``[evaluator]``: the bundle that scores the run's artifacts (``swarmyard.evaluator``).

    ``bundle`` is a folder path, relative to the swarm file's folder; it is resolved and loaded (checked) when the
    file is parsed, so a missing or malformed bundle stops the run before anything exists. The run copies it into
    the evaluator's private state and never changes the folder itself.
    """

    bundle: Annotated[str, Field(min_length=1)]

    @field_validator("bundle")
    @classmethod
    def _loadable(cls, value: str, info: ValidationInfo) -> str:
        from swarmyard.errors import BundleError
        from swarmyard.evaluator.bundle import load_bundle

        base = (info.context or {}).get("base_dir") if isinstance(info.context, dict) else None
        path = Path(value)
        if not path.is_absolute():
            path = Path(base or ".") / path
        try:
            return str(load_bundle(path).root)
        except BundleError as exc:
            raise ValueError(f"bad bundle: {exc.message}") from None

    @property
    def bundle_path(self) -> Path:
        """The bundle folder, absolute."""
        return Path(self.bundle)


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
    #: ``None``: the run's artifacts are stored but not scored, and there is no holdout
    evaluator: EvaluatorConfig | None = None
    #: a reference run's figures (the seed's), shown beside this run's
    reference: ReferenceConfig | None = None

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
        for where, tools in (("workers", self.workers.tools), ("lead", self.lead.tools or ())):
            named = [tool.name for tool in tools]
            if len(set(named)) != len(named):
                raise ValueError(f"{where}.tools: two tools are named "
                                 f"{next(n for n in named if named.count(n) > 1)!r}")
        names = [tool.name for tool in self.workers.tools]
        check_flows(self)
        for where, agent, profile in (("workers", self.workers.agent, self.workers.profile),
                                      ("lead", self.lead.agent, self.lead.profile)):
            if profile is Profile.GOVERNED and self.run.sandbox is SandboxKind.PROCESS:
                raise ValueError(f"{where}.profile: a governed machine needs a sandbox that can refuse exec; the "
                                 "process backend cannot (use local or ray)")
            if agent is not AgentKind.BUILTIN and profile is Profile.GOVERNED:
                from swarmyard.agents.adapters import get_adapter

                refusal = get_adapter(agent.value).governed_refusal
                if refusal:
                    raise ValueError(f"{where}.profile: {agent.value} cannot run governed: {refusal}")
            if agent is not AgentKind.BUILTIN and names and (where == "workers" or profile is Profile.GOVERNED):
                raise ValueError(f"{where}.agent: WASI tools are offered by the built-in agent, not {agent.value}")
        for where, model in (("workers.model", self.workers.model), ("lead.model", self.lead.model)):
            if model not in served:
                raise ValueError(f"{where}: no provider serves {model!r} (served: {', '.join(sorted(served))})")
        return self

    @property
    def task_count(self) -> int:
        """How many top-level tasks the run will have."""
        return len(self.tasks.lenses) if self.tasks.lenses else int(self.tasks.plan or 0)


def check_flows(config: SwarmConfig) -> None:
    """Each flow names tools its role is offered, in no more steps than its ``max_steps``."""
    from swarmyard.agents.actions import TOOLS

    lead_tools = config.lead.tools if config.lead.tools is not None else config.workers.tools
    for where, flow, tools, steps, profile in (
            ("workers", config.workers.flow, config.workers.tools, config.workers.max_steps, config.workers.profile),
            ("lead", config.lead.flow, lead_tools, config.lead.max_steps, config.lead.profile)):
        usable = set(TOOLS) | {tool.name for tool in tools}
        if profile is Profile.GOVERNED:
            usable -= {"shell", "read_file", "write_file"}
        for name in flow:
            if name not in usable:
                raise ValueError(f"{where}.flow: {name!r} is not a tool it is offered ({', '.join(sorted(usable))})")
        if len(flow) > steps:
            raise ValueError(f"{where}.flow: {len(flow)} steps, more than max_steps = {steps}")
    if config.lead.tools is not None and config.lead.profile is not Profile.GOVERNED:
        raise ValueError("lead.tools: WASI tools of the lead's own need profile = 'governed'")


def _table_model(annotation: Any) -> type[BaseModel] | None:
    """The config table a field holds: itself, or what a list, dict or optional of it holds."""
    import typing

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _table_model(arg)
        if found is not None:
            return found
    return None


def _did_you_mean(model: type[BaseModel], loc: list[str]) -> str:
    """`` (did you mean 'x'?)`` for an unknown key at ``loc`` close to a known one of its table, else ``""``."""
    import difflib

    table: type[BaseModel] | None = model
    for part in loc[:-1]:
        field = table.model_fields.get(part) if table is not None else None
        if field is not None:  # else a list index or a dict key: the same table's items
            table = _table_model(field.annotation)
    if table is None or not loc:
        return ""
    known = [field.alias or name for name, field in table.model_fields.items()]
    close = difflib.get_close_matches(loc[-1], known, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _field_of(error: dict[str, Any]) -> str:
    parts = [str(p) for p in error.get("loc", ()) if not str(p).startswith(("function-", "constrained-"))]
    # pydantic names union branches after their type ("str", "int"); they are not part of the field's path
    parts = [p for p in parts if p not in {"str", "int", "float", "bool"}]
    return ".".join(parts) or "swarm file"


def parse_config(data: dict[str, Any], *, base_dir: Path | None = None) -> SwarmConfig:
    """Validate a parsed swarm file; ``ConfigError`` names the first bad field. Files it names (a scripted
    provider's replies) are found from ``base_dir``, the swarm file's folder (by default the working folder)."""
    try:
        return SwarmConfig.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        first = exc.errors()[0]
        message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
        if first.get("type") == "missing":
            message = "is required"
        elif first.get("type") == "extra_forbidden":
            message = "is not a known setting" + _did_you_mean(SwarmConfig, [str(p) for p in first.get("loc", ())])
        field = _field_of(dict(first))
        if field == "swarm file" and ": " in message:
            # whole-file checks say which table they are about in front of the message
            field, message = message.split(": ", 1)
        raise ConfigError(message, field=field) from exc


def loads_config(text: str, *, base_dir: Path | None = None) -> SwarmConfig:
    """Parse a swarm file's TOML text."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}", field="swarm file") from exc
    return parse_config(data, base_dir=base_dir)


def load_config(path: Path) -> SwarmConfig:
    """Read and parse a swarm file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"no such swarm file: {path}", field="swarm file") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}", field="swarm file") from exc
    return loads_config(text, base_dir=path.parent)


def provider_table(providers_file: Path | None, flags: list[str]) -> dict[str, ProviderConfig]:
    """The providers of a file's ``[providers]`` table and of ``NAME=KIND:MODEL[,MODEL...]`` flags (a flag
    replaces the file's entry of that name): the one table ``swarmyard serve`` and ``swarmyard broker serve``
    build their broker from, checked as a swarm file's is (a hosted model needs a price)."""
    raw: dict[str, Any] = {}
    if providers_file is not None:
        try:
            data = tomllib.loads(providers_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read {providers_file}: {exc}", field="--providers") from exc
        table = data.get("providers")
        if not isinstance(table, dict) or not table:
            raise ConfigError(f"{providers_file} has no [providers] table", field="--providers")
        raw.update(table)
    for flag in flags:
        name, _, rest = flag.partition("=")
        kind, _, models = rest.partition(":")
        if not name or not kind or not models:
            raise ConfigError(f"--provider {flag!r} is not NAME=KIND:MODEL[,MODEL...]", field="--provider")
        raw[name] = {"kind": kind, "models": [m for m in models.split(",") if m]}
    base_dir = providers_file.parent if providers_file is not None else None
    out: dict[str, ProviderConfig] = {}
    for name, entry in raw.items():
        try:
            out[name] = ProviderConfig.model_validate(entry, context={"base_dir": base_dir})
        except ValidationError as exc:
            first = exc.errors()[0]
            message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
            if first.get("type") == "extra_forbidden":
                message = "is not a known setting"
            raise ConfigError(message, field=f"providers.{name}") from exc
    return out
