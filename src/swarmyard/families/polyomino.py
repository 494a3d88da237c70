"""The polyomino family (Test-Time Communication's packing task): place the given pieces on a grid.

The seed cuts a 6 x 6 grid into pieces of 2 to 5 cells (so a full packing exists), then hands each piece out
turned and flipped at random. An answer is the grid as text, each covered cell holding its piece's letter;
the exact verifier (``scorers/polyomino.py``) checks every letter's cells are its piece, moved, turned or
flipped. Score = covered fraction x 1,000,000. The verifier needs no hidden data: both splits hold the puzzle.
"""

from __future__ import annotations

import json
import random

from swarmyard.families.instance import Instance, TaskInput
from swarmyard.families.scorers.polyomino import LETTERS, normalized

NAME = "polyomino"
WIDTH = HEIGHT = 6
MIN_CELLS, MAX_CELLS = 2, 5

OBJECTIVE = (f"Pack the given polyomino pieces onto a {WIDTH} x {HEIGHT} grid, covering as many cells as "
             "possible: pieces may be moved, turned and flipped, never overlap, and each is used at most once.")


def _cut(rng: random.Random) -> list[frozenset[tuple[int, int]]]:
    """The grid cut into connected pieces of MIN_CELLS..MAX_CELLS cells (a lone leftover joins a neighbour)."""
    owner: dict[tuple[int, int], int] = {}
    pieces: list[set[tuple[int, int]]] = []
    cells = [(r, c) for r in range(HEIGHT) for c in range(WIDTH)]
    rng.shuffle(cells)

    def free_neighbours(group: set[tuple[int, int]]) -> list[tuple[int, int]]:
        out = {(r + dr, c + dc) for r, c in group for dr, dc in ((0, 1), (1, 0), (0, -1), (-1, 0))}
        return sorted(p for p in out if 0 <= p[0] < HEIGHT and 0 <= p[1] < WIDTH and p not in owner)

    for seed_cell in cells:
        if seed_cell in owner:
            continue
        group = {seed_cell}
        owner[seed_cell] = len(pieces)
        target = rng.randint(MIN_CELLS, MAX_CELLS)
        while len(group) < target and (options := free_neighbours(group)):
            cell = rng.choice(options)
            group.add(cell)
            owner[cell] = len(pieces)
        pieces.append(group)
    for index, group in enumerate(pieces):
        if len(group) >= MIN_CELLS:
            continue
        # a trapped cell joins the smallest neighbouring piece that stays within MAX_CELLS + 1
        (r, c), = group
        near = {owner[p] for p in ((r, c + 1), (r + 1, c), (r, c - 1), (r - 1, c)) if p in owner} - {index}
        host = min(near, key=lambda i: (len(pieces[i]), i))
        pieces[host] |= group
        for cell in group:
            owner[cell] = host
        group.clear()
    return [frozenset(g) for g in pieces if g]


def _shuffled_shape(cells: frozenset[tuple[int, int]], rng: random.Random) -> list[list[int]]:
    shape = set(cells)
    for _ in range(rng.randrange(4)):
        shape = {(c, -r) for r, c in shape}
    if rng.random() < 0.5:
        shape = {(r, -c) for r, c in shape}
    return [list(cell) for cell in sorted(normalized(shape))]


def picture(cells: list[list[int]], mark: str) -> str:
    """A piece drawn with ``mark`` for its cells and ``.`` elsewhere."""
    rows = 1 + max(r for r, _ in cells)
    cols = 1 + max(c for _, c in cells)
    taken = {(r, c) for r, c in cells}
    return "\n".join("".join(mark if (r, c) in taken else "." for c in range(cols)) for r in range(rows))


def generate(seed: int) -> Instance:
    """The instance of ``seed``: the same seed gives the same puzzle."""
    rng = random.Random(f"{NAME}:{seed}")
    cut = _cut(rng)
    rng.shuffle(cut)
    pieces = [_shuffled_shape(p, rng) for p in cut]
    puzzle = {"width": WIDTH, "height": HEIGHT, "pieces": pieces}
    drawn = "\n\n".join(f"piece {LETTERS[i]} ({len(p)} cells):\n{picture(p, LETTERS[i])}" for i, p in enumerate(pieces))
    prompt = (f"Pack these {len(pieces)} pieces onto a {WIDTH} x {HEIGHT} grid (they are also in "
              "task/puzzle.json as [row, col] cells). Answer with the grid: "
              f"{HEIGHT} lines of {WIDTH} characters, '.' for an empty cell and the piece's letter for a covered "
              "one. A piece may be moved, turned and flipped; each letter's cells must be exactly its piece. "
              "Submit each attempt with submit_artifact to see its score.\n\n" + drawn)
    data = json.dumps(puzzle) + "\n"
    task = TaskInput("pack the pieces", prompt, {"puzzle.json": data, "pieces.txt": drawn + "\n"}, "puzzle")
    return Instance(NAME, seed, OBJECTIVE, (task,), "polyomino", search={"puzzle.json": data},
                    holdout={"puzzle.json": data},
                    lead_prompt="Submit the best packing the findings hold: the grid alone, as found.")


def solution(seed: int) -> str:
    """A full packing of ``seed``'s puzzle (the cut it was made from), as the verifier reads answers."""
    rng = random.Random(f"{NAME}:{seed}")
    cut = _cut(rng)
    rng.shuffle(cut)
    grid = [["."] * WIDTH for _ in range(HEIGHT)]
    for index, cells in enumerate(cut):
        for r, c in cells:
            grid[r][c] = LETTERS[index]
    return "\n".join("".join(row) for row in grid) + "\n"
