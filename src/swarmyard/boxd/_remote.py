"""``Boxd()`` inside a coordinator machine: the same ``machines`` surface, over the ``/v1/machines`` routes of the
client that made the machine, through its relay, with the machine's own token (see :mod:`swarmyard.boxd._spawn`).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import httpx

from swarmyard.boxd._models import ExecResult, Machine, MachineSource
from swarmyard.errors import InvalidInputError, SwarmyardError, UserError
from swarmyard.plane.client import decode


def _machine(data: dict[str, Any]) -> Machine:
    source = data.get("source")
    return Machine(data["id"], data["name"], data["status"], datetime.fromtimestamp(data["created_at"]).astimezone(),
                   data["backend"], data.get("group"), MachineSource(**source) if source else None,
                   tuple(data.get("enforced") or ()), dict(data.get("addresses") or {}),
                   data.get("fork_memory"), data.get("fork_memory_reason"), data.get("suspension", "running"))


class RemoteFiles:
    """``boxd.machines.files`` of a coordinator machine."""

    def __init__(self, machines: RemoteMachines) -> None:
        self._m = machines

    def upload(self, machine: str, path: str, data: str | bytes) -> int:
        """See :meth:`swarmyard.boxd._client.Files.upload`."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        if not isinstance(data, bytes | bytearray):
            raise InvalidInputError("upload data must be str or bytes", field="data")
        answer = self._m._call("POST", f"/v1/machines/{machine}/upload",
                               {"path": path, "data_b64": base64.b64encode(bytes(data)).decode()})
        return int(answer["written"])

    def download(self, machine: str, path: str) -> bytes:
        """See :meth:`swarmyard.boxd._client.Files.download`."""
        return base64.b64decode(self._m._call("POST", f"/v1/machines/{machine}/download", {"path": path})["data_b64"])


class RemoteMachines:
    """``boxd.machines`` of a coordinator machine: only the machines it made."""

    def __init__(self, url: str, token: str, *, transport: httpx.BaseTransport | None = None,
                 may_spawn: bool = False) -> None:
        #: whether machines made here may make machines (the host's ``swarmyard machines`` service: yes; a
        #: coordinator machine: no, its machines cannot, and saying so beats the flag being dropped)
        self._may_spawn = may_spawn
        # an agent's exec can run for as long as its own timeout: the call waits for it
        self._http = httpx.Client(base_url=url, headers={"authorization": f"Bearer {token}"},
                                  timeout=httpx.Timeout(None, connect=30.0), transport=transport)
        self.files = RemoteFiles(self)

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        try:
            response = self._http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise UserError(f"cannot reach the machines of the client that made this machine: {exc}") from exc
        answer = decode(response)
        if response.status_code >= 400:
            raise SwarmyardError.from_dict(answer if isinstance(answer, dict) else {}, status=response.status_code)
        return answer

    def create(self, name: str | None = None, *, from_snapshot: str | None = None,
               networks: Sequence[str] | None = None, spawn: bool = False, **unsupported: Any) -> Machine:
        """A sibling machine (see :meth:`swarmyard.boxd._client.MachinesResource.create`); ``networks`` and
        ``spawn`` go to the server, which says whether its caller may."""
        # isolated=True is the default a script may spell out
        given = {k for k, v in unsupported.items() if v not in (None, True)}
        if spawn is not False and not self._may_spawn:
            given.add("spawn")
        if given:
            raise UserError(f"a coordinator machine creates machines by name, snapshot and networks only, not "
                            f"{sorted(given)}")
        body: dict[str, Any] = {"name": name, "from_snapshot": from_snapshot}
        if networks is not None:
            body["networks"] = list(networks) if isinstance(networks, list | tuple) else networks
        if spawn is not False:
            body["spawn"] = spawn
        return _machine(self._call("POST", "/v1/machines", body))

    def get(self, machine: str) -> Machine:
        """A machine this one made, by id or name."""
        return _machine(self._call("GET", f"/v1/machines/{machine}"))

    def list(self) -> list[Machine]:
        """The machines this one made."""
        return [_machine(m) for m in self._call("GET", "/v1/machines")]

    def wait_until_ready(self, machine: str, timeout: float = 180.0, poll_interval: float = 1.0) -> Machine:
        """See :meth:`swarmyard.boxd._client.MachinesResource.wait_until_ready`."""
        del poll_interval
        return _machine(self._call("POST", f"/v1/machines/{machine}/wait", {"timeout": timeout}))

    def exec(self, machine: str, command: str | Sequence[str], *, env: Mapping[str, str] | None = None,
             cwd: str | None = None, timeout: float | None = None, stdin: str | bytes | None = None) -> ExecResult:
        """See :meth:`swarmyard.boxd._client.MachinesResource.exec`."""
        data = stdin.encode("utf-8") if isinstance(stdin, str) else stdin
        body = {"command": command if isinstance(command, str) else list(command), "env": dict(env or {}),
                "cwd": cwd, "timeout": timeout,
                "stdin_b64": None if data is None else base64.b64encode(data).decode()}
        raw = self._call("POST", f"/v1/machines/{machine}/exec", body)
        out, err = base64.b64decode(raw["stdout_b64"]), base64.b64decode(raw["stderr_b64"])
        return ExecResult(out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), int(raw["exit_code"]),
                          bool(raw["timed_out"]), float(raw["duration_s"]), out, err, bool(raw["truncated"]))

    def fork(self, machine: str, new_name: str | None = None) -> Machine:
        """See :meth:`swarmyard.boxd._client.MachinesResource.fork`."""
        return _machine(self._call("POST", f"/v1/machines/{machine}/fork", {"new_name": new_name}))

    def delete(self, machine: str) -> None:
        """Delete a machine this one made."""
        self._call("DELETE", f"/v1/machines/{machine}")

    def close(self) -> None:
        """Close the connection (the machines stay: they live as long as this machine does)."""
        self._http.close()
