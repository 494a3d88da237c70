"""The campaign's durable record: one JSON line per finished trial, appended and fsynced before the next starts.

``DIR/campaign.json`` names the campaign (its file's digest) so that ``--resume`` continues the same one;
``DIR/trials.jsonl`` holds the finished trials. A process killed mid-write leaves at most a torn last line,
which is ignored: that trial is run again. Any other line must be a whole record, of a trial not recorded before
(a record with ``"score": "abc"``, or a second one for a finished trial, is refused by its line number rather than
read or let replace the first). ``DIR/.lock`` is held (``flock``) by the one process running the campaign.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from swarmyard.errors import CampaignBusyError, CampaignRecordError, ConfigError, UserError

STATE_FILE = "campaign.json"
TRIALS_FILE = "trials.jsonl"


@dataclass(frozen=True, slots=True)
class TrialRecord:
    """What one finished trial measured."""

    key: str
    cell: str
    seed: int
    run_id: str
    #: the run's score (its holdout when the run has one, else its best search score, else 0 where the run has
    #: an evaluator); ``None``: a run without an evaluator, or one that failed
    score: int | None
    spend_micro_usd: int
    calls: int
    tokens_in: int
    tokens_out: int
    wall_s: float
    #: mean pairwise similarity of the trial's submissions (``None`` with fewer than two)
    similarity: float | None
    submissions: int
    synthesis: bool
    #: why the run failed, when it did (it counts as finished, unscored)
    error: str = ""
    #: the workers' own model calls and tokens (the lead's and planner's left out: what a token or call match
    #: gives the same of); ``None`` in a record written before they were kept
    worker_calls: int | None = None
    worker_tokens: int | None = None

    def to_json(self) -> str:
        """One line of the record."""
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrialRecord:
        """Read a line back (unknown keys are ignored, so an older record still reads)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


class _Line(BaseModel):
    """A record line as it must be: every field of its type (strict: no "1" for 1), counts not negative."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    key: str = Field(min_length=1)
    cell: str = Field(min_length=1)
    seed: int
    run_id: str
    score: int | None
    spend_micro_usd: int = Field(ge=0)
    calls: int = Field(ge=0)
    tokens_in: int = Field(ge=0)
    tokens_out: int = Field(ge=0)
    wall_s: float = Field(ge=0)
    similarity: float | None = Field(ge=0, le=1)
    submissions: int = Field(ge=0)
    synthesis: bool
    error: str = ""
    worker_calls: int | None = Field(default=None, ge=0)
    worker_tokens: int | None = Field(default=None, ge=0)


#: Lock files held by this process, by folder, with how many holders (a CLI and the runner it calls both hold).
_HELD: dict[Path, tuple[int, int]] = {}


@contextmanager
def hold(folder: Path) -> Iterator[None]:
    """Hold ``folder``'s campaign lock (made with the folder where missing), or raise ``CampaignBusyError``."""
    key = folder.resolve()
    if key in _HELD:
        fd, count = _HELD[key]
        _HELD[key] = (fd, count + 1)
    else:
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:  # a dir no folder can be made in (/proc/x), or not ours to write
            raise ConfigError(f"cannot make the campaign's folder {folder}: {exc.strerror or exc}",
                              field="campaign.dir") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise CampaignBusyError(str(folder)) from None
        _HELD[key] = (fd, 1)
    try:
        yield
    finally:
        fd, count = _HELD.pop(key)
        if count > 1:
            _HELD[key] = (fd, count - 1)
        else:
            os.close(fd)  # the lock goes with the descriptor


class TrialLog:
    """The record of one campaign folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / TRIALS_FILE

    def begin(self, name: str, digest: str, *, resume: bool) -> dict[str, TrialRecord]:
        """Start a new record (refused where one exists), or, with ``resume``, read the finished trials of the
        same campaign (refused for another campaign's folder or one with nothing to resume)."""
        state = self.folder / STATE_FILE
        if resume:
            try:
                saved = json.loads(state.read_text())
            except (FileNotFoundError, json.JSONDecodeError):
                raise UserError(f"no campaign to resume in {self.folder}") from None
            if saved.get("digest") != digest:
                raise UserError(f"{self.folder} holds another campaign ({saved.get('name')!r}, or this one's file "
                                "or its swarm file changed since): run it in another dir") from None
            self._drop_torn_tail()
            return self.read()
        if state.exists() or self.path.exists():
            raise UserError(f"{self.folder} already holds a campaign: --resume to continue it, or remove the folder")
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = state.with_suffix(".tmp")
        tmp.write_text(json.dumps({"name": name, "digest": digest}))
        tmp.replace(state)
        return {}

    def read(self) -> dict[str, TrialRecord]:
        """The finished trials by key (a torn last line is not one)."""
        out: dict[str, TrialRecord] = {}
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return out
        where: dict[str, int] = {}
        for number, line in enumerate(text.splitlines(keepends=True), start=1):
            if not line.endswith("\n"):
                break  # the write of this trial was cut off: it runs again
            try:
                record = TrialRecord(**_Line.model_validate_json(line).model_dump())
            except ValidationError as exc:
                first = exc.errors()[0]
                at = ".".join(str(part) for part in first["loc"]) or "the line"
                raise CampaignRecordError(str(self.path), number, f"{at}: {first['msg']}") from None
            if record.key in where:
                raise CampaignRecordError(str(self.path), number,
                                          f"trial {record.key} was recorded already on line {where[record.key]}")
            where[record.key] = number
            out[record.key] = record
        return out

    def _drop_torn_tail(self) -> None:
        """Cut a last line whose write was killed, so the next trial's line starts on a line of its own."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        if data and not data.endswith(b"\n"):
            with self.path.open("r+b") as handle:
                handle.truncate(data.rfind(b"\n") + 1)

    def append(self, record: TrialRecord) -> None:
        """Add one finished trial, durably (flushed and fsynced) before returning."""
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(record.to_json() + "\n")
            handle.flush()
            os.fsync(handle.fileno())
