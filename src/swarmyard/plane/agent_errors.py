"""Why an agent run ended badly, read back from the log the runner keeps of it (``agents/<slot>-<worker>.log``).

The runner writes that log when the agent's process ends: a header line (``# SLOT (ROLE, AGENT) worker ID: exit N
after S s`` or ``timed out``), then the process's stderr and stdout. The built-in agent's last word on a failure
is ``agent error (CODE): MESSAGE`` on stderr; an agent CLI's is whatever it printed last. The dashboard shows
that as the worker's last error: its code and its message as text (never bytes), cut at a word.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from pathlib import Path

from swarmyard.plane.folder_files import read_regular
from swarmyard.plane.trajectory import without_tokens

#: Characters of an error's message the dashboard shows.
MESSAGE_CHARS = 300
#: Bytes of a log read: the runner keeps the head and tail of each stream, so a log is bounded, and so is this.
_MAX_LOG_BYTES = 4 * 1024 * 1024
_HEADER = re.compile(r"# (?P<slot>\S+) \((?P<role>[^,]+), (?P<agent>[^)]+)\) worker (?P<worker>\S+): "
                     r"(?P<ending>exit -?\d+|timed out) after (?P<took>[\d.]+) s")
_AGENT_ERROR = re.compile(r"agent error \((?P<code>[a-z0-9_]{1,64})\): (?P<message>.*)")
#: the most specific code inside a message, as the agent words it: "... before any work (upstream_lost): ..."
_INNER_CODE = re.compile(r"\(([a-z0-9]+(?:_[a-z0-9]+)+)\): ")


@dataclass(frozen=True, slots=True)
class AgentError:
    """An agent run's failure: a code (``upstream_lost``, ``timeout``, ``exit_2``) and a line of text."""

    worker: str
    slot: str
    code: str
    message: str
    at: float

    def to_dict(self) -> dict[str, object]:
        """As JSON values."""
        return {"code": self.code, "message": self.message, "at": self.at, "slot": self.slot}


def cut_text(text: str, limit: int = MESSAGE_CHARS) -> str:
    """``text`` on one line, at most ``limit`` characters, cut at a word boundary with an ellipsis."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    head = flat[: limit - 1]
    space = head.rfind(" ")
    if space >= limit // 2:
        head = head[:space]
    return head.rstrip(" ,;:") + "…"


def slot_and_worker(name: str) -> tuple[str, str] | None:
    """``worker-0-wrk_01h...`` (a log's or trajectory's stem) as (slot, worker id); None for another name."""
    slot, sep, worker = name.rpartition("-")
    if not sep or not slot or not worker.startswith("wrk_"):
        return None
    return slot, worker


def parse_log(text: str, at: float) -> AgentError | None:
    """The failure a runner's agent log records, or None when the run ended well (exit 0, no agent error).

    The log is the agent's own output, which never went through the plane's routes: a capability token the agent
    printed there is taken out here, before the dashboard shows a line of it."""
    text = without_tokens(text)
    first, _, rest = text.partition("\n")
    header = _HEADER.fullmatch(first.strip())
    if header is None:
        return None
    stderr = rest.split("\n## stderr\n", 1)[-1].split("\n\n## stdout\n", 1)[0]
    lines = [line.strip() for line in stderr.splitlines() if line.strip() and "HTTP Request:" not in line]
    slot, worker, ending = header["slot"], header["worker"], header["ending"]
    for line in reversed(lines):
        found = _AGENT_ERROR.search(line)
        if found is not None:
            message = found["message"]
            inner = _INNER_CODE.search(message)
            # the agent wraps the model's error in its own ("stopped on a model error ... (upstream_lost): ...")
            code = inner.group(1) if inner is not None and found["code"] == "provider_error" else found["code"]
            return AgentError(worker, slot, code, cut_text(message), at)
    if ending == "timed out":
        return AgentError(worker, slot, "timeout", f"timed out after {float(header['took']):.0f} s", at)
    if ending == "exit 0":
        return None
    last = lines[-1] if lines else "(it wrote nothing on stderr)"
    return AgentError(worker, slot, "exit_" + ending.removeprefix("exit ").replace("-", "minus_"),
                      cut_text(last), at)


class AgentLogs:
    """The agent logs of one run folder's ``agents/``, each parsed once per change (size and mtime)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._seen: dict[str, tuple[tuple[int, int], AgentError | None]] = {}
        self._lock = threading.Lock()

    def errors(self) -> dict[str, AgentError]:
        """Each worker's failure, by worker id (workers whose run ended well, or is still going, are absent)."""
        out: dict[str, AgentError] = {}
        try:
            paths = [p for p in self.folder.glob("*.log") if slot_and_worker(p.stem) is not None]
        except OSError:
            return out
        for path in paths:
            error = self._parsed(path)
            if error is not None:
                out[error.worker] = error
        return out

    def _parsed(self, path: Path) -> AgentError | None:
        try:
            info = path.stat()
        except OSError:
            return None
        key = (info.st_size, info.st_mtime_ns)
        with self._lock:
            cached = self._seen.get(path.name)
        if cached is not None and cached[0] == key:
            return cached[1]
        data = read_regular(path, _MAX_LOG_BYTES)  # a link, pipe or device in its place is no log
        if data is None:
            return None
        text = data.decode("utf-8", "replace")
        error = parse_log(text, info.st_mtime)
        with self._lock:
            self._seen[path.name] = (key, error)
        return error
