"""Run the built-in agent from its environment (``SWARMYARD_PLANE_URL``, ``SWARMYARD_TOKEN``, ...)."""

from swarmyard.agents.entry import main

raise SystemExit(main())
