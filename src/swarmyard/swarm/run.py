"""``Swarm.from_file(path).run()``: the whole run from Python, as ``swarmyard run`` does it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swarmyard.config import SandboxKind, SwarmConfig, load_config
from swarmyard.errors import SwarmyardError, UserError
from swarmyard.ids import new_id
from swarmyard.report.data import WorkerSpan
from swarmyard.store import open_store
from swarmyard.swarm.coordinator import Coordinator, ProgressRow, RunResult, RunState

if TYPE_CHECKING:
    from swarmyard.audit.witness import HttpWitnessClient
    from swarmyard.audit.witness_process import WitnessProcess
    from swarmyard.plane.dashboard import UiListen
    from swarmyard.telemetry import LiveTrace


class Swarm:
    """A parsed swarm file, ready to run."""

    def __init__(self, config: SwarmConfig, *, sandbox: SandboxKind | None = None,
                 providers: Mapping[str, Any] | None = None, witness: str | None = None,
                 ray_address: str | None = None, no_witness: bool = False) -> None:
        #: provider objects that replace the file's entries of the same name (a scripted provider in a test)
        self.providers = providers
        #: without a witness of the file's or ``witness``, the run starts its own (``swarmyard.audit.witness_process``)
        #: unless this is set: its log is then signed by its own key only, which cannot show a rollback
        self.no_witness = no_witness
        overrides: dict[str, Any] = {}
        if sandbox is not None:
            overrides["sandbox"] = sandbox
        if witness is not None:
            overrides["witness"] = witness
        if ray_address is not None:
            overrides["ray_address"] = ray_address
        self.config = (
            config.model_copy(update={"run": config.run.model_copy(update=overrides)}) if overrides else config
        )
        if no_witness and self.config.run.witness is not None:
            raise UserError(f"no witness was asked for, and one is named ({self.config.run.witness}): give one or "
                            "the other")

    @classmethod
    def from_file(cls, path: Path | str, *, sandbox: SandboxKind | None = None,
                  providers: Mapping[str, Any] | None = None, witness: str | None = None,
                  no_witness: bool = False) -> Swarm:
        """Parse a swarm file (``ConfigError`` naming the field; nothing is started)."""
        return cls(load_config(Path(path)), sandbox=sandbox, providers=providers, witness=witness,
                   no_witness=no_witness)

    def run(
        self,
        *,
        resume: str | None = None,
        on_span: Callable[[WorkerSpan], None] | None = None,
        on_progress: Callable[[list[ProgressRow]], None] | None = None,
        ui: UiListen | None = None,
        trace: LiveTrace | None = None,
    ) -> RunResult:
        """Run to the synthesis (or continue run ``resume``); machines are deleted in every case.

        ``ui`` also serves the control plane on loopback TCP, for the dashboard at ``/ui``; ``trace`` is told of
        every model call as it ends (its ``finish`` is the caller's, with the run's data)."""
        from swarmyard.broker.providers.configured import check_table
        from swarmyard.swarm.preflight import check_host

        check_host(self.config)  # before anything is created: the sandbox, the baseline
        check_table(self.config.providers, self.providers, env=os.environ)
        runs = Path(self.config.run.runs_dir)
        run_id = resume or new_id("run")
        run_dir = runs / run_id
        embedded: WitnessProcess | None = None
        if self.config.run.witness is None and not self.no_witness:
            from swarmyard.audit.witness_process import WitnessProcess

            embedded = WitnessProcess.start(run_id=run_id)  # before anything exists: a run without it stops here
        try:
            witness = embedded.client() if embedded is not None else _witness(self.config.run.witness)
        except BaseException:
            if embedded is not None:
                embedded.close()
            raise
        try:
            return self._run(run_id, run_dir, runs, witness, resume, on_span, on_progress, ui, trace)
        finally:
            if witness is not None:
                witness.close()
            if embedded is not None:
                embedded.close()

    def _run(self, run_id: str, run_dir: Path, runs: Path, witness: HttpWitnessClient | None,
             resume: str | None, on_span: Callable[[WorkerSpan], None] | None,
             on_progress: Callable[[list[ProgressRow]], None] | None, ui: UiListen | None,
             trace: LiveTrace | None = None) -> RunResult:
        from swarmyard.swarm.machine_launcher import MachineLauncher
        from swarmyard.swarm.scoring import RunEvaluator

        if resume:
            url = RunState.load(run_dir / "run.json").store_url
        else:
            # 0700: the store, the audit log and the agents' logs are the run's own (its secrets live elsewhere)
            runs.mkdir(mode=0o700, parents=True, exist_ok=True)
            run_dir.mkdir(mode=0o700, exist_ok=True)
            url = self.config.run.store or f"sqlite:///{(run_dir / 'store.db').resolve()}"
        store = open_store(url, serving=True)
        evaluator = RunEvaluator(self.config.evaluator.bundle_path, run_id, store) if self.config.evaluator else None
        try:
            coordinator = Coordinator(
                self.config,
                store,
                MachineLauncher(self.config, store, run_dir, self.providers, ui=ui, evaluator=evaluator,
                                trace=trace),
                run_id=run_id,
                run_dir=run_dir,
                on_span=on_span,
                on_progress=on_progress,
                witness=witness,
                evaluator=evaluator,
            )
            return asyncio.run(coordinator.run(resume=resume is not None))
        finally:
            store.close()


def _witness(where: str | None) -> HttpWitnessClient | None:
    """A client of the run's witness, checked before anything starts: a run that asked for one gets one."""
    if where is None:
        return None
    from swarmyard.audit.witness import HttpWitnessClient

    is_url = where.startswith(("http://", "https://"))
    client = HttpWitnessClient(url=where) if is_url else HttpWitnessClient(socket=Path(where))
    try:
        client.verifier()
    except SwarmyardError as exc:
        client.close()
        raise UserError(f"witness {where}: {exc.message}") from exc
    return client
