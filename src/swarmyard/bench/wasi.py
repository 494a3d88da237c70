"""``swarmyard bench wasi``: the cost of one WASI tool call and how fast a runaway one is stopped.

``call_ms_p50``: instantiate a cached compiled module in a fresh store, run it, read its JSON (the trivial
``echo`` module): what every tool call pays on top of its own work. ``fuel_trap_s``: an endless loop (``spin``)
stopped by a 50M fuel cap. Also the first compile of a module (what the cache saves) and a wall-clock trap.

Measured on a shared 2-core host (wasmtime 50): call_ms_p50 0.23 ms (p99 3.5 ms), the first compile 60-180 ms,
fuel_trap_s 0.004-0.008 s (the issue's earlier figure: ~0.06 s), a 0.1 s wall-clock cap 0.12 s.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from swarmyard.bench.result import BenchResult, BenchRow
from swarmyard.errors import WasiTrapError
from swarmyard.wasi import WasiCaps, WasiRunner, WasiToolSpec, shipped_wasm
from swarmyard.wasi.catalog import ParamType

FUEL_CAP = 50_000_000


def _trap_s(runner: WasiRunner, spec: WasiToolSpec) -> float:
    start = time.perf_counter()
    try:
        runner.call(spec, {})
    except WasiTrapError:
        return time.perf_counter() - start
    raise AssertionError(f"{spec.name} ended without its cap")  # the loop never ends: a cap must stop it


def run(quick: bool = False, **_: object) -> BenchResult:
    """Run the measurements."""
    result = BenchResult("wasi")
    calls = 50 if quick else 300
    with tempfile.TemporaryDirectory(prefix="swarmyard-bench-wasi-") as temp:
        folder = Path(temp).resolve()  # a tool's folder may not pass through a symlink (a TMPDIR may)
        runner = WasiRunner()
        echo = WasiToolSpec("echo", "", shipped_wasm("echo"), folder, {"x": ParamType.STRING})
        start = time.perf_counter()
        runner.module(echo.wasm)
        compile_ms = (time.perf_counter() - start) * 1000
        samples = []
        for i in range(calls):
            start = time.perf_counter()
            runner.call(echo, {"x": str(i)})
            samples.append((time.perf_counter() - start) * 1000)
        spin = shipped_wasm("spin")
        fuel = WasiToolSpec("spin", "", spin, folder, caps=WasiCaps(fuel=FUEL_CAP, wall_s=60))
        runner.module(spin)
        fuel_s = statistics.median(_trap_s(runner, fuel) for _ in range(3 if quick else 5))
        wall = WasiToolSpec("spin", "", spin, folder, caps=WasiCaps(fuel=10**15, wall_s=0.1))
        wall_s = _trap_s(runner, wall)
    p50, p99 = statistics.median(samples), sorted(samples)[int(len(samples) * 0.99) - 1]
    result.add(BenchRow("call_ms_p50", p50, "ms", target="<= 5 ms (cached compiled module)"))
    result.add(BenchRow("call_ms_p99", p99, "ms"))
    result.add(BenchRow("compile_ms", compile_ms, "ms"))
    result.add(BenchRow("fuel_trap_s", fuel_s, "s", target=f"endless loop under {FUEL_CAP:,} fuel; ~0.06 s before"))
    result.add(BenchRow("wall_trap_s", wall_s, "s", target="a 0.1 s wall-clock cap"))
    result.summary = {"call_ms_p50": round(p50, 3), "call_ms_p99": round(p99, 3), "compile_ms": round(compile_ms, 3),
                      "fuel_trap_s": round(fuel_s, 4), "wall_trap_s": round(wall_s, 4), "calls": calls,
                      "fuel_cap": FUEL_CAP}
    return result
