"""``swarmyard run SWARM.toml [--resume RUN] [--quiet] [--sandbox local|ray|process] [--ray-address ADDR]
[--witness URL | --no-witness]``: run one swarm."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from swarmyard.cli import render
from swarmyard.config import ReferenceConfig, SandboxKind, load_config
from swarmyard.domain import TaskState
from swarmyard.money import format_usd, usd_to_micro
from swarmyard.report.data import ReportData, RunScores, WorkerSpan
from swarmyard.report.figures import RunFigures
from swarmyard.swarm.coordinator import ProgressRow, ProgressRows, ProgressSummary, why_no_synthesis

if TYPE_CHECKING:
    from swarmyard.telemetry import LiveTrace


def summary_line(summary: ProgressSummary) -> str:
    """The run so far in one line: tasks, calls, spend, elapsed time and the workers' current errors (their words
    as ``render.shown`` prints them)."""
    elapsed = int(summary.elapsed_s)
    failed = f", {summary.tasks_failed} failed" if summary.tasks_failed else ""
    held = f" + {format_usd(summary.held_micro_usd)} held" if summary.held_micro_usd else ""
    line = (f"tasks {summary.tasks_done}/{summary.tasks_total} done{failed}, {summary.calls} calls, "
            f"{format_usd(summary.settled_micro_usd)} settled{held}, {elapsed // 60}:{elapsed % 60:02d} elapsed")
    if summary.errors:
        line += "; errors: " + "; ".join(f"{slot} {code}: {render.shown(message[:80])}"
                                         for slot, code, message in summary.errors)
    return line


class WorkerSpanPrinter:
    """Progress on stderr: a rich live view on a terminal, else plain lines; nothing with ``--quiet``.

    The live view is the run's summary line (tasks done of all, calls, spend, elapsed, current errors) over a
    table (worker, task, state, steps, tokens, spend, last board post), refreshed from the coordinator's progress
    rows. Off a terminal, plain lines: each finished agent run, and the summary line when it changed, at most
    every ``every_s`` seconds (``clock``: when that is).
    """

    COLUMNS = ("worker", "task", "state", "steps", "tokens", "spend", "last board post")

    def __init__(self, quiet: bool, *, live: bool | None = None, every_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.quiet = quiet
        self.rows: list[ProgressRow] = []
        self.summary: ProgressSummary | None = None
        self.live: Any = None
        self._every_s = every_s
        self._clock = clock
        self._said: tuple[ProgressSummary, float] | None = None  # the last summary said (elapsed left out), and when
        if not quiet and (sys.stderr.isatty() if live is None else live):
            from rich.live import Live

            self.live = Live(self.view(), console=render.stderr, refresh_per_second=4)

    def table(self) -> Any:
        """The live table as a rich ``Table``."""
        from rich.table import Table

        table = Table(title="swarm")
        for column in self.COLUMNS:
            table.add_column(column, justify="right" if column in ("steps", "tokens", "spend") else "left")
        from rich.text import Text

        for r in self.rows:
            # as text, not rich markup: a task title or a worker's board post '[/x]' raised MarkupError and
            # ended the run; '[link=...]' drew a link on the operator's terminal
            # and no control character: rich strips a few (BEL, CR, ...) but prints ESC sequences as they are
            table.add_row(*(Text(render.shown(cell)) for cell in (r.worker, r.task, r.state, str(r.steps), str(r.tokens),
                                                    format_usd(r.spent_micro_usd), r.last_post)))
        return table

    def view(self) -> Any:
        """The live view: the summary line (once there is one) over the table."""
        from rich.console import Group
        from rich.text import Text

        if self.summary is None:
            return self.table()
        line = Text(summary_line(self.summary), style="bold red" if self.summary.errors else "bold")
        return Group(line, self.table())

    @property
    def wants_progress(self) -> bool:
        """Whether the run should hand this printer its progress rows (not with ``--quiet``)."""
        return not self.quiet

    def progress(self, rows: list[ProgressRow]) -> None:
        """New rows (and summary) for the live view, or a plain summary line off a terminal."""
        self.rows = rows
        if isinstance(rows, ProgressRows) and rows.summary is not None:
            self.summary = rows.summary
        if self.live is not None:
            self.live.update(self.view())
            return
        if self.quiet or self.summary is None:
            return
        # the elapsed time alone changes every second: a line is said when anything else changed, or once a
        # while otherwise, so that a log shows the run is alive
        line = summary_line(self.summary)
        what = replace(self.summary, elapsed_s=0.0)
        now = self._clock()
        final = isinstance(rows, ProgressRows) and rows.final
        if self._said is not None and not final:
            before, at = self._said
            if now - at < self._every_s and (before == what or now - at < 1.0):
                return
        self._said = (what, now)
        render.stderr.print(f"progress: {line}", highlight=False, markup=False)

    def __call__(self, span: WorkerSpan) -> None:
        """Show one finished agent run (as a line when there is no live table)."""
        if self.quiet or self.live is not None:
            return
        render.stderr.print(f"{span.row} {span.ending} task={span.task_id or '-'} steps={span.steps} "
                            f"({span.ended_at - span.started_at:.1f} s)", highlight=False, markup=False)


def _figures_table(figures: RunFigures, reference: ReferenceConfig | None = None) -> Any:
    """The run's figures as a rich table (the seed's benchmark table), with the swarm file's reference run beside
    them when it names one."""
    from rich.table import Table

    table = Table(title=f"run {figures.run_id}")
    table.add_column("figure")
    table.add_column("value" if reference is None else "this run", justify="right")
    rows = figures.rows()
    if reference is None:
        for name, value in rows:
            table.add_row(name, value)
        return table
    from rich.text import Text

    table.add_column(Text(reference.label), justify="right")  # the swarm file's words, not rich markup
    rows.insert(6, ("tokens (in + out)", f"{figures.tokens_in + figures.tokens_out:,}"))
    theirs = {
        "score": None if reference.score is None else f"{reference.score:,}",
        "wall time": None if reference.wall_s is None else f"{reference.wall_s:.2f} s",
        "model calls": None if reference.calls is None else str(reference.calls),
        "tokens (in + out)": None if reference.tokens is None else f"{reference.tokens:,}",
        "settled spend": None if reference.spend_usd is None else format_usd(usd_to_micro(reference.spend_usd)),
    }
    for name, value in rows:
        table.add_row(name, value, theirs.get(name) or "-")
    return table


class _Announced:
    """Where the run's dashboard was served: its port is taken again for the finished run's."""

    port: int | None = None


def _dashboard(host: str, port: int, names: tuple[str, ...] = (), seen: _Announced | None = None) -> Any:
    """Where ``--ui`` serves the dashboard: checked before anything starts (loopback only, without TLS)."""
    from swarmyard.errors import UserError
    from swarmyard.plane.dashboard import UiListen
    from swarmyard.plane.server import is_loopback

    if not is_loopback(host):
        raise UserError(f"--host {host} is beyond loopback: the dashboard of a run is served on loopback only; "
                        "serve the run's store with `swarmyard serve --host ... --tls-cert ... --tls-key ... "
                        "--tls-ca ...` to reach it from elsewhere")

    def announce(url: str, token_file: Path) -> None:
        if seen is not None:
            seen.port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
        render.stderr.print(f"dashboard on {url} (operator token in {token_file})", highlight=False, markup=False)

    return UiListen(host, port, announce, names)


def _serve_finished(run_dir: Path, host: str, seen: _Announced, names: tuple[str, ...]) -> None:
    """``--ui`` after the run: its dashboard, read-only, until Ctrl-C or SIGTERM, on the live one's port when it
    is free (a page left open carries on by itself: same address, same token secret, so its sign-in holds)."""
    from swarmyard.cli.ui import serve_run

    serve_run(run_dir, host, seen.port or 0, names, "the run has ended; its dashboard stays")


def _finish_trace(trace: LiveTrace, data: Any, agents: Path, quiet: bool) -> None:
    """The rest of the run's spans to the collector (the model calls went as they ended); what it did not take is
    in the run folder's fallback file, said on stderr (the run and its report are written either way)."""
    sent, filed, lost = trace.finish(data, agents)
    if filed or lost:
        render.stderr.print(f"warning: the OTLP collector at {trace.url} did not take {filed + lost} of the run's "
                            f"{sent + filed + lost} spans; {filed} are in {trace.fallback} (OTLP/JSON lines)"
                            + (f", {lost} lost" if lost else ""), highlight=False, markup=False)
    elif not quiet:
        render.stderr.print(f"trace: {sent} spans sent to {trace.url}", highlight=False, markup=False)


