"""What every benchmark returns: rows with a value and, where there is one, a same-process baseline and ratio."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class BenchRow:
    """One measurement; ``ratio`` is ``value / baseline`` when a baseline was run in the same process."""

    name: str
    value: float
    unit: str
    baseline: float | None = None
    baseline_name: str | None = None
    target: str | None = None

    @property
    def ratio(self) -> float | None:
        """``value / baseline``, or ``None`` without a baseline."""
        if self.baseline is None or self.baseline == 0:
            return None
        return self.value / self.baseline


@dataclass(slots=True)
class BenchResult:
    """A benchmark's table rows plus the machine-readable summary printed with ``--json``."""

    area: str
    rows: list[BenchRow] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, row: BenchRow) -> BenchRow:
        """Append a row and return it."""
        self.rows.append(row)
        return row
