"""Agent trajectories: every step an agent reports is appended, as one JSON line, to its worker's file.

An agent runs in a machine that cannot write to the run folder, so it reports each step to the control plane
(``POST /v1/trajectory/steps`` with its worker token) and the plane keeps it: ``<folder>/<label>.jsonl``, one
line a step (the model's replies, the action parsed, the tool's result cut to a bound, tokens and time), the
plane adding the worker id and when it arrived. Every field is bounded by the request model, and a file stops
growing at ``max_file_bytes`` (a last line says it was cut): an agent that floods its trajectory costs the
host at most that much disk.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from swarmyard.errors import InvalidInputError
from swarmyard.plane.step_text import MAX_TEXT_CHARS

#: Bytes of one request to the trajectory endpoint.
MAX_STEP_BYTES = 256 * 1024
#: Bytes of one worker's trajectory file.
MAX_FILE_BYTES = 8 * 1024 * 1024

_Text = Annotated[StrictStr, Field(max_length=MAX_TEXT_CHARS)]
_Name = Annotated[StrictStr, Field(min_length=1, max_length=200)]
_Count = Annotated[StrictInt, Field(ge=0, le=2**31)]
#: milliseconds since the epoch (canonical JSON holds no floats)
_Millis = Annotated[StrictInt, Field(ge=0, le=2**45)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ToolCallRecord(_Strict):
    """A native tool call as the model wrote it."""

    name: _Name
    arguments: _Text = ""


class ReplyRecord(_Strict):
    """One model reply of a step (a step holds more than one when a malformed reply was asked again)."""

    text: _Text = ""
    tool_calls: Annotated[list[ToolCallRecord], Field(max_length=8)] = []
    input_tokens: _Count = 0
    output_tokens: _Count = 0
    duration_ms: Annotated[StrictInt, Field(ge=0, le=10**9)] = 0
    malformed: Annotated[StrictStr, Field(max_length=1000)] | None = None


class ActionRecord(_Strict):
    """The action the agent parsed from the replies."""

    tool: _Name
    args: dict[str, Any] = {}


class StepRecord(_Strict):
    """One agent step, as the agent reports it."""

    step: Annotated[StrictInt, Field(ge=0, le=100_000)]
    role: Annotated[StrictStr, Field(max_length=40)] = "worker"
    task_id: Annotated[StrictStr, Field(max_length=64, pattern=r"^[a-z]{2,8}_[0-9a-z]{1,40}$")] | None = None
    #: the claim the step worked under
    fencing_token: Annotated[StrictInt, Field(ge=0, le=2**62)] | None = None
    started_ms: _Millis
    ended_ms: _Millis
    replies: Annotated[list[ReplyRecord], Field(max_length=16)] = []
    action: ActionRecord | None = None
    result: _Text | None = None
    note: Annotated[StrictStr, Field(max_length=1000)] | None = None
    #: the agent process's CPU time so far and its peak resident memory (its own and its commands')
    cpu_ms: _Count | None = None
    max_rss_kb: _Count | None = None


class StepAccepted(_Strict):
    """The plane's answer: whether the step was kept (``false`` once the file is full)."""

    kept: bool


class TrajectoryFiles:
    """The folder of one run's trajectories: one JSONL file per worker, bounded."""

    def __init__(self, folder: Path, *, max_file_bytes: int = MAX_FILE_BYTES) -> None:
        self.folder = folder
        self.max_file_bytes = max_file_bytes
        self._labels: dict[str, str] = {}
        self._usage: dict[str, dict[str, int]] = {}
        self._lock = threading.Lock()

    def label(self, worker_id: str, label: str) -> None:
        """Name ``worker_id``'s file ``<label>.jsonl`` (the runner names it after the worker's slot)."""
        if not label or "/" in label or label.startswith("."):
            raise InvalidInputError(f"bad trajectory label {label!r}", field="label")
        with self._lock:
            self._labels[worker_id] = label

    def usage(self) -> dict[str, dict[str, int]]:
        """Each worker's CPU time, peak memory and step, as of its latest step (in this process)."""
        with self._lock:
            return dict(self._usage)

    def path(self, worker_id: str) -> Path:
        """The trajectory file of ``worker_id``."""
        return self.folder / f"{self._labels.get(worker_id, worker_id)}.jsonl"

    def append(self, worker_id: str, record: StepRecord) -> bool:
        """Append one step; ``False`` (and nothing written but, once, a line saying so) when the file is full."""
        line = _line({"worker": worker_id, "received_ms": int(time.time() * 1000),
                      **record.model_dump(mode="json", exclude_none=True)})
        path = self.path(worker_id)
        with self._lock:
            if record.cpu_ms is not None and record.max_rss_kb is not None:
                self._usage[worker_id] = {"cpu_ms": record.cpu_ms, "max_rss_kb": record.max_rss_kb,
                                          "step": record.step}
            self.folder.mkdir(parents=True, exist_ok=True)
            # O_APPEND: several serving processes may append to one worker's file; each line is one write
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                size = os.fstat(fd).st_size
                if size + len(line) > self.max_file_bytes:
                    marker = _line({"worker": worker_id, "cut": True,
                                    "note": "trajectory file full; later steps dropped"})
                    if size and not _ends_with_line(path, size, marker):
                        os.write(fd, marker)
                    return False
                os.write(fd, line)
                return True
            finally:
                os.close(fd)


def _line(value: dict[str, Any]) -> bytes:
    # sorted keys, no spaces; a model's arguments may hold floats (canonical JSON, the audit's, has none)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def _ends_with_line(path: Path, size: int, line: bytes) -> bool:
    """Whether the file's last line is exactly ``line``: a worker's own step may hold ``"cut":true`` in its
    arguments, but never is the marker line (a step has its step number and times). On disk, not in memory:
    several serving processes append to one file."""
    with contextlib.suppress(OSError), path.open("rb") as f:
        f.seek(max(0, size - len(line) - 1))
        tail = f.read(len(line) + 1)
        return tail == line or tail == b"\n" + line
    return False


def read_trajectory(path: Path, *, max_bytes: int = MAX_FILE_BYTES + 4096) -> list[dict[str, Any]]:
    """The steps of a trajectory file (lines that do not parse are skipped; at most ``max_bytes`` read; a link,
    pipe or device in its place reads as no steps: ``folder_files.read_regular``)."""
    from swarmyard.plane.folder_files import read_regular

    data = read_regular(path, max_bytes)
    if data is None:
        return []
    steps = []
    for raw in data.splitlines():
        try:
            value = json.loads(raw)
        except ValueError:
            continue
        if isinstance(value, dict):
            steps.append(value)
    return steps
