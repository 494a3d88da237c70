"""The names a networked machine's hosts file gives its peers: ``<name>.yard`` and ``<name>.boxd`` on one line, and
a coordinator's machines also by the names it gave them, for it and for them, never over a whole name."""

from __future__ import annotations

import pytest

from swarmyard.errors import InvalidInputError
from swarmyard.machines.networks import LOCALHOST, check_member_name, hosts_text


def _lines(text: str) -> dict[str, list[str]]:
    assert text.startswith(LOCALHOST)
    return {line.split("\t")[0]: line.split("\t")[1].split() for line in text[len(LOCALHOST):].splitlines()}


def test_every_peer_resolves_under_both_suffixes_to_one_address() -> None:
    lines = _lines(hosts_text("worker", {"coordinator": "10.231.1.1", "worker": "10.231.1.2"}))
    assert lines == {"10.231.1.1": ["coordinator.yard", "coordinator.boxd"],
                     "10.231.1.2": ["worker.yard", "worker.boxd"]}


def test_a_coordinators_machines_go_by_their_short_names_for_it_and_each_other() -> None:
    peers = {"coord": "10.231.1.1", "coord.w1": "10.231.1.2", "coord.w2": "10.231.1.3", "other": "10.231.1.4"}
    for viewer in ("coord", "coord.w1"):
        lines = _lines(hosts_text(viewer, peers))
        assert lines["10.231.1.3"] == ["coord.w2.yard", "coord.w2.boxd", "w2.yard", "w2.boxd"]
        assert lines["10.231.1.1"] == ["coord.yard", "coord.boxd"]
    # a machine of the host's on the same network knows them by their whole names only
    assert _lines(hosts_text("other", peers))["10.231.1.2"] == ["coord.w1.yard", "coord.w1.boxd"]


def test_a_whole_name_wins_over_a_short_one() -> None:
    lines = _lines(hosts_text("coord", {"coord": "10.231.1.1", "coord.w1": "10.231.1.2", "w1": "10.231.1.3"}))
    assert lines["10.231.1.2"] == ["coord.w1.yard", "coord.w1.boxd"]
    assert lines["10.231.1.3"] == ["w1.yard", "w1.boxd"]


@pytest.mark.parametrize("name", ["worker-1", "coord.w1", "a.b.c", "x" * 63])
def test_member_names_are_lowercase_dns_labels(name: str) -> None:
    check_member_name(name)


@pytest.mark.parametrize("name", ["Worker", "coord..w1", ".w1", "w1.", "under_score", "-w", "x" * 64,
                                  "a." + "b" * 62])
def test_other_member_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidInputError):
        check_member_name(name)
