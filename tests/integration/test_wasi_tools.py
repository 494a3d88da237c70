"""The shipped WASI tools through the runner a governed agent uses: each answers correctly, and each is stopped by
its fuel cap and its memory cap and refuses a path outside its folder, as a typed ``ToolError``; the folder is
read-only unless the tool is a writer; a wall-clock cap stops an endless loop; the runner carries on after a trap.

The modules are built from their C source (``python -m swarmyard.wasi.build``) into a temporary folder first.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from swarmyard.errors import ToolError, WasiTrapError
from swarmyard.wasi import SHIPPED, ParamType, WasiCaps, WasiRunner, WasiToolSpec

pytest.importorskip("wasmtime", reason="WASI tools need the wasi extra (scripts/test installs the dev extra)")
pytestmark = pytest.mark.skipif(shutil.which("clang") is None,
                                reason="needs clang, lld and wasi-libc (scripts/test installs them)")


@pytest.fixture(scope="module")
def built(wasi_built: Path) -> Path:
    """The session's build (tests/conftest.py): every shipped tool and the two test modules."""
    assert sorted(p.name for p in wasi_built.glob("*.wasm")) == sorted(f"{n}.wasm" for n in (*SHIPPED, "echo", "spin"))
    return wasi_built


def test_the_build_refuses_an_sqlite_that_is_not_the_pinned_one(built: Path, tmp_path: Path) -> None:
    from swarmyard.wasi.build import SQLITE_FILES

    # the amalgamation the module fixture fetched and checked, with one byte of its source changed
    changed = tmp_path / "changed"
    changed.mkdir()
    for name in SQLITE_FILES:
        shutil.copyfile(built / "sqlite" / name, changed / name)
    with (changed / "sqlite3.c").open("ab") as f:
        f.write(b"\n")
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "swarmyard.wasi.build", "--out", str(out), "--sqlite", str(changed)],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 1
    assert "is not the sqlite3.c of better-sqlite3@13.2.0" in done.stderr and "SHA-256" in done.stderr
    assert not (out / "sqlquery.wasm").exists() and not (out / "sqlite").exists()


@pytest.fixture
def data(tmp_path: Path) -> Path:
    folder = tmp_path / "data"
    (folder / "sub").mkdir(parents=True)
    (folder / "left.csv").write_text('id,name,qty\n1,apple,3\n2,pear,5\n3,"fig, dried",7\n')
    (folder / "right.csv").write_text('id,name,qty,origin\n1,apple,4,es\n3,"fig, dried",7,tr\n4,kiwi,1,nz\n')
    (folder / "orders.json").write_text(json.dumps({"orders": [{"total": 3}, {"total": 4.5, "note": 'a "b"'}],
                                                    "a key": None}))
    (folder / "sub" / "notes.txt").write_text("first line\nthe Ledger is off by one\nlast\n")
    (tmp_path / "secret.txt").write_text("outside the folder")
    import sqlite3

    with contextlib.closing(sqlite3.connect(folder / "shop.db")) as db, db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total REAL, note TEXT, raw BLOB)")
        db.executemany("INSERT INTO orders VALUES (?, ?, ?, ?)",
                       [(1, 3.0, "first", None), (2, 4.5, 'a "b"', b"\x00\xff"), (3, None, None, None)])
    return folder


@pytest.fixture(scope="module")
def runner() -> WasiRunner:
    return WasiRunner()


def _spec(built: Path, name: str, folder: Path, **kwargs: Any) -> WasiToolSpec:
    tool = SHIPPED[name]
    return WasiToolSpec(name, tool.description, built / f"{name}.wasm", folder, tool.params, tool.required, **kwargs)


# one correct call, one argument set that makes it work hard enough to trap, and a path argument per tool
CALLS: dict[str, tuple[dict[str, Any], str]] = {
    "csvdiff": ({"left": "left.csv", "right": "right.csv"}, "left"),
    "jsonquery": ({"path": "orders.json", "query": ".orders[1].note"}, "path"),
    "textsearch": ({"pattern": "ledger", "ignore_case": True}, "path"),
    "sqlquery": ({"csv": "left.csv", "query": "SELECT count(*), max(id) FROM data"}, "csv"),
}


