"""The real launcher: the control plane (tools + broker) on a Unix socket, a machine for every agent run.

Each agent run gets a fresh capability token scoped to the goal and its slot's group; the machine sees the
plane only through its in-sandbox relay (on a Ray node of another host, through its node's bridge to the
plane's TLS listener: see :mod:`swarmyard.swarm.plane_tls`). A machine lives as long as its agent's task
(``workers.machine = "per_task"``) or its slot (``"per_slot"``), at most ``workers.max_machines`` at once (see
:mod:`swarmyard.swarm.run_machines`); whatever is left is deleted in ``close``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swarmyard.agents.adapters import AdapterContext, get_adapter
from swarmyard.agents.settings import DEFAULT_MAX_TOKENS, AgentSettings, Role
from swarmyard.auth.tokens import TokenAuthority, load_or_create_secret
from swarmyard.config import AgentKind, HistoryMode, Profile, SandboxKind, SwarmConfig
from swarmyard.domain import Goal
from swarmyard.errors import BudgetExceededError, ConfigError, SandboxError, SwarmyardError
from swarmyard.ids import new_id
from swarmyard.machines.environment import MACHINE_PYTHON, lean_python
from swarmyard.machines.local import HOME as MACHINE_HOME
from swarmyard.plane.server import BackgroundServer, Listen
from swarmyard.plane.trajectory import MAX_FILE_BYTES, TrajectoryFiles
from swarmyard.report.data import WorkerSpan
from swarmyard.store.protocol import Store
from swarmyard.swarm import governance
from swarmyard.swarm.launcher import WorkerSlot
from swarmyard.swarm.run_machines import HeldMachine, RunMachines
from swarmyard.swarm.run_secrets import TOKEN_SECRET, run_secrets
from swarmyard.swarm.sources import LensSources, lens_files, lens_of_task

if TYPE_CHECKING:
    from swarmyard.broker.app import Broker
    from swarmyard.machines.protocol import ExecResult
    from swarmyard.machines.ray import RayBackend
    from swarmyard.plane.dashboard import UiListen
    from swarmyard.plane.tools import Evaluator as PlaneEvaluator
    from swarmyard.telemetry import LiveTrace

log = logging.getLogger(__name__)

#: ``rm -rf -- FOLDER`` and ``find DIR -name '*.jsonl' -type f -size -MAX -newer MARK`` in the machine's own
#: interpreter, the one program every machine (a governed one too) may execute.
_REMOVE_TREE = "import shutil, sys; shutil.rmtree(sys.argv[1], ignore_errors=True)"
_FIND_TRANSCRIPTS = (
    "import os, sys\n"
    "top, mark, most = sys.argv[1], os.stat(sys.argv[2]).st_mtime, int(sys.argv[3])\n"
    "for folder, _, names in os.walk(top):\n"
    "    for name in names:\n"
    "        path = os.path.join(folder, name); st = os.lstat(path)\n"
    "        if name.endswith('.jsonl') and os.path.isfile(path) and not os.path.islink(path) \\\n"
    "                and st.st_size < most and st.st_mtime > mark:\n"
    "            print(path)\n"
)
#: What a governed machine's helpers start with: they walk folders the agent wrote, and execute nothing.
_LOCKED = "from swarmyard.guest.seccomp import lock_exec; lock_exec()\n"

#: Longest Unix socket path the kernel accepts (``sun_path`` is 108 bytes with its terminating NUL).
_MAX_SOCKET_PATH = 107


#: where an agent CLI writes its own session transcript, under its home
_TRANSCRIPTS = {AgentKind.CLAUDE: ".claude/projects", AgentKind.CODEX: ".codex/sessions"}


class _MachineLost(Exception):
    """The agent's machine went away while the agent ran in it (``error``: how the exec learnt it)."""

    def __init__(self, worker_id: str, error: SandboxError) -> None:
        super().__init__(error.message)
        self.worker_id = worker_id
        self.error = error


