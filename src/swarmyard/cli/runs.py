"""``swarmyard runs list`` and ``swarmyard runs show RUN``: the runs in a runs folder, read back from their stores."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import typer

from swarmyard.cli import render
from swarmyard.cli.options import JsonOption
from swarmyard.errors import StoreError, SwarmyardError, UserError
from swarmyard.money import format_usd
from swarmyard.plane.folder_files import read_regular

#: Bytes of ``run.json`` and of a checkpoint note read, and of a trajectory whose steps are counted (a worker's
#: file stops at 8 MiB): a file in their place (a link to ``/dev/zero``, a pipe) is bounded, or reads as absent.
_RUN_JSON_BYTES, _NOTE_BYTES, _TRAJECTORY_BYTES = 1024 * 1024, 64 * 1024, 16 * 1024 * 1024

app = typer.Typer(help="Runs in a runs folder: list them, show one.", no_args_is_help=True)

_RunsDir = typer.Option(Path("runs"), "--runs-dir", help="The runs folder (\\[run] runs_dir of the swarm file).")


def _state(run_dir: Path) -> dict[str, Any]:
    raw = read_regular(run_dir / "run.json", _RUN_JSON_BYTES)
    try:
        value = json.loads(raw if raw is not None else b"")
    except (ValueError, RecursionError) as exc:
        raise UserError(f"{run_dir} is not a run folder (no readable run.json)") from exc
    if not isinstance(value, dict) or not isinstance(value.get("goal_id"), str):
        raise UserError(f"{run_dir}/run.json is not a run's state")
    return value


def _audit_root(run_dir: Path) -> tuple[int, str] | None:
    """The latest signed checkpoint's tree size and root (its second and third lines)."""
    notes = sorted((run_dir / "audit" / "checkpoints").glob("*.note"))
    note = read_regular(notes[-1], _NOTE_BYTES) if notes else None
    if note is None:
        return None
    lines = note.decode("utf-8", "replace").splitlines()
    if len(lines) < 3 or not (lines[1].isascii() and lines[1].isdigit() and len(lines[1]) <= 18):
        return None
    return int(lines[1]), lines[2]


