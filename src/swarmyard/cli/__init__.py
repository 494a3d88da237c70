"""The ``swarmyard`` command line: one module per noun; each parses, calls and renders, nothing else."""
