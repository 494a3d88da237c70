"""The local model's assembly says what it does: ``assemble_qwen`` run for real on six small part files (the pinned
size and hash swapped for theirs), its progress on a stream that is not a terminal (plain lines at each quarter,
then the hash check and where the model is), on one (a rich bar), and nothing when quiet."""

from __future__ import annotations

import hashlib
import io
import sys
from pathlib import Path
from types import ModuleType

import pytest

from swarmyard.broker.providers import local
from swarmyard.progress import ByteProgress


@pytest.fixture
def parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> bytes:
    whole = b""
    names = []
    for n in range(6):
        data = bytes([n]) * 1000
        whole += data
        path = tmp_path / f"part{n}"
        path.write_bytes(data)
        module = ModuleType(f"fake_model_part{n}")
        module.get_part_path = lambda p=path: str(p)  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, module.__name__, module)
        names.append(module.__name__)
    monkeypatch.setattr(local, "QWEN_PARTS", tuple(names))
    monkeypatch.setattr(local, "QWEN_SIZE", len(whole))
    monkeypatch.setattr(local, "QWEN_SHA256", hashlib.sha256(whole).hexdigest())
    return whole


def test_the_assembly_says_each_quarter_the_hash_check_and_where_the_model_is(
        parts: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    said = io.StringIO()
    monkeypatch.setattr(sys, "stderr", said)
    monkeypatch.delenv("SWARMYARD_QUIET", raising=False)
    model = local.assemble_qwen(tmp_path / "cache")
    assert model.path.read_bytes() == parts
    lines = said.getvalue().splitlines()
    target = tmp_path / "cache" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    head = f"assembling the local model qwen2.5-coder-0.5b into {target} (once)"
    assert lines[0] == f"{head}: 0 of 0 MB"
    assert [line.rsplit("(", 1)[1] for line in lines[1:5]] == ["25%)", "50%)", "75%)", "100%)"]
    assert lines[5:] == ["checking the assembled model's sha256 (qwen2.5-coder-0.5b)",
                         f"the local model qwen2.5-coder-0.5b is assembled: {target}"]
    # assembled once: a second call finds it and says nothing
    said.truncate(0)
    said.seek(0)
    assert local.assemble_qwen(tmp_path / "cache").path == target and said.getvalue() == ""


def test_quiet_assembles_without_a_word(parts: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    said = io.StringIO()
    monkeypatch.setattr(sys, "stderr", said)
    monkeypatch.setenv("SWARMYARD_QUIET", "1")
    assert local.assemble_qwen(tmp_path / "cache").path.read_bytes() == parts
    assert said.getvalue() == ""


def test_on_a_terminal_it_is_a_bar_of_bytes() -> None:
    out = io.StringIO()
    bar = ByteProgress("assembling", 4_000_000, stream=out, live=True, quiet=False)
    bar.advance(2_000_000)
    bar.note("checking")
    bar.close()
    text = out.getvalue()
    assert "\x1b[" in text and "assembling" in text and "checking" in text
    assert "4.0 MB" in text  # the total, in bytes as a download bar says them
