"""Bundle loading: the example bundle loads; every malformed bundle is a BundleError naming the field."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from swarmyard.errors import BundleError
from swarmyard.evaluator.bundle import Split, load_bundle

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "bundles" / "sort-numbers"

GOOD_TOML = """
name = "tiny"
[scoring]
entry = "score.py"
[limits]
timeout_s = 5
"""


def make(root: Path, toml: str = GOOD_TOML, *, entry: str | None = "score.py",
         splits: tuple[str, ...] = ("search", "holdout")) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "evaluator.toml").write_text(toml)
    if entry is not None:
        (root / entry).write_text("print(1)\n")
    for split in splits:
        (root / split).mkdir()
    return root


def test_the_example_bundle_loads() -> None:
    bundle = load_bundle(EXAMPLE)
    assert bundle.name == "sort-numbers"
    assert bundle.entry_path == EXAMPLE / "score.py"
    assert bundle.split_dir(Split.HOLDOUT) == EXAMPLE / "holdout"
    assert bundle.limits.cpu_s == 10


def test_defaults_fill_missing_limits(tmp_path: Path) -> None:
    bundle = load_bundle(make(tmp_path / "b"))
    assert bundle.limits.timeout_s == 5
    assert bundle.limits.memory_mib == 512
    assert bundle.manifest.scoring.interpreter == "/usr/bin/python3"


@pytest.mark.parametrize(("toml", "field"), [
    ("name = \n", "evaluator.toml"),
    ("[scoring]\nentry = 'score.py'\n", "name"),
    ("name = 'tiny'\n", "scoring"),
    ("name = 'Tiny Bundle'\n[scoring]\nentry = 'score.py'\n", "name"),
    ("name = 'tiny'\n[scoring]\nentry = '../score.py'\n", "scoring.entry"),
    ("name = 'tiny'\n[scoring]\nentry = '/etc/passwd'\n", "scoring.entry"),
    ("name = 'tiny'\n[scoring]\nentry = 'score.py'\ninterpreter = '/opt/python'\n", "scoring.interpreter"),
    ("name = 'tiny'\n[scoring]\nentry = 'score.py'\ninterpreter = '/usr/bin/no-such-python'\n",
     "scoring.interpreter"),
    ("name = 'tiny'\n[scoring]\nentry = 'score.py'\n[limits]\ntimeout_s = '10'\n", "limits.timeout_s"),
    ("name = 'tiny'\n[scoring]\nentry = 'score.py'\n[limits]\ntimeout_s = 0\n", "limits.timeout_s"),
    ("name = 'tiny'\n[scoring]\nentry = 'score.py'\n[limits]\nmemory_mib = true\n", "limits.memory_mib"),
    ("name = 'tiny'\n[scoring]\nentry = 'score.py'\n[limits]\nmemory_mb = 10\n", "limits.memory_mb"),
    ("name = 'tiny'\nowner = 'me'\n[scoring]\nentry = 'score.py'\n", "owner"),
])
def test_malformed_toml_names_the_field(tmp_path: Path, toml: str, field: str) -> None:
    root = make(tmp_path / "b", toml)
    with pytest.raises(BundleError) as caught:
        load_bundle(root)
    assert caught.value.field == field
    assert field in str(caught.value)
    assert caught.value.path == str(root)


def test_missing_manifest(tmp_path: Path) -> None:
    root = tmp_path / "b"
    root.mkdir()
    with pytest.raises(BundleError) as caught:
        load_bundle(root)
    assert caught.value.field == "evaluator.toml"


def test_not_a_folder(tmp_path: Path) -> None:
    with pytest.raises(BundleError) as caught:
        load_bundle(tmp_path / "missing")
    assert caught.value.field == "bundle"


def test_missing_entry_file(tmp_path: Path) -> None:
    with pytest.raises(BundleError) as caught:
        load_bundle(make(tmp_path / "b", entry=None))
    assert caught.value.field == "scoring.entry"


@pytest.mark.parametrize("missing", ["search", "holdout"])
def test_missing_split_folder(tmp_path: Path, missing: str) -> None:
    splits = tuple(s for s in ("search", "holdout") if s != missing)
    with pytest.raises(BundleError) as caught:
        load_bundle(make(tmp_path / "b", splits=splits))
    assert caught.value.field == f"{missing}/"


def test_a_symlink_is_refused(tmp_path: Path) -> None:
    root = make(tmp_path / "b")
    (root / "holdout" / "cases.json").symlink_to("/etc/passwd")
    with pytest.raises(BundleError) as caught:
        load_bundle(root)
    assert caught.value.field == "holdout/cases.json"


def test_a_bad_bundle_changes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "b"
    shutil.copytree(EXAMPLE, root)
    (root / "evaluator.toml").write_text("name = 3\n")
    before = {p: (p.stat().st_mode, p.read_bytes() if p.is_file() else b"") for p in root.rglob("*")}
    with pytest.raises(BundleError):
        load_bundle(root)
    after = {p: (p.stat().st_mode, p.read_bytes() if p.is_file() else b"") for p in root.rglob("*")}
    assert before == after
