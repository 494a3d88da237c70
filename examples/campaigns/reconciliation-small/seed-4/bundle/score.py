"""Score a reconciliation answer: F1 of the record ids it names against the inconsistent ones, x 1,000,000.

Called as ``score.py ARTIFACT DATA_DIR``; DATA_DIR/truth.json holds ``universe`` (the record ids this split
judges) and ``inconsistent`` (those of them that are inconsistent). Ids outside the universe are not judged
(they belong to the other split). Prints one integer on stdout.
"""

import json
import re
import sys
from pathlib import Path

SCALE = 1_000_000
RECORD_ID = re.compile(r"\bTX-[0-9]{5}\b")


def named_ids(text: str) -> set[str]:
    """The record ids an answer names, wherever they stand in its text."""
    return set(RECORD_ID.findall(text))


def f1_score(named: set[str], inconsistent: set[str], universe: set[str]) -> int:
    """F1 x SCALE, floored, over the ids of ``universe``; nothing to find and nothing named is a full score."""
    judged = named & universe
    hits = len(judged & inconsistent)
    wrong = len(judged - inconsistent)
    missed = len(inconsistent - judged)
    if hits + wrong + missed == 0:
        return SCALE
    return 2 * hits * SCALE // (2 * hits + wrong + missed)


def main() -> None:
    artifact, data = Path(sys.argv[1]), Path(sys.argv[2])
    truth = json.loads((data / "truth.json").read_text(encoding="utf-8"))
    text = artifact.read_bytes().decode("utf-8", "replace")
    print(f1_score(named_ids(text), set(truth["inconsistent"]), set(truth["universe"])))


if __name__ == "__main__":
    main()
