"""Swarm files for one-lens runs: on the scripted provider, or on an OpenAI-compatible upstream."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def scripted_swarm(folder: Path, *, agent: str | None = None, replies: str | None = "replies/answers.json",
                   extra: str = "", lenses: Sequence[tuple[str, str]] = (("market", "Size the market."),),
                   call_cap: int = 50, lens_extra: str = "") -> Path:
    """``folder/conf/swarm.toml``: one lens ("market") for one scripted worker, then a scripted lead, in local
    machines, its runs under ``folder/runs``.

    ``replies`` is the replies file's path as the swarm file says it (relative to ``conf``, so not the working
    folder's; ``None`` leaves it out); ``agent`` names the workers' agent (the default one where ``None``);
    ``extra`` is TOML added after the provider's table; ``lenses`` are (title, prompt) pairs; ``lens_extra``
    (the scouts' ``files = [...]``) is added to every lens and makes the run grounded (``cite_files``).
    """
    lens_tables = "".join(f'[[tasks.lenses]]\ntitle = "{title}"\nprompt = "{prompt}"\n{lens_extra}\n'
                          for title, prompt in lenses)
    grounded = "[tasks]\ncite_files = true" if lens_extra else ""
    conf = folder / "conf"
    conf.mkdir(exist_ok=True)
    path = conf / "swarm.toml"
    path.write_text(f"""
[goal]
objective = "Should a small team build a speech app?"
budget_usd = "1"
call_cap = {call_cap}
deadline_s = 300
{grounded}
{lens_tables}
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


def upstream_swarm(folder: Path, base_url: str, *, objective: str, lens: tuple[str, str],
                   workers: dict[str, int | float], budget_usd: str = "1", input_usd: str = "1",
                   output_usd: str = "2") -> Path:
    """``folder/swarm.toml``: one lens for one worker (model ``up-worker``) and a lead (``up-lead``), both on an
    OpenAI-compatible provider at ``base_url`` at the same prices (USD per million tokens), in local machines.

    ``lens`` is the lens's title and prompt; ``workers`` holds the ``[workers]`` settings beside count = 1,
    concurrency = 1, exec_timeout_s = 120 and the model.
    """
    settings = "".join(f"{key} = {value}\n" for key, value in workers.items())
    prices = "".join(f'[providers.up.prices.{model}]\ninput_usd_per_mtok = "{input_usd}"\n'
                     f'output_usd_per_mtok = "{output_usd}"\n' for model in ("up-worker", "up-lead"))
    path = folder / "swarm.toml"
    path.write_text(f"""
[goal]
objective = "{objective}"
budget_usd = "{budget_usd}"
call_cap = 50
deadline_s = 300
[[tasks.lenses]]
title = "{lens[0]}"
prompt = "{lens[1]}"
[workers]
count = 1
concurrency = 1
exec_timeout_s = 120
{settings}model = "up-worker"
[lead]
model = "up-lead"
[providers.up]
kind = "openai_compatible"
base_url = "{base_url}"
models = ["up-worker", "up-lead"]
{prices}[run]
runs_dir = "{folder / 'runs'}"
sandbox = "local"
""")
    return path
