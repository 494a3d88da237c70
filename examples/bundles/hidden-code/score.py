"""Score an attempt at instance I's hidden code: ``score.py ARTIFACT DATA_DIR`` prints one integer.

The artifact is ``instance I code DIGITS``; the hidden code is the first LENGTH digits of SHA-256(key:I) read as
decimal digits (``DATA_DIR/key.txt`` and ``DATA_DIR/length.txt``). The score is the digits in the right place
times 1,000,000 // LENGTH; an artifact of another shape scores 0.
"""

import hashlib
import re
import sys
from pathlib import Path


def code(key: str, instance: int, length: int) -> str:
    digits = ""
    counter = 0
    while len(digits) < length:
        block = hashlib.sha256(f"{key}:{instance}:{counter}".encode()).digest()
        digits += "".join(str(b % 10) for b in block)
        counter += 1
    return digits[:length]


def main() -> None:
    artifact, data = Path(sys.argv[1]), Path(sys.argv[2])
    key = (data / "key.txt").read_text().strip()
    length = int((data / "length.txt").read_text())
    found = re.fullmatch(r"\s*instance (\d{1,9}) code (\d+)\s*", artifact.read_text(errors="replace"))
    if found is None or len(found[2]) != length:
        print(0)
        return
    target = code(key, int(found[1]), length)
    right = sum(1 for a, b in zip(found[2], target, strict=True) if a == b)
    print(right * 1_000_000 // length)


main()