def test_csvdiff_answers_added_removed_and_changed(built: Path, data: Path, runner: WasiRunner) -> None:
    result = runner.call(_spec(built, "csvdiff", data), {"left": "left.csv", "right": "right.csv", "key": "id"})
    assert result == {"key": "id", "left_rows": 3, "right_rows": 3, "same": 1, "added": ["4"], "removed": ["2"],
                      "changed": [{"key": "1", "column": "qty", "left": "3", "right": "4"}],
                      "columns_added": ["origin"], "columns_removed": [], "truncated": False}


def test_jsonquery_picks_a_value_and_says_when_none_is_there(built: Path, data: Path, runner: WasiRunner) -> None:
    spec = _spec(built, "jsonquery", data)
    assert runner.call(spec, {"path": "orders.json", "query": ".orders[1].note"}) == {
        "found": True, "type": "string", "value": 'a "b"'}
    assert runner.call(spec, {"path": "orders.json", "query": ".orders"})["length"] == 2
    assert runner.call(spec, {"path": "orders.json", "query": '.["a key"]'})["type"] == "null"
    assert runner.call(spec, {"path": "orders.json", "query": ".orders[5]"}) == {"found": False,
                                                                                  "missing": "[5]"}
    (data / "bad.json").write_text('{"a": [1, 2,]}')
    with pytest.raises(ToolError) as bad:
        runner.call(spec, {"path": "bad.json", "query": "."})
    assert bad.value.reason == "bad_input" and "not valid JSON" in bad.value.message


def test_textsearch_finds_lines_in_a_folder(built: Path, data: Path, runner: WasiRunner) -> None:
    result = runner.call(_spec(built, "textsearch", data), {"pattern": "ledger", "ignore_case": True})
    assert result["matches"] == [{"path": "sub/notes.txt", "line": 2, "text": "the Ledger is off by one"}]
    assert result["truncated"] is False
    assert runner.call(_spec(built, "textsearch", data), {"pattern": "ledger"})["matches"] == []


def test_textsearch_cuts_a_long_line_between_characters_not_inside_one(built: Path, data: Path,
                                                                      runner: WasiRunner) -> None:
    # 399 ASCII bytes, then an "é" (2 bytes) across the 400-byte cut: the cut used to split it, and the line came
    # back ending in U+FFFD, words the file does not hold, so no citation of it could be checked
    line = "x" * 399 + "é and the rest of the line"
    (data / "long.txt").write_text(line + "\n", encoding="utf-8")
    [match] = runner.call(_spec(built, "textsearch", data), {"pattern": "rest of", "path": "long.txt"})["matches"]
    assert match["text"] == "x" * 399 and line.startswith(match["text"])


def test_textsearch_cuts_a_long_line_at_the_end_of_a_word(built: Path, data: Path, runner: WasiRunner) -> None:
    # the plane refuses a quote that ends inside a word: a line cut mid-word could never be cited as returned
    line = " ".join(["word"] * 120)  # 599 bytes; byte 400 falls inside a word
    (data / "words.txt").write_text(line + "\n", encoding="utf-8")
    [match] = runner.call(_spec(built, "textsearch", data), {"pattern": "word", "path": "words.txt"})["matches"]
    text = match["text"]
    assert len(text) <= 400 and line.startswith(text) and text.endswith("word") and line[len(text)] == " "


def test_sqlquery_answers_a_query_over_a_database_and_over_a_csv(built: Path, data: Path,
                                                                 runner: WasiRunner) -> None:
    spec = _spec(built, "sqlquery", data)
    assert runner.call(spec, {"database": "shop.db", "query": "SELECT * FROM orders ORDER BY id"}) == {
        "columns": ["id", "total", "note", "raw"],
        "rows": [[1, 3.0, "first", None], [2, 4.5, 'a "b"', {"hex": "00ff"}], [3, None, None, None]],
        "row_count": 3, "truncated": False}
    # a CSV's numbers are numbers, so they sum and compare as such; its text stays text
    by_csv = runner.call(spec, {"csv": "right.csv", "table": "stock", "query":
                                "SELECT name, qty, typeof(qty) FROM stock WHERE qty > 1 ORDER BY qty DESC"})
    assert by_csv["columns"] == ["name", "qty", "typeof(qty)"]
    assert by_csv["rows"] == [["fig, dried", 7, "integer"], ["apple", 4, "integer"]]
    counted = runner.call(spec, {"database": "shop.db", "max_rows": 2, "query":
                                 "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT i FROM n"})
    assert (counted["rows"], counted["row_count"], counted["truncated"]) == ([[1], [2]], 2, True)


