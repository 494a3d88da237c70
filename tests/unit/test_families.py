"""Task families: the same seed gives the same instance, and each verifier scores right, wrong and malformed
answers as it should; bad input is refused and writes nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from swarmyard.config import load_config
from swarmyard.errors import ConfigError, UserError
from swarmyard.families import FAMILIES, generate, instance, polyomino, reconciliation
from swarmyard.families import code as code_family
from swarmyard.families.scorers.code import passed_count
from swarmyard.families.scorers.polyomino import packing_score
from swarmyard.families.scorers.reconciliation import SCALE, f1_score, named_ids


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_same_seed_writes_the_same_files_and_another_seed_others(tmp_path: Path, name: str) -> None:
    first = _tree(generate(name, 7, tmp_path / "a"))
    again = _tree(generate(name, 7, tmp_path / "b"))
    other = _tree(generate(name, 8, tmp_path / "c"))
    assert first == again
    assert first != other
    assert {"tasks.toml", "bundle/evaluator.toml", "bundle/score.py"} <= set(first)
    assert any(k.startswith("bundle/search/") for k in first) and any(k.startswith("bundle/holdout/") for k in first)


def test_reconciliation_has_ten_shards_and_fifteen_inconsistent_records() -> None:
    made = instance("reconciliation", 3)
    assert len(made.tasks) == 10
    truth = json.loads(made.holdout["truth.json"])
    assert len(truth["inconsistent"]) == 15 and truth["inconsistent"] == sorted(truth["inconsistent"])
    # what the shards' files disagree on is exactly the truth: no record is inconsistent by accident
    found = set()
    for task in made.tasks:
        ledger = set(task.files["ledger.csv"].splitlines()[1:])
        bank = set(task.files["bank.csv"].splitlines()[1:])
        found |= {line.split(",")[0] for line in ledger ^ bank}
    assert sorted(found) == truth["inconsistent"] == reconciliation.answer(3)
    search = json.loads(made.search["truth.json"])
    assert len(search["universe"]) == 200 and set(search["inconsistent"]) <= set(truth["inconsistent"])


def test_reconciliation_f1() -> None:
    truth = set(reconciliation.answer(1))
    universe = set(json.loads(instance("reconciliation", 1).holdout["truth.json"])["universe"])
    assert f1_score(truth, truth, universe) == SCALE
    assert f1_score(set(), truth, universe) == 0
    half = set(sorted(truth)[:5])
    assert f1_score(half, truth, universe) == 2 * 5 * SCALE // (2 * 5 + 10)
    wrong = set(sorted(universe - truth)[:15])
    assert f1_score(truth | wrong, truth, universe) == 666_666  # precision 1/2, recall 1: F1 2/3
    # ids named twice, in prose, in any order are one answer; ids outside the universe are not judged
    text = "Found: " + ", ".join(sorted(truth, reverse=True)) + "\n" + " ".join(sorted(truth)) + " TX-00000"
    assert f1_score(named_ids(text), truth, universe) == SCALE
    assert named_ids("TX-1234 tx-12345 TX-123456 garbage \x00\xff") == set()


def test_polyomino_exact_verifier() -> None:
    puzzle = json.loads(instance("polyomino", 2).holdout["puzzle.json"])
    solved = polyomino.solution(2)
    assert packing_score(solved, puzzle) == SCALE
    assert packing_score("here it is:\n" + solved + "thanks", puzzle) == SCALE  # other lines are ignored
    empty = "\n".join("." * 6 for _ in range(6))
    assert packing_score(empty, puzzle) == 0
    lines = solved.splitlines()
    # one piece taken out: the rest still counts
    letter = lines[0][0]
    size = solved.count(letter)
    without = "\n".join(line.replace(letter, ".") for line in lines)
    assert packing_score(without, puzzle) == (36 - size) * SCALE // 36
    # a piece's shape changed, a letter with no piece, no grid at all: 0
    grown = "\n".join([lines[0].replace(lines[0][1], letter, 1) if lines[0][1] != letter else lines[0], *lines[1:]])
    if grown != solved:
        assert packing_score(grown, puzzle) == 0
    assert packing_score(solved.replace(letter, "Z"), puzzle) == 0
    assert packing_score("no grid here", puzzle) == 0
    assert packing_score("\n".join(lines[:5]), puzzle) == 0


def test_code_scorer_counts_only_the_expected_values_as_json() -> None:
    answers = ['{"value": "ab"}', '{"error": true}', 'not json', '{"value": 1}', '{"value": [1, 2]}']
    # True is not 1 and the list must match exactly; a missing answer (the fifth expected) is not passed
    assert passed_count(answers, ["ab", "x", "y", True, [1, 2], "z"]) == 2
    assert passed_count([], ["ab"]) == 0


def test_code_reference_passes_its_visible_tests_and_the_stub_fails_them(tmp_path: Path) -> None:
    folder = generate("code", 5, tmp_path / "inst")
    repo = folder / "inputs" / "repo"
    stub = (repo / "solution.py").read_text()
    run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"]
    assert subprocess.run(run, cwd=repo, capture_output=True).returncode == 1
    (repo / "solution.py").write_text(code_family.reference_solution(5))
    done = subprocess.run(run, cwd=repo, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:]
    assert "raise NotImplementedError" in stub


@pytest.mark.parametrize(("name", "seed", "words"), [
    ("nope", 1, "no task family 'nope'"),
    ("reconciliation", -1, "the seed must be"),
    ("reconciliation", 1 << 63, "the seed must be"),
    ("polyomino", True, "the seed must be"),
])
def test_bad_family_or_seed_is_refused_and_writes_nothing(tmp_path: Path, name: str, seed: int, words: str) -> None:
    with pytest.raises(UserError, match=words):
        generate(name, seed, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_folder_that_is_not_empty_is_refused_untouched(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(UserError, match="not an empty folder"):
        generate("code", 1, tmp_path / "out")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]


def _swarm(folder: Path, tasks: str) -> Path:
    path = folder / "swarm.toml"
    path.write_text(f'[goal]\nobjective = "x"\nbudget_usd = "1"\n{tasks}\n')
    return path


def test_from_family_takes_an_instance_s_lenses_with_their_files(tmp_path: Path) -> None:
    generate("reconciliation", 1, tmp_path / "inst")
    config = load_config(_swarm(tmp_path, '[tasks]\nfrom_family = "inst"'))
    assert [lens.title for lens in config.tasks.lenses] == [f"shard {i:02d}" for i in range(1, 11)]
    assert config.tasks.lenses[0].files == (str((tmp_path / "inst" / "inputs" / "shard-01").resolve()),)


@pytest.mark.parametrize(("tasks", "words"), [
    ('[tasks]\nfrom_family = "missing"', "holds no tasks.toml"),
    ('[[tasks.lenses]]\ntitle = "a"\nfiles = ["nothing-here"]', "does not exist"),
    ('[[tasks.lenses]]\ntitle = "a"\nfiles = ["data"]\n[[tasks.lenses]]\ntitle = "a"\nfiles = ["data"]',
     "titles of their own"),
    ('[tasks]\nfrom_family = "inst"\n[[tasks.lenses]]\ntitle = "a"', "either lenses or from_family"),
])
def test_unusable_task_files_are_a_config_error(tmp_path: Path, tasks: str, words: str) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.txt").write_text("x")
    generate("polyomino", 1, tmp_path / "inst")
    with pytest.raises(ConfigError, match=words):
        load_config(_swarm(tmp_path, tasks))


def test_a_symbolic_link_in_task_files_is_refused(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "link").symlink_to("/etc/hostname")
    with pytest.raises(ConfigError, match="not a regular file"):
        load_config(_swarm(tmp_path, '[[tasks.lenses]]\ntitle = "a"\nfiles = ["data"]'))


def test_the_shipped_reconciliation_instance_is_seed_one_as_generated(tmp_path: Path) -> None:
    shipped = Path(__file__).resolve().parents[2] / "examples" / "reconciliation" / "seed-1"
    assert _tree(shipped) == _tree(generate("reconciliation", 1, tmp_path / "again"))


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_ships_its_seed_one_instance_and_a_swarm_file_that_parses(tmp_path: Path, name: str) -> None:
    shipped = Path(__file__).resolve().parents[2] / "examples" / name
    assert _tree(shipped / "seed-1") == _tree(generate(name, 1, tmp_path / "again"))
    config = load_config(shipped / "swarm.toml")
    assert config.tasks.from_family == str((shipped / "seed-1").resolve())
    assert config.evaluator is not None and config.evaluator.bundle_path == (shipped / "seed-1" / "bundle").resolve()


def test_a_symbolic_link_to_a_folder_in_task_files_is_refused_not_skipped(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.txt").write_text("x")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "data" / "out").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match=r"out is not a regular file \(a symbolic link"):
        load_config(_swarm(tmp_path, '[[tasks.lenses]]\ntitle = "a"\nfiles = ["data"]'))


def test_a_socket_or_a_named_pipe_in_task_files_is_refused_by_name(short_tmp: Path) -> None:
    import os
    import socket

    (short_tmp / "data").mkdir()
    os.mkfifo(short_tmp / "data" / "pipe")
    with pytest.raises(ConfigError, match=r"pipe is not a regular file \(a named pipe\)"):
        load_config(_swarm(short_tmp, '[[tasks.lenses]]\ntitle = "a"\nfiles = ["data"]'))
    (short_tmp / "data" / "pipe").unlink()
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(short_tmp / "data" / "plane.sock"))
        with pytest.raises(ConfigError, match=r"plane\.sock is not a regular file \(a socket\)"):
            load_config(_swarm(short_tmp, '[[tasks.lenses]]\ntitle = "a"\nfiles = ["data"]'))


@pytest.mark.parametrize(("name", "secret"), [(".env", True), (".env.local", True), (".netrc", True),
                                              ("id_ed25519", True), (".env.example", False), ("env.txt", False),
                                              ("notes.env", False)])
def test_a_file_that_usually_holds_secrets_is_refused_in_task_files(tmp_path: Path, name: str,
                                                                    secret: bool) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.txt").write_text("x")
    (tmp_path / "data" / name).write_text("KEY=value\n")
    for files in ('["data"]', f'["data/{name}"]'):  # in a lens folder or named on its own
        text = f'[[tasks.lenses]]\ntitle = "a"\nfiles = {files}'
        if secret:
            with pytest.raises(ConfigError, match=f"{name} is a file that usually holds secrets"):
                load_config(_swarm(tmp_path, text))
        else:
            assert load_config(_swarm(tmp_path, text)).tasks.lenses[0].files


@pytest.mark.parametrize(("files", "words"), [('["."]', "holds the runs folder"), ('["out"]', "holds the runs folder"),
                                              ('["out/runs"]', "holds the runs folder"),
                                              ('["out/runs/old"]', "is in the runs folder")])
def test_a_lens_that_holds_the_runs_folder_or_lies_in_it_is_refused_before_the_run(
        tmp_path: Path, files: str, words: str) -> None:
    from swarmyard.swarm.preflight import check_host

    (tmp_path / "out" / "runs" / "old").mkdir(parents=True)
    (tmp_path / "out" / "runs" / "old" / "run.json").write_text("{}")
    text = (f'[[tasks.lenses]]\ntitle = "a"\nfiles = {files}\n'
            f'[run]\nsandbox = "process"\nruns_dir = "{tmp_path / "out" / "runs"}"')
    config = load_config(_swarm(tmp_path, text))
    with pytest.raises(ConfigError, match=words) as raised:
        check_host(config)
    assert raised.value.field == "tasks.lenses.0.files"
    # beside it, not in it: fine
    check_host(load_config(_swarm(tmp_path, text.replace(files, '["swarm.toml"]'))))


@pytest.mark.parametrize("target", ["file", "folder"])
def test_a_symbolic_link_named_in_task_files_is_refused_not_followed(tmp_path: Path, target: str) -> None:
    # a link named directly in files (not only one under a lens folder) to a file or a folder anywhere
    (tmp_path / "fakehome" / ".aws").mkdir(parents=True)
    (tmp_path / "fakehome" / ".aws" / "credentials").write_text("aws_secret_access_key = not-a-real-key\n")
    (tmp_path / "work").mkdir()
    pointed = tmp_path / "fakehome" / ".aws" / ("credentials" if target == "file" else "")
    (tmp_path / "work" / "docs").symlink_to(pointed)
    for files in ('["docs"]', '["docs/."]', f'["{tmp_path / "work" / "docs"}"]'):
        with pytest.raises(ConfigError, match=r"docs is not a regular file \(a symbolic link") as raised:
            load_config(_swarm(tmp_path / "work", f'[[tasks.lenses]]\ntitle = "a"\nfiles = {files}'))
        assert str(tmp_path / "work" / "docs") in str(raised.value) and "not-a-real" not in str(raised.value)


def test_a_link_among_the_folders_above_a_named_path_is_followed_but_not_its_last_part(tmp_path: Path) -> None:
    # /home/u a link to /data/u, as hosts often have: a lens named through it works; a link it names does not
    (tmp_path / "data" / "u" / "notes").mkdir(parents=True)
    (tmp_path / "data" / "u" / "notes" / "a.txt").write_text("a")
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "u").symlink_to(tmp_path / "data" / "u")
    (tmp_path / "data" / "u" / "link").symlink_to(tmp_path / "data" / "u" / "notes")
    for files in ('["notes"]', f'["{tmp_path / "home" / "u" / "notes"}"]'):
        config = load_config(_swarm(tmp_path / "home" / "u", f'[[tasks.lenses]]\ntitle = "a"\nfiles = {files}'))
        assert config.tasks.lenses[0].files == (str(tmp_path / "data" / "u" / "notes"),)
    for files in ('["link"]', f'["{tmp_path / "home" / "u" / "link"}"]'):
        with pytest.raises(ConfigError, match=r"link is not a regular file \(a symbolic link"):
            load_config(_swarm(tmp_path / "home" / "u", f'[[tasks.lenses]]\ntitle = "a"\nfiles = {files}'))


def test_secret_names_are_matched_whatever_their_case_with_key_variants_and_more_names(tmp_path: Path) -> None:
    from swarmyard.families.tasks import secret_file_name

    refused = [".ENV", ".Env", ".ENV.local", ".NETRC", "ID_RSA", "_netrc", "_NETRC", "id_rsa.bak", "id_rsa_work",
               "id_ed25519_sk", "id_ecdsa-old", "ID_DSA.orig", ".envrc", ".ENVRC", ".npmrc", ".PGPASS"]
    allowed = ["id_rsa.pub", "ID_ED25519_SK.PUB", ".env.example", ".ENV.example", ".Env.Sample", ".env.TEMPLATE",
               ".ENV.DIST", "notes.txt", "environment.md", "identity.txt"]
    assert [name for name in refused if not secret_file_name(name)] == []
    assert [name for name in allowed if secret_file_name(name)] == []
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.txt").write_text("x")
    (tmp_path / "data" / "id_rsa.pub").write_text("ssh-rsa AAAA\n")
    (tmp_path / "data" / ".ENV.example").write_text("KEY=\n")
    text = '[[tasks.lenses]]\ntitle = "a"\nfiles = ["data"]'
    assert load_config(_swarm(tmp_path, text)).tasks.lenses[0].files
    (tmp_path / "data" / ".ENV").write_text("KEY=value\n")
    with pytest.raises(ConfigError, match=r"\.ENV is a file that usually holds secrets"):
        load_config(_swarm(tmp_path, text))
