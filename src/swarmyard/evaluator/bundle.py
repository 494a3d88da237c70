"""An evaluator bundle: ``evaluator.toml``, the scoring entry point, and ``search/`` + ``holdout/`` data.

    bundle/
      evaluator.toml      name, [scoring] entry + interpreter, [limits]
      score.py            the entry point named by [scoring].entry
      search/             data the scoring code sees for split="search"
      holdout/            data it sees only for the one-shot final holdout

``load_bundle`` parses and checks everything up front, so a bad bundle fails at start with a ``BundleError``
naming the field, never halfway through a run.
"""

from __future__ import annotations

import re
import stat
import tomllib
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError, field_validator

from swarmyard.errors import BundleError

MANIFEST = "evaluator.toml"
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


class Split(StrEnum):
    """Which data the scoring code sees."""

    SEARCH = "search"
    HOLDOUT = "holdout"


class Limits(BaseModel):
    """What one scoring run may use; the sandbox enforces every one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout_s: Annotated[StrictInt, Field(gt=0, le=3600)] = 30
    cpu_s: Annotated[StrictInt, Field(gt=0, le=3600)] = 20
    memory_mib: Annotated[StrictInt, Field(ge=64, le=65536)] = 512
    max_artifact_bytes: Annotated[StrictInt, Field(gt=0, le=1 << 30)] = 16 << 20
    max_output_bytes: Annotated[StrictInt, Field(gt=0, le=1 << 24)] = 64 << 10
    tmpfs_mib: Annotated[StrictInt, Field(gt=0, le=65536)] = 64
    #: RLIMIT_NPROC of the scoring run; counted per user, so it holds when the evaluator has a user of its own.
    max_processes: Annotated[StrictInt, Field(ge=8, le=4096)] = 64


class Scoring(BaseModel):
    """How to run the scoring code: ``interpreter entry ARTIFACT DATA_DIR``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    entry: StrictStr
    interpreter: StrictStr = "/usr/bin/python3"
    #: The highest score the scoring code may print; a score outside [0, max_score] is a scoring error.
    max_score: Annotated[StrictInt, Field(gt=0, le=2**62)] = 1_000_000

    @field_validator("entry")
    @classmethod
    def _relative_inside(cls, value: str) -> str:
        path = PurePosixPath(value)
        if not value or path.is_absolute() or ".." in path.parts:
            raise ValueError("must be a relative path inside the bundle")
        return value

    @field_validator("interpreter")
    @classmethod
    def _system_path(cls, value: str) -> str:
        # The sandbox mounts only the system folders read-only, so the interpreter must live in one of them.
        if not value.startswith(("/usr/", "/bin/")):
            raise ValueError("must be an absolute path under /usr or /bin")
        return value


class Manifest(BaseModel):
    """The parsed ``evaluator.toml``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: StrictStr
    scoring: Scoring
    limits: Limits = Limits()

    @field_validator("name")
    @classmethod
    def _name_shape(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError("must be 1-64 characters of a-z, 0-9, '.', '_', '-', starting alphanumeric")
        return value


class Bundle(BaseModel):
    """A loaded, checked bundle."""

    model_config = ConfigDict(frozen=True)

    root: Path
    manifest: Manifest

    @property
    def name(self) -> str:
        """The bundle's name from ``evaluator.toml``."""
        return self.manifest.name

    @property
    def limits(self) -> Limits:
        """The scoring limits."""
        return self.manifest.limits

    @property
    def entry_path(self) -> Path:
        """The scoring entry point on the host."""
        return self.root / self.manifest.scoring.entry

    def split_dir(self, split: Split) -> Path:
        """The data folder of ``split`` on the host."""
        return self.root / split.value


def _field_of(error: ValidationError) -> tuple[str, str]:
    first = error.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or "(top level)"
    return field, first["msg"]


def _check_entries(root: Path) -> None:
    # Ownership and modes are changed recursively as root; a symlink could point that at any file on the host.
    # A FIFO, socket or device cannot be copied into the run (a FIFO blocks the copy): only files and folders.
    for path in root.rglob("*"):
        if path.is_symlink():
            raise BundleError("symbolic links are not allowed in a bundle", field=str(path.relative_to(root)),
                              path=str(root))
        mode = path.lstat().st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise BundleError("only regular files and folders are allowed in a bundle (this is a FIFO, socket "
                              "or device)", field=str(path.relative_to(root)), path=str(root))


def load_bundle(root: Path) -> Bundle:
    """Load and check the bundle at ``root``; raise ``BundleError`` naming the first bad field."""
    root = Path(root).resolve()
    where = str(root)
    if not root.is_dir():
        raise BundleError("is not a folder", field="bundle", path=where)
    manifest_path = root / MANIFEST
    if not manifest_path.is_file():
        raise BundleError("missing", field=MANIFEST, path=where)
    try:
        raw = tomllib.loads(manifest_path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise BundleError("is not UTF-8", field=MANIFEST, path=where) from exc
    except tomllib.TOMLDecodeError as exc:
        raise BundleError(f"is not valid TOML ({exc})", field=MANIFEST, path=where) from exc
    try:
        manifest = Manifest.model_validate(raw)
    except ValidationError as exc:
        field, message = _field_of(exc)
        raise BundleError(message, field=field, path=where) from exc
    _check_entries(root)
    entry = root / manifest.scoring.entry
    if not entry.is_file():
        raise BundleError(f"{manifest.scoring.entry!r} is not a file in the bundle", field="scoring.entry",
                          path=where)
    if not Path(manifest.scoring.interpreter).is_file():
        raise BundleError(f"{manifest.scoring.interpreter!r} does not exist on this host",
                          field="scoring.interpreter", path=where)
    for split in Split:
        if not (root / split.value).is_dir():
            raise BundleError("folder missing", field=f"{split.value}/", path=where)
    return Bundle(root=root, manifest=manifest)