def holds_line(data: ReportData, store_url: str) -> str | None:
    """What the run left held (a call whose answer never came, or whose broker is gone) and how to settle it; None
    when nothing is left."""
    from swarmyard.domain import ReservationState

    left = [r for r in data.reservations if r.state in (ReservationState.HELD, ReservationState.UNKNOWN)]
    if not left:
        return None
    unknown = sum(1 for r in left if r.state is ReservationState.UNKNOWN)
    return (f"{len(left)} hold{'s' if len(left) != 1 else ''} ({format_usd(sum(r.amount for r in left))}) "
            f"left open, {unknown} unknown (the answer never came: the provider's bill says what it cost): list "
            f"them with `swarmyard budget show {data.goal.id} --store {store_url}`, then settle each with "
            f"`swarmyard budget reconcile RESERVATION --actual MICRO_USD --store {store_url}` (or --release)")


def totals_line(run_id: str, data: ReportData, where: Path | str) -> str:
    """The run's last line: time, calls, tokens, settled spend and, apart, what is still held."""
    from swarmyard.domain import ReservationState

    held = sum(r.amount for r in data.reservations if r.state in (ReservationState.HELD, ReservationState.UNKNOWN))
    settled = data.goal.envelope.settled
    spend = f"{format_usd(settled)} settled" + (f", {format_usd(held)} held" if held else "")
    return (f"run {run_id}: {data.wall_s:.1f} s, {data.calls} calls, {data.input_tokens + data.output_tokens} "
            f"tokens, {spend}; report {where}")


