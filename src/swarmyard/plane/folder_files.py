"""Reading a run folder's files for its dashboard: the folder's own regular files only, and a bounded part of each.

A run folder may be another user's, or made by hand, and ``swarmyard ui`` opens it as whoever runs it: a file
there that is a symbolic link (to another user's trajectory, to ``/dev/zero``), a named pipe (whose open or read
waits for a writer that never comes) or a device is read as if it were absent, and no file is read past
``max_bytes``. The file is opened without following a link and without blocking, and checked on its descriptor.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def read_regular(path: Path, max_bytes: int) -> bytes | None:
    """At most ``max_bytes`` of ``path`` when it is a regular file (not a link, pipe or device), else ``None``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks: list[bytes] = []
        left = max_bytes
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)
