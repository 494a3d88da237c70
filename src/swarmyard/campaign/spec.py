"""Campaign files: which cells, which trial seeds, the one cap they all run under, and each trial's swarm file.

A campaign file (TOML)::

    [campaign]   name, swarm (the swarm file, relative to the campaign file), seeds = [1, 2, 3],
                 budget_usd, call_cap, deadline_s (the cap every cell runs under; by default the swarm
                 file's), dir (where results go; by default campaigns/NAME in the working folder)
    [grid]       the seed's 2x2: {a single worker, a cohort of ``cohort``} x {scored_history,
                 single_draft_refinement}; top_k (attempts a scored history holds), policy (how the cohort
                 shares: team by default)
    [sweep]      best@n (independent) vs team@n for every n in ``n``; history (the workers' context)

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
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from swarmyard.config import GoalConfig, HistoryMode, PolicyKind, ProviderKind, SwarmConfig, parse_config
from swarmyard.errors import ConfigError

#: The placeholder a swarm file may hold for the trial's seed.
SEED = "${seed}"
#: A run id's length (``run_`` and 26 characters): the plane's socket is ``DIR/runs/RUN/plane.sock``.
_RUN_ID_CHARS = 30
_MAX_SOCKET_PATH = 107

PositiveInt = Annotated[int, Field(gt=0, strict=True)]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CampaignTable(_Frozen):
    """``[campaign]``: the swarm file, the seeds and the cap shared by every cell."""

    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
    swarm: Annotated[str, Field(min_length=1)]
    seeds: Annotated[tuple[Annotated[int, Field(ge=0, strict=True)], ...], Field(min_length=1)]
    budget_usd: str | int | None = None
    call_cap: PositiveInt | None = None
    deadline_s: Annotated[float, Field(gt=0)] | None = None
    dir: Annotated[str, Field(min_length=1)] | None = None

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if len(set(value)) != len(value):
            raise ValueError("each seed once (the same seed is the same trial)")
        return value

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

    cohort: Annotated[int, Field(ge=2, strict=True)] = 3
    top_k: PositiveInt = 3
    policy: PolicyKind = PolicyKind.TEAM


class SweepTable(_Frozen):
    """``[sweep]``: best@n (independent workers) vs team@n (one board) for every n listed."""

    n: Annotated[tuple[PositiveInt, ...], Field(min_length=1)]
    history: HistoryMode | None = None
    top_k: PositiveInt = 3

    @field_validator("n")
    @classmethod
    def _distinct(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if len(set(value)) != len(value):
            raise ValueError("each n once")
        return tuple(sorted(value))


class CampaignFile(_Frozen):
    """A whole campaign file."""

    campaign: CampaignTable
    grid: GridTable | None = None
    sweep: SweepTable | None = None

    @model_validator(mode="after")
    def _some_cells(self) -> Self:
        if self.grid is None and self.sweep is None:
            raise ValueError("campaign file: give a [grid] table, a [sweep] table, or both")
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


def cells_of(spec: CampaignFile, base: SwarmConfig) -> list[Cell]:
    """The cells the file asks for, grid first, then the sweep by n."""
    cells: list[Cell] = []
    if spec.grid is not None:
        g = spec.grid
        for history in (HistoryMode.SCORED_HISTORY, HistoryMode.SINGLE_DRAFT_REFINEMENT):
            cells.append(Cell(f"single/{history.value}", 1, PolicyKind.INDEPENDENT, history, g.top_k, "grid"))
            cells.append(Cell(f"cohort{g.cohort}/{history.value}", g.cohort, g.policy, history, g.top_k, "grid"))
    if spec.sweep is not None:
        s = spec.sweep
        history = s.history or base.workers.history
        for n in s.n:
            cells.append(Cell(f"best@{n}", n, PolicyKind.INDEPENDENT, history, s.top_k, "sweep"))
            cells.append(Cell(f"team@{n}", n, PolicyKind.TEAM, history, s.top_k, "sweep"))
    return cells


def _trial_data(raw: dict[str, Any], base: SwarmConfig, cell: Cell, table: CampaignTable,
                runs_dir: Path) -> dict[str, Any]:
    """The swarm file's tables with the cell and the campaign's cap written over them."""
    data = dict(raw)
    goal = dict(data.get("goal") or {})
    for key in ("budget_usd", "call_cap", "deadline_s"):
        value = getattr(table, key)
        if value is not None:
            goal[key] = value
    data["goal"] = goal
    lenses = [lens.model_dump(mode="json") for lens in base.tasks.lenses]
    if len(lenses) == 1 and cell.n > 1:
        # one problem: each of the n workers makes its own attempt at it
        lenses = [{**lenses[0], "title": f"{lenses[0]['title']} (attempt {i + 1} of {cell.n})"}
                  for i in range(cell.n)]
    data["tasks"] = {"lenses": lenses}
    data["policy"] = {**base.policy.model_dump(mode="json"), "kind": cell.policy.value}
    workers = dict(data.get("workers") or {})
    workers.update(count=cell.n, concurrency=min(cell.n, base.workers.concurrency), history=cell.history.value,
                   history_top_k=cell.top_k)
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


def _swarm_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"no such swarm file: {path}", field="campaign.swarm") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}", field="campaign.swarm") from None


def _parse_trial(text: str, seed: int, swarm_path: Path, overrides: Any = None) -> tuple[dict[str, Any], SwarmConfig]:
    try:
        raw = tomllib.loads(text.replace(SEED, str(seed)))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{swarm_path} is not valid TOML: {exc}", field="campaign.swarm") from None
    try:
        return raw, parse_config(raw if overrides is None else overrides(raw), base_dir=swarm_path.parent)
    except ConfigError as exc:
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


def load_campaign(path: Path, *, cwd: Path | None = None) -> Campaign:
    """Read a campaign file and build every trial's swarm config; ``ConfigError`` names the first bad field."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"no such campaign file: {path}", field="campaign file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}", field="campaign file") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}", field="campaign file") from None
    try:
        spec = CampaignFile.model_validate(data)
    except ValidationError as exc:
        raise _first_error(exc) from None
    table = spec.campaign
    swarm_path = Path(table.swarm)
    if not swarm_path.is_absolute():
        swarm_path = path.parent / swarm_path
    swarm_text = _swarm_text(swarm_path)
    _, base = _parse_trial(swarm_text, table.seeds[0], swarm_path)
    if not base.tasks.lenses:
        raise ConfigError("the swarm file must state its problem as [[tasks.lenses]] or from_family (every "
                          "cell gets the same tasks), not as a plan", field="campaign.swarm")
    where = Path(table.dir) if table.dir else Path("campaigns") / table.name
    if not where.is_absolute():
        where = (cwd or Path.cwd()) / where
    where = Path(os.path.abspath(where))
    runs_dir = where / "runs"
    socket = len(os.fsencode(runs_dir)) + 1 + _RUN_ID_CHARS + len("/plane.sock")
    if socket > _MAX_SOCKET_PATH:
        raise ConfigError(f"{where} is too deep: a trial's control-plane socket would be {socket} bytes long, "
                          f"at most {_MAX_SOCKET_PATH}; choose a shorter dir", field="campaign.dir")
    cells = cells_of(spec, base)
    trials: list[Trial] = []
    for cell in cells:
        for seed in table.seeds:
            def over(raw: dict[str, Any], cell: Cell = cell, seed: int = seed) -> dict[str, Any]:
                _, base_of_seed = _parse_trial(swarm_text, seed, swarm_path)
                return _trial_data(raw, base_of_seed, cell, table, runs_dir)
            _, config = _parse_trial(swarm_text, seed, swarm_path, over)
            trials.append(Trial(cell, seed, config))
    first = trials[0].config.goal
    digest = hashlib.sha256(text.encode() + b"\0" + swarm_text.encode()).hexdigest()
    return Campaign(table.name, where, table.seeds, tuple(cells), tuple(trials), digest,
                    first.budget_micro_usd, first.call_cap, first.deadline_s)
