"""Deterministic tools as WebAssembly (WASI) modules, run with wasmtime under fuel, memory and wall-clock caps.

A governed worker has no shell; what it may compute beyond the model is these tools. Each call instantiates a
cached compiled module in a fresh store with no network, an empty environment and one preopened folder (read-only
unless the tool is a writer); arguments and results are JSON; a trap is a typed ``ToolError`` for the agent.
"""

from swarmyard.wasi.catalog import SHIPPED, ParamType, WasiCaps, WasiToolSpec, shipped_wasm
from swarmyard.wasi.runner import WasiRunner

__all__ = ["SHIPPED", "ParamType", "WasiCaps", "WasiRunner", "WasiToolSpec", "shipped_wasm"]
