"""Swarm files for runs on the scripted provider."""

from __future__ import annotations

from pathlib import Path


def scripted_swarm(folder: Path, *, agent: str | None = None, replies: str | None = "replies/answers.json",
                   extra: str = "") -> Path:
    """``folder/conf/swarm.toml``: one lens ("market") for one scripted worker, then a scripted lead, in local
    machines, its runs under ``folder/runs``.

    ``replies`` is the replies file's path as the swarm file says it (relative to ``conf``, so not the working
    folder's; ``None`` leaves it out); ``agent`` names the workers' agent (the default one where ``None``);
    ``extra`` is TOML added after the provider's table.
    """
    conf = folder / "conf"
    conf.mkdir(exist_ok=True)
    path = conf / "swarm.toml"
    path.write_text(f"""
[goal]
objective = "Should a small team build a speech app?"
budget_usd = "1"
call_cap = 50
deadline_s = 300
[[tasks.lenses]]
title = "market"
prompt = "Size the market."
[workers]
{f'agent = "{agent}"' if agent else ""}
count = 1
concurrency = 1
exec_timeout_s = 120
max_steps = 4
model = "scripted-worker"
retry_backoff_s = 0.2
[lead]
model = "scripted-lead"
[providers.script]
kind = "scripted"
models = ["scripted-worker", "scripted-lead"]
{f'replies = "{replies}"' if replies else ""}
{extra}
[run]
runs_dir = "{folder / 'runs'}"
sandbox = "local"
""")
    return path