def _summary(run_dir: Path, *, detail: bool = False) -> dict[str, Any]:
    """What a run's store says about it (opened read-mostly: the run is over, or runs elsewhere)."""
    from swarmyard.domain import ReservationState, TaskState
    from swarmyard.plane.run_view import closed_at, open_run_store, refuse_not_sqlite, run_store_url
    from swarmyard.report.data import reservation_cost

    state = _state(run_dir)
    url = run_store_url(run_dir, state)
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        raise UserError(f"run {run_dir.name}: its store {url} is gone")
    if url.startswith("sqlite:///"):
        refuse_not_sqlite(run_dir, Path(url.removeprefix("sqlite:///")))
    try:
        store = open_run_store(url)
    except sqlite3.DatabaseError as exc:  # past its header: pages a database does not have
        raise UserError(f"run {run_dir.name}: its store cannot be read ({str(exc)[:200]})") from exc
    try:
        goal = store.get_goal(state["goal_id"])
        tasks = store.list_tasks(goal.id)
        reservations = store.list_reservations(goal.id)
        findings = store.read_findings(goal.id, limit=10_000) if detail else []
        workers = store.list_workers(goal.id) if detail else []
        scores = store.list_scores(goal.id, split=None)
        ended = closed_at(store, run_dir, str(state.get("run_id") or run_dir.name))
    except sqlite3.DatabaseError as exc:
        raise UserError(f"run {run_dir.name}: its store cannot be read ({str(exc)[:200]})") from exc
    finally:
        store.close()
    lead = [t for t in tasks if t.group == "lead"]
    if state.get("lead_done"):
        status = "done"
    elif (lead and lead[-1].state is TaskState.FAILED) or ended is not None:
        status = "no synthesis"
    else:
        status = "running or stopped"
    holdout = max((s.score for s in scores if s.split == "holdout"), default=None)
    best = max((s.score for s in scores if s.split == "search"), default=None)
    out: dict[str, Any] = {
        "run": run_dir.name, "goal": goal.id, "status": status, "objective": goal.objective, "policy": goal.policy,
        "started_at": goal.created_at, "tasks": len(tasks),
        "tasks_done": sum(1 for t in tasks if t.state is TaskState.DONE),
        "tasks_failed": sum(1 for t in tasks if t.state is TaskState.FAILED),
        "calls": sum(1 for r in reservations if r.state.value != "released"),
        "tokens": sum(r.input_tokens + r.output_tokens for r in reservations),
        "spent_micro_usd": sum(reservation_cost(r) for r in reservations),
        "settled_micro_usd": goal.envelope.settled,
        "held_micro_usd": sum(r.amount for r in reservations
                              if r.state in (ReservationState.HELD, ReservationState.UNKNOWN)),
        "budget_micro_usd": goal.budget_micro_usd,
        # the holdout score where the run had one, else its best search score
        "score": holdout if holdout is not None else best, "holdout_score": holdout, "best_score": best,
        "wall_s": None if ended is None else round(ended - goal.created_at, 3),
    }
    if not detail:
        return out
    agents = run_dir / "agents"
    per_worker: dict[str, dict[str, int]] = {}
    for r in reservations:
        row = per_worker.setdefault(r.worker_id or "-", {"calls": 0, "tokens": 0, "spent_micro_usd": 0})
        row["calls"] += 1
        row["tokens"] += r.input_tokens + r.output_tokens
        row["spent_micro_usd"] += reservation_cost(r)
    files = {p.name: p for p in agents.glob("*.jsonl")} if agents.is_dir() else {}
    audit = _audit_root(run_dir)
    synthesis = next((f for f in reversed(findings) if lead and f.task_id == lead[-1].id), None)
    out.update({
        "task_list": [{"id": t.id, "title": t.title, "group": t.group, "state": t.state.value,
                       "attempts": t.attempts, "result": t.result} for t in tasks],
        "workers": [{"id": w.id, "group": w.group, **per_worker.get(w.id, {"calls": 0, "tokens": 0,
                                                                           "spent_micro_usd": 0}),
                     "trajectory": next((str(p) for n, p in files.items()
                                         if n.endswith(f"{w.id}.jsonl") and ".transcript." not in n), None),
                     "steps": next((_lines(p) for n, p in files.items() if n.endswith(f"{w.id}.jsonl")), 0)}
                    for w in workers],
        "findings": [{"id": f.id, "title": f.title, "author": f.author, "score": f.score,
                      "citations": len(f.citations)} for f in findings],
        "synthesis": synthesis.body if synthesis else None,
        "audit_size": audit[0] if audit else None, "audit_root": audit[1] if audit else None,
        "report": str(run_dir / "report.html") if (run_dir / "report.html").exists() else None,
    })
    return out


def _lines(path: Path) -> int:
    """The lines of a trajectory file of the folder's own (0 for a link, a pipe or a device)."""
    data = read_regular(path, _TRAJECTORY_BYTES)
    return len(data.splitlines()) if data is not None else 0


#: a run's folder name (``run_...`` from ``new_id``; a folder a user renamed keeps to the same characters)
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def _runs(runs_dir: Path) -> list[Path]:
    if not runs_dir.is_dir():
        raise UserError(f"no runs folder at {runs_dir} (give --runs-dir)")
    return sorted(p for p in runs_dir.iterdir() if (p / "run.json").is_file())


