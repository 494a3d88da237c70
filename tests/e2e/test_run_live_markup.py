"""``swarmyard run`` on a terminal draws its live table from the run's own strings: a task title from the swarm
file and a worker's last board post. They were drawn as rich markup: a title or post holding '[/x]' raised
MarkupError in the live view and ended the run ('error (internal): MarkupError ...', exit 1), and
'[link=...]' would have drawn a link on the operator's terminal. Through the console script under a pty, on the
scripted provider (process sandbox: the subject is the terminal), the run ends 0 and shows both strings as they
were written.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from rigs.scripted import tool_call
from rigs.swarm_files import scripted_swarm
from rigs.terminal import run_on_a_terminal

pytestmark = [pytest.mark.slow]

SWARMYARD = Path(sys.executable).with_name("swarmyard")
TITLE = "market [/x] [red]"
POST = "[/oops] [bold red]loud[link=http://evil.example]x"


def test_markup_in_a_title_or_board_post_is_shown_as_text_in_the_live_view(short_tmp: Path) -> None:
    swarm = scripted_swarm(short_tmp, lenses=((TITLE, "Size the market."),))
    swarm.write_text(swarm.read_text().replace('sandbox = "local"', 'sandbox = "process"'))
    (short_tmp / "conf" / "replies").mkdir()
    (short_tmp / "conf" / "replies" / "answers.json").write_text(json.dumps({
        "scripted-worker": [tool_call("board_post", body=POST), tool_call("shell", command="sleep 2"),
                            tool_call("submit_finding", title="market", body="Large.", cite=["1"])],
        "scripted-lead": [tool_call("submit_finding", title="synthesis", body="Go.")]}))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(short_tmp), "LANG": "C.UTF-8",
           "XDG_STATE_HOME": str(short_tmp / "state"), "SWARMYARD_STATE_DIR": str(short_tmp / "state"),
           "TERM": "xterm-256color", "COLUMNS": "200", "LINES": "40"}
    code, stdout, seen = run_on_a_terminal([str(SWARMYARD), "run", str(swarm), "--no-witness"], cwd=short_tmp,
                                           env=env)
    out = stdout.decode()
    assert code == 0, seen.decode(errors="replace")[-3000:]
    assert out.strip() == "Go."
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\]8;[^\x1b]*\x1b\\\\", "", seen.decode(errors="replace"))
    assert "MarkupError" not in text and "error (internal)" not in text
    assert TITLE in text
    assert POST in text  # whole: 49 characters, under the column's 60
    assert b"\x1b]8;" not in seen  # no terminal hyperlink was drawn
