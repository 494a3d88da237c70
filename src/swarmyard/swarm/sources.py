"""The run's sources as the plane checks citations against them: each task's lens files (``[tasks] cite_files``)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from swarmyard.config import Lens
from swarmyard.domain import Task
from swarmyard.plane.sources import SourceFiles


def lens_of(lenses: Sequence[Lens], title: str) -> Lens | None:
    """The lens whose files a task of this title gets (a ``groups`` round's task keeps its lens's title first)."""
    return next((lens for lens in lenses
                 if lens.files and (title == lens.title or title.startswith(f"{lens.title} (round "))), None)


class LensSources:
    """A task's sources are its lens's files, read once (as the launcher copies them into its machine's
    ``task/``); a task of no lens with files (the lead's) has none, and its findings cite findings instead."""

    def __init__(self, lenses: Sequence[Lens]) -> None:
        self._lenses = tuple(lenses)
        self._read: dict[str, SourceFiles] = {}
        self._lock = threading.Lock()  # the plane's store threads check findings side by side

    def of(self, task: Task) -> SourceFiles | None:
        """The lines of every file of the task's lens, by its path under ``task/``."""
        from swarmyard.families.tasks import task_files

        lens = lens_of(self._lenses, task.title)
        if lens is None:
            return None
        with self._lock:
            if lens.title not in self._read:
                texts = {item.inside: item.source.read_bytes().decode("utf-8", "replace")
                         for item in task_files(lens.files)}
                self._read[lens.title] = SourceFiles.from_texts(texts)
            return self._read[lens.title]
