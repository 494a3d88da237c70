"""Swarm files for one-lens runs: on the scripted provider (optionally priced and scored), or on an
OpenAI-compatible upstream; a built-in worker and lead on the scripted provider looking around their machine."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


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


#: The evaluator bundle of the examples (sort the integers on stdin), for scored runs.
SORT_NUMBERS = Path(__file__).resolve().parents[2] / "examples" / "bundles" / "sort-numbers"
#: The objective of a run scored by :data:`SORT_NUMBERS`.
SORT_OBJECTIVE = "Write a Python program that sorts the integers on stdin."


def scripted_run(folder: Path, replies: Mapping[str, Sequence[Mapping[str, Any]]], *,
                 objective: str = "Should a small team build a speech app?",
                 lens: tuple[str, str] = ("market", "Size the market."), budget_usd: str = "1",
                 workers: Mapping[str, int | float | str] | None = None, priced: bool = False,
                 bundle: Path | None = None) -> Path:
    """``folder/conf/swarm.toml`` with its ``replies.json``: one lens for one scripted worker (model
    ``scripted-worker``), then a scripted lead (``scripted-lead``), in local machines, its runs under
    ``folder/runs``.

    ``replies`` are the scripted provider's replies per model; ``workers`` holds the ``[workers]`` settings beside
    count = 1, concurrency = 1 and the model (``exec_timeout_s``, ``max_steps``, ``baseline``: a string is written
    as a TOML string); ``priced`` prices both
    models (2 and 8 USD per million tokens in and out), so the ledger moves with every call; ``bundle`` is copied
    to ``conf/bundles/<its name>`` and named in ``[evaluator]``: the run is scored.
    """
    conf = folder / "conf"
    conf.mkdir(exist_ok=True)
    (conf / "replies.json").write_text(json.dumps(replies))
    settings = "".join(f"{key} = {json.dumps(value)}\n" for key, value in (workers or {}).items())
    prices = "".join(f'[providers.script.prices.{model}]\ninput_usd_per_mtok = "2"\noutput_usd_per_mtok = "8"\n'
                     for model in ("scripted-worker", "scripted-lead")) if priced else ""
    evaluator = ""
    if bundle is not None:
        shutil.copytree(bundle, conf / "bundles" / bundle.name)
        evaluator = f'[evaluator]\nbundle = "bundles/{bundle.name}"\n'
    path = conf / "swarm.toml"
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
{settings}model = "scripted-worker"
[lead]
model = "scripted-lead"
[providers.script]
kind = "scripted"
models = ["scripted-worker", "scripted-lead"]
replies = "replies.json"
{prices}{evaluator}[run]
runs_dir = "{folder / 'runs'}"
sandbox = "local"
""")
    return path


def simulated_swarm(folder: Path, *, objective: str, lenses: Sequence[tuple[str, str]],
                    workers: Mapping[str, int | float], budget_usd: str = "1", call_cap: int = 20,
                    deadline_s: int = 300, latency_s: float = 0, lead: Mapping[str, int | float] | None = None,
                    fast_lead: bool = False) -> Path:
    """``folder/swarm.toml``: the simulated provider (model ``sim-1``) answers every call after ``latency_s``, at
    1 and 2 USD per million tokens in and out, in local machines, its runs under ``folder/runs``.

    ``lenses`` are (title, prompt) pairs; ``workers`` holds the ``[workers]`` settings beside the model (count and
    concurrency among them), ``lead`` the ``[lead]`` settings beside its model. With ``fast_lead`` the lead's model
    is ``sim-lead``, on a second simulated provider at the same prices that answers at once: the workers' calls are
    slow, and the lead's are not what the test watches.
    """
    lens_tables = "".join(f'[[tasks.lenses]]\ntitle = "{title}"\nprompt = "{prompt}"\n' for title, prompt in lenses)
    worker_settings = "".join(f"{key} = {value}\n" for key, value in workers.items())
    lead_settings = "".join(f"{key} = {value}\n" for key, value in (lead or {}).items())
    lead_model = "sim-lead" if fast_lead else "sim-1"
    lead_provider = ('[providers.lead]\nkind = "simulated"\nmodels = ["sim-lead"]\n[providers.lead.prices.sim-lead]\n'
                     'input_usd_per_mtok = "1"\noutput_usd_per_mtok = "2"\n') if fast_lead else ""
    path = folder / "swarm.toml"
    path.write_text(f"""
[goal]
objective = "{objective}"
budget_usd = "{budget_usd}"
call_cap = {call_cap}
deadline_s = {deadline_s}
{lens_tables}
[workers]
{worker_settings}model = "sim-1"
[lead]
model = "{lead_model}"
{lead_settings}
[providers.sim]
kind = "simulated"
models = ["sim-1"]
latency_s = {latency_s}
[providers.sim.prices.sim-1]
input_usd_per_mtok = "1"
output_usd_per_mtok = "2"
{lead_provider}[run]
runs_dir = "{folder / 'runs'}"
sandbox = "local"
""")
    return path


def machine_swarm(folder: Path, replies: Mapping[str, Sequence[Mapping[str, Any]]], *, lead_max_steps: int,
                  extra: str = "") -> Path:
    """``folder/swarm.toml`` with ``folder/replies.json``: one built-in worker (model ``w``, two steps) looks around
    its machine, then a built-in lead (``l``), both on the scripted provider, in a team; ``extra`` is TOML added at
    the end. No ``[run]`` table: the run's folder is ``folder/runs`` (the CLI's default, run from ``folder``)."""
    (folder / "replies.json").write_text(json.dumps(replies))
    path = folder / "swarm.toml"
    path.write_text(f"""
[goal]
objective = "Look around the machine."
budget_usd = "0.50"
call_cap = 20
deadline_s = 200
max_depth = 1
[[tasks.lenses]]
title = "look"
prompt = "Look around your machine."
[policy]
kind = "team"
[workers]
agent = "builtin"
count = 1
concurrency = 1
max_steps = 2
model = "w"
[lead]
agent = "builtin"
model = "l"
max_steps = {lead_max_steps}
[providers.s]
kind = "scripted"
models = ["w", "l"]
replies = "replies.json"
{extra}""")
    return path
