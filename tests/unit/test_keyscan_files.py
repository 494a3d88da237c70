"""The key scan's reading of a machine's files from outside: streamed (a key across two reads is found), bounded
(a file past the bound is counted as not scanned, never passed as clean), links not followed."""

from __future__ import annotations

import os
from pathlib import Path

from swarmyard.machines.supervised import HostView
from swarmyard.swarm import keyscan

KEY = "sk-scan-0123456789abcdefXYZ"


def _view(root: Path) -> HostView:
    (root / "machine").mkdir()
    return HostView(root, (), os.readlink("/proc/self/ns/mnt"), "/machine")


def test_a_key_across_two_reads_is_found(tmp_path: Path) -> None:
    view = _view(tmp_path)
    # the key starts 5 bytes before the first read ends
    (tmp_path / "machine" / "big.bin").write_bytes(b"\0" * ((1 << 20) - 5) + KEY.encode() + b"\0" * 100)
    assert keyscan.scan_view(view, [KEY]) == ["/machine/big.bin"]


def test_a_file_past_the_bound_is_counted_not_passed(tmp_path: Path) -> None:
    view = _view(tmp_path)
    (tmp_path / "machine" / "big.bin").write_bytes(b"\0" * 4096 + KEY.encode())
    places = keyscan.scan_view(view, [KEY], max_bytes=1024)
    assert len(places) == 1 and "1 files not scanned" in places[0]


def test_a_link_is_not_followed(tmp_path: Path) -> None:
    view = _view(tmp_path)
    (tmp_path / "outside.txt").write_text(KEY)
    (tmp_path / "machine" / "link").symlink_to(tmp_path / "outside.txt")
    (tmp_path / "machine" / "dir").symlink_to(tmp_path)
    assert keyscan.scan_view(view, [KEY]) == []


def test_a_socket_or_fifo_is_passed_over(tmp_path: Path) -> None:
    import socket

    view = _view(tmp_path)
    os.mkfifo(tmp_path / "machine" / "fifo")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "machine" / "sock"))
        assert keyscan.scan_view(view, [KEY]) == []  # not "2 files not scanned": they hold no file's bytes
