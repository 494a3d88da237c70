"""Campaign files: which cells, which trial seeds, the one cap they all run under, and each trial's swarm file.

A campaign file (TOML)::

    [campaign]   name, swarm (the swarm file, relative to the campaign file), seeds = [1, 2, 3] (by default 1-8
                 where every model is the simulated one; required otherwise), budget_usd, call_cap, deadline_s
                 (the cap every cell runs under; by default the swarm file's), dir (where results go; by
                 default campaigns/NAME in the working folder; a new or empty folder, or a campaign's own),
                 match = "budget" | "tokens" | "calls" (what
                 every cell of a seed gets the same of: the goal's caps as a run has them; the workers' tokens
                 in all, ``tokens``; or the workers' calls in all, ``call_cap``)
    [grid]       the seed's 2x2: {a single worker, a cohort of ``cohort``} x {scored_history,
                 single_draft_refinement}; top_k (attempts a scored history holds), policy (how the cohort
                 shares: team by default)
    [sweep]      best@n (independent) vs team@n for every n in ``n``; history (the workers' context);
                 tokens_per_agent = [...] with match = "tokens" (a cell of n workers gets n times as many)
    [[cells]]    cells of your own: name, and ``workers``, ``lead`` and ``policy`` tables whose keys replace the
                 swarm file's (``workers = { count = 1 }``, ``lead = { tools = [], flow = [...] }``): any contrast
                 the swarm file can state (worker counts, tools, flows, models), under the same cap and tasks
    [[claims]]   sentences the campaign tests: sentence, a, b (two cells by name; the sentence says a beats b)

Under ``match = "tokens"`` every token costs one micro-USD (the broker's budget then holds and settles tokens
exactly, worst case first), the goal's call cap is out of the way and a call's output is at most
``TOKEN_MATCH_MAX_OUTPUT`` unless the swarm file says otherwise; a hosted provider is refused (its real price
would go uncapped). Under ``"tokens"`` and ``"calls"`` the coordinator's one share held back for the lead is one
share more than the workers' allowance, outside the match.

The swarm file states the problem as its lenses (listed, or ``from_family``). A problem of one lens is
attempted by each of a cell's n workers (n copies of the task); a problem of several (a family's shards) is
shared by the cell's n workers as it is. ``${seed}`` anywhere in the swarm file is replaced by the trial's seed,
so the same seed is the same task instance in every cell: a task family's instances, made beforehand with
``swarmyard families generate NAME instances/seed-N --seed N``, are named as ``from_family =
"instances/seed-${seed}"`` and ``[evaluator] bundle = "instances/seed-${seed}/bundle"``. Every trial's swarm file is built and checked when the campaign file is read, so a
bad campaign is refused (``ConfigError`` naming the field) before anything runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import tomllib
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from swarmyard.campaign.stats import MIN_TRUSTED_SEEDS
from swarmyard.config import (
    FREE_KINDS,
    GoalConfig,
    HistoryMode,
    PolicyKind,
    ProviderKind,
    SwarmConfig,
    parse_config,
)
from swarmyard.errors import ConfigError

#: The seeds of a campaign on the simulated provider that names none: as many as the paired interval needs.
DEFAULT_SEEDS = tuple(range(1, MIN_TRUSTED_SEEDS + 1))
#: The placeholder a swarm file may hold for the trial's seed.
SEED = "${seed}"
#: A run id's length (``run_`` and 26 characters): the plane's socket is ``DIR/runs/RUN/plane.sock``.
_RUN_ID_CHARS = 30
_MAX_SOCKET_PATH = 107
#: The largest campaign or swarm file read: a larger one is refused before it is parsed.
MAX_FILE_BYTES = 1 << 20

PositiveInt = Annotated[int, Field(gt=0, strict=True)]
#: The most workers a cell may have (a seeded team's turns go up to this many).
MAX_CELL_WORKERS = 1024
#: The most trials (cells x seeds) a campaign may have: each trial's swarm file is built and checked when the
#: file is read, so a file of a few kilobytes could otherwise hold the reader for hours.
MAX_TRIALS = 10_000
Workers = Annotated[int, Field(gt=0, le=MAX_CELL_WORKERS, strict=True)]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Match(StrEnum):
    """What every cell of a seed gets the same of."""

    #: the money cap, call cap and deadline of the goal (the lead's share included, as a run has them)
    BUDGET = "budget"
    #: the workers' tokens in all (each worker its share; the lead gets one share more, outside the match)
    TOKENS = "tokens"
    #: the workers' model calls in all (each worker its share, and as many steps; the lead one share more)
    CALLS = "calls"


class CampaignTable(_Frozen):
    """``[campaign]``: the swarm file, the seeds and the cap shared by every cell."""

    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
    swarm: Annotated[str, Field(min_length=1)]
    seeds: Annotated[tuple[Annotated[int, Field(ge=0, strict=True)], ...], Field(min_length=1)] | None = None
    budget_usd: str | int | None = None
    call_cap: PositiveInt | None = None
    deadline_s: Annotated[float, Field(gt=0, strict=True, allow_inf_nan=False)] | None = None
    dir: Annotated[str, Field(min_length=1)] | None = None
    #: what every cell of a seed gets the same of: the money cap (and call cap), the workers' tokens, or their calls
    match: Match = Match.BUDGET
    #: with ``match = "tokens"``: the workers' tokens of every cell of the grid, in all
    tokens: PositiveInt | None = None

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError("each seed once (the same seed is the same trial)")
        return value

    @model_validator(mode="after")
    def _matched(self) -> Self:
        if self.match is Match.CALLS and self.call_cap is None:
            raise ValueError('call_cap: match = "calls" needs the workers\' calls of every cell, in all')
        if self.tokens is not None and self.match is not Match.TOKENS:
            raise ValueError('tokens: is for match = "tokens"')
        return self

    @field_validator("budget_usd", mode="before")
    @classmethod
    def _money(cls, value: Any) -> Any:
        if value is None:
            return None
        # the goal table's own checks: a decimal string or an integer, never a float, more than zero
        try:
            GoalConfig(objective="-", budget_usd=value)
        except ValidationError as exc:
            raise ValueError(str(exc.errors()[0].get("msg", "invalid")).removeprefix("Value error, ")) from None
        return value


class GridTable(_Frozen):
    """``[grid]``: the 2x2 of a single worker vs a cohort, scored history vs single-draft refinement."""

    cohort: Annotated[int, Field(ge=2, le=MAX_CELL_WORKERS, strict=True)] = 3
    top_k: PositiveInt = 3
    policy: PolicyKind = PolicyKind.TEAM


class SweepTable(_Frozen):
    """``[sweep]``: best@n (independent workers) vs team@n (one board) for every n listed; with ``match =
    "tokens"``, at every number of tokens per agent listed (the cell's workers get n times as many)."""

    n: Annotated[tuple[Workers, ...], Field(min_length=1)]
    history: HistoryMode | None = None
    top_k: PositiveInt = 3
    tokens_per_agent: Annotated[tuple[PositiveInt, ...], Field(min_length=1)] | None = None

    @field_validator("tokens_per_agent")
    @classmethod
    def _distinct_tokens(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError("each number once")
        return None if value is None else tuple(sorted(value))

    @field_validator("n")
    @classmethod
    def _distinct(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if len(set(value)) != len(value):
            raise ValueError("each n once")
        return tuple(sorted(value))


#: The swarm file's tables a ``[[cells]]`` entry may set keys of: the rest (the goal, tasks, evaluator,
#: providers) is what every cell shares.
CELL_TABLES = ("workers", "lead", "policy")


class CellTable(_Frozen):
    """``[[cells]]``: a cell of the file's own, the swarm file with some keys of these tables replaced."""

    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.@/+-]*$")]
    workers: dict[str, Any] = Field(default_factory=dict)
    lead: dict[str, Any] = Field(default_factory=dict)
    policy: dict[str, Any] = Field(default_factory=dict)

    @field_validator("workers")
    @classmethod
    def _not_matched(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "concurrency" in value:
            # concurrency follows the count (at most the swarm file's), as in every other cell
            raise ValueError("concurrency: a cell's concurrency follows its count; set it in the swarm file")
        return value


class ClaimTable(_Frozen):
    """``[[claims]]``: a sentence that cell ``a`` beats cell ``b``, tested seed by seed."""

    sentence: Annotated[str, Field(min_length=1, max_length=300)]
    a: Annotated[str, Field(min_length=1)]
    b: Annotated[str, Field(min_length=1)]


class CampaignFile(_Frozen):
    """A whole campaign file."""

    campaign: CampaignTable
    grid: GridTable | None = None
    sweep: SweepTable | None = None
    cells: tuple[CellTable, ...] = ()
    claims: tuple[ClaimTable, ...] = ()

    @model_validator(mode="after")
    def _some_cells(self) -> Self:
        if self.grid is None and self.sweep is None and not self.cells:
            raise ValueError("campaign file: give a [grid] table, a [sweep] table, [[cells]], or any of them")
        names = [c.name for c in self.cells]
        if len(set(names)) != len(names):
            raise ValueError("cells: each cell's name once")
        if self.cells and self.campaign.match is not Match.BUDGET:
            raise ValueError('cells: [[cells]] run under match = "budget" (the goal\'s caps, the same for every '
                             "cell)")
        for index, claim in enumerate(self.claims):
            for side in ("a", "b"):
                if getattr(claim, side) not in names:
                    raise ValueError(f"claims.{index}.{side}: {getattr(claim, side)!r} is not a cell of "
                                     "[[cells]]")
            if claim.a == claim.b:
                raise ValueError(f"claims.{index}.b: a claim compares two different cells")
        tokens = self.campaign.match is Match.TOKENS
        if tokens and self.grid is not None and self.campaign.tokens is None:
            raise ValueError('campaign.tokens: match = "tokens" needs the workers\' tokens of every grid cell')
        if tokens and self.sweep is not None and self.sweep.tokens_per_agent is None:
            raise ValueError('sweep.tokens_per_agent: match = "tokens" needs the tokens each agent gets')
        if not tokens and self.sweep is not None and self.sweep.tokens_per_agent is not None:
            raise ValueError('sweep.tokens_per_agent: is for match = "tokens"')
        return self


@dataclass(frozen=True, slots=True)
class Cell:
    """One arm of the campaign: how many workers, how they share, how a worker's context is built."""

    name: str
    n: int
    policy: PolicyKind
    history: HistoryMode
    top_k: int
    #: which comparison the cell belongs to: ``grid`` or ``sweep``
    family: str
    #: the workers' tokens (``match = "tokens"``) or calls (``"calls"``) in all; ``None``: matched on budget
    allowance: int | None = None
    #: a token sweep's tokens per agent
    tokens_per_agent: int | None = None
    #: a ``[[cells]]`` cell's keys that replace the swarm file's: (table, its keys as canonical JSON)
    overrides: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Trial:
    """One cell run on one seed: its swarm config, ready for ``Swarm``."""

    cell: Cell
    seed: int
    config: SwarmConfig

    @property
    def key(self) -> str:
        """The trial's name in the campaign's record."""
        return f"{self.cell.name}#{self.seed}"


@dataclass(frozen=True, slots=True)
class Campaign:
    """A parsed campaign: its cells, seeds and every trial's swarm config."""

    name: str
    dir: Path
    seeds: tuple[int, ...]
    cells: tuple[Cell, ...]
    trials: tuple[Trial, ...]
    #: SHA-256 of the campaign file and its swarm file: a resume must be of the same campaign
    digest: str
    budget_micro_usd: int
    call_cap: int
    deadline_s: float
    match: Match = Match.BUDGET
    #: every model is the simulated provider's: a trial's figures are the same every time it runs
    reproducible: bool = False
    #: the file's ``[[claims]]``: (sentence, a, b)
    claims: tuple[tuple[str, str, str], ...] = ()


def cells_of(spec: CampaignFile, base: SwarmConfig) -> list[Cell]:
    """The cells the file asks for, grid first, then the sweep by n."""
    cells: list[Cell] = []
    t = spec.campaign
    allowance = t.tokens if t.match is Match.TOKENS else t.call_cap if t.match is Match.CALLS else None
    if spec.grid is not None:
        g = spec.grid
        for history in (HistoryMode.SCORED_HISTORY, HistoryMode.SINGLE_DRAFT_REFINEMENT):
            cells.append(Cell(f"single/{history.value}", 1, PolicyKind.INDEPENDENT, history, g.top_k, "grid",
                              allowance))
            cells.append(Cell(f"cohort{g.cohort}/{history.value}", g.cohort, g.policy, history, g.top_k, "grid",
                              allowance))
    if spec.sweep is not None:
        s = spec.sweep
        history = s.history or base.workers.history
        for per_agent in s.tokens_per_agent or (None,):
            for n in s.n:
                suffix = f"/t{per_agent}" if per_agent is not None else ""
                total = n * per_agent if per_agent is not None else allowance
                cells.append(Cell(f"best@{n}{suffix}", n, PolicyKind.INDEPENDENT, history, s.top_k, "sweep", total,
                                  per_agent))
                cells.append(Cell(f"team@{n}{suffix}", n, PolicyKind.TEAM, history, s.top_k, "sweep", total,
                                  per_agent))
    for own in spec.cells:
        cells.append(_own_cell(own, base))
    names = [c.name for c in cells]
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise ConfigError(f"{twice[0]!r} names two cells (a [[cells]] name may not be one the grid or sweep makes)",
                          field="cells")
    return cells


def _own_cell(own: CellTable, base: SwarmConfig) -> Cell:
    """A ``[[cells]]`` cell: its workers, policy and history as the swarm file with its keys over them."""
    workers = {**base.workers.model_dump(mode="json"), **own.workers}
    policy = {**base.policy.model_dump(mode="json"), **own.policy}
    # the keys' values are checked with the whole trial's swarm file, where a bad one names its field
    n, history, top_k = workers.get("count"), workers.get("history"), workers.get("history_top_k")
    try:
        cell_policy = PolicyKind(str(policy.get("kind")))
        cell_history = HistoryMode(str(history))
    except ValueError as exc:
        raise ConfigError(str(exc), field=f"cells.{own.name}") from None
    for key, value in (("count", n), ("history_top_k", top_k)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigError(f"workers.{key} must be a positive integer, not {value!r}", field=f"cells.{own.name}")
    if isinstance(n, int) and n > MAX_CELL_WORKERS:
        raise ConfigError(f"workers.count must be at most {MAX_CELL_WORKERS}, not {n}", field=f"cells.{own.name}")
    assert isinstance(n, int) and isinstance(top_k, int)
    overrides = tuple((table, json.dumps(getattr(own, table), sort_keys=True)) for table in CELL_TABLES
                      if getattr(own, table))
    return Cell(own.name, n, cell_policy, cell_history, top_k, "cells", overrides=overrides)


#: What one token costs under ``match = "tokens"`` (1 USD a million: one micro-USD), so the goal's money cap is
#: its token allowance, held and settled by the broker like any budget.
TOKEN_PRICE_USD_PER_MTOK = "1"
#: A call's output under ``match = "tokens"`` unless the swarm file sets its own: the broker holds a call's worst
#: case (its input and this much output) before it is made, so a worker's last call must fit it, and an agent's
#: own large default would leave most of a small allowance unusable.
TOKEN_MATCH_MAX_OUTPUT = 256
#: The goal's call cap under ``match = "tokens"``: out of the way, the tokens bind.
_UNBOUND_CALLS = 100_000
_UNBOUND_STEPS = 10_000
#: The largest integer the store keeps (SQLite's and PostgreSQL's 64-bit integers).
MAX_STORED_INT = 2**63 - 1


def _matched(data: dict[str, Any], goal: dict[str, Any], workers: dict[str, Any], cell: Cell,
             match: Match) -> None:
    """Give the cell's workers ``cell.allowance`` tokens or calls in all, each its share; the lead one share more
    (the coordinator holds one share back for it), outside what the cells are matched on."""
    assert cell.allowance is not None
    share = max(1, cell.allowance // cell.n)
    if match is Match.CALLS:
        goal["call_cap"] = share * (cell.n + 1)
        workers["max_steps"] = share  # its last step is its finding: it makes exactly its calls
        return
    goal["budget_usd"] = str(Decimal(share * (cell.n + 1)) / 1_000_000)
    goal["call_cap"] = _UNBOUND_CALLS
    workers["max_steps"] = _UNBOUND_STEPS
    providers = {}
    for name, table in dict(data.get("providers") or {}).items():
        prices = {model: {"max_output_tokens": TOKEN_MATCH_MAX_OUTPUT,
                          **dict(table.get("prices", {}).get(model, {})),
                          "input_usd_per_mtok": TOKEN_PRICE_USD_PER_MTOK,
                          "output_usd_per_mtok": TOKEN_PRICE_USD_PER_MTOK} for model in table.get("models", ())}
        providers[name] = {**table, "prices": prices}
    data["providers"] = providers


def _trial_data(raw: dict[str, Any], base: SwarmConfig, cell: Cell, table: CampaignTable,
                runs_dir: Path) -> dict[str, Any]:
    """The swarm file's tables with the cell and the campaign's cap written over them."""
    data = dict(raw)
    own: dict[str, dict[str, Any]] = {table: json.loads(keys) for table, keys in cell.overrides}
    if "lead" in own:
        data["lead"] = {**dict(data.get("lead") or {}), **own["lead"]}
    goal = dict(data.get("goal") or {})
    for key in ("budget_usd", "call_cap", "deadline_s"):
        value = getattr(table, key)
        if value is not None:
            goal[key] = value
    lenses = [lens.model_dump(mode="json") for lens in base.tasks.lenses]
    if len(lenses) == 1 and cell.n > 1:
        # one problem: each of the n workers makes its own attempt at it
        lenses = [{**lenses[0], "title": f"{lenses[0]['title']} (attempt {i + 1} of {cell.n})"}
                  for i in range(cell.n)]
    data["tasks"] = {"lenses": lenses}
    data["policy"] = {**base.policy.model_dump(mode="json"), **own.get("policy", {}), "kind": cell.policy.value}
    workers = {**dict(data.get("workers") or {}), **own.get("workers", {})}
    workers.update(count=cell.n, concurrency=min(cell.n, base.workers.concurrency), history=cell.history.value,
                   history_top_k=cell.top_k)
    if table.match is not Match.BUDGET:
        _matched(data, goal, workers, cell, table.match)
    data["goal"] = goal
    if cell.policy is not PolicyKind.INDEPENDENT and cell.n > 1 and _seeded(base):
        # workers that read each other's attempts: a seeded model answers them in turn, all at once, so the
        # trial is the same whatever the scheduling (independent workers need no turns: nothing they read moves)
        workers["concurrency"] = cell.n
        data["providers"] = {name: ({**table, "turns": cell.n} if table.get("kind") == "simulated" else table)
                             for name, table in dict(data.get("providers") or {}).items()}
    data["workers"] = workers
    # every trial keeps its own store in its run folder, as a run of its own does
    run = {k: v for k, v in dict(data.get("run") or {}).items() if k != "store"}
    data["run"] = {**run, "runs_dir": str(runs_dir)}
    return data


def _seeded(config: SwarmConfig) -> bool:
    """Every model of the swarm file is the simulated provider's: its trials can be reproduced exactly."""
    return bool(config.providers) and all(p.kind is ProviderKind.SIMULATED for p in config.providers.values())


def _read_capped(path: Path, field: str) -> str:
    """The file's text; ``ConfigError`` naming ``field`` for a file over ``MAX_FILE_BYTES``, or for one that is not a
    regular file (a FIFO or a device would hold the reader until something wrote to it, or for ever)."""
    if path.exists() and not path.is_file() and not path.is_dir():
        raise ConfigError(f"{path} is not a regular file", field=field)
    with path.open("rb") as handle:
        data = handle.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"{path} is larger than {MAX_FILE_BYTES:,} bytes", field=field)
    return data.decode("utf-8")


def _loads(text: str, what: str, field: str) -> dict[str, Any]:
    """TOML ``text``; ``ConfigError`` naming ``field`` for text that is not TOML or nests too deep to parse."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{what} is not valid TOML: {exc}", field=field) from None
    except RecursionError:
        raise ConfigError(f"{what} nests its tables or arrays too deep", field=field) from None


def _swarm_text(path: Path) -> str:
    try:
        return _read_capped(path, "campaign.swarm")
    except FileNotFoundError:
        raise ConfigError(f"no such swarm file: {path}", field="campaign.swarm") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}", field="campaign.swarm") from None


def _parse_trial(text: str, seed: int, swarm_path: Path, overrides: Any = None,
                 cell: Cell | None = None) -> tuple[dict[str, Any], SwarmConfig]:
    raw = _loads(text.replace(SEED, str(seed)), str(swarm_path), "campaign.swarm")
    try:
        return raw, parse_config(raw if overrides is None else overrides(raw), base_dir=swarm_path.parent)
    except ConfigError as exc:
        table, _, rest = (exc.field or "").partition(".")
        own = dict(cell.overrides) if cell is not None else {}
        if table in own and rest.split(".")[0] in json.loads(own[table]):
            # a key the campaign file's [[cells]] entry set: named there, not in the swarm file
            message = exc.message.removeprefix(f"{exc.field}: ")
            raise ConfigError(message, field=f"cells.{cell.name if cell else ''}.{exc.field}") from None
        raise ConfigError(f"{swarm_path}: {exc.message}", field="campaign.swarm") from None


def _first_error(exc: ValidationError) -> ConfigError:
    first = exc.errors()[0]
    message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
    if first.get("type") == "missing":
        message = "is required"
    elif first.get("type") == "extra_forbidden":
        message = "is not a known setting"
    parts = [str(p) for p in first.get("loc", ()) if not str(p).startswith(("function-", "constrained-"))]
    parts = [p for p in parts if p not in {"str", "int", "float", "bool"}]
    field = ".".join(parts) or "campaign file"
    if field == "campaign file" and ": " in message:
        field, message = message.split(": ", 1)
    return ConfigError(message, field=field)


#: What a campaign's folder holds before its record starts: the lock its process takes first.
_BEFORE_RECORD = frozenset({".lock"})
#: A campaign's own record files: a folder holding them is a campaign's (resumed, or refused as taken).
_RECORD_FILES = ("campaign.json", "trials.jsonl")


def _check_dir(where: Path) -> None:
    """``ConfigError`` for a ``dir`` the campaign cannot own: a path that is not a folder, or a folder that holds
    files of something else (the working folder, ``/``): the campaign would write its record, report and runs
    among them. A missing or empty folder, or a campaign's own, is fine."""
    if "\0" in str(where):
        raise ConfigError("a folder's name cannot hold a NUL character", field="campaign.dir")
    try:
        if where.exists() and not where.is_dir():
            raise ConfigError(f"{where} exists and is not a folder", field="campaign.dir")
        if not where.exists():
            return
        names = {entry.name for entry in where.iterdir()}
    except OSError as exc:
        raise ConfigError(f"cannot use {where}: {exc.strerror or exc}", field="campaign.dir") from None
    if names - _BEFORE_RECORD and not any(name in names for name in _RECORD_FILES):
        raise ConfigError(f"{where} already holds files that are not a campaign's ({', '.join(sorted(names)[:3])}"
                          f"{', ...' if len(names) > 3 else ''}): name a new or empty folder", field="campaign.dir")


def load_campaign(path: Path, *, cwd: Path | None = None) -> Campaign:
    """Read a campaign file and build every trial's swarm config; ``ConfigError`` names the first bad field."""
    try:
        text = _read_capped(path, "campaign file")
    except FileNotFoundError:
        raise ConfigError(f"no such campaign file: {path}", field="campaign file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}", field="campaign file") from None
    data = _loads(text, "the campaign file", "campaign file")
    try:
        spec = CampaignFile.model_validate(data)
    except ValidationError as exc:
        raise _first_error(exc) from None
    except RecursionError:
        raise ConfigError("nests its tables or arrays too deep", field="campaign file") from None
    table = spec.campaign
    swarm_path = Path(table.swarm)
    if not swarm_path.is_absolute():
        swarm_path = path.parent / swarm_path
    swarm_text = _swarm_text(swarm_path)
    _, base = _parse_trial(swarm_text, (table.seeds or DEFAULT_SEEDS)[0], swarm_path)
    if not base.tasks.lenses:
        raise ConfigError("the swarm file must state its problem as [[tasks.lenses]] or from_family (every "
                          "cell gets the same tasks), not as a plan", field="campaign.swarm")
    if table.seeds is None and not _seeded(base):
        raise ConfigError("is required where a model is not the simulated one (each seed is a paid trial per "
                          f"cell); {len(DEFAULT_SEEDS)} is the least the paired interval is trusted at",
                          field="campaign.seeds")
    seeds = table.seeds or DEFAULT_SEEDS
    hosted = [name for name, p in base.providers.items() if p.kind not in FREE_KINDS]
    if table.match is Match.TOKENS and hosted:
        raise ConfigError(f'match = "tokens" counts every token at one micro-USD, so it cannot also cap what '
                          f"provider {hosted[0]!r} charges: use match = \"budget\" or \"calls\" with it",
                          field="campaign.match")
    where = Path(table.dir) if table.dir else Path("campaigns") / table.name
    if not where.is_absolute():
        where = (cwd or Path.cwd()) / where
    where = Path(os.path.abspath(where))
    _check_dir(where)
    runs_dir = where / "runs"
    socket = len(os.fsencode(runs_dir)) + 1 + _RUN_ID_CHARS + len("/plane.sock")
    if socket > _MAX_SOCKET_PATH:
        raise ConfigError(f"{where} is too deep: a trial's control-plane socket would be {socket} bytes long, "
                          f"at most {_MAX_SOCKET_PATH}; choose a shorter dir", field="campaign.dir")
    cells = cells_of(spec, base)
    if len(cells) * len(seeds) > MAX_TRIALS:
        raise ConfigError(f"{len(cells)} cells x {len(seeds)} seeds = {len(cells) * len(seeds):,} trials, more "
                          f"than the {MAX_TRIALS:,} a campaign may have", field="campaign.seeds")
    # turns make a team reproducible; explore's direction claims and groups' later rounds are not in them, in
    # any cell (the grid's cohort, or a [[cells]] cell whose policy the file or the swarm file sets)
    reproducible = _seeded(base) and all(c.policy in (PolicyKind.TEAM, PolicyKind.INDEPENDENT) for c in cells)
    for cell in cells:
        if cell.allowance is not None and cell.allowance % cell.n:
            # each worker gets allowance // n: a remainder would leave this cell's workers less in all
            what = "call_cap" if table.match is Match.CALLS else "tokens"
            raise ConfigError(f"{cell.allowance:,} does not split evenly among cell {cell.name}'s {cell.n} workers "
                              "(every cell of a seed gets the same in all): give a multiple of "
                              f"{cell.n}", field=f"campaign.{what}")
        if table.match is Match.CALLS and cell.allowance is not None \
                and cell.allowance // cell.n * (cell.n + 1) > MAX_STORED_INT:
            # the goal's row keeps its call cap (the workers' and the lead's shares) as a 64-bit integer: refused
            # here, not by the store once the campaign's folder exists
            raise ConfigError(f"{cell.allowance:,} gives cell {cell.name}'s goal a call cap of "
                              f"{cell.allowance // cell.n * (cell.n + 1):,} (its workers' shares and the lead's), "
                              f"more than the {MAX_STORED_INT:,} a goal can hold", field="campaign.call_cap")
    trials: list[Trial] = []
    for cell in cells:
        for seed in seeds:
            def over(raw: dict[str, Any], cell: Cell = cell, seed: int = seed) -> dict[str, Any]:
                _, base_of_seed = _parse_trial(swarm_text, seed, swarm_path)
                return _trial_data(raw, base_of_seed, cell, table, runs_dir)
            _, config = _parse_trial(swarm_text, seed, swarm_path, over, cell)
            trials.append(Trial(cell, seed, config))
    first = trials[0].config.goal
    digest = hashlib.sha256(text.encode() + b"\0" + swarm_text.encode()).hexdigest()
    return Campaign(table.name, where, seeds, tuple(cells), tuple(trials), digest,
                    first.budget_micro_usd, first.call_cap, first.deadline_s, table.match, reproducible,
                    tuple((c.sentence, c.a, c.b) for c in spec.claims))

