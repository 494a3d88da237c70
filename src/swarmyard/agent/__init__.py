"""``python -m swarmyard.agent``: the built-in agent, run inside a worker's machine."""