def _why(result: ExecResult) -> str:
    """How an agent run ended, in a line: its timeout, or its exit code and the last line it wrote that is
    not a request log (on stderr, else stdout)."""
    if result.timed_out:
        return f"timed out after {result.duration_s:.0f} s"
    for stream in (result.stderr, result.stdout):
        lines = [line.strip() for line in stream.decode("utf-8", "replace").splitlines()
                 if line.strip() and "HTTP Request:" not in line]
        if lines:
            return f"exit {result.exit_code}: {lines[-1][:300]}"
    return f"exit {result.exit_code}"


def _tail_text(data: bytes, limit: int) -> str:
    """The end of an agent's output for a log line: decoded text, its request log lines left out, at most
    ``limit`` characters, cut at a word with an ellipsis where it was cut (``-`` when nothing is left)."""
    text = " / ".join(line.strip() for line in data.decode("utf-8", "replace").splitlines()
                      if line.strip() and "HTTP Request:" not in line)
    if len(text) <= limit:
        return text or "-"
    tail = text[-(limit - 1):]
    space = tail.find(" ")
    if 0 <= space < limit // 2:
        tail = tail[space + 1:]
    return "…" + tail


def machine_cap(config: SwarmConfig) -> int:
    """The most machines the run keeps at once: ``workers.max_machines`` as the swarm file sets it; left unset,
    its default or room for every concurrent worker plus the lead or the planner, whichever is more (a run of
    200 concurrent workers under the default 128 would start its last 72 agents only as the first ones end)."""
    workers = config.workers
    if "max_machines" in workers.model_fields_set:
        return workers.max_machines
    return max(workers.max_machines, workers.concurrency + 2)


def _history_of(config: SwarmConfig) -> str:
    """The workers' history mode as the agent reads it: "" for ``none``."""
    mode = config.workers.history
    return "" if mode is HistoryMode.NONE else mode.value


