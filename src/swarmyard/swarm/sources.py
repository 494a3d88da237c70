"""The run's sources as the plane checks citations against them: each task's lens files (``[tasks] cite_files``)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from swarmyard.config import Lens
from swarmyard.domain import Task
from swarmyard.errors import ConfigError
from swarmyard.plane.sources import SourceFiles

if TYPE_CHECKING:
    from swarmyard.families.tasks import TaskFile


def lens_files(lens: Lens) -> list[TaskFile]:
    """The files of ``lens`` as they are now: checked when the swarm file was parsed, but a folder can change
    while the run goes (a socket or a ``.env`` put in it), and that is the user's configuration, not an internal
    error: a ``ConfigError`` naming the lens."""
    from swarmyard.families.tasks import task_files

    try:
        return task_files(lens.files)
    except ValueError as exc:
        raise ConfigError(f"lens {lens.title!r} changed since the run started: {exc}", field="tasks.lenses") from None


def lens_of(lenses: Sequence[Lens], title: str) -> Lens | None:
    """The lens whose files a task of this title gets (a ``groups`` round's task keeps its lens's title first)."""
    return next((lens for lens in lenses
                 if lens.files and (title == lens.title or title.startswith(f"{lens.title} (round "))), None)


def lens_of_task(lenses: Sequence[Lens], task: Task, get_task: Callable[[str], Task]) -> Lens | None:
    """The lens whose files ``task`` gets: its title's, else (a task delegated from another) its nearest
    ancestor's. A subtask works on its parent's sources, and its findings must cite them like its parent's."""
    while (lens := lens_of(lenses, task.title)) is None and task.parent_id is not None:
        task = get_task(task.parent_id)
    return lens


class LensSources:
    """A task's sources are its lens's files (``lens_of_task``), read once (as the launcher copies them into its
    machine's ``task/``); a task of no lens with files (the lead's) has none, and its findings cite findings
    instead."""

    def __init__(self, lenses: Sequence[Lens], get_task: Callable[[str], Task]) -> None:
        self._lenses = tuple(lenses)
        self._get_task = get_task
        self._read: dict[str, SourceFiles] = {}
        self._lock = threading.Lock()  # the plane's store threads check findings side by side

    def of(self, task: Task) -> SourceFiles | None:
        """The lines of every file of the task's lens, by its path under ``task/``."""
        lens = lens_of_task(self._lenses, task, self._get_task)
        if lens is None:
            return None
        with self._lock:
            if lens.title not in self._read:
                texts = {item.inside: item.source.read_bytes().decode("utf-8", "replace")
                         for item in lens_files(lens)}
                self._read[lens.title] = SourceFiles.from_texts(texts)
            return self._read[lens.title]
