"""The control plane: worker tools over HTTP and MCP, capability tokens, the operator API and metrics."""
