"""Progress of long byte work on stderr (the local model's assembly): a rich bar on a terminal, plain lines at
each quarter off one, nothing when quiet (``SWARMYARD_QUIET=1``, which ``--quiet`` commands set)."""

from __future__ import annotations

import os
import sys
from typing import IO, Any

QUIET_ENV = "SWARMYARD_QUIET"


class ByteProgress:
    """``label`` going from 0 to ``total`` bytes: ``advance(n)`` as they are done, ``note(text)`` for a step
    after them (a hash check), ``close()`` at the end. ``stream`` (default stderr) and ``live`` (default: whether
    it is a terminal) say where and how."""

    def __init__(self, label: str, total: int, *, stream: IO[str] | None = None, live: bool | None = None,
                 quiet: bool | None = None) -> None:
        self.label = label
        self.total = max(1, total)
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = os.environ.get(QUIET_ENV, "") not in ("", "0") if quiet is None else quiet
        self._quarter = 0
        self._bar: Any = None
        self._task: Any = None
        if self.quiet:
            return
        if self.stream.isatty() if live is None else live:
            from rich.console import Console
            from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

            console = Console(file=self.stream, force_terminal=True)
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                 TimeElapsedColumn(), console=console, transient=False)
            self._task = self._bar.add_task(label, total=self.total)
            self._bar.start()
        else:
            self._line(f"{label}: 0 of {self._mb(self.total)}")

    @staticmethod
    def _mb(n: int) -> str:
        return f"{n / 1e6:,.0f} MB"

    def _line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def advance(self, n: int) -> None:
        """``n`` more bytes are done."""
        self.done += n
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=min(self.done, self.total))
            return
        quarter = min(4, self.done * 4 // self.total)
        if quarter > self._quarter:
            self._quarter = quarter
            self._line(f"{self.label}: {self._mb(self.done)} of {self._mb(self.total)} ({quarter * 25}%)")

    def note(self, text: str) -> None:
        """A step after the bytes, said as a line (above the bar on a terminal)."""
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.console.print(text, highlight=False, markup=False)
        else:
            self._line(text)

    def close(self) -> None:
        """The work has ended (the bar stays on the terminal, full or where it stopped)."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
