"""Task input files: the files a task's worker finds in its machine, and an instance's ``tasks.toml``.

A lens's ``files`` are files or folders on the host; when a worker is given the task, its machine's ``task/``
folder is emptied and filled with them (a folder's contents, a file by its name), so the worker's tools find
the same paths whatever task it held before.
"""

from __future__ import annotations

import os
import stat
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from swarmyard.families.instance import TASKS_FILE

#: the folder under a machine's home that holds the current task's files
TASK_FOLDER = "task"
#: what one task's files may hold in all: they are copied into every machine that takes the task
MAX_TASK_FILES_BYTES = 16 << 20
MAX_TASK_FILES = 1000


@dataclass(frozen=True, slots=True)
class TaskFile:
    """One file to put in a machine: its path under ``task/`` and where it is on the host."""

    inside: str
    source: Path


def resolve(value: str, base: Path) -> Path:
    """``value`` as an absolute path, relative ones taken from ``base``: its folders resolved, but its last part
    kept as written (``.`` and ``..`` taken as written, not through a link), so that a symbolic link named in a
    lens's ``files`` is seen as one by ``task_files`` and refused, not followed to wherever it points.

    A link among the folders above it (``/home/u`` a link to ``/data/u``, as hosts often have) is followed: a
    path may be absolute anyway, so such a link reaches nothing an absolute path could not, and refusing it
    would refuse ordinary hosts."""
    path = Path(value)
    path = Path(os.path.normpath(path if path.is_absolute() else base.resolve() / path))
    return path.parent.resolve() / path.name if path.name else path


#: names of files that usually hold credentials (a provider's key in ``.env`` or ``.envrc``, a login in ``.netrc``
#: or ``_netrc``, a registry token in ``.npmrc``, an SSH key): never copied into a machine, whose processes a key
#: must not reach (``swarmyard.swarm.keyscan``); matched whatever the case of the name's letters
SECRET_FILE_NAMES = frozenset({".env", ".envrc", ".netrc", "_netrc", ".npmrc", ".pgpass", ".pypirc",
                               ".git-credentials", "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519"})
#: SSH private keys by the start of their name: their copies and variants too (``id_rsa.bak``, ``id_rsa_work``,
#: ``id_ed25519_sk``, ``id_ecdsa-old``), but not the public halves (``.pub``)
_KEY_PREFIXES = ("id_rsa", "id_dsa", "id_ecdsa", "id_ed25519")
#: ``.env.NAME`` files that are conventionally templates without values, not secrets
_ENV_TEMPLATES = frozenset({"example", "sample", "template", "dist"})


def secret_file_name(name: str) -> bool:
    """Whether a file called ``name`` usually holds credentials (``.env``, ``.env.local``, ``.netrc``,
    ``id_rsa.bak``, ...), whatever the case of its letters (``.ENV`` is the same file on some file systems)."""
    name = name.casefold()
    if name in SECRET_FILE_NAMES:
        return True
    if name.startswith(_KEY_PREFIXES) and not name.endswith(".pub"):
        return True
    head, dot, tail = name.partition(".env.")
    return not head and bool(dot) and tail not in _ENV_TEMPLATES


def _not_regular(path: Path) -> ValueError:
    """The refusal of ``path``, a symbolic link or a special file (a socket, a named pipe, a device), in words."""
    if path.is_symlink():
        kind = "a symbolic link: links are not followed into machines, name the file or folder it points to"
    else:
        mode = path.lstat().st_mode
        kind = ("a socket" if stat.S_ISSOCK(mode) else "a named pipe" if stat.S_ISFIFO(mode) else
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a special file")
    return ValueError(f"{path} is not a regular file ({kind}); a lens's files may hold only regular files and "
                      "folders")


def _walk(root: Path) -> list[Path]:
    """Every file under the folder ``root``, sorted; a symbolic link (to a file or a folder) or a special file
    anywhere under it is refused, never skipped: the worker would silently miss what the folder shows its user."""
    found = []
    for path in sorted(root.rglob("*")):
        if path.is_symlink() or not (path.is_dir() or path.is_file()):
            raise _not_regular(path)
        if not path.is_dir():
            found.append(path)
    return found


def task_files(paths: tuple[str, ...]) -> list[TaskFile]:
    """Every file the (absolute) ``paths`` stand for; ``ValueError`` says why one cannot be used."""
    out: dict[str, TaskFile] = {}
    size = 0
    for value in paths:
        root = Path(value)
        if root.is_symlink():  # named itself, not only under a lens folder: never followed
            raise _not_regular(root)
        if not root.exists():
            raise ValueError(f"{value} does not exist")
        if not (root.is_file() or root.is_dir()):
            raise _not_regular(root)
        found = [root] if root.is_file() else _walk(root)
        for path in found:
            if secret_file_name(path.name):
                raise ValueError(f"{path} is a file that usually holds secrets ({path.name}): it would be copied "
                                 "into every machine that takes the task, and no secret enters a machine; move it "
                                 "out of the folder, or list the files the task needs")
            inside = str(PurePosixPath(path.name if path == root else path.relative_to(root).as_posix()))
            if inside in out:
                raise ValueError(f"two files would be task/{inside}")
            size += path.stat().st_size
            out[inside] = TaskFile(inside, path)
    if size > MAX_TASK_FILES_BYTES or len(out) > MAX_TASK_FILES:
        raise ValueError(f"a task's files may hold at most {MAX_TASK_FILES} files and {MAX_TASK_FILES_BYTES} bytes "
                         f"(these: {len(out)} files, {size} bytes)")
    return list(out.values())


def family_lenses(folder: Path) -> list[dict[str, Any]]:
    """The lenses of an instance folder's ``tasks.toml``, their files made absolute; ``ValueError`` says why not."""
    path = folder / TASKS_FILE
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{folder} holds no {TASKS_FILE} (make one with swarmyard families generate)") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    lenses = data.get("lenses")
    if not isinstance(lenses, list) or not lenses or not all(isinstance(lens, dict) for lens in lenses):
        raise ValueError(f"{path} lists no [[lenses]]")
    out = []
    for lens in lenses:
        files = lens.get("files", [])
        if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
            raise ValueError(f"{path}: files must be a list of paths")
        out.append({**lens, "files": [str(resolve(f, folder)) for f in files]})
    return out
