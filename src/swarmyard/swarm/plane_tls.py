"""A run's plane for Ray nodes of other hosts: a CA of the run's own, a TCP listener with mutual TLS, bridges.

A machine on a Ray node that cannot see the plane's Unix socket reaches the plane through a bridge its node's
host actor runs (see :mod:`swarmyard.machines.bridge`). For those, a run on Ray also serves its plane on TCP, at
the address Ray knows the runner's node by (the one every other node already reaches it at, port chosen by the
kernel), with mutual TLS: a client must present a certificate of the run's own CA, made at each start of the
plane (a resumed run makes new ones) in the run's private folder (see :mod:`swarmyard.swarm.run_secrets`): never
in the run folder, never in a machine. The CA's key is removed as soon as both certificates are signed, so no
other client certificate can be made for the run. Only the CA, the client certificate and its key go to the node
hosts that need a bridge.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass

from swarmyard.machines.bridge import PlaneTls
from swarmyard.plane.certs import CertPaths, init_certs
from swarmyard.plane.server import Listen, TlsFiles
from swarmyard.swarm.run_secrets import run_secrets

#: The run's certificates' folder, inside its private folder.
FOLDER = "plane-tls"
#: How long the run's certificates are valid: a run never lasts this long.
DAYS = 30


@dataclass(frozen=True, slots=True)
class PlaneListener:
    """Where the run's plane listens over TLS for nodes of other hosts, and the files it serves with."""

    host: str
    certs: CertPaths

    def listen(self) -> Listen:
        """The TCP address with mutual TLS (port 0: the kernel's choice, read back once bound)."""
        return Listen(None, self.host, 0, TlsFiles(self.certs.server_cert, self.certs.server_key,
                                                     self.certs.ca_cert))

    def for_nodes(self, port: int) -> PlaneTls:
        """What a node's bridge needs: the address, the CA, the client certificate and its key."""
        return PlaneTls(self.host, port, self.certs.ca_cert.read_bytes(), self.certs.client_cert.read_bytes(),
                        self.certs.client_key.read_bytes())


def plane_listener(run_id: str, host: str) -> PlaneListener:
    """Make the run's CA, its server certificate for ``host`` and its client certificate, afresh."""
    folder = run_secrets(run_id) / FOLDER
    shutil.rmtree(folder, ignore_errors=True)  # a resumed run's: its CA must sign nothing the new plane accepts
    folder.mkdir(mode=0o700)
    certs = init_certs(folder, [host], client_name="swarmyard-node", days=DAYS)
    certs.ca_key.unlink()
    return PlaneListener(host, certs)
