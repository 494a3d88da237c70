"""The agent's hands: the governed tools over HTTP (``/v1/tools/*``) and its own machine (shell, files)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from swarmyard.errors import InvalidInputError
from swarmyard.plane.client import AsyncToolClient, ToolCall
from swarmyard.plane.tool_results import parse

if TYPE_CHECKING:
    from swarmyard.plane.lean_client import HttpClient

#: Longest tool output handed back to the model (small models have small contexts).
MAX_RESULT_CHARS = 2000

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ClaimedTask:
    """The task a worker holds: what to do and the fencing token every later call carries."""

    task_id: str
    fencing_token: int
    title: str
    prompt: str
    group: str


class PlaneTools(AsyncToolClient):
    """The worker tools of the control plane, called with the worker's capability token (see
    :class:`~swarmyard.plane.client.AsyncToolClient`), and the task the worker holds."""

    def __init__(self, client: HttpClient) -> None:
        super().__init__(client)
        self.task: ClaimedTask | None = None

    async def claim(self, task_id: str | None = None, *, model: str | None = None,
                    max_tokens: int | None = None) -> ClaimedTask | None:
        """Claim ``task_id`` or any claimable task of the worker's group; ``None`` when none is left. ``model`` and
        ``max_tokens``: what this worker's calls will ask for, so that the plane refuses (``BudgetExceededError``)
        a task that cannot afford one of them rather than hand it over."""
        claimed = await self.claim_task(task_id, model=model, max_tokens=max_tokens)
        task, token = claimed.task, claimed.fencing_token
        self.task = None if task is None or token is None else ClaimedTask(task.id, token, task.title, task.prompt,
                                                                           task.group)
        return self.task

    async def answer(self, call: ToolCall[T]) -> tuple[Any, T]:
        """``call``'s answer twice: its JSON as the plane sent it (what the model is shown, and the trajectory
        records) and read as its type (what the agent reads; a malformed answer is a ``bad_response`` error)."""
        data = await self.call(call.name, call.body)
        return data, parse(call.result, data)


class LocalTools:
    """Shell and files inside the agent's own machine, confined to its working folder."""

    def __init__(
        self, workdir: Path, *, exec_timeout_s: float = 60.0, env: dict[str, str] | None = None
    ) -> None:
        self.workdir = workdir.resolve()
        self.exec_timeout_s = exec_timeout_s
        # a fixed small environment: the agent's own variables (its token) never reach a shell command
        self._env = (
            env
            if env is not None
            else {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(self.workdir), "LANG": "C.UTF-8"}
        )

    def _confine(self, path: str) -> Path:
        target = (self.workdir / path).resolve()
        if not target.is_relative_to(self.workdir):
            raise InvalidInputError(f"{path!r} is outside the working folder", field="path")
        return target

    def read_file(self, path: str) -> str:
        """A file's text (at most ``MAX_RESULT_CHARS``)."""
        target = self._confine(path)
        try:
            return target.read_text(encoding="utf-8", errors="replace")[:MAX_RESULT_CHARS]
        except OSError as exc:
            raise InvalidInputError(f"cannot read {path}: {exc.strerror}", field="path") from exc

    def write_file(self, path: str, content: str) -> str:
        """Write a file; returns what was done."""
        target = self._confine(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
        return f"wrote {len(content.encode())} bytes to {target.relative_to(self.workdir)}"

    async def shell(self, command: str) -> str:
        """Run ``command`` with ``sh -c`` in its own process group; on timeout the whole group is killed."""
        process = await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            command,
            cwd=self.workdir,
            env=self._env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            out, _ = await asyncio.wait_for(process.communicate(), timeout=self.exec_timeout_s)
        except TimeoutError:
            # killing only the shell would leave its children running; kill the group it leads
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
            return f"[timed out after {self.exec_timeout_s:g} s; the command and its children were killed]"
        text = out.decode("utf-8", "replace")
        return f"[exit {process.returncode}]\n{text[-MAX_RESULT_CHARS:]}"
