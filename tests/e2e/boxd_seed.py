"""The swarm script swarmyard starts from, written for boxd's SDK: three scouts and a lead, each in a machine of
its own, each running Claude Code headless; the lead reads the scouts' reports from its home folder.

``SEED`` is that script (a reconstruction from its described shape; see ``swarmyard.bench.agents``, where it
lives so that ``swarmyard bench agents`` runs the same text). ``ported`` makes the only two changes a user makes
to run it on swarmyard: the import line, and the client's construction (no boxd API key).
"""

from __future__ import annotations

from swarmyard.bench.agents import CONSTRUCTION, IMPORT, SEED, ported

__all__ = ["CONSTRUCTION", "IMPORT", "SEED", "ported"]
