"""One call of a WASI tool: typed JSON in, one JSON object out, every cap a typed error.

Where it runs: in the worker's machine, inside the agent's own process (wasmtime is a library, so no exec is
needed: it works in a governed machine where every exec is refused). The files a tool reads are the worker's
task inputs and its own files, which live on the machine's disk; running tools in the control plane would mean
moving worker-chosen bytes and worker-chosen CPU into the process that holds the store, the provider keys and the
audit key. In the machine a wasmtime fault stays inside bwrap, Landlock, seccomp and the machine's cgroup limits.

The guest's contract (``csrc/tool.h``): arguments come as ``argv`` entries ``name=value``; the folder is ``/data``;
exit 0 with one JSON object on stdout is a result, exit 2 bad input (message on stderr), exit 3 out of memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from swarmyard.errors import MissingExtraError, ToolError, WasiTrapError
from swarmyard.wasi.catalog import ParamType, WasiToolSpec

if TYPE_CHECKING:
    import wasmtime

#: The epoch ticks every this many seconds while a call runs; a wall-clock cap is a whole number of ticks.
TICK_S = 0.01
_PAGE = 65536
_STDERR_BYTES = 4096
_EXIT_BAD_INPUT = 2
_EXIT_NO_MEMORY = 3
#: A funcref table element takes a pointer: tables together are held to the memory cap as well.
_TABLE_ELEMENT_BYTES = 8
_MAX_TABLES = 2
#: WASI preview 1's ``notsup``: what a module that asks to sleep (``poll_oneoff``) is answered.
_ERRNO_NOTSUP = 58


def _wasmtime() -> Any:
    try:
        import wasmtime
    except ImportError as exc:
        raise MissingExtraError("WASI tools", "wasi", "wasmtime") from exc
    return wasmtime


class _Ticker:
    """Advances the engine's epoch every ``TICK_S`` while at least one call runs, and sleeps otherwise."""

    def __init__(self, engine: wasmtime.Engine) -> None:
        self._engine = engine
        self._active = 0
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> None:
        with self._wake:
            self._active += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name="swarmyard-wasi-epoch")
                self._thread.start()
            self._wake.notify()

    def __exit__(self, *_: object) -> None:
        with self._wake:
            self._active -= 1

    def _run(self) -> None:
        while True:
            with self._wake:
                while self._active == 0:
                    self._wake.wait()
                self._wake.wait(TICK_S)
            self._engine.increment_epoch()