def test_sqlquery_only_reads_and_runs_one_statement(built: Path, data: Path, runner: WasiRunner) -> None:
    spec = _spec(built, "sqlquery", data)
    before = (data / "shop.db").read_bytes()
    for args, said in [({"database": "shop.db", "query": "DELETE FROM orders"}, "must only read"),
                       ({"database": "shop.db", "query": "SELECT 1; DROP TABLE orders"}, "one statement"),
                       ({"database": "shop.db", "query": "ATTACH 'shop.db' AS again"}, "attached"),
                       ({"database": "left.csv", "query": "SELECT 1"}, "not a database"),
                       ({"database": "shop.db", "csv": "left.csv", "query": "SELECT 1"}, "exactly one"),
                       ({"csv": "left.csv", "query": "SELEC 1"}, "syntax error")]:
        with pytest.raises(ToolError) as refused:
            runner.call(spec, args)
        assert refused.value.reason == "bad_input" and said in refused.value.message, args
    assert (data / "shop.db").read_bytes() == before


@pytest.mark.parametrize("name", sorted(CALLS))
def test_fuel_cap_is_a_typed_trap_and_the_runner_carries_on(built: Path, data: Path, runner: WasiRunner,
                                                             name: str) -> None:
    args, _ = CALLS[name]
    with pytest.raises(WasiTrapError) as trap:
        runner.call(_spec(built, name, data, caps=WasiCaps(fuel=2_000)), args)
    assert (trap.value.code, trap.value.limit, trap.value.value) == ("wasi_trap", "fuel", 2_000)
    assert runner.call(_spec(built, name, data), args)  # the same runner, the same module: a clean answer


@pytest.mark.parametrize("name", sorted(CALLS))
def test_memory_cap_is_a_typed_trap(built: Path, data: Path, runner: WasiRunner, name: str) -> None:
    args, _ = CALLS[name]
    # the module's own data needs more than one 64 KiB page: it cannot even start under this cap
    with pytest.raises(WasiTrapError) as small:
        runner.call(_spec(built, name, data, caps=WasiCaps(memory_bytes=64 << 10)), args)
    assert small.value.limit == "memory"
    # an input bigger than the cap: the module starts, its allocation fails, and that is the memory trap too
    big = data / "big"
    big.mkdir()
    line = "x" * 1000 + "\n"
    (big / "left.csv").write_text("id,v\n" + "".join(f"{i},{line}" for i in range(3000)))
    (big / "right.csv").write_text("id,v\n1,a\n")
    (big / "orders.json").write_text(json.dumps({"orders": ["y" * 1000] * 3000}))
    (big / "sub").mkdir()
    (big / "sub" / "notes.txt").write_text(line * 3000)
    with pytest.raises(WasiTrapError) as grown:
        runner.call(_spec(built, name, big, caps=WasiCaps(memory_bytes=1 << 20)), args)
    assert grown.value.limit == "memory"
    assert runner.call(_spec(built, name, big), args)  # with room, the same input is answered


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_path_outside_the_folder_is_refused(built: Path, data: Path, runner: WasiRunner, name: str) -> None:
    args, field = CALLS[name]
    for outside in ("../secret.txt", "/etc/passwd", "sub/../../secret.txt"):
        with pytest.raises(ToolError) as refused:
            runner.call(_spec(built, name, data), {**args, field: outside})
        assert refused.value.reason == "outside_folder", outside
    # a symbolic link out of the folder: the host refuses it by name, and WASI would not follow it either
    (data / "link.txt").symlink_to(data.parent / "secret.txt")
    with pytest.raises(ToolError) as linked:
        runner.call(_spec(built, name, data), {**args, field: "link.txt"})
    assert linked.value.reason == "outside_folder"


def test_wasi_itself_refuses_what_the_host_check_would_let_through(built: Path, data: Path,
                                                                   runner: WasiRunner) -> None:
    # a folder link inside that points outside; the guest is asked to read through it with a string argument
    (data / "out").symlink_to(data.parent)
    spec = WasiToolSpec("textsearch", "", built / "textsearch.wasm", data, {"pattern": ParamType.STRING,
                                                                            "path": ParamType.STRING})
    with pytest.raises(ToolError) as refused:
        runner.call(spec, {"pattern": "outside", "path": "out/secret.txt"})
    assert refused.value.reason == "bad_input"  # the module could not open it: its preopen does not reach there


