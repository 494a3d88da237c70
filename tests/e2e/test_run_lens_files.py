"""``swarmyard run`` refuses, with one typed line and exit 1 before anything exists, a lens whose files would copy
into its machines what must never be there: the runs folder itself (``files = ["."]`` beside a swarm file run
from its own folder: the run's store, audit log and plane socket) or a file that usually holds secrets (``.env``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from rigs.cli import cli_env, run_cli

SWARM = """[goal]
objective = "Read the notes."
budget_usd = "0.10"
call_cap = 30
deadline_s = 120
[[tasks.lenses]]
title = "reader"
prompt = "Read the notes."
files = [FILES]
[workers]
count = 1
model = "scripted-worker"
[lead]
model = "scripted-worker"
[providers.script]
kind = "scripted"
models = ["scripted-worker"]
replies = "replies.json"
"""


def _run(short_tmp: Path, files: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The swarm file in an ordinary folder ``work`` with a note beside it, run from that folder with the
    default runs folder (``work/runs``); its temporary and state folders are siblings of ``work``."""
    work = short_tmp / "work"
    work.mkdir(exist_ok=True)
    (work / "swarm.toml").write_text(SWARM.replace("FILES", files))
    (work / "replies.json").write_text('{"*": [{"say": "done"}]}')
    (work / "notes.txt").write_text("the notes\n")
    (short_tmp / "tmp").mkdir()
    env = cli_env(work, TMPDIR=str(short_tmp / "tmp"), SWARMYARD_STATE_DIR=str(short_tmp / "state"))
    return run_cli("run", "swarm.toml", cwd=work, env=env, timeout_s=120), work


def _one_typed_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 1, (done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "config_error" in lines[0] and "internal" not in lines[0], lines[0]
    assert "Traceback" not in done.stderr and done.stdout == ""
    return lines[0]


def _nothing_made(short_tmp: Path) -> None:
    # no runs folder (so no store, goal or socket), no machine, no private state, nothing in the temporary folder
    assert sorted(p.name for p in short_tmp.iterdir()) == ["tmp", "work"]
    assert list((short_tmp / "tmp").iterdir()) == []


def test_a_lens_of_the_folder_that_holds_the_runs_folder_is_refused(short_tmp: Path) -> None:
    done, work = _run(short_tmp, '"."')
    line = _one_typed_line(done)
    assert "tasks.lenses.0.files" in line and "runs folder" in line and str(work / "runs") in line, line
    _nothing_made(short_tmp)
    assert sorted(p.name for p in work.iterdir()) == ["notes.txt", "replies.json", "swarm.toml"]


def test_a_lens_folder_holding_an_env_file_is_refused(short_tmp: Path) -> None:
    sub = short_tmp / "work" / "sub"
    sub.mkdir(parents=True)
    (sub / "notes.txt").write_text("the notes\n")
    (sub / ".env").write_text("OPENAI_API_KEY=sk-not-a-real-key-0123456789\n")
    done, work = _run(short_tmp, '"sub"')
    line = _one_typed_line(done)
    assert "tasks.lenses.0.files" in line and str(sub / ".env") in line and "secrets" in line, line
    assert "sk-not" not in done.stderr
    _nothing_made(short_tmp)
    assert sorted(p.name for p in work.iterdir()) == ["notes.txt", "replies.json", "sub", "swarm.toml"]


def test_a_lens_that_names_a_link_to_a_folder_outside_is_refused_not_followed(short_tmp: Path) -> None:
    # files = ["docs"], docs a link to a folder elsewhere on the host (~/.aws, say): never copied into a machine
    outside = short_tmp / "outside" / ".aws"
    outside.mkdir(parents=True)
    (outside / "credentials").write_text("aws_secret_access_key = not-a-real-secret-0123456789\n")
    work = short_tmp / "work"
    work.mkdir()
    (work / "docs").symlink_to(outside)
    done, _ = _run(short_tmp, '"docs"')
    line = _one_typed_line(done)
    assert "tasks.lenses.0.files" in line and str(work / "docs") in line and "symbolic link" in line, line
    assert "not-a-real" not in done.stderr and "credentials" not in done.stderr
    assert sorted(p.name for p in short_tmp.iterdir()) == ["outside", "tmp", "work"]
    assert list((short_tmp / "tmp").iterdir()) == []
    assert sorted(p.name for p in work.iterdir()) == ["docs", "notes.txt", "replies.json", "swarm.toml"]
