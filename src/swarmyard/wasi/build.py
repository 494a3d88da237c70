"""Build the shipped WASI tools from ``csrc/`` with clang for ``wasm32-wasi`` (``python -m swarmyard.wasi.build``).

The toolchain is the distribution's: clang and lld, wasi-libc (the sysroot, under ``/usr`` on Debian) and
libclang-rt-dev-wasm32 (the compiler runtime). A module is rebuilt only when its source is newer.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from swarmyard.errors import UserError
from swarmyard.wasi.catalog import BENCH_MODULES, BUILD_HINT, SHIPPED, built_dir

SOURCES = Path(__file__).parent / "csrc"
#: Where Debian's wasi-libc puts its headers and libraries (``/usr/include/wasm32-wasi``, ``/usr/lib/wasm32-wasi``).
DEFAULT_SYSROOT = "/usr"
_FLAGS = ("--target=wasm32-wasi", "-O2", "-Wall", "-Wno-unused-function", "-Werror", "-Wl,--strip-all")


def _compiler() -> str:
    for name in ("clang", *(f"clang-{v}" for v in range(20, 13, -1))):
        found = shutil.which(name)
        if found:
            return found
    raise UserError(f"no clang found: {BUILD_HINT}")


def build(out: Path | None = None, *, sysroot: str = DEFAULT_SYSROOT, force: bool = False) -> list[Path]:
    """Compile every shipped tool and benchmark module into ``out``; the paths built (or already current)."""
    target = out or built_dir()
    target.mkdir(parents=True, exist_ok=True)
    clang = _compiler()
    made = []
    for name in (*SHIPPED, *BENCH_MODULES):
        source, wasm = SOURCES / f"{name}.c", target / f"{name}.wasm"
        newest = max(source.stat().st_mtime, (SOURCES / "tool.h").stat().st_mtime)
        if force or not wasm.is_file() or wasm.stat().st_mtime < newest:
            partial = wasm.with_suffix(".wasm.part")
            result = subprocess.run([clang, *_FLAGS, f"--sysroot={sysroot}", "-o", str(partial), str(source)],
                                    capture_output=True, text=True, check=False)
            if result.returncode != 0:
                partial.unlink(missing_ok=True)
                raise UserError(f"building {name}.wasm failed: {result.stderr.strip()[-2000:]}\n{BUILD_HINT}")
            os.replace(partial, wasm)  # a reader never sees half a module
        made.append(wasm)
    return made


def main(argv: list[str] | None = None) -> int:
    """Entry point: build, print each module's path; exit 1 with the reason when the toolchain is missing."""
    parser = argparse.ArgumentParser(prog="python -m swarmyard.wasi.build", description=__doc__)
    parser.add_argument("--out", type=Path, help=f"where the modules go (default {built_dir()})")
    parser.add_argument("--sysroot", default=DEFAULT_SYSROOT, help="the wasi-libc sysroot (default /usr)")
    parser.add_argument("--force", action="store_true", help="rebuild even when a module is current")
    args = parser.parse_args(argv)
    try:
        for path in build(args.out, sysroot=args.sysroot, force=args.force):
            print(path)
    except UserError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
