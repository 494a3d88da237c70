"""The swarm: coordinator, exploration policies and the lead step."""
