"""swarmyard: fan one problem out to a swarm of sandboxed LLM agents, safely, cheaply and measurably."""

from swarmyard.errors import SwarmyardError

__version__ = "0.1.0"

__all__ = ["SwarmyardError", "__version__"]
