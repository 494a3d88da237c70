"""Score a sorting program: run it on every case in the split's data and print how many it got right.

Called as ``score.py ARTIFACT DATA_DIR`` inside the evaluator's sandbox; prints one integer on stdout.
"""

import json
import subprocess
import sys
from pathlib import Path


def main() -> None:
    artifact, data = Path(sys.argv[1]), Path(sys.argv[2])
    cases = json.loads((data / "cases.json").read_text())
    right = 0
    for case in cases:
        try:
            done = subprocess.run([sys.executable, str(artifact)], input=" ".join(map(str, case)), text=True,
                                  capture_output=True, timeout=2)
        except subprocess.TimeoutExpired:
            continue
        if done.stdout.split() == [str(n) for n in sorted(case)]:
            right += 1
    print(right)


main()
