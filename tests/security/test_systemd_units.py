"""The systemd units in deploy/systemd: each service as its own user, ProtectSystem=strict, PrivateTmp, and the
plane unable to open the others' state folders; checked by ``systemd-analyze verify`` (every warning fails it)
with ExecStart pointed at this checkout's installed console script, and their keys read with a parser."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
SWARMYARD = Path(sys.executable).with_name("swarmyard")
USERS = {"swarmyard-plane.service": "swarmyard-plane", "swarmyard-evaluator.service": "swarmyard-eval",
         "swarmyard-witness.service": "swarmyard-witness"}


def _service(name: str) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=True, interpolation=None, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read(UNITS / name)
    return parser["Service"]


def test_every_service_runs_as_its_own_user_in_a_strict_sandbox() -> None:
    assert sorted(p.name for p in UNITS.glob("*.service")) == sorted(USERS)
    states = {}
    for name, user in USERS.items():
        service = _service(name)
        assert (service["User"], service["Group"]) == (user, user), name
        assert service["ProtectSystem"] == "strict" and service["PrivateTmp"] == "true", name
        assert service["NoNewPrivileges"] == "true" and service["ProtectHome"] == "true", name
        # no service needs a root capability or the cgroup tree: each gives up both
        assert service.get("CapabilityBoundingSet") == "" and service.get("ProtectControlGroups") == "true", name
        assert "DynamicUser" not in service, name  # the users are fixed: verify reads the witness's folder later
        states[user] = service["StateDirectory"]
        assert service["ExecStart"].startswith("/usr/local/bin/swarmyard "), name
    # each its own state folder; only the plane has the others' groups, which open their sockets and nothing else
    assert len(set(states.values())) == 3
    assert _service("swarmyard-plane.service")["SupplementaryGroups"].split() == ["swarmyard-eval",
                                                                                  "swarmyard-witness"]
    assert _service("swarmyard-evaluator.service")["StateDirectoryMode"] == "0700"
    assert "--home /var/lib/swarmyard/witness " in _service("swarmyard-witness.service")["ExecStart"]
    # the plane's audit log is cosigned by that witness, on the socket the witness unit serves
    witness_socket = _service("swarmyard-witness.service")["ExecStart"].split("--socket ")[1].split()[0]
    assert f"--witness {witness_socket}" in _service("swarmyard-plane.service")["ExecStart"]
    sysusers = (UNITS / "swarmyard.sysusers").read_text().splitlines()
    assert sorted(line.split()[1] for line in sysusers if line.startswith("u ")) == sorted(USERS.values())


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze (apt-get install systemd)")
def test_systemd_analyze_verify_passes_without_a_warning(tmp_path: Path) -> None:
    for name in USERS:
        text = (UNITS / name).read_text().replace("/usr/local/bin/swarmyard", str(SWARMYARD))
        (tmp_path / name).write_text(text)
    done = subprocess.run(["systemd-analyze", "verify", *(str(tmp_path / n) for n in USERS)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
    # the check can fail: a misspelt key is a warning it prints
    (tmp_path / "bad.service").write_text(
        (tmp_path / "swarmyard-witness.service").read_text().replace("ProtectSystem=", "ProtectSystm="))
    bad = subprocess.run(["systemd-analyze", "verify", str(tmp_path / "bad.service")], capture_output=True,
                         text=True, timeout=120)
    assert "Unknown key 'ProtectSystm'" in bad.stderr
