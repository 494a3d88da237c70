"""A WASI tool's arguments fixed by the swarm file, and csvdiff's answer of only the keys that differ.

A small model copies a path or a key column badly (a 0.5B worker once gave csvdiff the key
``id,account,date,amount``): a swarm file fixes what is the same for every call, the model is shown only the rest,
and whatever it gives, the fixed values are the ones the tool runs with.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from swarmyard.config import loads_config
from swarmyard.errors import ConfigError, ToolError, UserError
from swarmyard.wasi import SHIPPED, WasiRunner, WasiToolSpec, shipped_wasm

pytest.importorskip("wasmtime", reason="WASI tools need the wasi extra (scripts/test installs the dev extra)")


@pytest.fixture
def csvdiff() -> Path:
    try:
        return shipped_wasm("csvdiff")
    except UserError as exc:
        pytest.skip(exc.message)


def _shard(folder: Path) -> Path:
    folder.mkdir()
    (folder / "ledger.csv").write_text("id,date,amount\nA-3,2025-01-02,5.00\nA-1,2025-01-01,1.00\n"
                                       "A-2,2025-01-01,2.00\nA-4,2025-01-04,4.00\n")
    (folder / "bank.csv").write_text("id,amount,date\nA-2,2.50,2025-01-03\nA-1,1.00,2025-01-01\n"
                                     "A-5,9.00,2025-01-05\nA-3,5.00,2025-01-02\n")
    return folder


def test_csvdiff_keys_names_each_record_that_differs_once_sorted(csvdiff: Path, tmp_path: Path) -> None:
    tool = SHIPPED["csvdiff"]
    spec = WasiToolSpec("csvdiff", tool.description, csvdiff, _shard(tmp_path / "shard"), tool.params, tool.required)
    # A-2 differs in two columns (one key, once), A-4 is only in the ledger, A-5 only in the bank
    got = WasiRunner().call(spec, {"left": "ledger.csv", "right": "bank.csv", "keys": True, "max": 1})
    assert got == {"key": "id", "left_rows": 4, "right_rows": 4, "same": 2, "differ": 3,
                   "value": ["A-2", "A-4", "A-5"]}  # max cuts the lists of a full diff, never the keys


def test_fixed_arguments_are_hidden_from_the_model_and_win_over_its_own(csvdiff: Path, tmp_path: Path) -> None:
    _shard(tmp_path / "task")
    (tmp_path / "task" / "other.csv").write_text("id,date,amount\n")
    config = loads_config("""
[goal]
objective = "o"
budget_usd = "1"
[[tasks.lenses]]
title = "t"
[[workers.tools]]
name = "compare"
wasm = "csvdiff"
folder = "task"
args = { left = "ledger.csv", right = "bank.csv", key = "id", keys = true }
""")
    [tool] = config.workers.tools
    spec = tool.spec(csvdiff, tmp_path)
    schema = spec.json_schema()
    assert set(schema["properties"]) == {"max"} and schema["required"] == []
    # a model that names a fixed argument anyway is overruled: the swarm file's values are the ones run
    got = WasiRunner().call(WasiToolSpec.from_dict(spec.to_dict()), {"left": "other.csv", "key": "date"})
    assert got["value"] == ["A-2", "A-4", "A-5"]


@pytest.mark.parametrize(("args", "says"), [
    ('{ lefty = "a.csv" }', "not one of its params"),
    ('{ keys = "yes" }', "args.keys must be true or false"),
    ('{ max = "5" }', "args.max must be an integer"),
    ('{ keys = true }\noffer = ["keys"]', "offer names 'keys'"),
])
def test_a_bad_fixed_argument_is_refused_when_the_file_is_read(csvdiff: Path, args: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        loads_config(f"""
[goal]
objective = "o"
budget_usd = "1"
[[tasks.lenses]]
title = "t"
[[workers.tools]]
name = "compare"
wasm = "csvdiff"
args = {args}
""")
    assert says in caught.value.message and caught.value.field.startswith("workers.tools")


def test_offer_narrows_what_the_model_is_shown_and_may_give(csvdiff: Path, tmp_path: Path) -> None:
    _shard(tmp_path / "task")
    config = loads_config("""
[goal]
objective = "o"
budget_usd = "1"
[[tasks.lenses]]
title = "t"
[[workers.tools]]
name = "compare"
wasm = "csvdiff"
folder = "task"
args = { left = "ledger.csv", right = "bank.csv", keys = true }
offer = []
""")
    spec = WasiToolSpec.from_dict(config.workers.tools[0].spec(csvdiff, tmp_path).to_dict())
    assert spec.json_schema()["properties"] == {}
    assert WasiRunner().call(spec, {})["value"] == ["A-2", "A-4", "A-5"]
    with pytest.raises(ToolError) as caught:
        WasiRunner().call(spec, {"key": "date"})  # a param it was not offered: refused, not run
    assert "takes no argument 'key'" in caught.value.message