def scores_line(scores: RunScores) -> str:
    """The run's evaluator in a line: which one and as whom, the holdout score, the best search score and who."""
    h, best = scores.holdout, scores.best
    holdout = (f"holdout {h.score} (artifact {h.sha256[:12]} by {h.worker})" if h is not None
               else f"no holdout score ({scores.holdout_note or 'not scored'})")
    reached = (f"best search score {best.score} by {best.worker} at {best.at_s:.1f} s" if best is not None
               else "no search score")
    return render.shown(f"evaluator {scores.evaluator}: {holdout}; {reached}")


def command(
    swarm_file: Annotated[Path, typer.Argument(help="The swarm file (TOML).")],
    resume: Annotated[str | None, typer.Option("--resume", help="Continue run RUN from the store.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress; only the synthesis.")] = False,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the run's figures (score, wall_s, calls, tokens, spend, leftover holds, keys found "
        "in sandboxes) as one JSON object on stdout instead of the synthesis.")] = False,
    sandbox: Annotated[SandboxKind | None, typer.Option(
        "--sandbox", help="Machine backend: local (default), ray (a Ray cluster's nodes) or process (no "
        "isolation).")] = None,
    ray_address: Annotated[str | None, typer.Option(
        "--ray-address", help="The Ray cluster for --sandbox ray (HOST:PORT; default: RAY_ADDRESS, else a "
        "local cluster).")] = None,
    witness: Annotated[str | None, typer.Option(
        "--witness", help="A witness (swarmyard witness serve) to cosign the audit log: URL or socket path "
        "(default: the run starts the host's own, as its own user when run as root).")] = None,
    no_witness: Annotated[bool, typer.Option(
        "--no-witness", help="Start no witness: the log is signed by its own key only, and `audit verify` cannot "
        "then tell a rollback or a log re-signed with that key.")] = False,
    ui: Annotated[bool, typer.Option(
        "--ui", help="Serve the live dashboard (/ui) while the run goes, and the finished run's (read-only, on "
        "the same port when it is still free) once it has ended, until Ctrl-C or SIGTERM; its URL and token file go "
        "to stderr. The exit status is then the run's.")] = False,
    host: Annotated[str, typer.Option(
        "--host", help="With --ui: the address to serve it on (loopback only; beyond it use swarmyard serve "
        "with mutual TLS).")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535,
                                      help="With --ui: the TCP port (0: any free one).")] = 0,
    ui_host: Annotated[list[str] | None, typer.Option(
        "--ui-host", help="With --ui: a name (NAME or NAME:PORT) by which browsers may open the dashboard, beside "
        "the address it listens on (repeatable); any other Host is refused (421).")] = None,
    otlp: Annotated[str | None, typer.Option(
        "--otlp", help="Send the run's trace to this OTLP/HTTP collector as it goes: model calls in batches as they "
        "end, the run's tree at its end; batches it does not take, after retries, go to traces.otlp.jsonl in the "
        "run folder (default: OTEL_EXPORTER_OTLP_ENDPOINT; needs the otel extra).")] = None,
    otlp_content: Annotated[bool, typer.Option(
        "--otlp-content", help="With --otlp: put the messages sent and the answers in the model calls' spans "
        "(gen_ai.input.messages, gen_ai.output.messages; also OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="
        "SPAN_ONLY). Off by default: they may hold what the run reads.")] = False,
) -> None:
    """Run a swarm file to its synthesis: print it, then time, calls, tokens and spend.

    Exit 0 with a synthesis; 1 when the run ended without one (its report says why). Tasks given up on are
    named on stderr either way.
    """
    from swarmyard.swarm.run import Swarm

    config = load_config(swarm_file)  # a bad file stops here: ConfigError names the field, exit 1
    if quiet:  # the local model's assembly, deep in the broker, says nothing either
        import os as _os

        from swarmyard.progress import QUIET_ENV

        _os.environ[QUIET_ENV] = "1"
    if sandbox is SandboxKind.RAY:
        from swarmyard.errors import UserError
        from swarmyard.machines.ray import missing

        if (hint := missing()) is not None:
            raise UserError(hint)  # before any run folder or goal exists
    seen = _Announced()
    dashboard = _dashboard(host, port, tuple(ui_host or ()), seen) if ui else None
    import os

    from swarmyard.telemetry import LiveTrace, content_wanted, otlp_url

    traces = otlp_url(otlp, os.environ)  # a bad URL or a missing extra stops here, before anything starts
    if otlp_content and traces is None:
        from swarmyard.errors import UserError

        raise UserError("--otlp-content needs a collector: --otlp URL or OTEL_EXPORTER_OTLP_ENDPOINT")
    trace = LiveTrace(traces, content=content_wanted(otlp_content, os.environ)) if traces is not None else None
    if sandbox is SandboxKind.PROCESS:
        render.stderr.print("[yellow]warning[/yellow]: --sandbox process runs agents without isolation",
                            markup=True)
    import warnings

    from swarmyard.machines.process import ProcessWarning

    # the process backend logs its warning for each machine in a line (and above, for --sandbox process):
    # Python's own rendering of it (a source path, line and code) is not for the user
    warnings.filterwarnings("ignore", category=ProcessWarning)
    printer = WorkerSpanPrinter(quiet)
    live = printer.live
    if live is not None:
        live.start()
    try:
        result = Swarm(config, sandbox=sandbox, witness=witness, ray_address=ray_address, no_witness=no_witness).run(
            resume=resume, on_span=printer, on_progress=printer.progress if printer.wants_progress else None,
            ui=dashboard, trace=trace)
    except BaseException:
        if trace is not None:
            trace.finish(None, Path())  # the calls' spans queued so far: sent, or in the fallback file
        raise
    finally:
        if live is not None:
            live.stop()
    data = result.data
    figures = RunFigures.of(data, result.keys_found, keys_held=result.keys_held)
    if as_json:
        print(json.dumps(figures.to_dict()))
    else:
        print(render.shown(data.synthesis.body) if data.synthesis else "(no synthesis was written)")
    for task in data.tasks:
        if task.state is TaskState.FAILED:
            # why it failed may be a worker's words (its agent's stderr): no ESC sequence reaches the terminal
            render.stderr.print(f"task {task.title!r} ({task.id}) failed: {render.shown(task.result or '-')}",
                                highlight=False, markup=False)
    if trace is not None:
        _finish_trace(trace, data, Path(config.run.runs_dir) / result.run_id / "agents", quiet)
    where = result.report.html if result.report else "-"
    run_dir = Path(config.run.runs_dir) / result.run_id
    if not quiet:
        render.stderr.print(_figures_table(figures, config.reference))
        if data.scores is not None:
            render.stderr.print(scores_line(data.scores), highlight=False, markup=False)
        store_url = config.run.store or f"sqlite:///{(run_dir / 'store.db').resolve()}"
        if (holds := holds_line(data, store_url)) is not None:
            render.stderr.print(holds, highlight=False, markup=False)
        # the totals line stays the last one: scripts read it
        render.stderr.print(totals_line(result.run_id, data, where), highlight=False, markup=False)
    if data.synthesis is None:
        why = render.shown(why_no_synthesis(data.tasks, data.findings))  # the lead's own words, maybe
        render.stderr.print(f"run {result.run_id} ended without a synthesis: {why} (see {where})", highlight=False,
                            markup=False)
    if ui:
        _serve_finished(run_dir, host, seen, tuple(ui_host or ()))
    if data.synthesis is None:
        raise typer.Exit(1)
