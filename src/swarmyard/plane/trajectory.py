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
import hashlib
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from swarmyard.auth.tokens import REDACTED
from swarmyard.errors import InvalidInputError
from swarmyard.plane.step_text import MAX_TEXT_CHARS

if TYPE_CHECKING:
    from swarmyard.broker.calls import CallEnd
    from swarmyard.broker.chat import Message

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
        self._steps: dict[str, int] = {}  # worker -> the last step it reported (in this process)
        self._calls: dict[str, list[dict[str, Any]]] = {}  # worker -> its calls since its last step
        self._sent: dict[str, tuple[Message, ...]] = {}  # worker -> the messages of its last call
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

    def last_step(self, worker_id: str) -> int:
        """The last step ``worker_id`` reported to this process (0 before its first)."""
        with self._lock:
            return self._steps.get(worker_id, 0)

    def messages_path(self, worker_id: str) -> Path:
        """Where the messages ``worker_id`` sent to its model are kept: one line a call, in a folder of their own
        (readers of ``<folder>/*.jsonl`` see trajectories only)."""
        return self.folder / "messages" / f"{self._labels.get(worker_id, worker_id)}.jsonl"

    def model_call(self, call: CallEnd) -> None:
        """A model call the broker answered (a ``CallEnd`` watcher): its messages go to the worker's messages
        file, as what differs from its previous call (``same``: how many leading messages it repeats) with a
        SHA-256 of all of them; its model, tokens and cost wait for the worker's next step, which records them."""
        if not call.worker_id or not call.reservation_id:
            return  # refused before it was admitted: not a call the worker made
        full = [_message(m) for m in call.messages]
        # of the whole list as compact JSON with sorted keys: what a reader rebuilds from the file checks against it
        digest = hashlib.sha256(_line({"messages": full})[len('{"messages":'):-2]).hexdigest()
        with self._lock:
            before = self._sent.get(call.worker_id, ())
            same = 0
            for old, new in zip(before, call.messages, strict=False):
                if old != new:
                    break
                same += 1
            self._sent[call.worker_id] = call.messages
            path = self.messages_path(call.worker_id)
            kept = self._write(path, _line({"reservation_id": call.reservation_id, "sha256": digest, "same": same,
                                            "messages": full[same:]}), call.worker_id)
            self._calls.setdefault(call.worker_id, []).append({
                "reservation_id": call.reservation_id, "model": call.model,
                **({"response_model": call.response_model} if call.response_model else {}),
                "outcome": call.outcome, "cost_micro_usd": call.cost_micro_usd,
                "input_tokens": call.input_tokens, "output_tokens": call.output_tokens,
                **({"finish_reason": call.finish_reason} if call.finish_reason else {}),
                **({"error_code": call.error_code} if call.error_code else {}),
                "messages": {"file": f"messages/{path.name}", "sha256": digest, "count": len(full),
                             **({} if kept else {"kept": False})}})

    def path(self, worker_id: str) -> Path:
        """The trajectory file of ``worker_id``."""
        return self.folder / f"{self._labels.get(worker_id, worker_id)}.jsonl"

    def append(self, worker_id: str, record: StepRecord) -> bool:
        """Append one step; ``False`` (and nothing written but, once, a line saying so) when the file is full."""
        path = self.path(worker_id)
        with self._lock:
            # the model calls the broker answered this worker since its last step: what it sent, on which model,
            # at what cost (micro-USD, as the ledger settles it)
            calls = self._calls.pop(worker_id, [])
            ledger: dict[str, Any] = {}
            if calls:
                models = sorted({c["model"] for c in calls})
                ledger = {"calls": calls, "model": models[0] if len(models) == 1 else ",".join(models),
                          "cost_micro_usd": sum(c["cost_micro_usd"] for c in calls)}
            line = _line({"worker": worker_id, "received_ms": int(time.time() * 1000),
                          **record.model_dump(mode="json", exclude_none=True), **ledger})
            self._steps[worker_id] = max(self._steps.get(worker_id, 0), record.step)
            if record.cpu_ms is not None and record.max_rss_kb is not None:
                self._usage[worker_id] = {"cpu_ms": record.cpu_ms, "max_rss_kb": record.max_rss_kb,
                                          "step": record.step}
            return self._write(path, line, worker_id)

    def _write(self, path: Path, line: bytes, worker_id: str) -> bool:
        """Append ``line`` to ``path`` (under the lock); ``False`` once the file is full."""
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # the run's own, as its folder is
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


def _message(message: Message) -> dict[str, Any]:
    """A message as the trajectory keeps it (the conventions' role and parts shape)."""
    parts: list[dict[str, Any]] = []
    if message.content:
        if message.tool_call_id is not None:
            parts.append({"type": "tool_call_response", "id": message.tool_call_id, "response": message.content})
        else:
            parts.append({"type": "text", "content": message.content})
    parts += [{"type": "tool_call", "id": c.id, "name": c.name, "arguments": c.arguments}
              for c in message.tool_calls]
    return {"role": message.role.value, "parts": parts}


#: a capability token as swarmyard issues it (``sy1.<payload>.<mac>``, base64url): an agent holds its own and can
#: print it (a shell's ``env``) into what it reports or sends its model; no file of the run keeps one. Needed
#: beside the tools' own redaction (``TokenAuthority.redact``): what an agent sends its model comes through the
#: broker and its steps through their own route, and a token of another plane (or cut short of its MAC's end)
#: has this form too
TOKEN_FORM = re.compile(r"sy1\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{20,}")
TOKEN_FORM_BYTES = re.compile(TOKEN_FORM.pattern.encode())
#: what stands in a token's place (the same marker the plane puts in what a worker submits)
TOKEN_REDACTED = REDACTED


def without_tokens(text: str) -> str:
    """``text`` with every capability token replaced by ``TOKEN_REDACTED``."""
    return TOKEN_FORM.sub(TOKEN_REDACTED, text) if "sy1." in text else text


def _line(value: dict[str, Any]) -> bytes:
    # sorted keys, no spaces; a model's arguments may hold floats (canonical JSON, the audit's, has none). A
    # token's characters need no JSON escape, so one written out whole is found in the line as it is
    line = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
    return TOKEN_FORM_BYTES.sub(TOKEN_REDACTED.encode(), line) if b"sy1." in line else line


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
        except (ValueError, RecursionError):  # nested past the parser: a line no agent wrote
            continue
        if isinstance(value, dict):
            steps.append(value)
    return steps
