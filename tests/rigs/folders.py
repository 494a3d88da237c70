"""Short temporary folders."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def short_folder(prefix: str = "sy-") -> Iterator[Path]:
    """A fresh folder directly under the system's temporary folder, removed with all it holds when the block ends.

    Short because a run keeps its plane's Unix socket in the run folder, and such a path holds at most 107 bytes
    (pytest's ``tmp_path`` is often longer than that once a run's own folders are added).
    """
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
