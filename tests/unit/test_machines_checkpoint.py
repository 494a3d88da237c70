"""Why a fork keeps the disk only: the reason names what is missing first, in words a user can act on."""

from __future__ import annotations

import os
import shutil

import pytest

from swarmyard.machines import checkpoint
from swarmyard.machines.checkpoint import CRIU_HINT, ForkMemory


def test_no_criu_is_said_with_how_to_install_it() -> None:
    assert checkpoint.criu_refusal(None, 0) == f"CRIU is not installed ({CRIU_HINT})"


def test_criu_without_root_is_refused_before_running_it() -> None:
    # a path that does not exist: the privilege is checked first, so criu is never run as a user
    reason = checkpoint.criu_refusal("/nonexistent/criu", 1000)
    assert reason is not None and "needs root" in reason and "uid 1000" in reason


def test_a_criu_that_cannot_run_is_named() -> None:
    reason = checkpoint.criu_refusal("/nonexistent/criu", 0)
    assert reason is not None and reason.startswith("`/nonexistent/criu check` could not run")


@pytest.mark.skipif(shutil.which("criu") is None or os.geteuid() != 0, reason="needs criu and root")
def test_the_installed_criu_check_answers_in_criu_words() -> None:
    reason = checkpoint.criu_refusal(shutil.which("criu"), 0)
    # CRIU's failure in its own words, without its lines about helper processes exiting
    assert reason is None or (reason.startswith("`criu check` fails on this kernel: ") and "exited" not in reason)


def test_a_fork_of_the_disk_only_must_say_why() -> None:
    with pytest.raises(ValueError, match="says why"):
        ForkMemory(False)
    assert checkpoint.fork_memory("process") == ForkMemory(False, checkpoint.NO_SANDBOX)
    local = checkpoint.fork_memory("local")
    assert local.kept is False and local.reason  # restore is not built: never kept, always a reason
