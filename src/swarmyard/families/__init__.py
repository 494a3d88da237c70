"""Task families: generators that turn a seed into a task instance (input files for machines) and the evaluator
bundle that scores it. The same seed gives the same instance, byte for byte.

    generate("reconciliation", seed=1, out=Path("instance"))   # tasks.toml, inputs/, bundle/

Families are found by name in ``FAMILIES`` and imported only when used; see ``swarmyard.families.instance`` for
the folder a generator writes.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from swarmyard.errors import UserError
from swarmyard.families.instance import Instance, write_instance

#: family name -> the module whose ``generate(seed) -> Instance`` makes its instances
FAMILIES: dict[str, str] = {
    "reconciliation": "swarmyard.families.reconciliation",
    "polyomino": "swarmyard.families.polyomino",
    "code": "swarmyard.families.code",
}
#: seeds are non-negative and fit a signed 64-bit integer (the store and JSON keep them exactly)
MAX_SEED = (1 << 63) - 1


def instance(name: str, seed: int) -> Instance:
    """The instance of family ``name`` for ``seed``; ``UserError`` for an unknown family or a bad seed."""
    if name not in FAMILIES:
        raise UserError(f"no task family {name!r}: choose one of {', '.join(sorted(FAMILIES))}", field="family")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise UserError(f"the seed must be an integer from 0 to {MAX_SEED}", field="seed")
    made: Instance = importlib.import_module(FAMILIES[name]).generate(seed)
    return made


def generate(name: str, seed: int, out: Path) -> Path:
    """Write the instance of family ``name`` for ``seed`` into ``out`` (a new or empty folder)."""
    return write_instance(instance(name, seed), out)


__all__ = ["FAMILIES", "Instance", "generate", "instance"]