class _Output:
    """A stream kept up to a limit; what is past it is counted, not kept."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = 0

    def write(self, data: bytes) -> None:
        room = self.limit - sum(len(p) for p in self.parts)
        if room > 0:
            self.parts.append(bytes(data[:room]))
        self.size += len(data)

    @property
    def over(self) -> bool:
        return self.size > self.limit

    def text(self) -> str:
        return b"".join(self.parts).decode("utf-8", "replace")


class WasiRunner:
    """Runs WASI tools; compiled modules are cached by content for the life of the runner (one agent run)."""

    def __init__(self) -> None:
        wt = _wasmtime()
        config = wt.Config()
        config.consume_fuel = True
        config.epoch_interruption = True
        self._wt = wt
        self._engine = wt.Engine(config)
        self._linker = wt.Linker(self._engine)
        self._linker.define_wasi()
        # poll_oneoff is WASI's sleep: a guest blocked in it runs no wasm, so neither fuel nor the epoch deadline
        # would end it (a module asking for an hour would get an hour). A tool is a computation: it may not wait.
        self._linker.allow_shadowing = True
        i32 = wt.ValType.i32()
        self._linker.define_func("wasi_snapshot_preview1", "poll_oneoff", wt.FuncType([i32] * 4, [i32]),
                                 lambda *_: _ERRNO_NOTSUP)
        self._linker.allow_shadowing = False
        self._modules: dict[str, wasmtime.Module] = {}
        self._by_path: dict[tuple[str, int, int], str] = {}
        self._lock = threading.Lock()
        self._ticker = _Ticker(self._engine)

    def module(self, wasm: Path) -> wasmtime.Module:
        """The compiled module of a file, compiled once per content."""
        try:
            stat = wasm.stat()
        except OSError as exc:
            raise ToolError(f"cannot read the module {wasm}: {exc.strerror}", tool=wasm.stem,
                            reason="no_module") from exc
        key = (str(wasm), stat.st_mtime_ns, stat.st_size)
        with self._lock:
            digest = self._by_path.get(key)
            if digest is not None:
                return self._modules[digest]
        data = wasm.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        with self._lock:
            if digest not in self._modules:
                try:
                    self._modules[digest] = self._wt.Module(self._engine, data)
                except self._wt.WasmtimeError as exc:
                    raise ToolError(f"{wasm} is not a WebAssembly module: {str(exc)[:300]}", tool=wasm.stem,
                                    reason="bad_module") from exc
            self._by_path[key] = digest
            return self._modules[digest]

    def call(self, spec: WasiToolSpec, args: Mapping[str, Any]) -> dict[str, Any]:
        """Run one call; the tool's JSON object, or ``ToolError`` (``WasiTrapError`` for a cap)."""
        hidden = sorted(set(args) - set(spec.shown()) - set(spec.fixed))
        if hidden and hidden[0] in spec.params:
            raise ToolError(f"{spec.name} takes no argument {hidden[0]!r} here (it takes: "
                            f"{', '.join(spec.shown()) or 'none'})", tool=spec.name, reason="bad_arguments")
        # the swarm file's fixed arguments win: a model cannot give them (its schema has none of them)
        argv = [spec.name, *self._argv(spec, {**args, **spec.fixed})]
        module = self.module(spec.wasm)
        folder = _open_folder(spec)
        store = self._wt.Store(self._engine)
        try:
            return self._run(spec, module, store, argv, f"/proc/self/fd/{folder}")
        finally:
            # freed now, not by the collector: a store left to the interpreter's exit (a trapped one above all)
            # makes wasmtime's runtime thread abort the process as it is torn down
            store.close()
            os.close(folder)

    def _run(self, spec: WasiToolSpec, module: wasmtime.Module, store: wasmtime.Store,
             argv: list[str], folder: str) -> dict[str, Any]:
        wt = self._wt
        wasi = wt.WasiConfig()
        wasi.argv = argv
        out, err = _Output(spec.caps.output_bytes), _Output(_STDERR_BYTES)
        wasi.stdout_custom = out.write
        wasi.stderr_custom = err.write
        # no environment, no stdin, no sockets (preview 1 offers none unless given): only the folder
        wasi.preopen_dir(folder, "/data", spec.writer)
        store.set_wasi(wasi)
        store.set_fuel(spec.caps.fuel)
        store.set_limits(memory_size=spec.caps.memory_bytes, memories=1, instances=1, tables=_MAX_TABLES,
                         table_elements=spec.caps.memory_bytes // _TABLE_ELEMENT_BYTES // _MAX_TABLES)
        # one tick more than the cap: the first tick may come at once, and a cap is a floor, not a ceiling
        store.set_epoch_deadline(max(1, round(spec.caps.wall_s / TICK_S)) + 1)
        try:
            instance = self._linker.instantiate(store, module)
        except wt.WasmtimeError as exc:
            if ("memory" in str(exc) or "table" in str(exc)) and "limit" in str(exc):
                raise WasiTrapError(spec.name, "memory", spec.caps.memory_bytes) from exc
            raise ToolError(f"{spec.name} could not start: {str(exc)[:300]}", tool=spec.name,
                            reason="instantiate") from exc
        start = instance.exports(store).get("_start")
        if not isinstance(start, wt.Func):
            raise ToolError(f"{spec.name}'s module has no _start function to run (a WASI command exports one)",
                            tool=spec.name, reason="bad_module")
        code = 0
        with self._ticker:
            try:
                start(store)
            except wt.ExitTrap as exc:
                code = exc.code
            except wt.Trap as exc:
                raise self._trap(spec, exc, self._memory_full(store, instance, spec)) from exc
            except wt.WasmtimeError as exc:
                # a host function's refusal that is not a trap (a pointer out of bounds or misaligned in a WASI
                # call): the module's fault, answered as one, never an exception that ends the agent
                first = str(exc).strip().splitlines()[-1].strip()[:300]
                raise ToolError(f"{spec.name} failed in a WASI call: {first}", tool=spec.name,
                                reason="trap") from exc
        if out.over:
            raise WasiTrapError(spec.name, "output", spec.caps.output_bytes)
        if code == _EXIT_NO_MEMORY or (code != 0 and self._memory_full(store, instance, spec)):
            raise WasiTrapError(spec.name, "memory", spec.caps.memory_bytes)
        if code != 0:
            said = err.text().strip() or f"exit {code}"
            reason = "bad_input" if code == _EXIT_BAD_INPUT else "tool_failed"
            raise ToolError(f"{spec.name}: {said[:1000]}", tool=spec.name, reason=reason)
        try:
            result = json.loads(out.text())
        except ValueError as exc:
            raise ToolError(f"{spec.name} answered no JSON", tool=spec.name, reason="bad_output") from exc
        if not isinstance(result, dict):
            raise ToolError(f"{spec.name} answered JSON that is not an object", tool=spec.name,
                            reason="bad_output")
        return result

    def _trap(self, spec: WasiToolSpec, exc: Exception, memory_full: bool) -> ToolError:
        code = getattr(exc, "trap_code", None)
        codes = self._wt.TrapCode
        if code == codes.OUT_OF_FUEL:
            return WasiTrapError(spec.name, "fuel", spec.caps.fuel)
        if code == codes.INTERRUPT:
            return WasiTrapError(spec.name, "wall_time", int(spec.caps.wall_s * 1000))
        if memory_full:
            return WasiTrapError(spec.name, "memory", spec.caps.memory_bytes)
        first = str(getattr(exc, "message", exc)).splitlines()[0][:300]
        return ToolError(f"{spec.name} trapped: {first}", tool=spec.name, reason="trap")

    def _memory_full(self, store: wasmtime.Store, instance: wasmtime.Instance, spec: WasiToolSpec) -> bool:
        """Whether the module's memory is within a page of its cap (a failed grow is how a cap shows)."""
        memory = instance.exports(store).get("memory")
        if not isinstance(memory, self._wt.Memory):
            return False
        return bool(memory.size(store) * _PAGE + _PAGE > spec.caps.memory_bytes)

    def _argv(self, spec: WasiToolSpec, args: Mapping[str, Any]) -> list[str]:
        """The typed arguments checked against the spec and written as ``name=value``."""
        unknown = sorted(set(args) - set(spec.params))
        if unknown:
            raise ToolError(f"{spec.name} takes no argument {unknown[0]!r} (it takes: "
                            f"{', '.join(spec.params) or 'none'})", tool=spec.name, reason="bad_arguments")
        missing = [name for name in spec.required if name not in args]
        if missing:
            raise ToolError(f"{spec.name} needs {', '.join(missing)}", tool=spec.name, reason="bad_arguments")
        argv = []
        for name, value in args.items():
            argv.append(f"{name}={self._value(spec, name, spec.params[name], value)}")
        return argv

    def _value(self, spec: WasiToolSpec, name: str, kind: ParamType, value: object) -> str:
        def bad(why: str) -> ToolError:
            return ToolError(f"{spec.name}: {name} {why}", tool=spec.name, reason="bad_arguments")

        match kind:
            case ParamType.BOOLEAN:
                if not isinstance(value, bool):
                    raise bad("must be true or false")
                return "true" if value else "false"
            case ParamType.INTEGER:
                if isinstance(value, bool) or not isinstance(value, int) or abs(value) >= 2**53:
                    raise bad("must be an integer")
                return str(value)
            case ParamType.STRING | ParamType.PATH:
                if not isinstance(value, str) or "\0" in value or len(value) > 4096:
                    raise bad("must be a string (no NUL, at most 4096 characters)")
                if kind is ParamType.PATH:
                    self._inside(spec, name, value)
                return value
        raise bad("has an unknown type")  # pragma: no cover - ParamType is closed

    def _inside(self, spec: WasiToolSpec, name: str, value: str) -> None:
        """A path argument must name something inside the tool's folder: relative, no ``..``, no symlink out.

        WASI refuses an escape too (a preopen is a capability); this says so by name before the module runs.
        """
        pure = PurePosixPath(value)
        if pure.is_absolute() or ".." in pure.parts:
            raise ToolError(f"{spec.name}: {name} {value!r} is outside the tool's folder (paths are relative to "
                            "it, without '..')", tool=spec.name, reason="outside_folder")
        folder = os.path.realpath(spec.folder)
        real = os.path.realpath(os.path.join(folder, value))
        if real != folder and not real.startswith(folder + os.sep):
            raise ToolError(f"{spec.name}: {name} {value!r} leads outside the tool's folder", tool=spec.name,
                            reason="outside_folder")


def _open_folder(spec: WasiToolSpec) -> int:
    """The tool's folder, opened: a descriptor of a directory that neither is nor passes through a symlink.

    A process in the machine may have put a symlink where the folder should be (``task -> /etc``); the preopen
    would follow it. The folder is opened without following one and then checked by the path the kernel gives
    for what was opened, so a swap between the check and the preopen (which takes ``/proc/self/fd/N``) gains
    nothing.
    """
    where = os.path.normpath(os.path.abspath(spec.folder))

    def refused(why: str, reason: str) -> ToolError:
        return ToolError(f"{spec.name}: its folder {str(spec.folder)!r} {why}", tool=spec.name, reason=reason)

    try:
        fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise refused("does not exist", "no_folder") from None
    except OSError as exc:
        if os.path.islink(where):
            raise refused("is a symlink (a tool reads only the folder it was given)", "outside_folder") from None
        raise refused(f"cannot be opened: {exc.strerror}", "no_folder") from None
    try:
        opened = os.readlink(f"/proc/self/fd/{fd}")
    except OSError as exc:
        os.close(fd)
        raise refused(f"cannot be checked (no /proc: {exc.strerror})", "no_folder") from None
    if opened != where:
        os.close(fd)
        raise refused(f"passes through a symlink (it is {opened})", "outside_folder")
    return fd
