"""``python -m swarmyard.cli``: the same as the ``swarmyard`` command."""

from swarmyard.cli.main import main

main()
