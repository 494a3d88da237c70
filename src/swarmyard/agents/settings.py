"""The built-in agent's settings and their ``SWARMYARD_*`` variables, both ways.

The launcher that starts an agent builds an :class:`AgentSettings` and hands its machine ``to_env()``; the agent
in the machine reads them back with ``from_env``. This module is imported in every machine: it imports only the
agent's own light modules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from swarmyard.agents import governed, history
from swarmyard.agents.model import OutputMode
from swarmyard.errors import ConfigError

#: The ``max_tokens`` of the built-in agent's model calls unless ``SWARMYARD_MAX_TOKENS`` says otherwise.
DEFAULT_MAX_TOKENS = 512
#: The model asked when ``SWARMYARD_MODEL`` is not set.
DEFAULT_MODEL = "qwen2.5-coder-0.5b-instruct"
#: The lead's ways to its synthesis (``AgentSettings.synthesis``), and a worker's to its finding (``free`` or
#: ``quoted``: ``AgentSettings.finding``).
FREE, DIGEST, QUOTED = "free", "digest", "quoted"

PLANE_URL = "SWARMYARD_PLANE_URL"
TOKEN = "SWARMYARD_TOKEN"
MODEL = "SWARMYARD_MODEL"
ROLE = "SWARMYARD_ROLE"
OUTPUT_MODE = "SWARMYARD_OUTPUT_MODE"
MAX_STEPS = "SWARMYARD_MAX_STEPS"
EXEC_TIMEOUT_S = "SWARMYARD_EXEC_TIMEOUT_S"
WORKDIR = "SWARMYARD_WORKDIR"
TASK_ID = "SWARMYARD_TASK_ID"
MAX_TOKENS = "SWARMYARD_MAX_TOKENS"
PLAN_COUNT = "SWARMYARD_PLAN_COUNT"
POLICY = "SWARMYARD_POLICY"
HEARTBEAT_S = "SWARMYARD_HEARTBEAT_S"
PROFILE = "SWARMYARD_PROFILE"
WASI_TOOLS = "SWARMYARD_WASI_TOOLS"
HISTORY = "SWARMYARD_HISTORY"
HISTORY_TOP_K = "SWARMYARD_HISTORY_TOP_K"
SYNTHESIS = "SWARMYARD_SYNTHESIS"
FINDING = "SWARMYARD_FINDING"
FLOW = "SWARMYARD_FLOW"
ATTACH_RESULT = "SWARMYARD_ATTACH_RESULT"
SYNTHESIS_ARTIFACT = "SWARMYARD_SYNTHESIS_ARTIFACT"


class Role(StrEnum):
    """What the agent is for."""

    WORKER = "worker"
    LEAD = "lead"
    PLANNER = "planner"  # one call that splits the objective into lenses (``swarmyard.agents.planner``)


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """Everything the agent reads from its environment (and the few knobs it does not: ``max_reasks``,
    ``max_retries`` and ``retry_backoff_s`` have no variable, so ``from_env`` gives their defaults)."""

    plane_url: str
    token: str
    model: str
    role: Role = Role.WORKER
    max_steps: int = 8
    max_reasks: int = 2
    #: re-asks of a model call that failed in passing (a 5xx, a dropped broker connection), and the first wait
    max_retries: int = 2
    retry_backoff_s: float = 2.0
    exec_timeout_s: float = 60.0
    workdir: Path = Path(".")
    mode: OutputMode = OutputMode.TOOLS
    task_id: str | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    #: planner: how many lenses to ask for
    plan_count: int = 3
    #: the run's policy; under ``explore`` the directions and their settings come from the store, through the tools
    policy: str = ""
    #: seconds between lease renewals while a model call is in flight (well inside the plane's lease)
    heartbeat_s: float = 20.0
    #: ``full`` (shell and files in its machine) or ``governed`` (only the governed tools and its WASI tools)
    profile: str = "full"
    #: the WASI tools it may run, as ``swarmyard.agents.governed.wasi_tools`` reads them (a JSON list of specs;
    #: "" for none), parsed where the agent starts
    wasi_tools: str = ""
    #: how a worker's context is built from its group's prior scored attempts (``swarmyard.agents.history``):
    #: "" (as the conversation went), ``scored_history`` or ``single_draft_refinement``; and the top K kept
    history: str = ""
    history_top_k: int = 3
    #: a lead's way to the synthesis: ``free`` (one drafted submission), ``digest`` (a point per finding, then
    #: the answer, composed: what a small model can write without copying what it read) or ``quoted`` (composed
    #: from the findings' verdicts and cited lines, with no model call)
    synthesis: str = FREE
    #: the tool each step offers, in order (constrained decoding: the model can only fill its arguments); past
    #: the list, every tool
    flow: tuple[str, ...] = ()
    #: the finding's body is the last tool call's result as the tool gave it (the model writes the title)
    attach_result: bool = False
    #: a worker's finding: ``free`` (the model writes it) or ``quoted`` (the model chooses the lines its question
    #: rests on, and the finding is written from them: ``swarmyard.agents.quoted``)
    finding: str = FREE
    #: a lead's synthesis is also submitted as an artifact (scored where the run has an evaluator), and cited
    synthesis_artifact: bool = False

    def to_env(self) -> dict[str, str]:
        """The ``SWARMYARD_*`` variables ``from_env`` reads back as these settings (optional ones only when set)."""
        env = {
            PLANE_URL: self.plane_url,
            TOKEN: self.token,
            MODEL: self.model,
            ROLE: self.role.value,
            OUTPUT_MODE: self.mode.value,
            MAX_STEPS: str(self.max_steps),
            EXEC_TIMEOUT_S: str(self.exec_timeout_s),
            WORKDIR: str(self.workdir),
            MAX_TOKENS: str(self.max_tokens),
            PLAN_COUNT: str(self.plan_count),
            POLICY: self.policy,
            HEARTBEAT_S: str(self.heartbeat_s),
            PROFILE: self.profile,
            HISTORY: self.history,
            HISTORY_TOP_K: str(self.history_top_k),
            SYNTHESIS: self.synthesis,
        }
        if self.task_id:
            env[TASK_ID] = self.task_id
        if self.wasi_tools:
            env[WASI_TOOLS] = self.wasi_tools
        if self.flow:
            env[FLOW] = ",".join(self.flow)
        if self.attach_result:
            env[ATTACH_RESULT] = "1"
        if self.synthesis_artifact:
            env[SYNTHESIS_ARTIFACT] = "1"
        if self.finding != FREE:
            env[FINDING] = self.finding
        return env

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AgentSettings:
        """Read ``SWARMYARD_*`` variables; ``ConfigError`` names a missing or bad one."""

        def need(name: str) -> str:
            value = env.get(name)
            if not value:
                raise ConfigError("is not set", field=name)
            return value

        def number(name: str, default: float) -> float:
            try:
                return float(env.get(name, default))
            except ValueError:
                raise ConfigError("is not a number", field=name) from None

        try:
            role = Role(env.get(ROLE, "worker"))
            mode = OutputMode(env.get(OUTPUT_MODE, "tools"))
        except ValueError as exc:
            raise ConfigError(str(exc), field=f"{ROLE}/{OUTPUT_MODE}") from exc
        return cls(
            plane_url=need(PLANE_URL),
            token=need(TOKEN),
            model=env.get(MODEL, DEFAULT_MODEL),
            role=role,
            max_steps=int(number(MAX_STEPS, 8)),
            exec_timeout_s=number(EXEC_TIMEOUT_S, 60),
            workdir=Path(env.get(WORKDIR, ".")),
            mode=mode,
            task_id=env.get(TASK_ID) or None,
            max_tokens=int(number(MAX_TOKENS, DEFAULT_MAX_TOKENS)),
            plan_count=max(1, int(number(PLAN_COUNT, 3))),
            policy=env.get(POLICY, ""),
            heartbeat_s=max(1.0, number(HEARTBEAT_S, 20)),
            profile=_profile(env.get(PROFILE, governed.FULL)),
            wasi_tools=env.get(WASI_TOOLS, ""),
            history=_history(env.get(HISTORY, "")),
            history_top_k=max(1, int(number(HISTORY_TOP_K, 3))),
            synthesis=_synthesis(env.get(SYNTHESIS, FREE)),
            flow=tuple(name.strip() for name in env.get(FLOW, "").split(",") if name.strip()),
            attach_result=env.get(ATTACH_RESULT, "") == "1",
            synthesis_artifact=env.get(SYNTHESIS_ARTIFACT, "") == "1",
            finding=_finding(env.get(FINDING, FREE)),
        )


def _history(value: str) -> str:
    if value in ("", "none"):
        return ""
    if value not in history.MODES:
        raise ConfigError(f"is not one of none, {', '.join(sorted(history.MODES))}", field=HISTORY)
    return value


def _synthesis(value: str) -> str:
    if value not in (FREE, DIGEST, QUOTED):
        raise ConfigError(f"is not {FREE}, {DIGEST} or {QUOTED}", field=SYNTHESIS)
    return value


def _finding(value: str) -> str:
    if value not in (FREE, QUOTED):
        raise ConfigError(f"is not {FREE} or {QUOTED}", field=FINDING)
    return value


def _profile(value: str) -> str:
    if value not in (governed.FULL, governed.GOVERNED):
        raise ConfigError(f"is not {governed.FULL} or {governed.GOVERNED}", field=PROFILE)
    return value
