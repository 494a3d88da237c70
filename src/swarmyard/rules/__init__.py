"""The run's rules: pure functions and constants over domain values, below the control plane.

What belongs here: logic the plane, the coordinator and the agent all apply the same way (the exploration
policies, the copy and grounding checks on a finding, the no-result placeholder, the agent's instructions the copy
check compares with), written over ``swarmyard.domain``, ``swarmyard.config``, ``swarmyard.errors`` and
``swarmyard.money``. No I/O: no store, no network, no files, no clock of its own.

A module here imports nothing above it: not ``swarmyard.plane``, ``swarmyard.swarm``, ``swarmyard.agents``,
``swarmyard.broker``, ``swarmyard.machines``, ``swarmyard.cli`` nor ``swarmyard.boxd``
(``tests/unit/test_layers.py`` checks it). This file imports nothing either: the agent in every machine imports
some of these modules, and pays for whatever this package loads.
"""
