"""A Boxd machine is logged in at the plane while it boots (the plane's calls overlap the sandbox's start): a login
the plane refuses (the goal's budget has no room for another machine) deletes the machine it was for, so neither a
machine nor a slot of ``max_machines`` is left behind, and the error is the plane's own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from swarmyard.boxd import Boxd
from swarmyard.errors import BudgetExceededError

pytestmark = [pytest.mark.bwrap]


@pytest.fixture
def folder(short_tmp: Path) -> Path:
    (short_tmp / "providers.toml").write_text('[providers.sim]\nkind = "simulated"\nmodels = ["m1"]\n')
    return short_tmp


def test_a_refused_login_deletes_its_machine_and_frees_its_slot(folder: Path) -> None:
    with Boxd(providers=folder / "providers.toml", root=folder / "root", budget_usd="1", machine_budget_usd="1",
              max_machines=2, machine_wait_s=5) as boxd:
        first = boxd.machines.create("first")
        for name in ("second", "third"):  # twice: a slot kept by the first refusal would make the second wait
            with pytest.raises(BudgetExceededError):
                boxd.machines.create(name)
        assert [m.name for m in boxd.machines.list()] == ["first"]
        assert [i.name for i in boxd._sync.list()] == ["first"]  # nothing left in the backend either
        boxd.machines.delete(first.id)
        again = boxd.machines.create("again")  # the budget the first machine held came back
        boxd.machines.wait_until_ready(again.id)
        assert boxd.machines.exec(again.id, "echo hi").stdout == "hi\n"