def test_the_folder_is_read_only_unless_the_tool_is_a_writer(built: Path, data: Path, runner: WasiRunner) -> None:
    params = {"write": ParamType.STRING}
    reader = WasiToolSpec("echo", "", built / "echo.wasm", data, params)
    with pytest.raises(ToolError) as refused:
        runner.call(reader, {"write": "made.txt"})
    assert refused.value.reason == "bad_input"
    assert not (data / "made.txt").exists()
    writer = WasiToolSpec("echo", "", built / "echo.wasm", data, params, writer=True)
    assert runner.call(writer, {"write": "made.txt"}) == {"ok": True, "args": 1}
    assert (data / "made.txt").read_text() == "written\n"


def test_an_endless_loop_is_stopped_by_its_wall_clock_cap(built: Path, data: Path, runner: WasiRunner) -> None:
    spin = WasiToolSpec("spin", "", built / "spin.wasm", data, caps=WasiCaps(fuel=10**15, wall_s=0.2))
    with pytest.raises(WasiTrapError) as trap:
        runner.call(spin, {})
    assert (trap.value.limit, trap.value.value) == ("wall_time", 200)


def test_bad_arguments_are_typed_before_the_module_runs(built: Path, data: Path, runner: WasiRunner) -> None:
    spec = _spec(built, "textsearch", data)
    for args in ({}, {"pattern": "x", "nope": 1}, {"pattern": 3}, {"pattern": "x", "max_matches": "9"},
                 {"pattern": "x", "ignore_case": "yes"}, {"pattern": "a\0b"}):
        with pytest.raises(ToolError) as bad:
            runner.call(spec, args)
        assert bad.value.reason == "bad_arguments", args



def _module(tmp_path: Path, wat: str, **kwargs: Any) -> WasiToolSpec:
    import wasmtime

    path = tmp_path / "m.wasm"
    path.write_bytes(wasmtime.wat2wasm(wat))
    (tmp_path / "d").mkdir(exist_ok=True)
    return WasiToolSpec("m", "", path, tmp_path / "d", {}, (), **kwargs)


def test_a_missing_folder_is_a_typed_tool_error(built: Path, data: Path, runner: WasiRunner) -> None:
    with pytest.raises(ToolError, match="does not exist") as caught:
        runner.call(_spec(built, "jsonquery", data / "nosuch"), {"path": "orders.json", "query": "."})
    assert caught.value.reason == "no_folder"


@pytest.mark.parametrize("where", ["folder", "parent"])
def test_a_folder_that_is_or_passes_through_a_symlink_is_refused(built: Path, data: Path, runner: WasiRunner,
                                                                 tmp_path: Path, where: str) -> None:
    (tmp_path / "etc").symlink_to("/etc")
    folder = tmp_path / "etc" if where == "folder" else tmp_path / "etc" / "ssl"
    with pytest.raises(ToolError, match="symlink") as caught:
        runner.call(_spec(built, "textsearch", folder), {"pattern": "root:", "path": "."})
    assert caught.value.reason == "outside_folder"
    assert runner.call(_spec(built, "textsearch", data), {"pattern": "Ledger"})["matches"]  # and it carries on


def test_a_module_without_start_is_a_typed_tool_error(runner: WasiRunner, tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="no _start") as caught:
        runner.call(_module(tmp_path, '(module (memory (export "memory") 1))'), {})
    assert caught.value.reason == "bad_module"


def test_tables_are_held_to_the_memory_cap(runner: WasiRunner, tmp_path: Path) -> None:
    caps = WasiCaps(memory_bytes=1 << 20)
    big = '(module (table 50000000 funcref) (memory (export "memory") 1) (func (export "_start")))'
    with pytest.raises(WasiTrapError) as caught:
        runner.call(_module(tmp_path, big, caps=caps), {})
    assert caught.value.limit == "memory"
    # a grow past the cap fails (-1), which this module turns into a trap; one within it succeeds (exit 0, no JSON)
    grow = ('(module (table 1 funcref) (memory (export "memory") 1) (func (export "_start") (if (i32.eq (table.grow 0 '
            '(ref.null func) (i32.const {n})) (i32.const -1)) (then unreachable))))')
    with pytest.raises(ToolError, match="trapped") as failed:
        runner.call(_module(tmp_path, grow.format(n=50_000_000), caps=caps), {})
    assert failed.value.reason == "trap"
    with pytest.raises(ToolError, match="no JSON"):
        runner.call(_module(tmp_path, grow.format(n=1000), caps=caps), {})