class MachineLauncher:
    """Runs agents in ``swarmyard.machines`` machines against an in-process control plane."""

    def __init__(self, config: SwarmConfig, store: Store, run_dir: Path,
                 providers: Mapping[str, Any] | None = None, ui: UiListen | None = None,
                 evaluator: PlaneEvaluator | None = None, trace: LiveTrace | None = None) -> None:
        self.config = config
        self.ui = ui
        #: the run's trace, sent as it goes (``--otlp``): told of every model call the broker answers
        self.trace = trace
        #: scores what workers submit (the run's evaluator, started by the coordinator before ``start``)
        self.evaluator = evaluator
        self._slot_of: dict[str, str] = {}  # worker id -> the slot it ran in
        self._given_providers = providers
        self.store = store
        self.run_dir = run_dir
        # absolute: the relay inside the machine resolves the path from its own working folder
        self.socket = (run_dir / "plane.sock").resolve()
        self._machines: Any = None
        self._made: dict[str, str] = {}
        self._relays: dict[str, str] = {}
        self._homes: dict[str, str] = {}
        self._with_files: set[str] = set()  # slots whose machine holds a task's input files now
        self._held: RunMachines | None = None
        #: the threads agent runs block in: one per concurrent run (asyncio's default pool has cpu_count + 4,
        #: which would cap the concurrency of a small host below the swarm file's)
        self._pool: ThreadPoolExecutor | None = None
        self._groups: dict[str, str] = {}  # slot -> its group (the machine's)
        self._roles: dict[str, Role] = {}  # slot -> its role (a governed one's machine executes only its agent)
        self._key_places: list[str] = []  # where the scans of deleted machines found a provider key
        self._scanned = 0  # machines scanned for provider keys so far
        #: places a provider key was found in the machines at the end of the run (``None``: not scanned yet)
        self.keys_found: int | None = None
        self.keys_held = False  # whether any scan had a provider key to look for
        self._plane: BackgroundServer | None = None
        self._ray: RayBackend | None = None  # joined before the plane starts: its address is the plane's too
        self._broker: Broker | None = None
        #: the least call the plane lets a claim's task afford (its claim tool's ``CallFloor``)
        self._call_floor: Callable[[str | None, int | None], int] | None = None
        self._tokens: TokenAuthority | None = None
        self._goal: Goal | None = None
        self._running: dict[str, str] = {}
        self._baseline: str | None = config.workers.baseline
        #: every agent step a worker reports, one JSONL file per agent run beside its log
        self.trajectories = TrajectoryFiles(run_dir / "agents")

    async def start(self, goal: Goal) -> None:
        """Serve the plane on the run's socket and open the machines backend."""
        from swarmyard.machines.api import Machines
        from swarmyard.plane.assembly import assemble
        from swarmyard.plane.settings import PlaneSettings

        self._goal = goal
        # outside the run folder: machines, reports and whoever reads the run never see it
        secret = run_secrets(self.run_dir.name) / TOKEN_SECRET
        self._tokens = TokenAuthority(load_or_create_secret(secret), self.store)
        from swarmyard.broker.providers.configured import slots_for

        # an agent CLI's prompts need bigger slots of the embedded model than the built-in agent's
        agents = {self.config.workers.agent.value, self.config.lead.agent.value}
        # the broker's model calls are counted in /metrics and kept with the step they were made in (messages,
        # model, cost) by the assembly; the live trace is told of them too
        made = assemble(
            self.store,
            self._tokens,
            PlaneSettings(lease_s=self.config.workers.lease_s,
                          ui_hosts=self.ui.hosts if self.ui is not None else ()),
            providers=self.config.providers,
            given=self._given_providers,
            local_slots=slots_for(agents, self.config.workers.concurrency),
            trajectories=self.trajectories,
            machines=self.machines_view,
            evaluator=self.evaluator,
            # the quotes of worker findings are checked against the files each task's worker was given
            sources=(LensSources(self.config.tasks.lenses, self.store.get_task)
                     if self.config.tasks.cite_files else None),
        )
        self._broker = made.broker
        self._call_floor = made.core.tools.call_floor
        assert self._broker is not None  # a table was given: an empty one makes a broker that routes nothing
        if self.trace is not None:
            self.trace.begin(self.run_dir, goal.id, step_of=self.trajectories.last_step)
            self._broker.watchers.append(self.trace.model_call)
        if len(os.fsencode(self.socket)) > _MAX_SOCKET_PATH:
            # the kernel's sockaddr_un limit; uvicorn would fail in its thread and leave the run waiting
            raise ConfigError(f"the run folder {self.run_dir.resolve()} is too deep for the plane's Unix socket "
                              f"({len(os.fsencode(self.socket))} bytes, at most {_MAX_SOCKET_PATH})",
                              field="run.runs_dir")
        self.socket.unlink(missing_ok=True)
        listener = None
        if self.config.run.sandbox is SandboxKind.RAY:
            from swarmyard.machines.ray import RayBackend
            from swarmyard.swarm.plane_tls import plane_listener

            self._ray = await asyncio.to_thread(RayBackend, address=self.config.run.ray_address)
            # for the nodes that cannot see the socket: TCP with mutual TLS where Ray reaches this node
            listener = plane_listener(self.run_dir.name, self._ray.driver_address())
        # as `swarmyard serve` serves it (deadlines for headers and bodies, a cap on connections); with --ui the
        # same app on loopback TCP as well, for a browser: the dashboard at /ui
        self._plane = made.background(Listen(self.socket, self.ui.host, self.ui.port) if self.ui is not None
                                      else Listen(self.socket),
                                      also=(listener.listen(),) if listener is not None else ())
        await asyncio.to_thread(self._plane.start)
        if self.ui is not None:
            self._announce_ui(self.ui, self._plane.tcp_port)
        if self._ray is not None and listener is not None:
            port = self._plane.tcp_ports[0]
            assert port is not None
            self.store.record_event("plane.tls_listening", {"goal": goal.id, "host": listener.host, "port": port})
            routes = await asyncio.to_thread(self._ray.bridge_plane, self.socket, listener.for_nodes(port))
            self.store.record_event("machines.plane_routes", {"goal": goal.id, "nodes": routes})
        workers = self.config.workers
        cap = machine_cap(self.config)
        # The launcher keeps within the cap itself (RunMachines); the API's own cap is the same number, and a
        # machine made outside the launcher that holds a place longer than an agent may run is an error there.
        self._machines = await asyncio.to_thread(Machines, self._ray or self.config.run.sandbox.value,
                                                 max_concurrent=cap,
                                                 queue_timeout_s=workers.exec_timeout_s + 60)
        self._held = RunMachines(cap, workers.machine, self._make, self._drop)
        # the workers, plus the lead or the planner, which may start while the last workers end
        self._pool = ThreadPoolExecutor(max_workers=workers.concurrency + 2, thread_name_prefix="swarmyard-agent")
        self._baseline = await asyncio.to_thread(self._agent_baseline)

    def _announce_ui(self, ui: UiListen, port: int | None) -> None:
        """Write an operator token for the dashboard (0600, beside the run's other secrets) and say where."""
        from swarmyard.secret_files import write_secret_file

        assert self._tokens is not None
        path = run_secrets(self.run_dir.name) / "operator-token"
        path.unlink(missing_ok=True)  # a resumed run gets a fresh one
        write_secret_file(path, self._tokens.issue_operator(ttl_s=self.config.goal.deadline_s + 3600).encode())
        host = f"[{ui.host}]" if ":" in ui.host else ui.host
        if ui.announce is not None:
            ui.announce(f"http://{host}:{port}/ui", path)

    def machines_view(self) -> list[dict[str, Any]]:
        """Every agent run's machine, for the dashboard: worker, slot, machine id and whether it runs now."""
        running = set(self._running.values())
        return [{"worker": worker, "slot": slot, "machine": self._made.get(slot, "deleted"),
                 "state": "running" if worker in running else ("ended" if slot in self._made else "deleted")}
                for worker, slot in list(self._slot_of.items())]

    def _agent_baseline(self) -> str | None:
        """The baseline every machine starts from: the swarm file's, or a PyPI agent's own environment."""
        from swarmyard.agents.adapters import venvs
        from swarmyard.errors import UserError

        kinds = {self.config.workers.agent, self.config.lead.agent} - {AgentKind.BUILTIN}
        specs = {spec for kind in kinds if (spec := get_adapter(kind.value).venv) is not None}
        if not specs:
            return self.config.workers.baseline
        if self.config.workers.baseline is not None or len(specs) > 1:
            # a machine has one baseline; two lower layers (a repo and an agent) would need the Machines API
            raise ConfigError(f"{', '.join(sorted(s.agent for s in specs))} run from an environment of their "
                              "own, which a machine sees through its baseline: no other baseline can be given "
                              "with it yet", field="workers.baseline")
        (spec,) = specs
        source = venvs.require(spec)
        try:
            self._machines.prepare_baseline(spec.baseline, source)
            log.info("froze %s's environment as machine baseline %s", spec.agent, spec.baseline)
        except UserError:
            pass  # made by an earlier run on this host (a new pin is a new name)
        return spec.baseline

    def _make(self, slot: str) -> HeldMachine:
        """Boot a machine for ``slot`` (fresh, or from the baseline) and wait until it runs commands."""
        group = self._groups.get(slot)
        # a governed slot's machine executes nothing but its agent (see swarmyard.swarm.governance)
        info = self._machines.create(f"{slot}-{new_id('m')[-8:]}", self._baseline, group,
                                     control_socket=self.socket,
                                     isolation=governance.isolation(self.config, self._roles.get(slot, Role.WORKER)))
        try:
            ready = self._machines.wait_until_ready(info.id)
        except BaseException:
            self._machines.delete(info.id)
            raise
        self.store.record_event("machine.created", {"goal": self._goal.id if self._goal else None,
                                                    "machine": info.id, "slot": slot, "group": group,
                                                    **({"node": info.node} if info.node else {})})
        # where the machine's own disk is, as the agent inside sees it
        home = MACHINE_HOME if info.backend in ("local", "ray") else (info.disk or ".")
        held = HeldMachine(info.id, slot, f"http://127.0.0.1:{ready.relay_port}", home)
        self._made[slot], self._homes[slot], self._relays[slot] = held.id, held.home, held.relay
        return held

    def _drop(self, held: HeldMachine) -> None:
        """Scan a machine for provider keys, then delete it; a machine already gone is no error."""
        if self._made.get(held.slot) == held.id:
            self._made.pop(held.slot, None)
            self._with_files.discard(held.slot)
        self._scan_for_keys([held.id])
        try:
            self._machines.delete(held.id)
        except SwarmyardError as exc:
            log.info("machine %s of %s was already gone: %s", held.id, held.slot, exc.message)
            return
        self.store.record_event("machine.deleted", {"goal": self._goal.id if self._goal else None,
                                                    "machine": held.id, "slot": held.slot})

    def _run_blocking(self, slot: WorkerSlot) -> WorkerSpan:
        assert self._held is not None
        self._groups[slot.name] = slot.group
        self._roles[slot.name] = slot.role
        started = time.time()
        held = self._held.take(slot.name)
        lost = False
        try:
            return self._run_in(slot, held.id, started)
        except _MachineLost as exc:
            # the machine died under its agent (its processes were killed): that agent run failed, not the
            # swarm; its claim goes back like any failed run's, and the machine is deleted, never kept
            lost = True
            log.warning("%s: machine %s went away under its agent: %s", slot.name, held.id, exc.error.message)
            return WorkerSpan(exc.worker_id, None, started, time.time(), "error", 0, slot.name, None,
                              exc.error.message)
        finally:
            self._held.give_back(held, lost=lost)

    def _run_in(self, slot: WorkerSlot, machine_id: str, started: float) -> WorkerSpan:
        assert self._tokens is not None and self._goal is not None
        if slot.role is Role.WORKER and slot.task_id is not None:
            self._put_task_files(slot, machine_id, slot.task_id)
        relay = self._relays[slot.name]
        token, who = self._tokens.issue(self._goal.id, slot.group, ttl_s=self.config.goal.deadline_s)
        self.trajectories.label(who.worker_id, f"{slot.name}-{who.worker_id}")
        self._slot_of[who.worker_id] = slot.name
        self._running[slot.name] = who.worker_id
        lead = slot.role is Role.LEAD
        agent = self.config.lead.agent if lead else self.config.workers.agent
        model = self.config.lead.model if lead else self.config.workers.model
        steps = self.config.lead.max_steps if lead else self.config.workers.max_steps
        if slot.role is Role.PLANNER:
            agent = AgentKind.BUILTIN  # the planning call is always the built-in one: an external CLI cannot
        submit: tuple[str, str, int, str] | None = None  # (file, task, fencing token, title) for an agent w/o MCP
        if agent is AgentKind.BUILTIN:
            python = lean_python()
            argv: list[str] = [*python.argv, "-m", "swarmyard.agents"]
            settings = AgentSettings(
                plane_url=relay, token=token, model=model, role=slot.role, max_steps=steps, exec_timeout_s=60.0,
                workdir=Path("."), task_id=slot.task_id or None,
                # renew the claim four times a lease while waiting on a slow model
                heartbeat_s=max(1.0, self.config.workers.lease_s / 4),
                policy=self.config.policy.kind.value,  # explore's directions and settings are in the store
                history=_history_of(self.config), history_top_k=self.config.workers.history_top_k)
            settings = governance.agent_settings(self.config, slot.role, settings)
            for path, data in governance.uploads(self.config, slot.role).items():
                self._machines.files.upload(machine_id, path, data, mode=0o400)
            if (max_tokens := self._max_tokens(slot.role)) is not None:
                settings = replace(settings, max_tokens=max_tokens)
            if lead:
                settings = replace(settings, synthesis=self.config.lead.synthesis.value)
            if slot.role is Role.PLANNER:
                settings = replace(settings, plan_count=self.config.tasks.plan or 1)
            env = {**python.env, **settings.to_env()}
        else:
            # An agent CLI calls its model before any tool, and the broker only serves a worker that holds a
            # claim: so the launcher claims for it, and the agent starts with its task in hand.
            try:
                claim = self.store.claim(self._goal.id, who.worker_id, self.config.workers.lease_s,
                                         task_id=slot.task_id, group=slot.group,
                                         min_slice_micro_usd=self.claim_floor(slot.role), calls=True)
            except BudgetExceededError as exc:  # as the plane refuses the built-in agent's claim
                log.warning("%s: claim refused: %s", slot.name, exc.message)
                return WorkerSpan(who.worker_id, None, started, time.time(), "claim_refused", 0, slot.name,
                                  None, exc.message)
            if claim is None:
                return WorkerSpan(who.worker_id, None, started, time.time(), "no_task", 0, slot.name)
            prompt = (f"{self._goal.objective}\n\nYour task (already claimed for you): {claim.task.title}\n"
                      f"{claim.task.prompt}")
            adapter = get_adapter(agent.value)
            if adapter.finding_file is not None:
                # it cannot read the board itself: the latest posts of its group come with the prompt
                posts = self.store.read_board(self._goal.id, group=slot.group, limit=1000)[-20:]
                if posts:
                    prompt += "\n\nThe board so far:\n" + "\n".join(f"- [{p.kind}] {p.body[:500]}" for p in posts)
            launch = adapter.launch(
                # The machine's writable disk is its home; the MCP server is this same swarmyard, by interpreter
                # path (the console script's folder is not on the machine's PATH).
                AdapterContext(relay, token, model, prompt, home=self._homes[slot.name],
                               workdir=self._homes[slot.name],
                               mcp_command=(*MACHINE_PYTHON, "-m", "swarmyard.cli", "mcp"),
                               task_id=claim.task.id, fencing_token=claim.token,
                               governed=governance.profile_of(self.config, slot.role) is Profile.GOVERNED)
            )
            if adapter.finding_file is not None:
                submit = (adapter.finding_file, claim.task.id, claim.token, claim.task.title)
            for path, text in launch.files.items():
                self._machines.files.upload(machine_id, path, text.encode(), mode=0o600)
            argv, env = list(launch.argv), dict(launch.env)
        if agent in _TRANSCRIPTS:  # a mark: only transcripts newer than it are this run's
            self._machines.files.upload(machine_id, f".swarmyard-run-{who.worker_id}", b"", mode=0o600)
        try:
            result = self._machines.exec(machine_id, argv, timeout=self.config.workers.exec_timeout_s, env=env)
        except SandboxError as exc:
            raise _MachineLost(who.worker_id, exc) from exc
        self._keep_log(slot, who.worker_id, agent, result, time.time() - started)
        self._keep_transcript(slot, who.worker_id, agent, machine_id)
        if submit is not None and not result.timed_out:
            path, claimed, fencing_token, title = submit
            ending = self._submit_for(machine_id, path, token, claimed, fencing_token, title)
            if ending != "done":
                log.warning("%s: agent exit %s: %s | %s", slot.name, result.exit_code,
                            _tail_text(result.stderr, 500), _tail_text(result.stdout, 1500))
            return WorkerSpan(who.worker_id, claimed, started, time.time(), ending, 1, slot.name,
                              result.exit_code, _why(result))
        ending, task_id, steps_done = "timeout" if result.timed_out else "error", None, 0
        if not result.timed_out and result.stdout:
            try:
                outcome = json.loads(result.stdout.strip().splitlines()[-1])
                ending, task_id, steps_done = outcome["ending"], outcome["task_id"], int(outcome["steps"])
            except (ValueError, KeyError, IndexError, TypeError):
                ending = "done" if result.exit_code == 0 else "error"
        if ending in ("error", "timeout"):
            # agent CLIs often report on stdout (codex --json): show the tail of both
            log.warning("%s: agent %s (exit %s): %s | %s", slot.name, ending, result.exit_code,
                        _tail_text(result.stderr, 500), _tail_text(result.stdout, 1500))
        return WorkerSpan(who.worker_id, task_id, started, time.time(), ending, steps_done, slot.name,
                          None if result.timed_out else result.exit_code, _why(result))

    def _put_task_files(self, slot: WorkerSlot, machine_id: str, task_id: str) -> None:
        """Empty the machine's ``task/`` folder and fill it with the input files of the task's lens (if any)."""
        from swarmyard.families.tasks import TASK_FOLDER

        lens = lens_of_task(self.config.tasks.lenses, self.store.get_task(task_id), self.store.get_task)
        home = self._homes[slot.name]
        if slot.name in self._with_files:
            # the previous task's files must not pass for this one's
            # by the machine's interpreter, not rm: a governed machine executes nothing else
            self._machines.exec(machine_id, [*MACHINE_PYTHON, "-c", self._helper(slot, _REMOVE_TREE), TASK_FOLDER],
                                timeout=60, cwd=home)
            self._with_files.discard(slot.name)
        if lens is None:
            return
        for item in lens_files(lens):
            self._machines.files.upload(machine_id, f"{TASK_FOLDER}/{item.inside}", item.source.read_bytes())
        self._with_files.add(slot.name)

    def _helper(self, slot: WorkerSlot, code: str) -> str:
        """A helper program for the slot's machine: under ``governed`` it locks exec before anything else."""
        return _LOCKED + code if governance.profile_of(self.config, slot.role) is Profile.GOVERNED else code

    def _keep_log(self, slot: WorkerSlot, worker_id: str, agent: AgentKind, result: ExecResult,
                  took_s: float) -> None:
        """The agent's own output in the run folder: what to read when a worker or the lead failed.

        At most the head and tail of each stream the machine kept (see ``machines.OutputCap``): a worker that
        floods its output cannot fill the host's disk through its log.
        """
        folder = self.run_dir / "agents"
        folder.mkdir(exist_ok=True)
        ending = "timed out" if result.timed_out else f"exit {result.exit_code}"
        cut = (f"\n(output cut: it wrote {result.stdout_bytes} bytes of stdout and {result.stderr_bytes} of stderr; "
               "the head and tail of each are kept)\n" if result.truncated else "")
        text = (f"# {slot.name} ({slot.role.value}, {agent.value}) worker {worker_id}: {ending} after "
                f"{took_s:.1f} s\n{cut}\n## stderr\n{result.stderr.decode('utf-8', 'replace')}\n\n"
                f"## stdout\n{result.stdout.decode('utf-8', 'replace')}\n")
        (folder / f"{slot.name}-{worker_id}.log").write_text(text, encoding="utf-8")

    def _keep_transcript(self, slot: WorkerSlot, worker_id: str, agent: AgentKind, machine_id: str) -> None:
        """An external CLI's own transcript (Claude Code's and Codex's session JSONL), copied beside its log.

        Only files this run's agent wrote since its start, each at most ``MAX_FILE_BYTES`` (found by the machine
        itself): a transcript the agent inflated costs the host no more than that.
        """
        where = _TRANSCRIPTS.get(agent)
        if where is None:
            return
        home = self._homes[slot.name]
        # by the machine's interpreter, not find: a governed machine executes nothing else
        found = self._machines.exec(machine_id, [*MACHINE_PYTHON, "-c", self._helper(slot, _FIND_TRANSCRIPTS),
                                                 f"{home}/{where}",
                                                 f"{home}/.swarmyard-run-{worker_id}", str(MAX_FILE_BYTES)],
                                    timeout=30)
        paths = sorted(found.stdout.decode("utf-8", "replace").split())
        if not paths:
            return
        target = self.run_dir / "agents" / f"{slot.name}-{worker_id}.transcript.jsonl"
        with target.open("wb") as out:
            for path in paths:
                try:
                    out.write(self._machines.files.download(machine_id, path)[:MAX_FILE_BYTES])
                except (OSError, SwarmyardError) as exc:
                    log.info("could not copy %s's transcript %s: %s", slot.name, path, exc)

    def _submit_for(self, machine_id: str, path: str, token: str, task_id: str, fencing_token: int,
                    title: str) -> str:
        """Submit the file an agent without MCP wrote as its finding, through the plane with its own token."""
        from swarmyard.plane.client import Fence, PlaneAddress, ToolClient

        try:
            body = self._machines.files.download(machine_id, path).decode("utf-8", "replace").strip()
        except (OSError, SwarmyardError) as exc:
            log.warning("the agent left no %s: %s", path, exc)
            return "no_finding"
        if not body:
            log.warning("the agent wrote nothing into %s", path)
            return "no_finding"
        with PlaneAddress(socket_path=str(self.socket)).client(token, timeout_s=30) as http:
            try:
                ToolClient(http, Fence(task_id, fencing_token)).submit_finding(title[:500], body)
            except SwarmyardError as exc:
                log.warning("submitting the agent's finding was refused (%s): %s", exc.code, exc.message[:300])
                return "error"
        return "done"

    def _max_tokens(self, role: Role) -> int | None:
        """The ``max_tokens`` a built-in agent of ``role`` asks for when the launcher sets one (``None``: its
        default, ``AgentSettings.max_tokens``)."""
        if role is Role.LEAD:
            return 1024  # a synthesis is longer than a step (the route may hold less)
        if role is Role.PLANNER:
            return min(2048, 160 * (self.config.tasks.plan or 1) + 128)  # room for N lenses in one answer
        return None

    def claim_floor(self, role: Role) -> int:
        """The least call an agent of ``role`` makes, as the plane's claim tool prices it: a task that cannot
        afford it is refused at claim. The built-in agent names its model and ``max_tokens`` when it claims; an
        agent CLI, claimed for here, names only the model (its ``max_tokens`` is its own)."""
        if self._call_floor is None:
            return 0
        if role is Role.PLANNER:
            return self._call_floor(None, None)  # the planner's claim names no model
        lead = role is Role.LEAD
        model = self.config.lead.model if lead else self.config.workers.model
        if (self.config.lead.agent if lead else self.config.workers.agent) is not AgentKind.BUILTIN:
            return self._call_floor(model, None)
        return self._call_floor(model, self._max_tokens(role) or DEFAULT_MAX_TOKENS)

    def worker_of(self, slot: str) -> str | None:
        """The worker id of the agent running in ``slot`` now."""
        return self._running.get(slot)

    async def run(self, slot: WorkerSlot) -> WorkerSpan:
        """One agent run in a machine of its own (``per_task``) or its slot's (``per_slot``), once the cap has
        room."""
        assert self._pool is not None, "start() first"
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, self._run_blocking, slot)
        finally:
            self._running.pop(slot.name, None)

    def _scan_for_keys(self, machine_ids: list[str]) -> None:
        """Look for the broker's provider keys in machines about to be deleted (they add up in ``_key_places``)."""
        from swarmyard.broker.keys import held_values
        from swarmyard.swarm.keyscan import scan_machines

        scan = scan_machines(self._machines, machine_ids, held_values())
        self.keys_held = self.keys_held or scan.looked
        self._scanned += scan.machines
        self._key_places += scan.places
        if scan.found:
            log.warning("provider keys found in machines: %s", ", ".join(scan.places))

    def _close_machines(self) -> None:
        """Delete the machines still live (scanned first), then say what every scan of the run found."""
        left = self._held.close() if self._held is not None else []
        for held in left:
            self._drop(held)
        self.keys_found = len(self._key_places)
        if self._ray is not None:  # what the nodes' bridges carried to the plane (before their hosts stop)
            self.store.record_event("machines.bridged", {"goal": self._goal.id if self._goal else None,
                                                         "nodes": self._ray.bridged()})
        self.store.record_event("machines.keys_scanned", {"goal": self._goal.id if self._goal else None,
                                                          "machines": self._scanned, "places": self._key_places})

    async def close(self) -> None:
        """Delete every machine, then stop the plane."""
        try:
            if self._machines is not None:
                await asyncio.to_thread(self._close_machines)
                await asyncio.to_thread(self._machines.close)
            elif self._ray is not None:  # joined, and the run stopped before its machines API opened
                await asyncio.to_thread(self._ray.close)
        finally:
            if self._broker is not None:
                # the last answers' settlements are queued behind them: written before the report reads them
                await asyncio.to_thread(self._broker.wait_settled, 30)
            if self._plane is not None:
                await asyncio.to_thread(self._plane.stop)
            if self._pool is not None:
                # every machine is gone, so every agent run in it has returned or is about to
                self._pool.shutdown(wait=False, cancel_futures=True)
