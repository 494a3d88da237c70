"""Score a polyomino packing: the fraction of the grid's cells it covers x 1,000,000, or 0 if it breaks a rule.

Called as ``score.py ARTIFACT DATA_DIR``; DATA_DIR/puzzle.json holds ``width``, ``height`` and ``pieces``
(each a list of [row, col] cells). The answer is the grid as ``height`` lines of ``width`` characters: ``.``
for an empty cell, the piece's letter (A for piece 0, B for piece 1, ...) for a covered one; other lines of
the artifact are ignored. Each letter's cells must be that piece, moved, turned or flipped; a letter with no
piece, a shape that is not its piece, or no grid at all scores 0. Prints one integer on stdout.
"""

import json
import sys
from pathlib import Path
from typing import Any

SCALE = 1_000_000
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

Cells = frozenset[tuple[int, int]]


def normalized(cells: set[tuple[int, int]] | Cells) -> Cells:
    """The cells moved so their smallest row and column are 0."""
    top = min(r for r, _ in cells)
    left = min(c for _, c in cells)
    return frozenset((r - top, c - left) for r, c in cells)


def orientations(cells: Cells) -> set[Cells]:
    """The piece in each of its eight turns and flips, normalized."""
    out = set()
    shape = set(cells)
    for _ in range(4):
        shape = {(c, -r) for r, c in shape}
        out.add(normalized(shape))
        out.add(normalized({(r, -c) for r, c in shape}))
    return out


def read_grid(text: str, width: int, height: int) -> list[str] | None:
    """The first ``height`` consecutive lines that are each ``width`` grid characters, or None."""
    allowed = set(LETTERS) | {"."}
    lines = [line.strip() for line in text.splitlines()]
    for start in range(len(lines) - height + 1):
        block = lines[start:start + height]
        if all(len(line) == width and set(line) <= allowed for line in block):
            return block
    return None


def packing_score(text: str, puzzle: dict[str, Any]) -> int:
    """The covered fraction x SCALE (floored) of a valid packing, else 0."""
    width, height = int(puzzle["width"]), int(puzzle["height"])
    pieces = [frozenset((int(r), int(c)) for r, c in piece) for piece in puzzle["pieces"]]
    grid = read_grid(text, width, height)
    if grid is None:
        return 0
    placed: dict[str, set[tuple[int, int]]] = {}
    for r, line in enumerate(grid):
        for c, mark in enumerate(line):
            if mark != ".":
                placed.setdefault(mark, set()).add((r, c))
    covered = 0
    for mark, cells in placed.items():
        index = LETTERS.index(mark)
        if index >= len(pieces) or normalized(cells) not in orientations(pieces[index]):
            return 0
        covered += len(cells)
    return covered * SCALE // (width * height)


def main() -> None:
    artifact, data = Path(sys.argv[1]), Path(sys.argv[2])
    puzzle = json.loads((data / "puzzle.json").read_text(encoding="utf-8"))
    print(packing_score(artifact.read_bytes().decode("utf-8", "replace"), puzzle))


if __name__ == "__main__":
    main()