@app.command("list")
def list_runs(runs_dir: Path = _RunsDir, as_json: bool = JsonOption) -> None:
    """Every run in the runs folder, oldest first: state, score (holdout, else best search), wall time, tasks,
    calls, tokens, settled spend and what is still held."""
    rows = []
    for run_dir in _runs(runs_dir):
        try:
            rows.append(_summary(run_dir))
        except (SwarmyardError, OSError) as exc:
            message = exc.message if isinstance(exc, SwarmyardError) else str(exc)
            rows.append({"run": run_dir.name, "status": f"unreadable: {message}"})
    rows.sort(key=lambda r: r.get("started_at", 0.0))
    if as_json:
        render.print_json(rows)
        return
    render.print_table(None, ["run", "state", "score", "wall", "tasks", "calls", "tokens", "spend", "held",
                              "objective"], [
        [r["run"], r["status"], "-" if r.get("score") is None else f"{r['score']:,}",
         "-" if r.get("wall_s") is None else f"{r['wall_s']:.1f} s",
         f"{r['tasks_done']}/{r['tasks']}" if "tasks" in r else "-", r.get("calls", "-"), r.get("tokens", "-"),
         format_usd(r["settled_micro_usd"]) if "settled_micro_usd" in r else "-",
         format_usd(r["held_micro_usd"]) if r.get("held_micro_usd") else "-",
         str(r.get("objective", ""))[:60]] for r in rows])


@app.command()
def show(run: str = typer.Argument(help="The run id (a folder of the runs folder)."), runs_dir: Path = _RunsDir,
         as_json: bool = JsonOption,
         ui: bool = typer.Option(False, "--ui", help="Serve the run's dashboard instead, read-only, on loopback "
                                 "until Ctrl-C (as `swarmyard ui RUN_FOLDER` does).")) -> None:
    """One run: its goal, tasks, workers with their trajectories, findings, synthesis and audit root."""
    if _RUN_ID.fullmatch(run) is None:  # fullmatch: "abc\n" is no id, nor is a name too long for a folder
        shown = run if len(run) <= 60 else run[:60] + "..."
        raise UserError(f"not a run id: {shown!r}")
    run_dir = runs_dir / run
    if not (run_dir / "run.json").is_file():
        raise UserError(f"no run {run} in {runs_dir}")
    if ui:
        from swarmyard.cli.ui import serve_run

        serve_run(run_dir, "127.0.0.1", 0, (), f"run {run}: its dashboard")
        return
    try:
        info = _summary(run_dir, detail=True)
    except StoreError as exc:
        raise UserError(f"run {run}: its store cannot be read: {exc.message}") from exc
    if as_json:
        render.print_json(info)
        return
    out = render.stdout
    out.print(f"run {info['run']} ({info['status']}): {render.shown(info['objective'])}", highlight=False, markup=False)
    out.print(f"goal {info['goal']}, policy {info['policy']}; {info['calls']} calls, {info['tokens']} tokens, "
              f"{format_usd(info['spent_micro_usd'])} of {format_usd(info['budget_micro_usd'])}",
              highlight=False, markup=False)
    render.print_table("tasks", ["task", "group", "state", "tries", "result"],
                       [[t["title"], t["group"], t["state"], t["attempts"], (t["result"] or "")[:60]]
                        for t in info["task_list"]])
    render.print_table("workers", ["worker", "group", "calls", "tokens", "spend", "steps", "trajectory"],
                       [[w["id"], w["group"], w["calls"], w["tokens"], format_usd(w["spent_micro_usd"]), w["steps"],
                         w["trajectory"] or "-"] for w in info["workers"]])
    render.print_table("findings", ["finding", "title", "by", "score", "cites"],
                       [[f["id"], f["title"][:50], f["author"], "-" if f["score"] is None else f["score"],
                         f["citations"]] for f in info["findings"]])
    out.print(f"synthesis: {render.shown(info['synthesis'] or '(none)')}", highlight=False, markup=False)
    if info["audit_root"]:
        out.print(f"audit: {info['audit_size']} events, root {info['audit_root']}", highlight=False, markup=False)
    out.print(f"report: {info['report'] or '-'}", highlight=False, markup=False)
