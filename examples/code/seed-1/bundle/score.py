"""Score a code answer: the share of the split's pytest tests that pass against it x 1,000,000.

Called as ``score.py ARTIFACT DATA_DIR``: the artifact is the text of ``solution.py``; DATA_DIR holds the
split's test files (``test_*.py``). They run with pytest in a scratch folder under /tmp, with a wall-clock
limit; a test that fails, errors or is never reached counts as not passed. Prints one integer on stdout.
"""

import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

SCALE = 1_000_000
RUN_TIMEOUT_S = 60


def passed_share(report: Path, expected: int) -> int:
    """Passed tests x SCALE // ``expected``, read from a JUnit XML report (0 when there is none)."""
    if expected <= 0:
        return 0
    try:
        root = ElementTree.parse(report).getroot()
    except (OSError, ElementTree.ParseError):
        return 0
    passed = 0
    for case in root.iter("testcase"):
        if not any(child.tag in ("failure", "error", "skipped") for child in case):
            passed += 1
    return min(passed, expected) * SCALE // expected


def main() -> None:
    artifact, data = Path(sys.argv[1]), Path(sys.argv[2])
    expected = int((data / "expected.txt").read_text(encoding="utf-8").strip())
    work = Path(tempfile.mkdtemp(prefix="code-"))
    shutil.copyfile(artifact, work / "solution.py")
    for test in sorted(data.glob("test_*.py")):
        shutil.copyfile(test, work / test.name)
    report = work / "report.xml"
    try:
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                        str(work)], cwd=work, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=RUN_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        print(0)
        return
    print(passed_share(report, expected))


if __name__ == "__main__":
    main()
