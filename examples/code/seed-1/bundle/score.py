"""Score a code answer: the share of the split's test cases it passes x 1,000,000.

Called as ``score.py ARTIFACT DATA_DIR``: the artifact is the text of ``solution.py``; DATA_DIR holds the
split's cases (``cases.json``: function name -> [[args, expected], ...], the same cases as its ``test_*.py``)
and their count (``expected.txt``). Prints one integer on stdout.

The artifact is untrusted code, so it never runs in this process and nothing it can write is believed: a child
imports it and calls each function on each case's arguments, and sends back only the JSON of each return
value, on a pipe of its own. This process compares those values with the expected ones. The child confines
itself with Landlock before it imports the answer, so the answer cannot read those expected values. A child that forges a
report, patches its test runner or returns an object whose ``==`` is always true gains nothing: only the right
value, as JSON, counts. This process makes itself non-dumpable first, so the child (same user, same PID
namespace) cannot open ``/proc/PPID/fd/1`` and write into the score this prints.
"""

import ctypes
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

SCALE = 1_000_000
RUN_TIMEOUT_S = 20
PR_SET_DUMPABLE = 4
#: What the child runs: read [name, args] lines on stdin, answer one JSON line each on stdout.
RUNNER = """
import ctypes, errno, json, os, struct, sys
sys.path.insert(0, sys.argv[1])


def confine(work):
    # Landlock (ABI 1 rights), before the answer is imported: read /usr, read and write work, nothing else, so
    # it cannot read the split's expected values in the data folder. A kernel without Landlock runs unconfined.
    libc = ctypes.CDLL(None, use_errno=True)
    handled = (1 << 13) - 1
    ruleset = libc.syscall(444, struct.pack("Q", handled), 8, 0)
    if ruleset < 0:
        if ctypes.get_errno() in (errno.ENOSYS, errno.EOPNOTSUPP):
            return
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    read, write = 1 | 4 | 8, 2 | 16 | 32 | 128 | 256
    for path, allowed in (("/usr", read), ("/dev", 2 | 4), (work, read | write)):
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        if libc.syscall(445, ruleset, 1, struct.pack("=Qi", allowed, fd), 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_add_rule " + path)
        os.close(fd)
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.syscall(446, ruleset, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    os.close(ruleset)


confine(sys.argv[1])
out = sys.stdout
sys.stdout = sys.stderr
try:
    import solution
except BaseException:
    solution = None
for line in sys.stdin:
    name, args = json.loads(line)
    try:
        answer = json.dumps({"value": getattr(solution, name)(*args)})
    except BaseException:
        answer = json.dumps({"error": True})
    out.write(answer + "\\n")
    out.flush()
"""


def make_undumpable() -> None:
    """Make /proc/SELF/fd of this process unopenable by processes of the same user (exits if it cannot)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        sys.exit("prctl(PR_SET_DUMPABLE, 0) failed")


def canonical(value: Any) -> str:
    """The JSON of ``value`` with sorted keys: equal only for the same data of the same JSON types."""
    return json.dumps(value, sort_keys=True)


def passed_count(answers: list[str], expected: list[Any]) -> int:
    """How many of the child's answer lines carry the expected value, in order."""
    passed = 0
    for line, want in zip(answers, expected, strict=False):
        try:
            answer = json.loads(line)
        except ValueError:
            continue
        if isinstance(answer, dict) and "value" in answer and canonical(answer["value"]) == canonical(want):
            passed += 1
    return passed


def run_cases(solution: str, cases: dict[str, list[list[Any]]]) -> int:
    """Run every case against ``solution`` in a child and return how many it passed (0 on a timeout)."""
    requests = [(name, args, want) for name, rows in sorted(cases.items()) for args, want in rows]
    work = Path(tempfile.mkdtemp(prefix="code-"))
    (work / "solution.py").write_text(solution, encoding="utf-8")
    stdin = "".join(json.dumps([name, args]) + "\n" for name, args, _ in requests)
    try:
        done = subprocess.run([sys.executable, "-I", "-c", RUNNER, str(work)], cwd=work, input=stdin.encode(),
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=RUN_TIMEOUT_S,
                              close_fds=True, check=False)
    except subprocess.TimeoutExpired:
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)
    answers = done.stdout.decode("utf-8", "replace").splitlines()
    return passed_count(answers, [want for _, _, want in requests])


def main() -> None:
    make_undumpable()
    artifact, data = Path(sys.argv[1]), Path(sys.argv[2])
    expected = int((data / "expected.txt").read_text(encoding="utf-8").strip())
    cases = json.loads((data / "cases.json").read_text(encoding="utf-8"))
    solution = artifact.read_bytes().decode("utf-8", "replace")
    passed = run_cases(solution, cases) if expected > 0 else 0
    print(min(passed, expected) * SCALE // expected if expected > 0 else 0)


if __name__ == "__main__":
    main()
