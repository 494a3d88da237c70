"""A worker's last error, read from the runner's agent log: its code and a line of text, never bytes."""

from __future__ import annotations

import os
from pathlib import Path

from swarmyard.plane.agent_errors import AgentLogs, cut_text, parse_log, slot_and_worker

_LOST = ("agent error (provider_error): stopped on a model error at step 1 of 4, before any work "
         "(upstream_unknown): the upstream answer was lost after the request was sent; reservation rsv_01ab is held "
         "until reconciled")


def _log(worker: str, ending: str, stderr: str, stdout: str = "") -> str:
    return (f"# worker-3 (worker, builtin) worker {worker}: {ending} after 2.5 s\n\n## stderr\n{stderr}\n\n"
            f"## stdout\n{stdout}\n")


def test_the_built_in_agent_s_error_gives_the_model_error_s_code_and_its_message() -> None:
    stderr = 'agent INFO: HTTP Request: POST http://127.0.0.1:8484/v1/chat/completions "HTTP/1.1 502"\n' + _LOST
    error = parse_log(_log("wrk_01ab", "exit 1", stderr), 10.0)
    assert error is not None
    assert (error.worker, error.slot, error.code) == ("wrk_01ab", "worker-3", "upstream_unknown")
    assert error.message.startswith("stopped on a model error at step 1 of 4") and "b'" not in error.message
    assert error.to_dict()["at"] == 10.0


def test_a_run_that_ended_well_has_no_error_and_others_get_a_code_of_their_ending() -> None:
    assert parse_log(_log("wrk_1", "exit 0", "agent INFO: fine"), 0.0) is None
    timed = parse_log(_log("wrk_1", "timed out", ""), 0.0)
    assert timed is not None and (timed.code, timed.message) == ("timeout", "timed out after 2 s")
    crashed = parse_log(_log("wrk_1", "exit 2", "Traceback (most recent call last):\nKeyError: 'x'\n"), 0.0)
    assert crashed is not None and (crashed.code, crashed.message) == ("exit_2", "KeyError: 'x'")
    silent = parse_log(_log("wrk_1", "exit 137", ""), 0.0)
    assert silent is not None and silent.code == "exit_137" and "nothing" in silent.message
    assert parse_log("not a log\n", 0.0) is None


def test_a_long_message_is_cut_at_a_word_with_an_ellipsis() -> None:
    text = "word " * 200
    cut = cut_text(text, 50)
    assert len(cut) <= 50 and cut.endswith("word…") and "  " not in cut
    assert cut_text("short\n  and   spaced", 50) == "short and spaced"


def test_logs_are_named_slot_then_worker_and_each_is_parsed_again_only_when_it_changed(tmp_path: Path) -> None:
    assert slot_and_worker("worker-10-wrk_01ab") == ("worker-10", "wrk_01ab")
    assert slot_and_worker("lead-wrk_9") == ("lead", "wrk_9")
    assert slot_and_worker("notes") is None and slot_and_worker("worker-0-abc") is None
    path = tmp_path / "worker-3-wrk_01ab.log"
    path.write_text(_log("wrk_01ab", "exit 1", _LOST), encoding="utf-8")
    (tmp_path / "worker-4-wrk_02cd.log").write_text(_log("wrk_02cd", "exit 0", ""), encoding="utf-8")
    logs = AgentLogs(tmp_path)
    assert set(logs.errors()) == {"wrk_01ab"}
    path.write_text(_log("wrk_01ab", "timed out", ""), encoding="utf-8")
    os.utime(path, ns=(1, 1))  # a new mtime: the log changed
    assert logs.errors()["wrk_01ab"].code == "timeout"


def test_a_token_the_agent_printed_in_its_error_is_not_shown() -> None:
    # the log is the agent's own output: what it printed never went through the plane's routes
    token = "sy1." + "eyJhIjoxfQ" * 12 + "." + "M" * 43
    error = parse_log(_log("wrk_1", "exit 3", f"agent error (shell): env said SWARMYARD_TOKEN={token} and more"), 0.0)
    assert error is not None and error.code == "shell"
    assert error.message == "env said SWARMYARD_TOKEN=[capability token] and more"
